#!/usr/bin/env bash
# A GPU this build cannot run on must be reported, never launched on: builds libw4a16 for one architecture that the
# local GPU cannot execute (sm_80 SASS, no PTX, on an sm_90 GPU), then expects w4a16-doctor to say
# W4A16_ERR_ARCH_UNSUPPORTED-style "cannot load" with the GPU's compute capability and the compiled list, and exit 1.
#   usage: tests/arch_mismatch.sh BUILD_DIR     (run by `make test-arch-mismatch`; skips without a GPU)
set -uo pipefail
dir=$1
out=$("$dir/w4a16-doctor" 2>&1)
rc=$?
echo "$out" | sed 's/^/  | /'
if echo "$out" | grep -q "no NVIDIA driver found\|no CUDA device"; then echo "arch-mismatch: SKIPPED (no GPU)"; exit 0; fi
cc=$(echo "$out" | sed -n 's/.*compute capability \([0-9]*\.[0-9]*\).*/\1/p' | head -1)
if [ "$cc" = "8.0" ]; then echo "arch-mismatch: SKIPPED (this GPU is sm_80: it can run the sm_80 build)"; exit 0; fi
if [ $rc -eq 1 ] && echo "$out" | grep -q "cannot load w4a16's kernels" && echo "$out" | grep -q "this build holds SASS for 80"; then
    echo "arch-mismatch: PASSED (compute capability $cc refused, compiled archs named, nothing launched)"
    exit 0
fi
echo "arch-mismatch: FAILED (doctor exit $rc)"
exit 1
