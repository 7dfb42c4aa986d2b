#!/bin/sh
# python_venv.sh — the Python environment of kvtrim's Python package
# (python/, `import kvtrim`), its tests and examples: created once, reused,
# and kvtrim (re)installed into it from this checkout at every run (a few
# seconds).  Prints the path of its interpreter on stdout; progress goes
# to stderr.
#
#   sh scripts/python_venv.sh            # create or reuse; install kvtrim
#   sh scripts/python_venv.sh --deps     # create or reuse; skip kvtrim
#
# Where: $KVTRIM_PYTHON_VENV, default ${XDG_CACHE_HOME:-~/.cache}/kvtrim/
# venv-python (outside build/, so `make clean` keeps it: torch is large,
# about 4 GB with the CUDA libraries PyPI's Linux wheel depends on).
# `make test` runs the Python tests when this environment exists and
# skips them, naming this command, when it does not; .ci/run creates it.
#
# Pinned: torch 2.15.0, transformers 5.2.0 (what kvpress 0.5.5 pins),
# gguf 0.19.0 (transformers reads SmolLM2's GGUF with it), kvpress 0.5.5
# (the bench's comparison), numpy < 3.  Idempotent: a venv whose stamp
# matches the pins is reused.
set -eu
cd "$(dirname "$0")/.."
VENV=${KVTRIM_PYTHON_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtrim/venv-python}
PINS="torch==2.15.0 transformers==5.2.0 gguf==0.19.0 kvpress==0.5.5 numpy<3 setuptools>=77"
STAMP="$VENV/.kvtrim-pins"
PY="$VENV/bin/python"

if ! { [ -x "$PY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PINS" ]; }; then
	echo "python_venv: creating $VENV ($PINS); torch downloads about 4 GB" >&2
	t0=$(date +%s)
	python3 -m venv "$VENV" >&2
	"$PY" -m pip install -q --upgrade pip >&2
	# shellcheck disable=SC2086
	"$PY" -m pip install -q $PINS >&2
	"$PY" -c 'import torch, transformers, gguf, numpy
print("python_venv: torch", torch.__version__, "transformers",
      transformers.__version__, "gguf", gguf.__version__ if hasattr(gguf,
      "__version__") else "?", "numpy", numpy.__version__)' >&2
	echo "$PINS" >"$STAMP"
	echo "python_venv: created in $(($(date +%s) - t0)) s" >&2
fi
if [ "${1:-}" != "--deps" ]; then
	# The package builds its extension against build/ (make first).
	"$PY" -m pip install -q --no-deps --no-build-isolation ./python >&2
fi
echo "$PY"
