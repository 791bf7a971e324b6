#!/usr/bin/env bash
# Run every check: bring the machine up (no demo), then lint, type-check and all tests.
#   scripts/test.sh              everything (the README's test command; CI runs this)
#   scripts/test.sh --unit       lint, types and tests/unit, which need no Docker (seconds)
# Further arguments go to pytest (e.g. scripts/test.sh tests/unit -x).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${HAROMBE_VENV:-$(pwd)/.venv}"
UNIT=0
if [ "${1:-}" = "--unit" ]; then
  UNIT=1
  shift
fi
if [ "$UNIT" -eq 0 ] || [ ! -x "$VENV/bin/pytest" ]; then
  scripts/setup.sh --no-demo
fi
echo "==> ruff"
"$VENV/bin/ruff" check harombe tests bench scripts
echo "==> mypy"
"$VENV/bin/mypy"
echo "==> pytest"
if [ "$UNIT" -eq 1 ]; then
  exec "$VENV/bin/pytest" -q -m "not integration" "${@:-tests/unit}"
fi
exec "$VENV/bin/pytest" -q "$@"
