"""The SGLang adapter's hooks on a GPU, against stand-ins of SGLang's functions generated from the recorded schema
(tests/engines/schemas/sglang-*.json), driven the way SGLang 0.5.23's AWQ-Marlin and GPTQ-Marlin linear kernels call
them (load: repack, permute scales, zero points; forward: GEMM, then SGLang's own bias add), compared with an fp32
reference. SGLang itself is not needed; skipped, saying why, without torch or a CUDA GPU."""

import json
import pathlib
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to PyTorch", allow_module_level=True)

import w4a16.torch as wt  # noqa: E402
from w4a16 import formats  # noqa: E402
from w4a16.engines import sglang as adapter  # noqa: E402

SCHEMA = json.loads(
    sorted((pathlib.Path(__file__).resolve().parents[3] / "tests" / "engines" / "schemas").glob("sglang-*.json"))[
        -1
    ].read_text()
)
UINT4 = types.SimpleNamespace(id=SCHEMA["scalar_type_ids"]["uint4"], name="uint4", size_bits=4)
UINT4B8 = types.SimpleNamespace(id=SCHEMA["scalar_type_ids"]["uint4b8"], name="uint4b8", size_bits=4)
UINT8B128 = types.SimpleNamespace(id=7, name="uint8b128", size_bits=8)


class StandIns:
    """SGLang's functions with the recorded parameter lists; a call records its arguments and says so."""

    def __init__(self):
        self.calls = []
        for name, params in SCHEMA["params"].items():
            src = f"def {name}({params}):\n    return _seen({name!r}, locals())\n"
            scope = {"_seen": self._seen}
            exec(src, scope)
            setattr(self, name, scope[name])

    def _seen(self, name, args):
        self.calls.append((name, args))
        if name == "marlin_sort_g_idx":  # SGLang's own: argsort, as it does
            perm = torch.argsort(args["g_idx"]).to(torch.int)
            return args["g_idx"][perm], perm
        return "sglang"


@pytest.fixture
def sg(monkeypatch):
    monkeypatch.setattr(adapter, "_state", {"act_order_whole": True, "act_order_groups": set(), "logged": set()})
    orig = StandIns()
    hooks = adapter.make_hooks(UINT4.id, UINT4B8.id)
    # what SGLang's HookRegistry installs: hook(original, *args, **kwargs)
    fns = types.SimpleNamespace(
        **{n: (lambda h, o: lambda *a, **k: h(o, *a, **k))(hooks[n], getattr(orig, n)) for n in hooks}
    )
    return fns, orig


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def awq_layer(fns, K, N, G, dtype, gen):
    """AWQMarlinLinearKernel.process_weights_after_loading (SGLang 0.5.23), on a random AutoAWQ checkpoint."""
    w = torch.randn(K, N, generator=gen).numpy()
    qw, qz, s = formats.awq_quantize(w, G)
    s_t = torch.from_numpy(s.astype(np.float32)).to(dtype).cuda()
    wdq = torch.from_numpy(formats.awq_dequantize(qw, qz, s_t.float().cpu().numpy(), G))  # with the layer's scales
    mw = fns.awq_marlin_repack(torch.from_numpy(qw).cuda(), size_k=K, size_n=N, num_bits=4)
    ms = wt.marlin_permute_scales(s_t, K, N, G)
    mz = wt.awq_to_marlin_zero_points(torch.from_numpy(qz).cuda(), s.shape[0], N, 4)
    empty = torch.empty(0, dtype=torch.int, device="cuda")
    return dict(weight=mw, scales=ms, zp=mz, g_idx=empty, perm=empty, wtype=UINT4, is_k_full=True), wdq.float()


def gptq_layer(fns, K, N, G, dtype, gen, act_order=False):
    """GPTQMarlinLinearKernel.process_weights_after_loading (SGLang 0.5.23), whole K, symmetric 4-bit."""
    g = K if G == -1 else G
    q = torch.randint(0, 16, (K, N), generator=gen).numpy().astype(np.uint8)
    s = (torch.rand(K // g, N, generator=gen) * 0.01 + 0.005).to(dtype)
    g_idx = (torch.randperm(K, generator=gen) // g if act_order else torch.arange(K) // g).to(torch.int32)
    wdq = (torch.from_numpy(q.astype(np.float32)) - 8) * s.float()[g_idx.long()]
    empty = torch.empty(0, dtype=torch.int, device="cuda")
    if act_order:
        g_idx_sorted, perm = fns.marlin_sort_g_idx(g_idx.cuda())
    else:
        g_idx_sorted, perm = empty, empty
    mw = fns.gptq_marlin_repack(
        torch.from_numpy(formats.gptq_pack(q)).cuda(), perm=perm, size_k=K, size_n=N, num_bits=4
    )
    ms = wt.marlin_permute_scales(s.cuda(), K, N, G)
    return dict(weight=mw, scales=ms, zp=empty, g_idx=g_idx_sorted, perm=perm, wtype=UINT4B8, is_k_full=True), wdq


def forward(fns, lay, x, N, K, bias):
    """apply_gptq_marlin_linear / apply_awq_marlin_linear (SGLang 0.5.23): the GEMM, then SGLang adds the bias."""
    x2 = x.reshape(-1, x.shape[-1])
    out = fns.gptq_marlin_gemm(
        x2,
        None,
        lay["weight"],
        lay["scales"],
        None,
        lay["zp"],
        lay["g_idx"],
        lay["perm"],
        torch.zeros(132, dtype=torch.int, device="cuda"),
        lay["wtype"],
        size_m=x2.shape[0],
        size_n=N,
        size_k=K,
        is_k_full=lay["is_k_full"],
        use_atomic_add=False,
        use_fp32_reduce=True,
        is_zp_float=False,
    )
    if bias is not None:
        out.add_(bias)
    return out.reshape(x.shape[:-1] + (N,))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize(
    "kind,G", [("awq", 128), ("awq", 32), ("awq", -1), ("gptq", 128), ("gptq", 64), ("gptq", -1), ("gptq_act", 128)]
)
def test_layer_matches_fp32(sg, kind, G, dtype, with_bias):
    fns, orig = sg
    K, N = 1024, 384
    gen = torch.Generator().manual_seed(hash((kind, G, str(dtype), with_bias)) % 2**31)
    if kind == "awq":
        lay, wdq = awq_layer(fns, K, N, G, dtype, gen)
    else:
        lay, wdq = gptq_layer(fns, K, N, G, dtype, gen, act_order=kind == "gptq_act")
    bias = (torch.randn(N, generator=gen) * 0.5).to(dtype).cuda() if with_bias else None
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-2
    for M in (1, 16, 45, 300):
        x = torch.randn(1, M, K, generator=gen).to(dtype).cuda()
        y = forward(fns, lay, x, N, K, bias)
        torch.cuda.synchronize()
        ref = x.reshape(M, K).float().cpu() @ wdq
        if bias is not None:
            ref += bias.float().cpu()
        assert y.shape == (1, M, N) and y.dtype == dtype and not y.isnan().any()
        assert rel(y.reshape(M, N).cpu(), ref) < tol, (M, rel(y.reshape(M, N).cpu(), ref))
    assert [c[0] for c in orig.calls] == (["marlin_sort_g_idx"] if kind == "gptq_act" else [])


def test_cuda_graph_capture(sg):
    """The hooked GEMM and SGLang's bias add, captured in a CUDA graph and replayed on new activations."""
    fns, _ = sg
    K, N, M = 1024, 512, 8
    gen = torch.Generator().manual_seed(3)
    lay, wdq = awq_layer(fns, K, N, 128, torch.float16, gen)
    bias = torch.randn(N, generator=gen).half().cuda()
    x = torch.randn(M, K, generator=gen).half().cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        forward(fns, lay, x, N, K, bias)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = forward(fns, lay, x, N, K, bias)
    for _ in range(2):
        x.copy_(torch.randn(M, K, generator=gen).half().cuda())
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = x.float().cpu() @ wdq + bias.float().cpu()
        assert rel(y.cpu(), ref) < 1e-2


def test_unsupported_goes_to_sglang(sg):
    """8-bit GPTQ and act-order on a row-parallel shard: SGLang's functions get the call, unchanged."""
    fns, orig = sg
    K, N = 256, 128
    qw = torch.randint(-(2**31), 2**31 - 1, (K // 4, N), dtype=torch.int32, device="cuda")
    empty = torch.empty(0, dtype=torch.int, device="cuda")
    assert fns.gptq_marlin_repack(qw, perm=empty, size_k=K, size_n=N, num_bits=8) == "sglang"
    x = torch.randn(4, K, device="cuda").half()
    s = torch.rand(K // 128, N, device="cuda").half()
    w8 = torch.zeros(K // 16, 4 * N, dtype=torch.int32, device="cuda")
    assert (
        fns.gptq_marlin_gemm(x, None, w8, s, None, empty, empty, empty, empty, UINT8B128, size_m=4, size_n=N, size_k=K)
        == "sglang"
    )
    w4 = torch.zeros(K // 16, 2 * N, dtype=torch.int32, device="cuda")
    g_idx = (torch.arange(K, device="cuda") // 128).int()
    perm = torch.arange(K, device="cuda").int()
    assert (
        fns.gptq_marlin_gemm(
            x, None, w4, s, None, empty, g_idx, perm, empty, UINT4B8, size_m=4, size_n=N, size_k=K, is_k_full=False
        )
        == "sglang"
    )
    assert [c[0] for c in orig.calls] == ["gptq_marlin_repack", "gptq_marlin_gemm", "gptq_marlin_gemm"]
    assert orig.calls[0][1]["b_q_weight"] is qw and orig.calls[2][1]["is_k_full"] is False
