"""python -m w4a16: the same report as w4a16-doctor, from Python (exit 0 when every GPU is usable)."""
import sys

from . import W4A16Error, compiled_archs, device_info, library_path, version


def main():
    print(f"w4a16 {version()} ({library_path})")
    print(f"compiled architectures (SASS, then PTX): {compiled_archs()}")
    try:
        first = device_info(0)
    except W4A16Error as e:
        print(f"verdict: NOT USABLE - {e.detail}")
        return 1
    print(f"CUDA driver supports {first['driver_version'] // 1000}.{first['driver_version'] % 1000 // 10}")
    ok, d = 0, 0
    while True:
        try:
            info = device_info(d)
        except W4A16Error:
            break
        print(f"GPU {d}: {info['name']}, compute capability {info['cc_major']}.{info['cc_minor']}, "
              f"{info['sm_count']} SMs, {info['smem_per_block_optin'] // 1024} KB shared memory per block, "
              f"{'native SASS' if info['native_sass'] else 'no native SASS'}")
        print(f"  {info['reason']}")
        ok += bool(info["supported"])
        d += 1
    print(f"verdict: {'OK' if ok == d else 'NOT USABLE'} - w4a16 can run on {ok} of {d} GPU(s)"
          " (build/w4a16-doctor also self-tests both paths)")
    return 0 if ok == d else 1


if __name__ == "__main__":
    sys.exit(main())
