"""Redis, one narrow store per owner. Each store but tool state degrades to "no
answer" when Redis is unreachable, so callers never fail because it is down."""
