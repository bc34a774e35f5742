#!/usr/bin/env bash
# The fresh-machine check: a stock Debian 12 root file system (debootstrap: minbase plus python3, build-essential
# and ca-certificates, as a standard install has them), the host's CUDA toolkit bind-mounted read-only at
# /usr/local/cuda, this checkout's committed tree, and the README's test command run as written by root in a chroot
# (nothing else installed: tools/install-deps must bring everything). Needs root, mount, and network access to
# Debian and PyPI; takes minutes (not part of CI, which runs on the CI machine's own system Python).
#   usage: tests/fresh_machine.sh [ROOT_DIR] [ARCHS]   (default /tmp/w4a16-deb12, reused when present; ARCHS 90)
set -euo pipefail
root=${1:-/tmp/w4a16-deb12}
archs=${2:-90}
repo=$(git rev-parse --show-toplevel)
cuda=$(realpath "${CUDA_HOME:-/usr/local/cuda}")
if [ ! -x "$root/usr/bin/python3" ]; then
    debootstrap --variant=minbase --include=python3,build-essential,ca-certificates bookworm "$root" \
        http://deb.debian.org/debian
fi
mkdir -p "$root$cuda" "$root/proc" "$root/dev"
ln -sfn "$cuda" "$root/usr/local/cuda"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount --bind "$cuda" "$root$cuda"
mount -o remount,bind,ro "$root$cuda"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
trap 'umount "$root/dev" "$root/proc" "$root$cuda"' EXIT
rm -rf "$root/src/w4a16" && mkdir -p "$root/src/w4a16"
git -C "$repo" archive HEAD | tar -x -C "$root/src/w4a16"
echo "fresh-machine: $(chroot "$root" /usr/bin/python3 --version), $(chroot "$root" sh -c '. /etc/os-release; echo $PRETTY_NAME')," \
    "commit $(git -C "$repo" rev-parse --short HEAD)"
in_root() {
    chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        ARCHS="$archs" PTX_ARCH= /bin/bash -c "cd /src/w4a16 && $1"
}
in_root 'tools/install-deps && make -j$(nproc) test'
# the benchmark command: builds everything, then needs a GPU
rc=0
out=$(in_root 'tools/install-deps && make -j$(nproc) bench' 2>&1) || rc=$?
echo "$out" | tail -3
if [ $rc -ne 0 ] && ! grep -q "no usable CUDA GPU" <<<"$out"; then echo "fresh-machine: make bench FAILED"; exit 1; fi
echo "fresh-machine: passed (make test; make bench built and $([ $rc -eq 0 ] && echo ran || echo 'stopped: no GPU'))"
