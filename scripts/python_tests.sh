#!/bin/sh
# python_tests.sh — the Python package's tests (python/tests, pytest)
# against this checkout's build, in the environment of
# scripts/python_venv.sh.  `make test` runs it last.  Without that
# environment it skips, saying which command creates it (CI creates it
# first).  Under a sanitizer build (SANITIZER set) it skips too: the
# extension links the plain build's libkvtrim.a.
set -eu
cd "$(dirname "$0")/.."
VENV=${KVTRIM_PYTHON_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtrim/venv-python}
if [ -n "${SANITIZER:-}" ]; then
	echo "python tests: skipped under SANITIZER=$SANITIZER (the extension links the plain build)"
	exit 0
fi
if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.kvtrim-pins" ]; then
	echo "python tests: skipped, no Python environment at $VENV (create it with: sh scripts/python_venv.sh)"
	exit 0
fi
PY=$(sh scripts/python_venv.sh)
"$PY" -m pip install -q pytest >&2
# From the repository root, so `import kvtrim` finds the installed package
# (with its extension), not python/kvtrim's sources.
exec "$PY" -m pytest -q -p no:cacheprovider python/tests "$@"
