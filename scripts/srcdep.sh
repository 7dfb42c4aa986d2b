#!/bin/sh
# srcdep.sh NAME — run by `make deps`: builds one pinned dependency from
# source into the dependency cache, for kvtrimd, libkvtrim and the tests
# to link statically.  NAME is one of:
#
#   nng    nng 1.11.0 (kvtrimd, libkvtrim): Debian 12's libnng 1.5.2 has a
#          pipe reaper that can wedge for good under a hostile client
#          (docs/design-changes.md, "nng 1.5.2").
#   libuv  libuv 1.48.0 (kvtrimd only): Debian 12's libuv 1.44.2 spins the
#          loop thread while a preempted thread is inside uv_async_send
#          (docs/design-changes.md, "libuv 1.44").
#   (No newer nng or libuv is packaged for Debian 12.)
#
# Where the sources come from: the machines this project builds on reach
# Debian's archive and the Python package registry, not GitHub.  Two
# source distributions on the registry carry the upstream trees unchanged:
# pynng 0.9.0 (nng/, nng 1.11.0, MIT) and uvloop 0.21.0 (vendor/libuv/,
# libuv 1.48.0, MIT).  Each is fetched from the registry's simple index
# (no pip build: nothing of pynng or uvloop is built or installed), its
# sha256 is checked, and the one tree is built with cmake: static,
# position-independent (nng goes into libkvtrim.so), without tests or
# tools.
#
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/kvtrim/deps/NAME-VERSION (override
# with KVTRIM_DEPS), outside build/ so `make clean` costs no rebuild; the
# Makefile uses a library when its .a is there, else the system's shared
# one, and `make` says which.  A stamp file marks a finished build.
#
# Exit status: 0 built or present; 77 not available (offline, registry
# unreachable, no cmake): the build falls back to the system's library;
# 1 anything else (a wrong sha256, a failed build, an unknown NAME).
set -eu

NAME=${1:-}
case $NAME in
nng)
	VER=1.11.0
	PKG=pynng VERSION_PKG=0.9.0
	SHA256=fcd839abf82a2934fa8c27ff57b574b41810458e35895bac6288814defa8fb4e
	TREE=pynng-0.9.0/nng
	SIZE="about 7 MB"
	CHECK_FILE=include/nng/nng.h CHECK_TEXT="NNG_MINOR_VERSION 11"
	LIB=libnng.a LICENSE=LICENSE.txt
	CMAKE_OPTS="-DNNG_TESTS=OFF -DNNG_TOOLS=OFF -DNNG_ENABLE_TLS=OFF -DNNG_ENABLE_NNGCAT=OFF -DBUILD_SHARED_LIBS=OFF"
	;;
libuv)
	VER=1.48.0
	PKG=uvloop VERSION_PKG=0.21.0
	SHA256=3bf12b0fda68447806a7ad847bfa591613177275d35b6724b1ee573faa3704e3
	TREE=uvloop-0.21.0/vendor/libuv
	SIZE="about 2.5 MB"
	CHECK_FILE=include/uv/version.h CHECK_TEXT="UV_VERSION_MINOR 48"
	LIB=libuv.a LICENSE=LICENSE
	CMAKE_OPTS="-DLIBUV_BUILD_SHARED=OFF -DLIBUV_BUILD_TESTS=OFF -DLIBUV_BUILD_BENCH=OFF"
	;;
*)
	echo "usage: srcdep.sh nng|libuv" >&2
	exit 1
	;;
esac
SRC_PKG=$PKG-$VERSION_PKG.tar.gz
INDEX=${PIP_INDEX_URL:-https://pypi.org/simple}
CACHE=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}
DEPS=${KVTRIM_DEPS:-$CACHE/kvtrim/deps}
PREFIX=$DEPS/$NAME-$VER
STAMP=$PREFIX/.built
START=$(date +%s)

say() { echo "$NAME: [$(($(date +%s) - START))s] $*" >&2; }
unavailable() { say "$NAME $VER unavailable: $*; building against the system's $NAME"; exit 77; }
fail() { say "error: $*"; exit 1; }

if [ -f "$STAMP" ] && [ -f "$PREFIX/lib/$LIB" ]; then
	say "$NAME $VER present in $PREFIX"
	exit 0
fi
command -v cmake >/dev/null 2>&1 || unavailable "cmake not found"
command -v curl >/dev/null 2>&1 || unavailable "curl not found"
mkdir -p "$DEPS" 2>/dev/null || fail "cannot create $DEPS (set KVTRIM_DEPS)"
TMP=$(mktemp -d "$DEPS/.$NAME.XXXXXX") || fail "cannot write into $DEPS"
trap 'rm -rf "$TMP"' EXIT INT TERM

say "looking up $SRC_PKG in $INDEX/$PKG/"
URL=$(curl -fsSL --retry 2 --max-time 60 "$INDEX/$PKG/" 2>/dev/null |
	grep -o "href=\"[^\"]*$SRC_PKG[^\"]*\"" | head -n 1 |
	sed 's/^href="//; s/"$//; s/#.*//; s/&amp;/\&/g') || true
[ -n "$URL" ] || unavailable "the package index has no $SRC_PKG (offline, or the registry is unreachable)"
case $URL in
http*) ;;
*) URL="$INDEX/$PKG/$URL" ;;
esac
say "downloading $SRC_PKG ($SIZE)"
curl -fsSL --retry 2 --max-time 300 -o "$TMP/src.tgz" "$URL" ||
	unavailable "download of $URL failed"
GOT=$(sha256sum "$TMP/src.tgz" | cut -d' ' -f1)
[ "$GOT" = "$SHA256" ] || fail "$SRC_PKG has sha256 $GOT, expected $SHA256: not used"
say "extracting $NAME $VER"
tar -xzf "$TMP/src.tgz" -C "$TMP" "$TREE" || fail "no $TREE in $SRC_PKG"
SRC=$TMP/$TREE
grep -q "$CHECK_TEXT" "$SRC/$CHECK_FILE" ||
	fail "$SRC_PKG does not carry $NAME $VER"

say "building $NAME $VER (static, PIC) with cmake"
mkdir -p "$TMP/b"
# shellcheck disable=SC2086 # CMAKE_OPTS is a list of words
(cd "$TMP/b" &&
	cmake "$SRC" -DCMAKE_BUILD_TYPE=RelWithDebInfo $CMAKE_OPTS \
		-DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_INSTALL_LIBDIR=lib \
		-DCMAKE_INSTALL_PREFIX="$TMP/inst" >"$TMP/cmake.log" 2>&1 &&
	make -j"${KVTRIM_DEPS_JOBS:-2}" >"$TMP/make.log" 2>&1 &&
	make install >"$TMP/install.log" 2>&1) ||
	{ tail -20 "$TMP"/*.log >&2; fail "building $NAME $VER failed"; }
[ -f "$TMP/inst/lib/$LIB" ] || fail "building $NAME $VER made no lib/$LIB"
cp "$SRC/$LICENSE" "$TMP/inst/LICENSE.$NAME"
rm -rf "$PREFIX"
mv "$TMP/inst" "$PREFIX"
touch "$STAMP"
say "$NAME $VER ready in $PREFIX"
