"""Prompt-lookup drafts inside vLLM's engine: gated per request, drafted from predicted
calls."""
