#!/usr/bin/env bash
# Run every check: bring the machine up (no demo), then lint, type-check and all tests.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/unit -x).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --no-demo
VENV="${HAROMBE_VENV:-$(pwd)/.venv}"
echo "==> ruff"
"$VENV/bin/ruff" check harombe tests bench scripts
echo "==> mypy"
"$VENV/bin/mypy"
echo "==> pytest"
exec "$VENV/bin/pytest" -q "$@"
