"""Bad input to the torch ops (w4a16.torch): a ValueError or TypeError naming the argument and its value, raised
before anything is allocated or launched (no read past a tensor, no silent wrong answer). The shape checks come
before the device checks, so most cases run with CPU tensors where no GPU is visible; the device-only cases
(alignment, perm values) need one. Skipped without PyTorch."""

import re

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import w4a16.torch as wt  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
needs_gpu = pytest.mark.skipif(not CUDA, reason="no CUDA GPU visible to PyTorch")


def awq(K=1024, N=512, G=128, dtype=torch.float16):
    groups = 1 if G == -1 else K // G
    qw = torch.randint(-(2**31), 2**31 - 1, (K, N // 8), dtype=torch.int32, device=DEV)
    qz = torch.randint(-(2**31), 2**31 - 1, (groups, N // 8), dtype=torch.int32, device=DEV)
    s = (torch.rand((groups, N), device=DEV) * 0.01 + 0.005).to(dtype)
    return qw, qz, s


def marlin(M=4, K=1024, N=512, G=128):
    """Arguments of wt.marlin_gemm with valid shapes (random words: only the checks run)."""
    groups = K // G
    a = torch.randn(M, K, device=DEV).half()
    w = torch.randint(-(2**31), 2**31 - 1, (K // 16, 2 * N), dtype=torch.int32, device=DEV)
    s = torch.rand(groups, N, device=DEV).half()
    z = torch.randint(-(2**31), 2**31 - 1, (groups, N // 8), dtype=torch.int32, device=DEV)
    bias = torch.randn(N, device=DEV).half()
    return dict(a=a, b_q_weight=w, b_scales=s, b_zeros=z, b_bias=bias, size_m=M, size_n=N, size_k=K)


def raises(exc, text):
    return pytest.raises(exc, match=re.escape(text))


# ---------------------------------------------------------------- marlin_gemm
def test_marlin_gemm_b_zeros_one_group_row_short():
    args = marlin()
    args["b_zeros"] = args["b_zeros"][:-1].contiguous()
    with raises(ValueError, "marlin_gemm: b_zeros has shape (7, 64), expected [size_k/G, size_n/8] = (8, 64)"):
        wt.marlin_gemm(**args)


def test_marlin_gemm_bias_of_half_n():
    args = marlin()
    args["b_bias"] = args["b_bias"][:256].contiguous()
    with raises(ValueError, "marlin_gemm: b_bias has shape (256,), expected [size_n] = (512,)"):
        wt.marlin_gemm(**args)


@pytest.mark.parametrize(
    "field,value,text",
    [
        ("size_m", 0, "a has shape (4, 1024), expected [size_m, size_k] = (0, 1024)"),
        ("size_n", 500, "size_n=500 must be a positive multiple of 64"),
        ("size_k", 1000, "size_k=1000 must be a positive multiple of 128"),
        (
            "b_scales",
            "rows-1",
            "b_scales has 7 rows for K=1024: expected K/G rows, one of 32 (G=32), 16 (G=64), 8 (G=128), 1 (G=-1)",
        ),
        ("b_scales", "float32", "b_scales has dtype float32, expected float16"),
        ("b_q_weight", "short", "b_q_weight has shape (63, 1024), expected [size_k/16, 2 size_n] = (64, 1024)"),
        ("b_bias", "2d", "b_bias must be 1-D [size_n], got shape (1, 512)"),
        ("b_zeros", "int64", "b_zeros has dtype int64, expected int32"),
        ("a", "transposed", "a must be contiguous"),
    ],
)
def test_marlin_gemm_argument_checks(field, value, text):
    args = marlin()
    t = args[field]
    if value == "rows-1":
        value = t[:-1].contiguous()
    elif value == "float32":
        value = t.float()
    elif value == "short":
        value = t[:-1].contiguous()
    elif value == "2d":
        value = t.reshape(1, -1)
    elif value == "int64":
        value = t.long()
    elif value == "transposed":
        value = torch.randn(1024, 4, device=DEV).half().t()
    args[field] = value
    with pytest.raises((ValueError, TypeError), match=re.escape(text)):
        wt.marlin_gemm(**args)


def test_marlin_gemm_m_zero():
    args = marlin()
    args["a"], args["size_m"] = args["a"][:0], 0
    with raises(ValueError, "a has M=0 rows (shape (0, 1024)): w4a16 needs M >= 1"):
        wt.marlin_gemm(**args)


# ---------------------------------------------------------------- awq_gemm / awq_dequantize
def test_awq_gemm_one_scale_row_missing():
    qw, qz, s = awq()
    x = torch.randn(3, 1024, device=DEV).half()
    with raises(ValueError, "awq_gemm: scales has 7 rows for K=1024: expected K/G rows"):
        wt.awq_gemm(x, qw, s[:-1].contiguous(), qz[:-1].contiguous(), 0)


def test_awq_gemm_m_zero():
    qw, qz, s = awq()
    with raises(ValueError, "awq_gemm: input has M=0 rows (shape (0, 1024)): w4a16 needs M >= 1"):
        wt.awq_gemm(torch.empty(0, 1024, device=DEV).half(), qw, s, qz, 0)


@pytest.mark.parametrize(
    "case,text",
    [
        ("qzeros_rows", "qzeros has shape (7, 64), expected [K/G, N/8] = (8, 64)"),
        ("qweight_k", "qweight has shape (1000, 64), expected [K, N/8] = (1024, 64)"),
        ("scales_dtype", "scales has dtype bfloat16, expected float16"),
        ("input_3d", "input must be 2-D [M, K], got shape (1, 3, 1024)"),
        ("n_not_64", "N (scales.shape[1])=520 must be a positive multiple of 64"),
        ("k_not_32", "K (input.shape[1])=1000 must be a positive multiple of 32"),
    ],
)
def test_awq_gemm_argument_checks(case, text):
    qw, qz, s = awq()
    x = torch.randn(3, 1024, device=DEV).half()
    if case == "qzeros_rows":
        qz = qz[:-1].contiguous()
    elif case == "qweight_k":
        qw = qw[:1000].contiguous()
    elif case == "scales_dtype":
        s = s.bfloat16()
    elif case == "input_3d":
        x = x.reshape(1, 3, 1024)
    elif case == "n_not_64":
        s = torch.cat([s, s[:, :8]], 1)
    elif case == "k_not_32":
        x = x[:, :1000].contiguous()
    with pytest.raises((ValueError, TypeError), match=re.escape(text)):
        wt.awq_gemm(x, qw, s, qz, 0)


@pytest.mark.parametrize(
    "case,text",
    [
        ("qweight_n", "qweight has shape (1024, 32), expected [K, N/8] = (1024, 64)"),
        ("zeros_rows", "zeros has shape (4, 64), expected [K/G, N/8] = (8, 64)"),
        ("scales_rows", "scales has 3 rows for K=1024"),
    ],
)
def test_awq_dequantize_argument_checks(case, text):
    qw, qz, s = awq()
    if case == "qweight_n":
        qw = qw[:, :32].contiguous()
    elif case == "zeros_rows":
        qz = qz[:4].contiguous()
    else:
        s = s[:3].contiguous()
    with raises(ValueError, text):
        wt.awq_dequantize(qw, s, qz, 0, 0, 0)


# ---------------------------------------------------------------- converters
def test_awq_marlin_repack_checks():
    qw, _, _ = awq()
    with raises(ValueError, "awq_marlin_repack: size_k=1000 must be a positive multiple of 16"):
        wt.awq_marlin_repack(qw, 1000, 512, 4)
    with raises(ValueError, "b_q_weight has shape (1024, 64), expected [size_k, size_n/8] = (1024, 128)"):
        wt.awq_marlin_repack(qw, 1024, 1024, 4)
    with raises(ValueError, "num_bits=8: w4a16 has 4-bit weights only"):
        wt.awq_marlin_repack(qw, 1024, 512, 8)


def test_gptq_marlin_repack_checks():
    K, N = 256, 128
    qg = torch.randint(-(2**31), 2**31 - 1, (K // 8, N), dtype=torch.int32, device=DEV)
    perm = torch.randperm(K, device=DEV).to(torch.int32)
    with raises(ValueError, "perm has shape (128,), expected [size_k] = (256,)"):
        wt.gptq_marlin_repack(qg, perm[:128].contiguous(), K, N, 4)
    with raises(ValueError, "perm has dtype int64, expected int32"):
        wt.gptq_marlin_repack(qg, perm.long(), K, N, 4)
    with raises(ValueError, "b_q_weight has shape (32, 128), expected [size_k/8, size_n] = (64, 128)"):
        wt.gptq_marlin_repack(qg, perm, 512, N, 4)


@needs_gpu
@pytest.mark.parametrize("bad", [256, 100000, -2])
def test_gptq_marlin_repack_perm_values(bad):
    # a perm value past size_k made the kernel read past b_q_weight
    K, N = 256, 128
    qg = torch.randint(-(2**31), 2**31 - 1, (K // 8, N), dtype=torch.int32, device="cuda")
    perm = torch.randperm(K, device="cuda").to(torch.int32)
    perm[17] = bad
    with raises(ValueError, f"perm[17]={bad} is outside [0, size_k=256)"):
        wt.gptq_marlin_repack(qg, perm, K, N, 4)


@pytest.mark.parametrize(
    "args,text",
    [
        ((1024, 512, 64), "s has shape (8, 512), expected [size_k/group_size, size_n] = (16, 512)"),
        ((1024, 256, 128), "s has shape (8, 512), expected [size_k/group_size, size_n] = (8, 256)"),
        ((1024, 512, 96), "group_size=96 is not one of 32, 64, 128, -1"),
        ((1000, 512, 128), "size_k=1000 must be a positive multiple of 16"),
    ],
)
def test_marlin_permute_scales_checks(args, text):
    _, _, s = awq()
    with raises(ValueError, text):
        wt.marlin_permute_scales(s, *args)


def test_awq_to_marlin_zero_points_checks():
    _, qz, _ = awq()
    with raises(ValueError, "q_zp_packed has shape (8, 64), expected [size_k, size_n/8] = (16, 64)"):
        wt.awq_to_marlin_zero_points(qz, 16, 512, 4)
    with raises(ValueError, "q_zp_packed has shape (8, 64), expected [size_k, size_n/8] = (8, 128)"):
        wt.awq_to_marlin_zero_points(qz, 8, 1024, 4)


def test_permute_cols_checks():
    a = torch.randn(4, 256, device=DEV).half()
    perm = torch.randperm(256, device=DEV).to(torch.int32)
    with raises(ValueError, "permute_cols: perm has shape (255,), expected [K] = (256,)"):
        wt.permute_cols(a, perm[:255].contiguous())
    with raises(ValueError, "permute_cols: a has M=0 rows"):
        wt.permute_cols(a[:0], perm)


def test_awq_linear_checks():
    qw, qz, s = awq(G=64)
    with raises(
        ValueError,
        "AWQLinear: scales has shape (16, 512), expected [K/group_size, N] for K=1024, group_size=128 = (8, 512)",
    ):
        wt.AWQLinear(qw, qz, s, None, group_size=128)
    bias = torch.randn(1, device=DEV).half()  # would broadcast over N
    with raises(ValueError, "AWQLinear: bias has shape (1,), expected [N] = (512,)"):
        wt.AWQLinear(qw, qz, s, bias, group_size=64)


# ---------------------------------------------------------------- device-side checks
@needs_gpu
def test_misaligned_views_are_named():
    qw, qz, s = awq()
    x = torch.randn(3 * 1024 + 1, device="cuda").half()[1:].view(3, 1024)
    with raises(ValueError, "awq_gemm: input at address"):
        wt.awq_gemm(x, qw, s, qz, 0)
    args = marlin()
    args["b_bias"] = torch.randn(513, device="cuda").half()[1:]
    with raises(ValueError, "marlin_gemm: b_bias at address"):
        wt.marlin_gemm(**args)


@needs_gpu
def test_tensors_on_the_cpu_are_named():
    qw, qz, s = awq()
    x = torch.randn(3, 1024, device="cuda").half()
    with raises(ValueError, "awq_gemm: qzeros must be a CUDA tensor, got device cpu"):
        wt.awq_gemm(x, qw, s, qz.cpu(), 0)
