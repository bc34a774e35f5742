"""GPU tests of w4a16.torch (run on the GPU machine; skipped, saying why, without torch or a CUDA GPU)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to PyTorch", allow_module_level=True)

import w4a16.torch as wt  # noqa: E402
from w4a16 import formats  # noqa: E402

DTYPES = [torch.float16, torch.bfloat16]


def make_awq(K, N, G, dtype, seed=None):
    g = torch.Generator(device="cuda")
    g.seed() if seed is None else g.manual_seed(seed)
    qw = torch.randint(-(2**31), 2**31 - 1, (K, N // 8), dtype=torch.int32, device="cuda", generator=g)
    groups = 1 if G == -1 else K // G
    qz = torch.randint(-(2**31), 2**31 - 1, (groups, N // 8), dtype=torch.int32, device="cuda", generator=g)
    s = (torch.rand((groups, N), device="cuda", generator=g) * 0.01 + 0.005).to(dtype)
    return qw, qz, s


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_matches_numpy(dtype):
    qw, qz, s = make_awq(256, 128, 64, dtype)
    w = wt.awq_dequantize(qw, s, qz, 0, 0, 0)
    ref = formats.awq_dequantize(qw.cpu().numpy(), qz.cpu().numpy(), s.float().cpu().numpy(), 64)
    assert torch.allclose(w.float().cpu(), torch.from_numpy(ref).to(dtype).float(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M", [1, 7, 16, 33, 200])
@pytest.mark.parametrize("G", [128, -1])
def test_awq_and_marlin_vs_matmul(dtype, M, G):
    K, N = 1024, 512
    qw, qz, s = make_awq(K, N, G, dtype)
    x = torch.randn(M, K, device="cuda").to(dtype)
    w = wt.awq_dequantize(qw, s, qz, 0, 0, 0)
    ref = x.float() @ w.float()
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-2
    y = wt.awq_gemm(x, qw, s, qz, 8)
    assert not y.isnan().any() and rel(y, ref) < tol
    groups = s.shape[0]
    mw = wt.awq_marlin_repack(qw, K, N, 4)
    ms = wt.marlin_permute_scales(s, K, N, G)
    mz = wt.awq_to_marlin_zero_points(qz, groups, N, 4)
    y2 = wt.marlin_gemm(x, mw, ms, mz, None, M, N, K)
    assert rel(y2, ref) < tol
    # the converters equal the numpy formats bit for bit
    assert (mw.cpu().numpy() == formats.marlin_repack_awq(qw.cpu().numpy())).all()
    assert (mz.cpu().numpy() == formats.awq_to_marlin_zero_points(qz.cpu().numpy(), groups, N)).all()
    assert (
        ms.cpu() == torch.from_numpy(formats.marlin_permute_scales(s.float().cpu().numpy(), K, N, G)).to(dtype)
    ).all()


@pytest.mark.parametrize("M", [1, 16, 40, 300])
def test_pdl_chain_is_bit_identical(M):
    # each GEMM reads the previous one's output: with programmatic dependent launch the chain must not change a bit
    K = N = 1024
    layers = [make_awq(K, N, 128, torch.float16) for _ in range(2)]
    marlin = [
        (
            wt.awq_marlin_repack(qw, K, N, 4),
            wt.marlin_permute_scales(s, K, N, 128),
            wt.awq_to_marlin_zero_points(qz, K // 128, N, 4),
        )
        for qw, qz, s in layers
    ]
    torch.cuda.synchronize()
    x0 = torch.randn(M, K, device="cuda").to(torch.float16)

    def chain():
        x = x0
        for i in range(6):
            qw, qz, s = layers[i % 2]
            mw, ms, mz = marlin[i % 2]
            x = wt.awq_gemm(x, qw, s, qz, 8) if i % 2 else wt.marlin_gemm(x, mw, ms, mz, None, M, N, K)
        return x

    previous = wt.use_pdl(False)
    try:
        plain = chain()
        wt.use_pdl(True)
        with_pdl = chain()
    finally:
        wt.use_pdl(previous)
    assert torch.isfinite(plain.float()).all()
    assert torch.equal(plain, with_pdl)


def test_gptq_marlin_symmetric():
    K, N, G = 512, 256, 128
    q = np.random.randint(0, 16, size=(K, N), dtype=np.uint8)
    qg = torch.from_numpy(formats.gptq_pack(q)).cuda()
    s = (torch.rand(K // G, N, device="cuda") * 0.01 + 0.005).half()
    w = (torch.from_numpy(q.astype(np.float32)).cuda() - 8) * s.float().repeat_interleave(G, 0)
    x = torch.randn(5, K, device="cuda").half()
    mw = wt.gptq_marlin_repack(qg, torch.empty(0, dtype=torch.int32, device="cuda"), K, N, 4)
    y = wt.marlin_gemm(x, mw, wt.marlin_permute_scales(s, K, N, G), None, None, 5, N, K)
    assert rel(y, x.float() @ w.half().float()) < 1e-2


def test_opcheck():
    qw, qz, s = make_awq(256, 128, 128, torch.float16, seed=1)
    x = torch.randn(4, 256, device="cuda").half()
    torch.library.opcheck(wt.awq_gemm, (x, qw, s, qz, 0))
    mw, ms = wt.awq_marlin_repack(qw, 256, 128, 4), wt.marlin_permute_scales(s, 256, 128, 128)
    mz = wt.awq_to_marlin_zero_points(qz, 2, 128, 4)
    torch.library.opcheck(wt.marlin_gemm, (x, mw, ms, mz, None, 4, 128, 256))


def test_torch_compile_and_cuda_graph():
    lin = torch.nn.Linear(1024, 768, bias=True).cuda().half()
    layer = wt.AWQLinear.from_float(lin, 128)
    x = torch.randn(8, 1024, device="cuda").half()
    eager = layer(x)
    compiled = torch.compile(layer, fullgraph=True)
    assert rel(compiled(x), eager) < 1e-3
    wt.prepare()
    static_x = x.clone()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        layer(static_x)  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        static_y = layer(static_x)
    static_x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert rel(static_y, layer(static_x)) < 1e-6


@pytest.mark.parametrize("dtype", DTYPES)
def test_mlp_example(dtype):
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    from mlp import run_mlp

    e_deq, e_float = run_mlp(dtype=dtype, tokens=16)
    assert e_deq < (2e-2 if dtype == torch.bfloat16 else 1e-2)  # the kernels reproduce the dequantised MLP
    assert 0.03 < e_float < 0.2  # and the int4 quantisation error is what int4 gives (about 11% here)


def test_python_doctor_self_test():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "w4a16"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "self-test passed" in out.stdout and "verdict: OK" in out.stdout
