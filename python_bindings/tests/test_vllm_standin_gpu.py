"""The vLLM adapter on a GPU, against stand-ins generated from the recorded real schemas (vLLM is not installed on
the GPU machine; tests/engines/ runs the adapter against the real vLLM on CPU).

For each recorded vLLM release (tests/engines/schemas/vllm-*.json) the ops the adapter relies on are defined in a
namespace of their own with exactly the recorded schemas; their CUDA kernels (the "vLLM kernels") only record that
they were called. The adapter installs over them as it would over vLLM's `_C`, the layer set (AWQ and GPTQ, with and
without bias, fp16 and bf16, act-order for the 0.15 generation) is prepared the way vLLM's layer code prepares it,
and the outputs match fp32 references computed from the checkpoint tensors."""

import glob
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU: the vLLM stand-in tests run on a GPU machine", allow_module_level=True)

from w4a16 import formats  # noqa: E402
from w4a16.engines import _common  # noqa: E402
from w4a16.engines import vllm as adapter_mod  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECORDS = sorted(glob.glob(os.path.join(ROOT, "tests", "engines", "schemas", "vllm-*.json")))
DTYPES = (torch.float16, torch.bfloat16)
_libs = []


class StandIn:
    """The ops of one adapter generation, defined in namespace `ns` with the schemas recorded from the real vLLM;
    their CUDA kernels (vLLM's kernels) only record that they were called."""

    def __init__(self, record, ns):
        self.record, self.ns, self.calls = record, ns, []
        self.gen = adapter_mod.generation_named(record["version"])
        self._names = {op: self.gen.arg_names(op) for op in self.gen.schemas}  # parsed once, outside any trace
        lib = torch.library.Library(ns, "DEF")
        _libs.append(lib)
        for name in self.gen.schemas:
            lib.define(record["ops"][f"_C::{name}"].split("::", 1)[1])
            lib.impl(name, self._kernel(name), "CUDA")
            lib.impl(name, self._meta(name), "Meta")
        self.ids = record["scalar_type_ids"]

    def names(self, op):
        return self._names[op]

    def _kernel(self, name):
        def kernel(*args):
            self.calls.append(name)
            return self._meta(name)(*args)

        return kernel

    def _meta(self, name):
        names = self.names(name)

        def meta(*args):
            p = dict(zip(names, args))
            if name == self.gen.gemm:
                return p["a"].new_full((p["size_m"], p["size_n"]), float("nan"))
            if name in ("gptq_marlin_repack", "awq_marlin_repack"):
                return p["b_q_weight"].new_zeros((p["size_k"] // 16, p["size_n"] * 2))
            if name == "awq_gemm":
                return args[0].new_full((args[0].shape[0], args[2].shape[1]), float("nan"))
            return args[1].new_full((args[0].shape[0], args[1].shape[1]), float("nan"))

        return meta

    def call(self, op, **values):
        """The op called the way vLLM calls it: every argument of the recorded schema, in its order."""
        name = self.gen.gemm if op == "gemm" else op
        return getattr(getattr(torch.ops, self.ns), name)(*(values[n] for n in self.names(name)))


@pytest.fixture(scope="module", params=RECORDS, ids=[os.path.basename(r)[:-5] for r in RECORDS])
def env(request):
    record = json.load(open(request.param))
    ns = "w4a16_standin_" + record["version"].replace(".", "_")
    standin = StandIn(record, ns)
    adapter_mod.uninstall()
    ids = record["scalar_type_ids"]
    adapter = adapter_mod.install(
        record["version"], namespace=ns, type_ids={"uint4": ids["uint4"], "uint4b8": ids["uint4b8"]}
    )
    assert adapter is not None, "the adapter refused the recorded schemas"
    assert adapter.generation is standin.gen
    yield standin, adapter
    adapter_mod.uninstall()


def _old(standin):
    return "g_idx_or_none" in standin.gen.schemas[standin.gen.gemm]


def _gemm(standin, a, w, bias, s, zeros, type_name, M, N, K, g_idx=None, perm=None, is_k_full=True, a_scales=None):
    empty = torch.empty(0, dtype=torch.int32, device="cuda")
    tid = standin.ids[type_name]
    return standin.call(
        "gemm",
        a=a,
        c_or_none=None,
        b_q_weight=w,
        b_bias_or_none=bias,
        b_scales=s,
        a_scales=a_scales,
        global_scale=None,
        b_zeros_or_none=zeros if zeros is not None else empty,
        g_idx_or_none=empty if g_idx is None else g_idx,
        perm_or_none=empty if perm is None else perm,
        workspace=torch.zeros(1024, dtype=torch.int32, device="cuda"),
        b_type_id=tid,
        b_q_type=tid,
        size_m=M,
        size_n=N,
        size_k=K,
        is_k_full=is_k_full,
        use_atomic_add=False,
        use_fp32_reduce=True,
        is_zp_float=False,
    )


def _repack_gptq(standin, q, perm, K, N, num_bits=4, is_a_8bit=False):
    assert perm is None or _old(standin)
    p = perm if perm is not None else torch.empty(0, dtype=torch.int32, device="cuda")
    return standin.call(
        "gptq_marlin_repack", b_q_weight=q, perm=p, size_k=K, size_n=N, num_bits=num_bits, is_a_8bit=is_a_8bit
    )


def _repack_awq(standin, qw, K, N):
    if "perm" in standin.names("gptq_marlin_repack"):  # up to the 0.15-0.29 generation: AWQ words repacked directly
        return standin.call("awq_marlin_repack", b_q_weight=_t(qw), size_k=K, size_n=N, num_bits=4, is_a_8bit=False)
    # later: vLLM turns AWQ into the GPTQ packing, then the GPTQ repack
    return _repack_gptq(standin, _t(formats.gptq_pack(formats.awq_unpack(qw))), None, K, N)


def _t(a, dtype=None):
    t = torch.from_numpy(np.ascontiguousarray(a)).cuda()
    return t.to(dtype) if dtype is not None else t


def _rel(y, ref):
    return ((y.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("K,N,G,M", [(512, 256, 128, 1), (1024, 384, 64, 16), (512, 128, -1, 100)])
def test_awq_layer(env, dtype, bias, K, N, G, M):
    standin, adapter = env
    standin.calls.clear()
    rng = np.random.default_rng(K + N + M)
    w = rng.standard_normal((K, N)).astype(np.float32) * 0.05
    qw, qz, s = formats.awq_quantize(w, G)
    Geff = K if G == -1 else G
    s_dt = torch.from_numpy(s.astype(np.float32)).to(dtype).float().numpy()  # the scales as the layer holds them
    ref_w = formats.awq_dequantize(qw, qz, s_dt, G).astype(np.float32)
    mw = _repack_awq(standin, qw, K, N)  # load time, as vLLM's layer code does it
    ms = _t(formats.marlin_permute_scales(s.astype(np.float32), K, N, Geff), dtype)
    mz = _t(formats.awq_to_marlin_zero_points(qz, K // Geff, N))
    b = (torch.randn(N, device="cuda") * 0.5).to(dtype) if bias else None
    mb = _common.marlin_bias_unpermute(b) if bias else None  # vLLM's marlin_permute_bias (an involution)
    x = torch.randn(M, K, device="cuda").to(dtype)
    y = _gemm(standin, x, mw, mb, ms, mz, "uint4", M, N, K)
    ref = x.float() @ torch.from_numpy(ref_w).cuda().to(dtype).float() * 1.0
    if bias:
        ref = ref + b.float()
    torch.cuda.synchronize()
    assert standin.calls == [] and torch.isfinite(y).all()
    assert _rel(y, ref) < (2e-2 if dtype == torch.bfloat16 else 5e-3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_layer(env, dtype, bias, act_order):
    standin, adapter = env
    if act_order and not _old(standin):
        pytest.skip("this vLLM refuses act-order Marlin layers itself")
    standin.calls.clear()
    K, N, G, M = 1024, 256, 128, 8
    rng = np.random.default_rng(7 + act_order)
    q = rng.integers(0, 16, size=(K, N), dtype=np.uint8)
    scales = rng.random((K // G, N)).astype(np.float32) * 0.01 + 0.002
    g_idx = (rng.permutation(K) // G if act_order else np.arange(K) // G).astype(np.int32)
    deq = (q.astype(np.float32) - 8) * torch.from_numpy(scales).to(dtype).float().numpy()[g_idx]
    perm = None
    if act_order:  # vLLM's marlin_sort_g_idx, then the adapter's load-time check
        g_t = _t(g_idx)
        perm = torch.argsort(g_t).to(torch.int32)
        sorted_g = g_t[perm.long()]
        assert adapter.check_act_order(sorted_g, perm)
    mw = _repack_gptq(standin, _t(formats.gptq_pack(q)), perm, K, N)
    ms = _t(formats.marlin_permute_scales(scales, K, N, G), dtype)
    b = (torch.randn(N, device="cuda") * 0.5).to(dtype) if bias else None
    mb = _common.marlin_bias_unpermute(b) if bias else None
    x = torch.randn(M, K, device="cuda").to(dtype)
    y = _gemm(standin, x, mw, mb, ms, None, "uint4b8", M, N, K, g_idx=sorted_g if act_order else None, perm=perm)
    ref = x.float() @ torch.from_numpy(deq).cuda()
    if bias:
        ref = ref + b.float()
    torch.cuda.synchronize()
    assert standin.calls == []
    assert _rel(y, ref) < (2e-2 if dtype == torch.bfloat16 else 5e-3)
    if act_order:  # the same layer as a row-parallel shard (is_k_full=False): vLLM's kernel
        _gemm(standin, x, mw, mb, ms, None, "uint4b8", M, N, K, g_idx=sorted_g, perm=perm, is_k_full=False)
        assert standin.calls == [standin.gen.gemm]


def test_unsupported_calls_reach_vllms_kernel(env):
    standin, adapter = env
    standin.calls.clear()
    K, N = 256, 128
    x = torch.randn(4, K, device="cuda").half()
    w = torch.zeros(K // 16, 2 * N, dtype=torch.int32, device="cuda")
    s = torch.ones(K // 128, N, device="cuda").half()
    z = torch.zeros(K // 128, N // 8, dtype=torch.int32, device="cuda")
    gemm = standin.gen.gemm
    want = []
    if "a_scales" in standin.names(gemm):
        _gemm(standin, x, w, None, s, z, "uint4", 4, N, K, a_scales=torch.ones(4, device="cuda"))  # W4A8
        want.append(gemm)
    _gemm(standin, x, w, None, s, None, "uint8b128", 4, N, K)  # 8-bit
    q = torch.zeros(K // 8, N, dtype=torch.int32, device="cuda")
    _repack_gptq(standin, q, None, K, N, num_bits=8)  # 8-bit
    want += [gemm, "gptq_marlin_repack"]
    if "is_a_8bit" in standin.names("gptq_marlin_repack"):
        _repack_gptq(standin, q, None, K, N, is_a_8bit=True)  # W4A8 layout
        want.append("gptq_marlin_repack")
    torch.cuda.synchronize()
    assert standin.calls == want


def test_compile_fullgraph_and_cuda_graph(env):
    """The layer's forward as vLLM runs it: torch.compile(fullgraph=True), then captured in a CUDA graph."""
    standin, adapter = env
    standin.calls.clear()
    K, N, G, M = 512, 256, 128, 4
    rng = np.random.default_rng(3)
    qw, qz, s = formats.awq_quantize(rng.standard_normal((K, N)).astype(np.float32) * 0.05, G)
    mw = _repack_awq(standin, qw, K, N)
    ms = _t(formats.marlin_permute_scales(s.astype(np.float32), K, N, G), torch.float16)
    mz = _t(formats.awq_to_marlin_zero_points(qz, K // G, N))
    b = (torch.randn(N, device="cuda") * 0.5).half()
    mb = _common.marlin_bias_unpermute(b)

    def forward(x):
        return _gemm(standin, x, mw, mb, ms, mz, "uint4", x.shape[0], N, K) * 2.0

    x = torch.randn(M, K, device="cuda").half()
    eager = forward(x)
    compiled = torch.compile(forward, fullgraph=True)
    assert _rel(compiled(x), eager.float()) < 1e-3
    import w4a16.torch as wt

    wt.prepare()
    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = forward(static_x)
    static_x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert _rel(static_y, forward(static_x).float()) < 1e-6
    assert standin.calls == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_awq_plain_ops(env, dtype):
    """vLLM's non-Marlin AWQ path: _C::awq_gemm (few tokens) and _C::awq_dequantize (then a matmul)."""
    standin, adapter = env
    standin.calls.clear()
    K, N, G, M = 512, 256, 128, 5
    rng = np.random.default_rng(11)
    qw, qz, s = formats.awq_quantize(rng.standard_normal((K, N)).astype(np.float32) * 0.05, G)
    sc = _t(s.astype(np.float32), dtype)
    w = torch.from_numpy(formats.awq_dequantize(qw, qz, sc.float().cpu().numpy(), G)).cuda().to(dtype)
    x = torch.randn(M, K, device="cuda").to(dtype)
    y = standin.call("awq_gemm", _in_feats=x, _kernel=_t(qw), _scaling_factors=sc, _zeros=_t(qz), split_k_iters=8)
    d = standin.call(
        "awq_dequantize", _kernel=_t(qw), _scaling_factors=sc, _zeros=_t(qz), split_k_iters=0, thx=0, thy=0
    )
    torch.cuda.synchronize()
    assert standin.calls == []
    assert _rel(y, x.float() @ w.float()) < (2e-2 if dtype == torch.bfloat16 else 5e-3)
    assert torch.equal(d, w)
