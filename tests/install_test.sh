#!/usr/bin/env bash
# The C path as a user takes it: `make install` into a throwaway prefix (LIBDIR a multiarch-style folder), then
# examples/c/app.c built against the installed tree through pkg-config (shared and static) and CMake's
# find_package(w4a16) (both targets), and run. Without a GPU each program must stop with exit status 2 and name
# the reason (a W4A16_ERR_ status); with one it must match its CPU reference (exit 0). Then `make uninstall` must
# leave no file behind, and a DESTDIR install must put everything under DESTDIR.
#   usage: tests/install_test.sh BUILD_DIR    (make test-install)
set -euo pipefail
build=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
libdir=$prefix/lib/$(uname -m)-linux-gnu
vars=(BUILD="$build" PREFIX="$prefix" LIBDIR="$libdir")
fail() { echo "install-test: FAILED: $*"; exit 1; }

make -s "${vars[@]}" install >/dev/null
export PKG_CONFIG_PATH=$libdir/pkgconfig
pkg-config --exists --print-errors 'w4a16 >= 0.2' w4a16-static
cc=${CC:-cc}

# run PROGRAM: exit 0 with a reference match, or 2 with a readable reason when no GPU can be used
check_run() {
    local name=$1 rc=0 out
    out=$(LD_LIBRARY_PATH=$libdir "$2" 2>&1) || rc=$?
    echo "$out" | sed "s/^/  $name | /"
    case $rc in
        0) grep -q "relative error" <<<"$out" || fail "$name: exit 0 without a result" ;;
        2) grep -q "W4A16_ERR_" <<<"$out" || fail "$name: exit 2 without a status name" ;;
        *) fail "$name: exit status $rc" ;;
    esac
    echo "install-test: $name ran (exit $rc)"
}
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' '; }

# pkg-config, shared: libw4a16.so.N is needed, found through LD_LIBRARY_PATH
# shellcheck disable=SC2046
$cc -Wall -Werror examples/c/app.c -o "$tmp/app_shared" $(pkg-config --cflags --libs w4a16) \
    -L"$(pkg-config --variable=cudalibdir w4a16)" -lcudart_static -lm -ldl -lpthread -lrt
grep -q "libw4a16.so.0" <<<"$(needed "$tmp/app_shared")" || fail "app_shared does not need libw4a16.so.0"
check_run pkg-config-shared "$tmp/app_shared"
# pkg-config, static: no libw4a16 at run time
# shellcheck disable=SC2046
$cc -Wall -Werror examples/c/app.c -o "$tmp/app_static" $(pkg-config --cflags --libs w4a16-static)
if grep -q libw4a16 <<<"$(needed "$tmp/app_static")"; then fail "app_static needs libw4a16 at run time"; fi
check_run pkg-config-static "$tmp/app_static"
# `pkg-config --static` (Libs.private) covers what libw4a16.a needs when the linker is told to take the archive
# shellcheck disable=SC2046
$cc examples/c/app.c -o "$tmp/app_private" $(pkg-config --cflags w4a16) -Wl,-Bstatic -lw4a16 -Wl,-Bdynamic \
    $(pkg-config --static --libs w4a16 | sed 's/-lw4a16//')
check_run pkg-config-libs-private "$tmp/app_private"

# CMake: find_package(w4a16) with the prefix, both imported targets
cmake -S examples/c -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >"$tmp/cmake.log" 2>&1 \
    || { cat "$tmp/cmake.log"; fail "cmake configure"; }
cmake --build "$tmp/cmake" >>"$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; fail "cmake build"; }
check_run cmake-shared "$tmp/cmake/app"
check_run cmake-static "$tmp/cmake/app_static"
if grep -q libw4a16 <<<"$(needed "$tmp/cmake/app_static")"; then fail "cmake app_static needs libw4a16"; fi

# uninstall leaves nothing but empty folders
make -s "${vars[@]}" uninstall
left=$(find "$prefix" -type f -o -type l)
[ -z "$left" ] || fail "uninstall left: $left"
# DESTDIR: everything under it, the paths inside the files those of PREFIX
make -s BUILD="$build" PREFIX=/usr/local DESTDIR="$tmp/stage" install >/dev/null
[ -f "$tmp/stage/usr/local/lib/libw4a16.a" ] && [ -f "$tmp/stage/usr/local/lib/cmake/w4a16/w4a16Config.cmake" ] \
    || fail "DESTDIR install incomplete"
grep -q "^libdir=/usr/local/lib$" "$tmp/stage/usr/local/lib/pkgconfig/w4a16.pc" || fail "DESTDIR leaked into w4a16.pc"
echo "install-test: passed (pkg-config shared + static + Libs.private, CMake shared + static, uninstall, DESTDIR)"
