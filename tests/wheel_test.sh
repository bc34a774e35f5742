#!/usr/bin/env bash
# The Python package as a user gets it (after `make wheel`): a platform wheel (manylinux tag for this CPU, never
# py3-none-any, Root-Is-Purelib false) that installs into a fresh virtual environment and loads its own library
# from there; `w4a16.formats` imports without any library; `pip install` of the sources without a built library
# fails and says why.
#   usage: tests/wheel_test.sh BUILD_DIR    (make test-wheel)
set -euo pipefail
build=$1
repo=$(pwd)
python=${PYTHON:-python3}
fail() { echo "wheel-test: FAILED: $*"; exit 1; }
shopt -s nullglob
wheels=("$build"/wheel/w4a16-*.whl)
[ ${#wheels[@]} -eq 1 ] || fail "expected one wheel in $build/wheel, found ${#wheels[@]}"
whl=$(realpath "${wheels[0]}")
name=$(basename "$whl")
echo "wheel-test: $name"
[[ $name == *-py3-none-manylinux_*_"$(uname -m)".whl ]] || fail "$name is not a py3-none-manylinux_*_$(uname -m) wheel"
meta=$("$python" -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
print(z.read([n for n in z.namelist() if n.endswith(".dist-info/WHEEL")][0]).decode())
print("\n".join(z.namelist()))' "$whl")
grep -q "^Root-Is-Purelib: false" <<<"$meta" || fail "Root-Is-Purelib is not false"
grep -q "^w4a16/libw4a16.so.0$" <<<"$meta" || fail "the wheel does not carry w4a16/libw4a16.so.0"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the system's numpy serves (no download); the wheel itself installs into the environment
"$python" -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --no-deps "$whl"
cd "$tmp"   # away from the checkout, so only the installed package can be imported
"$tmp/venv/bin/python" - "$tmp/venv" <<'PY'
import os, sys
import w4a16
assert w4a16.library_path.startswith(sys.argv[1]), w4a16.library_path
print(f"wheel-test: installed w4a16 {w4a16.version()} loads {w4a16.library_path} (archs {w4a16.compiled_archs()})")
PY
# w4a16.formats is numpy only: it must import and work with no library at all; the library's absence is reported
# at the first call that needs it
W4A16_LIBRARY=/nonexistent/libw4a16.so "$tmp/venv/bin/python" - <<'PY'
import numpy as np
import w4a16.formats as f
import w4a16
q = np.random.default_rng(0).integers(0, 16, size=(32, 64), dtype=np.int32)
assert (f.awq_unpack(f.awq_pack(q)) == q).all()
try:
    w4a16.version()
except w4a16.LibraryNotFound as e:
    print("wheel-test: without the library, w4a16.formats works and the first call says:", str(e).splitlines()[0])
else:
    raise SystemExit("w4a16.version() worked without a library")
PY
# a source install without a built library must fail loudly, not install a package that cannot work
mkdir -p "$tmp/src"
cp -r "$repo/python_bindings" "$tmp/src/"
rm -rf "$tmp/src/python_bindings/build" "$tmp/src/python_bindings"/*.egg-info
if out=$("$tmp/venv/bin/python" -m pip install --no-deps "$tmp/src/python_bindings" 2>&1); then
    fail "pip install of the sources without a library succeeded"
fi
grep -q "libw4a16.so.<version> not found" <<<"$out" || { echo "$out" | tail -20; fail "no reason given"; }
echo "wheel-test: pip install of the sources without a library fails:" \
    "$(grep -o 'w4a16 setup: .* not found' <<<"$out" | head -1)"
echo "wheel-test: passed"
