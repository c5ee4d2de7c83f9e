#!/usr/bin/env bash
# The code checks CI runs before the tests: lint, format, strict types and the
# import contracts. Run inside the environment: bash cluster/setup.sh bash cluster/check-code.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
step() { printf '[check-code] %s\n' "$*" >&2; }
step "ruff check"
ruff check .
step "ruff format --check"
ruff format --check .
step "mypy (strict)"
mypy
step "import contracts"
lint-imports --no-cache
step "all clean"
