#!/bin/sh
# kvpress_venv.sh — the virtual environment of scripts/kvpress_parity.py
# (`make parity`; not part of `make test`).  Creates $VENV (default
# build/venv-kvpress) and prints its python on stdout.
#
# Pinned versions (kvpress 0.5.5 requires transformers < 5.3):
#   kvpress 0.5.5, transformers 5.2.0, gguf 0.19.0, and what kvpress
#   imports at start (datasets, cachetools, fire: pip resolves them).
# torch: when TORCH_VENV (default /work/venv-ref, or any venv whose python
# imports torch) exists, its site-packages are linked in by a .pth file
# (appended to sys.path, so the packages installed here, transformers
# 5.2.0 among them, come first); else torch 2.15.0 is installed from the
# package index.  Idempotent: a venv whose stamp matches is reused.
set -eu
VENV=${VENV:-build/venv-kvpress}
TORCH_VENV=${TORCH_VENV:-/work/venv-ref}
PINS="kvpress==0.5.5 transformers==5.2.0 gguf==0.19.0"
STAMP="$VENV/.kvtrim-pins"

if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] &&
   [ "$(cat "$STAMP")" = "$PINS" ]; then
	echo "$VENV/bin/python"
	exit 0
fi
python3 -m venv "$VENV" >&2
PY="$VENV/bin/python"
if [ -x "$TORCH_VENV/bin/python" ] &&
   "$TORCH_VENV/bin/python" -c 'import torch' 2>/dev/null; then
	sp=$("$TORCH_VENV/bin/python" -c \
	     'import sysconfig; print(sysconfig.get_paths()["purelib"])')
	own=$("$PY" -c \
	      'import sysconfig; print(sysconfig.get_paths()["purelib"])')
	echo "$sp" > "$own/zz-kvtrim-torch.pth"
	echo "kvpress_venv: torch from $TORCH_VENV" >&2
else
	"$PY" -m pip install -q "torch==2.15.0" >&2
fi
# the pins installed here shadow the linked venv's versions
"$PY" -m pip install -q $PINS >&2
"$PY" -c 'import kvpress, transformers, torch; print("kvpress_venv: kvpress",
    __import__("importlib.metadata").metadata.version("kvpress"),
    "transformers", transformers.__version__, "torch", torch.__version__)' >&2
echo "$PINS" > "$STAMP"
echo "$PY"
