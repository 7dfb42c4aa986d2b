#!/bin/sh
# python_bench.sh — scripts/hf_bench.py (SmolLM2 through transformers:
# DynamicCache, kvtrim and kvpress, decode ms/step and KV bytes) in the
# environment of scripts/python_venv.sh; `make bench-python` runs it.
#
#   sh scripts/python_bench.sh [OUT] [hf_bench.py options, e.g. --quick]
#
# OUT defaults to $B/bench-python.txt (B: the build directory, default
# build).  This checkout's kvtrim is installed into $B/pyenv, first on
# PYTHONPATH, not into the environment, which other checkouts share.
# Without the environment, or without the model of `make models`, it skips
# (exit 0) naming the command that provides it; otherwise it exits as
# hf_bench.py does (1 when a variant could not be measured).
set -eu
cd "$(dirname "$0")/.."
B=${B:-build}
OUT=${1:-$B/bench-python.txt}
[ $# -gt 0 ] && shift
VENV=${KVTRIM_PYTHON_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtrim/venv-python}
MODELS=${KVTRIM_MODELS:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtrim/models}
if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.kvtrim-pins" ]; then
	echo "python bench: skipped, no Python environment at $VENV (create it with: sh scripts/python_venv.sh)"
	exit 0
fi
if [ ! -f "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
	echo "python bench: skipped, no SmolLM2 in $MODELS (make models)"
	exit 0
fi
PY=$(sh scripts/python_venv.sh --deps)
KVTRIM_BUILD_DIR=$PWD/$B "$PY" -m pip install -q --no-deps \
	--no-build-isolation --upgrade --target "$B/pyenv" ./python >&2
echo "python bench: $PY scripts/hf_bench.py --out $OUT $*" >&2
PYTHONPATH=$PWD/$B/pyenv${PYTHONPATH:+:$PYTHONPATH} \
	exec "$PY" scripts/hf_bench.py --out "$OUT" "$@"
