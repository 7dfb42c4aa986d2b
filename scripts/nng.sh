#!/bin/sh
# nng.sh — run by `make deps`: builds nng 1.11.0 into the dependency cache,
# for kvtrimd, libkvtrim and the tests to link statically.
#
# Why not Debian's libnng (1.5.2, bookworm): its pipe reaper can wedge for
# good when the daemon closes a control connection whose peer keeps
# streaming requests (docs/design-changes.md, "nng 1.5.2"): no closed
# connection is released again and nng_close never returns.  A hostile
# local client can provoke it (tests/integration/test_hostile.c,
# a_reconnecting_flood_leaves_nothing_behind: about one run in four wedges
# with 1.5.2, none in twelve with 1.11.0).  nng 1.6 reworked that code; no
# newer nng is packaged for Debian 12.
#
# Where the source comes from: the machines this project builds on reach
# Debian's archive and the Python package registry, not GitHub.  The
# registry's source distribution of pynng 0.9.0 (the Python binding of
# nng) carries nng 1.11.0's source tree unchanged (nng/, MIT licence).  It
# is fetched from the registry's simple index (no pip build: nothing of
# pynng is built or installed), its sha256 is checked, and nng/ alone is
# built with cmake: static, position-independent (it goes into
# libkvtrim.so), no TLS, no tools, no tests.
#
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/kvtrim/deps/nng-1.11.0 (override
# with KVTRIM_DEPS), outside build/ so `make clean` costs no rebuild; the
# Makefile uses it when $PREFIX/lib/libnng.a is there, else the system's
# libnng with a warning.  A stamp file marks a finished build.
#
# Exit status: 0 built or present; 77 not available (offline, registry
# unreachable, no cmake): the build falls back to the system's nng;
# 1 anything else (a wrong sha256, a failed build).
set -eu

VER=1.11.0
SRC_PKG=pynng-0.9.0.tar.gz
SHA256=fcd839abf82a2934fa8c27ff57b574b41810458e35895bac6288814defa8fb4e
INDEX=${PIP_INDEX_URL:-https://pypi.org/simple}
CACHE=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}
DEPS=${KVTRIM_DEPS:-$CACHE/kvtrim/deps}
PREFIX=$DEPS/nng-$VER
STAMP=$PREFIX/.built
START=$(date +%s)

say() { echo "nng: [$(($(date +%s) - START))s] $*" >&2; }
unavailable() { say "nng $VER unavailable: $*; building against the system's libnng"; exit 77; }
fail() { say "error: $*"; exit 1; }

if [ -f "$STAMP" ] && [ -f "$PREFIX/lib/libnng.a" ]; then
	say "nng $VER present in $PREFIX"
	exit 0
fi
command -v cmake >/dev/null 2>&1 || unavailable "cmake not found"
command -v curl >/dev/null 2>&1 || unavailable "curl not found"
mkdir -p "$DEPS" 2>/dev/null || fail "cannot create $DEPS (set KVTRIM_DEPS)"
TMP=$(mktemp -d "$DEPS/.nng.XXXXXX") || fail "cannot write into $DEPS"
trap 'rm -rf "$TMP"' EXIT INT TERM

say "looking up $SRC_PKG in $INDEX/pynng/"
URL=$(curl -fsSL --retry 2 --max-time 60 "$INDEX/pynng/" 2>/dev/null |
	grep -o "href=\"[^\"]*$SRC_PKG[^\"]*\"" | head -n 1 |
	sed 's/^href="//; s/"$//; s/#.*//; s/&amp;/\&/g') || true
[ -n "$URL" ] || unavailable "the package index has no $SRC_PKG (offline, or the registry is unreachable)"
case $URL in
http*) ;;
*) URL="$INDEX/pynng/$URL" ;;
esac
say "downloading $SRC_PKG (about 7 MB)"
curl -fsSL --retry 2 --max-time 300 -o "$TMP/src.tgz" "$URL" ||
	unavailable "download of $URL failed"
GOT=$(sha256sum "$TMP/src.tgz" | cut -d' ' -f1)
[ "$GOT" = "$SHA256" ] || fail "$SRC_PKG has sha256 $GOT, expected $SHA256: not used"
say "extracting nng $VER"
tar -xzf "$TMP/src.tgz" -C "$TMP" pynng-0.9.0/nng || fail "no nng/ in $SRC_PKG"
NNG=$TMP/pynng-0.9.0/nng
grep -q "NNG_MINOR_VERSION 11" "$NNG/include/nng/nng.h" ||
	fail "$SRC_PKG does not carry nng $VER"

say "building nng $VER (static, PIC, no TLS) with cmake"
mkdir -p "$TMP/b"
(cd "$TMP/b" &&
	cmake "$NNG" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNNG_TESTS=OFF \
		-DNNG_TOOLS=OFF -DNNG_ENABLE_TLS=OFF -DNNG_ENABLE_NNGCAT=OFF \
		-DBUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
		-DCMAKE_INSTALL_PREFIX="$TMP/inst" >"$TMP/cmake.log" 2>&1 &&
	make -j"${NNG_JOBS:-2}" >"$TMP/make.log" 2>&1 &&
	make install >"$TMP/install.log" 2>&1) ||
	{ tail -20 "$TMP"/*.log >&2; fail "building nng $VER failed"; }
cp "$NNG/LICENSE.txt" "$TMP/inst/LICENSE.nng"
rm -rf "$PREFIX"
mv "$TMP/inst" "$PREFIX"
touch "$STAMP"
say "nng $VER ready in $PREFIX"
