"""python -m w4a16: the same report as w4a16-doctor, from Python, with a self-test of both paths when PyTorch is
there (exit 0 when every GPU is usable and passes)."""

import sys

from . import W4A16Error, compiled_archs, device_info, library_path, version


def self_test(device):
    """Both GEMM paths on a small AWQ problem against torch on the dequantised weight; None without PyTorch."""
    try:
        import torch
    except ImportError:
        return None
    from . import torch as wt

    with torch.cuda.device(device):
        g = torch.Generator(device="cuda").manual_seed(1)
        K, N, G, M = 512, 256, 128, 3
        qw = torch.randint(-(2**31), 2**31 - 1, (K, N // 8), dtype=torch.int32, device="cuda", generator=g)
        qz = torch.randint(-(2**31), 2**31 - 1, (K // G, N // 8), dtype=torch.int32, device="cuda", generator=g)
        s = (torch.rand((K // G, N), device="cuda", generator=g) * 0.01 + 0.005).half()
        x = torch.randn((M, K), device="cuda", generator=g).half()
        ref = x.float() @ wt.awq_dequantize(qw, s, qz, 0, 0, 0).float()
        y1 = wt.awq_gemm(x, qw, s, qz, 0)
        y2 = wt.marlin_gemm(
            x,
            wt.awq_marlin_repack(qw, K, N, 4),
            wt.marlin_permute_scales(s, K, N, G),
            wt.awq_to_marlin_zero_points(qz, K // G, N, 4),
            None,
            M,
            N,
            K,
        )
        rel = lambda y: ((y.float() - ref).norm() / ref.norm()).item()
        return rel(y1), rel(y2)


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
        print(
            f"GPU {d}: {info['name']}, compute capability {info['cc_major']}.{info['cc_minor']}, "
            f"{info['sm_count']} SMs, {info['smem_per_block_optin'] // 1024} KB shared memory per block, "
            f"{'native SASS' if info['native_sass'] else 'no native SASS'}"
        )
        print(f"  {info['reason']}")
        passed = bool(info["supported"])
        if passed:
            errs = self_test(d)
            if errs is None:
                print("  self-test skipped: it needs PyTorch (build/w4a16-doctor self-tests without it)")
            else:
                passed = errs[0] < 1e-2 and errs[1] < 1e-2
                print(
                    f"  self-test {'passed' if passed else 'FAILED'}: awq rel err {errs[0]:.1e}, "
                    f"marlin rel err {errs[1]:.1e} (limit 1e-2)"
                )
        ok += passed
        d += 1
    print(f"verdict: {'OK' if ok == d else 'NOT USABLE'} - w4a16 runs on {ok} of {d} GPU(s)")
    return 0 if ok == d else 1


if __name__ == "__main__":
    sys.exit(main())
