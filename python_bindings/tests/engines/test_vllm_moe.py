"""w4a16 under the real vLLM's fused Marlin MoE (the engine venv's release), on a machine without a GPU.

As in test_vllm.py, the adapter is installed for the CPU dispatch key and w4a16 is replaced by recorders: the dense
repack ops (which vLLM's stacked-expert repacks call per expert) answer from w4a16.formats, and w4a16.moe's grouped
GEMM records its arguments and writes random values into the rows the routing names (as w4a16 writes only those).
vLLM's own code runs the expert layer: its MoE weight helpers (awq/gptq_marlin_moe_repack, marlin_moe_permute_scales,
moe_awq_to_marlin_zero_points, marlin_permute_bias) and its `fused_marlin_moe`, whose two
`_moe_C::moe_wna16_marlin_gemm` calls reach w4a16 through the dispatcher. Stood in for, being CUDA only: vLLM's routing
kernel (the `_moe_C::moe_align_block_size` under its Python wrapper; replaced, wrapper included, by align_cpu, a CPU
twin of both, checked against routings worked out by hand from the kernel and against the real wrapper), the
SiLU-and-mul activation kernel and (0.33, expert parallelism) `_moe_C::moe_sum`; in 0.11 the GPU capability query that
picks use_atomic_add."""

import contextlib
import importlib
import importlib.metadata
import inspect
import json
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

vllm = pytest.importorskip("vllm", reason="not a vLLM venv")

from conftest import schema_record_path  # noqa: E402
from test_vllm import _LOAD, Recorder, _capture_log, _plugin_env, _same  # noqa: E402
from w4a16 import formats  # noqa: E402
from w4a16.engines import vllm as adapter_mod  # noqa: E402

adapter_mod.load_vllm_ops()
VERSION = importlib.metadata.version("vllm")
GEN = adapter_mod.generation_named(VERSION)
MOE = adapter_mod.Generation.MOE
DTYPES = (torch.float16, torch.bfloat16)
# a release whose wheel has the MoE GEMM (every recorded one) must have it served: without a MoE schema in its
# generation the tests below fail rather than skip
SERVED = f"_moe_C::{MOE}" in json.load(open(schema_record_path("vllm", VERSION)))["ops"]


@pytest.fixture(autouse=True)
def _where_served(request):
    if not SERVED and request.node.originalname != "test_moe_schema_refused_with_one_line":
        pytest.skip(f"vLLM {VERSION} has no _moe_C::{MOE} op")


def test_moe_schema_refused_with_one_line(monkeypatch):
    """Where the generation has no MoE schema, or the live one is not it: one line, MoE left alone."""
    lines = _capture_log(monkeypatch)
    if SERVED:
        monkeypatch.setattr(GEN, "moe", None)
    adapter_mod.uninstall()
    before = torch._C._dispatch_dump(f"_moe_C::{MOE}")
    a = adapter_mod.install(VERSION, dispatch_key="CPU", device_ok=lambda device: True)
    try:
        assert a is not None and not a.serves_moe
        assert torch._C._dispatch_dump(f"_moe_C::{MOE}") == before
        assert len([s for s in lines if "MoE layers stay on vLLM's kernels" in s]) == 1, lines
    finally:
        adapter_mod.uninstall()


def _moe_op():
    return torch.ops._moe_C.moe_wna16_marlin_gemm


# ---------------------------------------------------------------------------------------------- schema and install
def test_moe_schema_is_the_recorded_one():
    assert GEN is not None and GEN.moe is not None, f"vLLM {VERSION}: no MoE schema in its adapter generation"
    recorded = json.load(open(schema_record_path("vllm", VERSION)))
    assert recorded["ops"][f"_moe_C::{MOE}"] == GEN.moe
    assert adapter_mod.moe_mismatch(GEN) is None


def test_changed_moe_schema_keeps_moe_on_vllm(monkeypatch):
    """A MoE schema that differs from the recorded one: one log line, nothing registered for MoE, the dense ops are
    served as before."""
    monkeypatch.setattr(GEN, "moe", GEN.moe.replace("bool is_zp_float", "bool zp_f"))
    lines = _capture_log(monkeypatch)
    monkeypatch.setattr(adapter_mod.log, "_cache", {})  # isEnabledFor's cache, kept from before the level was set
    adapter_mod.uninstall()
    before = torch._C._dispatch_dump(f"_moe_C::{MOE}")
    a = adapter_mod.install(VERSION, dispatch_key="CPU", device_ok=lambda device: True)
    try:
        assert a is not None and not a.serves_moe and a.overrides._lib is not None
        assert torch._C._dispatch_dump(f"_moe_C::{MOE}") == before
        warn = [s for s in lines if "MoE layers stay on vLLM's kernels" in s]
        assert len(warn) == 1 and f"_moe_C::{MOE} has the schema" in warn[0], lines
        (served,) = [s for s in lines if "serves vLLM" in s]
        assert f"_moe_C::{MOE}" not in served and "MoE, W4A8" in served
    finally:
        adapter_mod.uninstall()


def test_plugin_logs_the_moe_op_as_served(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", _LOAD], capture_output=True, text=True, env=_plugin_env(tmp_path), timeout=600
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    line = next((s for s in text.splitlines() if "serves vLLM" in s), None)
    assert line is not None, text
    assert "and MoE experts" in line and f"_moe_C::{MOE}" in line, line
    print(line)


def test_installs_over_vllms_cuda_moe_kernel():
    adapter_mod.uninstall()
    before = torch._C._dispatch_dump(f"_moe_C::{MOE}")
    a = adapter_mod.install(VERSION)
    try:
        assert a is not None and a.serves_moe and a.moe_overrides.original(MOE) is not None
        assert torch._C._dispatch_dump(f"_moe_C::{MOE}") != before
    finally:
        adapter_mod.uninstall()
    assert torch._C._dispatch_dump(f"_moe_C::{MOE}") == before


# ---------------------------------------------------------------------------------------------- recorders
def routed_rows(sorted_ids, expert_ids, npp, block_size, num_experts, rows):
    """The rows of C a grouped MoE GEMM writes, as w4a16's does: the pair indices (< rows) of the blocks before the
    padded count whose expert is in [0, num_experts)."""
    blocks = int(npp.reshape(-1)[0]) // block_size
    ids = sorted_ids[: blocks * block_size].view(blocks, block_size).long()
    ok = (expert_ids[:blocks] >= 0) & (expert_ids[:blocks] < num_experts)
    ids = ids[ok].flatten()
    return ids[ids < rows]


class MoeRecorder(Recorder):
    """Also stands in for w4a16.moe._grouped (what the adapter calls): records, then writes random values into the
    rows of c the routing names (rows of pairs in no block of a served expert stay as they were; c None: a zeroed
    one, as w4a16's)."""

    def grouped(
        self,
        layout,
        a,
        c,
        w,
        bias,
        scales,
        zeros,
        sorted_ids,
        expert_ids,
        npp,
        topk_weights,
        mul_topk_weights,
        block_size,
        top_k,
        size_m,
        size_n,
        size_k,
    ):
        cl = lambda t: None if t is None else t.clone()
        self.calls.append(
            (
                "moe_gemm",
                dict(
                    layout=layout,
                    a=cl(a),
                    c=c,
                    w=cl(w),
                    bias=cl(bias),
                    scales=cl(scales),
                    zeros=cl(zeros),
                    sorted_ids=sorted_ids,
                    expert_ids=expert_ids,
                    npp=npp,
                    topk_weights=topk_weights,
                    mul=mul_topk_weights,
                    block=block_size,
                    top_k=top_k,
                    m=size_m,
                    n=size_n,
                    k=size_k,
                ),
            )
        )
        self.calls[-1][1]["c_in"] = cl(c)
        if c is None:
            c = torch.zeros(size_m * top_k, size_n, dtype=a.dtype)
        rows = routed_rows(sorted_ids, expert_ids, npp, block_size, w.shape[0], size_m * top_k)
        c[rows] = torch.randn(rows.numel(), size_n).to(c.dtype)
        self.calls[-1][1]["out"] = c.clone()
        return c


def recording_adapter(monkeypatch):
    """The adapter installed for CPU tensors, w4a16's repacks and grouped GEMM recorded (a generator for fixtures:
    test_vllm_moe_methods.py defines its own fixture on it, since pytest registers an imported fixture under its
    alias)."""
    import w4a16.moe
    import w4a16.torch as wt

    r = MoeRecorder()
    for name in ("awq_marlin_repack", "gptq_marlin_repack", "marlin_gemm"):
        monkeypatch.setattr(wt, name, getattr(r, name))
    monkeypatch.setattr(w4a16.moe, "_grouped", r.grouped)
    adapter_mod.uninstall()
    a = adapter_mod.install(VERSION, dispatch_key="CPU", device_ok=lambda device: True)
    assert a is not None and a.serves_moe
    r.adapter = a
    yield r
    adapter_mod.uninstall()


@pytest.fixture
def rec(monkeypatch):
    yield from recording_adapter(monkeypatch)


def _align_caps_small():
    """Whether this vLLM's moe_align_block_size caps the sorted ids at numel * block_size when there are fewer pairs
    than experts (0.14 on; 0.11 does not)."""
    real = importlib.import_module("vllm.model_executor.layers.fused_moe.moe_align_block_size").moe_align_block_size
    return "topk_ids.numel() < num_experts" in inspect.getsource(real)


_ALIGN_CAPS_SMALL = _align_caps_small()


def align_cpu(
    topk_ids, block_size, num_experts, expert_map=None, pad_sorted_ids=False, ignore_invalid_experts=False, **kw
):
    """CPU twin of vLLM's moe_align_block_size (its Python wrapper and its CUDA kernel, CUDA-only), output for output:
    - buffers: sorted ids of numel + num_experts (block_size - 1) entries (rounded up to block_size with
      pad_sorted_ids; from 0.14 on at most numel * block_size when numel < num_experts), one expert id per block_size
      of them;
    - each expert's pair indices, then the pad value numel up to a multiple of block_size, expert after expert; the
      pad value in every entry past the runs, expert id 0 in every block past them; the runs' length (padded count);
    - inside a run, the small-batch kernel's order (numel < 1024 and num_experts <= 64; it scans the pairs with
      max(num_experts, 32) threads, each taking every stride-th pair from its own index): by pair index modulo that
      stride, then by index. Larger routings take their order from atomics (any order), here by index.
    With expert_map (expert parallelism) two ways: as 0.11 does (and ignore_invalid_experts=False later), routed over
    all num_experts and each block's expert id (the tail's 0 included) mapped through expert_map afterwards, -1 for
    another rank's expert; with ignore_invalid_experts=True (0.14 on, which fused_marlin_moe uses) the kernel maps
    every pair's expert first and drops the pairs of other ranks' experts (-1): they appear in no run, the runs are
    those of the local expert ids, and no block holds -1."""
    numel = topk_ids.numel()
    cap = numel + num_experts * (block_size - 1)
    if pad_sorted_ids:
        cap = (cap + block_size - 1) // block_size * block_size
    if numel < num_experts and _ALIGN_CAPS_SMALL:
        cap = min(numel * block_size, cap)
    sorted_ids = torch.full((cap,), numel, dtype=torch.int32)
    expert_ids = torch.zeros(((cap + block_size - 1) // block_size,), dtype=torch.int32)
    flat = topk_ids.flatten().long()
    if expert_map is not None and ignore_invalid_experts:
        emap = expert_map.long()
        flat = torch.where(flat < num_experts, emap[flat.clamp(max=num_experts - 1)], num_experts)
        flat = torch.where(flat >= 0, flat, num_experts)  # dropped: counted for no expert
    stride = max(num_experts, 32) if numel < 1024 and num_experts <= 64 else numel
    pairs = torch.arange(numel)
    pos = 0
    for e in range(num_experts):
        idx = pairs[flat == e]
        if idx.numel():
            idx = idx[torch.argsort((idx % stride) * numel + idx)]
            sorted_ids[pos : pos + idx.numel()] = idx.to(torch.int32)
            nb = (idx.numel() + block_size - 1) // block_size
            expert_ids[pos // block_size : pos // block_size + nb] = e
            pos += nb * block_size
    if expert_map is not None and not ignore_invalid_experts:
        expert_ids = expert_map.to(torch.int32)[expert_ids.long()]
    return sorted_ids, expert_ids, torch.tensor([pos], dtype=torch.int32)


class AlignSpy:
    """Stands in for vLLM's moe_align_block_size with align_cpu, keeping each call's arguments and the buffers it
    returned to vLLM."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kw):
        out = align_cpu(*args, **kw)
        self.calls.append((args, kw, out))
        return out


# routings worked out by hand from vLLM's moe_align_block_size kernel (see align_cpu), in both expert-parallel forms
_EXPERT_MAP = [-1, 0, -1, 1, 2, -1, 3, -1]  # 8 global experts; this rank holds 1, 3, 4 and 6 as 0..3
_P = 8  # the pad value: numel
_ALIGN_CASES = {
    # local ids of the pairs: 0, -, 1, 3, -, 0, 3, -: runs of local experts 0 (pairs 0, 5), 1 (2) and 3 (3, 6)
    "dropped while routing (0.14 on)": (
        [[1, 0], [3, 6], [2, 1], [6, 7]],
        4,
        8,
        _EXPERT_MAP,
        True,
        [0, 5, _P, _P, 2, _P, _P, _P, 3, 6, _P, _P] + [_P] * 20,
        [0, 1, 3, 0, 0, 0, 0, 0],
        12,
    ),
    # routed over the global experts 0 (pair 1), 1 (0, 5), 2 (4), 3 (2), 6 (3, 6), 7 (7), then mapped (tail 0 too)
    "marked -1 after routing (0.11)": (
        [[1, 0], [3, 6], [2, 1], [6, 7]],
        4,
        8,
        _EXPERT_MAP,
        False,
        [1, _P, _P, _P, 0, 5, _P, _P, 4, _P, _P, _P, 2, _P, _P, _P, 3, 6, _P, _P, 7, _P, _P, _P] + [_P] * 8,
        [-1, 0, -1, 1, 3, -1, -1, -1],
        24,
    ),
    # 40 pairs of expert 0 scanned by 32 threads: pair i goes with thread i % 32, the threads' pairs in thread order
    "order inside a run": (
        [[0, 0]] * 20,
        8,
        2,
        None,
        False,
        [v for t in range(8) for v in (t, t + 32)] + list(range(8, 32)) + [40] * 14,
        [0] * 7,
        40,
    ),
}


@pytest.mark.parametrize("case", list(_ALIGN_CASES))
def test_align_twin_is_vllms_routing(monkeypatch, case):
    """align_cpu against routings worked out by hand from vLLM's kernel, and against vLLM's own moe_align_block_size
    wrapper (its buffer sizes and what it does around the kernel: here the CUDA-only kernel call is answered by the
    twin at the kernel's level, with the wrapper's buffers)."""
    ids, block, num_experts, emap, ignore, want_sorted, want_experts, want_npp = _ALIGN_CASES[case]
    topk_ids = torch.tensor(ids, dtype=torch.int32)
    emap = None if emap is None else torch.tensor(emap, dtype=torch.int32)
    mab = importlib.import_module("vllm.model_executor.layers.fused_moe.moe_align_block_size")
    has_ignore = "ignore_invalid_experts" in inspect.signature(mab.moe_align_block_size).parameters
    if ignore and not has_ignore:
        pytest.skip(f"vLLM {VERSION}'s routing has no ignore_invalid_experts")
    kw = {"ignore_invalid_experts": ignore} if has_ignore else {}
    sorted_ids, expert_ids, npp = align_cpu(topk_ids, block, num_experts, emap, **kw)
    assert sorted_ids.tolist() == want_sorted and expert_ids.tolist() == want_experts and npp.tolist() == [want_npp]

    def kernel(topk, n_exp, bs, s_out, e_out, n_out, kernel_map=None, scatter_idx=None):
        assert scatter_idx is None
        s, e, n = align_cpu(topk, bs, n_exp, kernel_map, ignore_invalid_experts=kernel_map is not None)
        assert s_out.shape == s.shape and e_out.shape == e.shape, "the wrapper's buffer sizes"
        s_out.copy_(s), e_out.copy_(e), n_out.copy_(n)

    monkeypatch.setattr(mab.ops, "moe_align_block_size", kernel)
    if not hasattr(mab.triton, "cdiv"):  # vLLM's placeholder where Triton is not installed (a CPU-only machine)
        monkeypatch.setattr(mab, "triton", types.SimpleNamespace(cdiv=lambda a, b: -(-a // b)))
    real = mab.moe_align_block_size(topk_ids, block, num_experts, emap, **kw)
    for got, want in zip(real, (sorted_ids, expert_ids, npp)):
        assert torch.equal(got, want)


def test_align_twin_buffer_sizes():
    """Fewer pairs than experts: from 0.14 on vLLM caps the sorted ids at numel * block_size."""
    sorted_ids, expert_ids, npp = align_cpu(torch.tensor([[5, 2]], dtype=torch.int32), 16, 8)
    want = 32 if _ALIGN_CAPS_SMALL else 2 + 8 * 15
    assert sorted_ids.numel() == want and expert_ids.numel() == (want + 15) // 16 and npp.tolist() == [32]
    assert sorted_ids[:32].tolist() == [1] + [2] * 15 + [0] + [2] * 15


def _fused_module():
    for name in (
        "vllm.model_executor.layers.fused_moe.experts.marlin_moe",
        "vllm.model_executor.layers.fused_moe.fused_marlin_moe",
    ):
        try:
            return importlib.import_module(name)
        except ImportError:
            pass
    raise ImportError("vLLM's fused_marlin_moe module")


def _silu_and_mul(activation, out, inp, **kw):
    n = inp.shape[1] // 2
    out.copy_(torch.nn.functional.silu(inp[:, :n]) * inp[:, n:])


def no_gpu_queries(monkeypatch):
    """0.11's fused_marlin_moe asks the GPU's capability (for use_atomic_add and a bf16 hint): answer an H100's."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))


@contextlib.contextmanager
def cpu_kernels():
    """CPU implementations of the two CUDA-only vLLM kernels the fused Marlin MoE calls around its GEMMs, for the
    duration: `_C::silu_and_mul` and (0.33) `_moe_C::moe_sum`, the sum over each token's top_k rows, which under
    expert parallelism (given topk_ids and expert_map) leaves out the slots of other ranks' experts."""

    def silu_and_mul(out, x):
        n = x.shape[-1] // 2
        out.copy_(torch.nn.functional.silu(x[..., :n]) * x[..., n:])

    def moe_sum(inp, out, topk_ids=None, expert_map=None):
        if expert_map is not None:
            inp = inp.masked_fill((expert_map.long()[topk_ids.long()] < 0)[..., None], 0)
        out.copy_(inp.sum(dim=1))

    act, moe = torch.library.Library("_C", "IMPL"), torch.library.Library("_moe_C", "IMPL")
    act.impl("silu_and_mul", silu_and_mul, "CPU")
    moe.impl("moe_sum", moe_sum, "CPU")
    try:
        yield
    finally:
        act._destroy()
        moe._destroy()


# ---------------------------------------------------------------------------------------------- checkpoints
def _experts(method, E, K, N, G, dtype, seed):
    """Per-expert checkpoint tensors for a [K -> N] projection: AWQ (qweight [K, N/8], qzeros, scales) or symmetric
    GPTQ (qweight [K/8, N], scales), stacked [E, ...]."""
    rng = np.random.default_rng(seed)
    qws, qzs, ss = [], [], []
    for _ in range(E):
        if method == "awq":
            qw, qz, s = formats.awq_quantize(rng.standard_normal((K, N)).astype(np.float32) * 0.05, G)
            qzs.append(qz)
        else:
            qw = formats.gptq_pack(rng.integers(0, 16, size=(K, N), dtype=np.uint8))
            s = rng.random((K // G, N)).astype(np.float32) * 0.01 + 0.002
        qws.append(qw)
        ss.append(s)
    st = lambda xs: torch.from_numpy(np.stack(xs))  # noqa: E731
    return st(qws), (st(qzs) if method == "awq" else None), st([s.astype(np.float32) for s in ss]).to(dtype)


def _vllm_process(method, qw, qz, s, K, N, G):
    """What vLLM's AWQ / GPTQ Marlin MoE methods do to the checkpoint after loading, with vLLM's own helpers."""
    import vllm._custom_ops as ops
    from vllm.model_executor.layers.quantization.utils import marlin_utils as mu

    E = qw.shape[0]
    repack = ops.awq_marlin_moe_repack if method == "awq" else ops.gptq_marlin_moe_repack
    extra = {"perm": torch.empty((E, 0), dtype=torch.int32)} if "perm" in inspect.signature(repack).parameters else {}
    w = repack(qw, size_k=K, size_n=N, num_bits=4, **extra)
    scales = mu.marlin_moe_permute_scales(s, size_k=K, size_n=N, group_size=G)
    zeros = mu.moe_awq_to_marlin_zero_points(qz, size_k=K // G, size_n=N, num_bits=4) if method == "awq" else None
    return w, scales, zeros


def _want(method, qw, qz, s, K, N, G):
    """w4a16.formats per expert, stacked: what must reach w4a16's grouped GEMM."""
    E = qw.shape[0]
    if method == "awq":
        w = [formats.marlin_repack_awq(qw[e].numpy()) for e in range(E)]
        z = torch.from_numpy(np.stack([formats.awq_to_marlin_zero_points(qz[e].numpy(), K // G, N) for e in range(E)]))
    else:
        w = [formats.marlin_repack_gptq(qw[e].numpy()) for e in range(E)]
        z = None
    sc = torch.from_numpy(
        np.stack([formats.marlin_permute_scales(s[e].float().numpy(), K, N, G) for e in range(E)])
    ).to(s.dtype)
    return torch.from_numpy(np.stack(w)), sc, z


# ---------------------------------------------------------------------------------------------- layers on w4a16
@pytest.mark.parametrize("method", ["awq", "gptq"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("E,T,G", [(4, 5, 64), (8, 64, 128)])
def test_fused_marlin_moe_on_w4a16(rec, monkeypatch, method, dtype, bias, E, T, G):
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_permute_bias
    from vllm.scalar_type import scalar_types

    H, inter, top_k = 256, 128, 2
    fm = _fused_module()
    monkeypatch.setattr(fm, "moe_align_block_size", align_cpu)
    no_gpu_queries(monkeypatch)
    seed = E * 1000 + T * 10 + G + (method == "gptq") + 2 * bias
    qw13, qz13, s13 = _experts(method, E, H, 2 * inter, G, dtype, seed)
    qw2, qz2, s2 = _experts(method, E, inter, H, G, dtype, seed + 1)
    w13, sc13, z13 = _vllm_process(method, qw13, qz13, s13, H, 2 * inter, G)
    w2, sc2, z2 = _vllm_process(method, qw2, qz2, s2, inter, H, G)
    b13 = (torch.randn(E, 2 * inter) * 0.5).to(dtype) if bias else None
    b2 = (torch.randn(E, H) * 0.5).to(dtype) if bias else None

    x = torch.randn(T, H).to(dtype)
    logits = torch.randn(T, E)
    topk_weights, topk_ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    topk_ids = topk_ids.to(torch.int32)
    rec.calls.clear()
    # keywords from topk_weights on: up to 0.14 a gating_output argument comes before it
    extra = {"gating_output": None} if "gating_output" in inspect.signature(fm.fused_marlin_moe).parameters else {}
    y = fm.fused_marlin_moe(
        x,
        w13,
        w2,
        None if b13 is None else marlin_permute_bias(b13),
        None if b2 is None else marlin_permute_bias(b2),
        sc13,
        sc2,
        topk_weights=topk_weights,
        topk_ids=topk_ids,
        quant_type_id=(scalar_types.uint4 if method == "awq" else scalar_types.uint4b8).id,
        activation_func=_silu_and_mul,
        w1_zeros=z13,
        w2_zeros=z2,
        workspace=torch.zeros(256, dtype=torch.int32),
        **extra,
    )

    assert rec.adapter.fell_back == {} and rec.adapter.served.get(MOE) == 2
    c1, c2 = [c[1] for c in rec.named("moe_gemm")]
    want13, want2 = _want(method, qw13, qz13, s13, H, 2 * inter, G), _want(method, qw2, qz2, s2, inter, H, G)
    for c, (ww, ws, wz), b in ((c1, want13, b13), (c2, want2, b2)):
        assert c["layout"] == "marlin"
        assert np.array_equal(c["w"].numpy(), ww.numpy())
        assert _same(c["scales"], ws)
        assert (c["zeros"] is None) if wz is None else np.array_equal(c["zeros"].numpy(), wz.numpy())
        assert (c["bias"] is None) if b is None else _same(c["bias"], b), "bias must reach w4a16 in natural order"
    sorted_ids, expert_ids, npp = align_cpu(topk_ids, c1["block"], E)
    for c in (c1, c2):
        assert torch.equal(c["sorted_ids"], sorted_ids) and torch.equal(c["expert_ids"], expert_ids)
        assert torch.equal(c["npp"], npp) and c["topk_weights"] is topk_weights and c["block"] == c2["block"]
    assert c1["block"] in (8, 16, 32, 48, 64)
    # first GEMM: the tokens, top_k rows each, gate and up; second: the activated rows, weighted by topk_weights
    assert _same(c1["a"], x) and (c1["m"], c1["top_k"], c1["n"], c1["k"], c1["mul"]) == (T, top_k, 2 * inter, H, False)
    act = torch.empty(T * top_k, inter, dtype=dtype)
    _silu_and_mul(None, act, c1["out"])
    assert _same(c2["a"], act)
    assert (c2["m"], c2["top_k"], c2["n"], c2["k"], c2["mul"]) == (T * top_k, 1, H, inter, True)
    assert c1["c"].shape == (T * top_k, 2 * inter) and c2["c"].shape == (T * top_k, H)
    assert _same(y, torch.sum(c2["out"].view(T, top_k, H), dim=1))


def _is_ep_spy(rec, monkeypatch):
    """The is_ep argument of each MoE call that reaches the adapter (None where the schema has none)."""
    seen, decide = [], rec.adapter._moe_reason
    monkeypatch.setattr(rec.adapter, "_moe_reason", lambda p: seen.append(p.get("is_ep")) or decide(p))
    return seen


def _routes_all_experts():
    """0.11's expert parallelism: routing over all experts, other ranks' blocks marked -1, the GEMMs told is_ep=True.
    From 0.14 on (no is_ep) vLLM's routing drops other ranks' pairs (ignore_invalid_experts=True)."""
    return "is_ep" in GEN.arg_names(MOE)


def _sums_local_slots():
    """0.33: the second GEMM's output is not zeroed first and vLLM's moe_sum (given topk_ids and expert_map) leaves
    out the slots of other ranks' experts. Up to 0.15: the output is zeroed before the second GEMM and every top_k
    row is summed, so the rows of those slots must stay zero."""
    import vllm._custom_ops as ops

    return "expert_map" in inspect.signature(ops.moe_sum).parameters


def check_expert_parallel(rec, spy, x, topk_weights, topk_ids, expert_map, wants, y):
    """What one rank under expert parallelism must see and give, in the form of this release (see
    _routes_all_experts and _sums_local_slots): the routing vLLM computed (one moe_align_block_size call, with this
    rank's expert_map over the global experts) reaches both GEMMs as it is, both GEMMs are served by w4a16 on the
    rank's experts (wants: per GEMM, the w4a16.formats weight, scales, zeros of the local experts) into vLLM's own
    output buffers, the rows of the pairs of other ranks' experts are left as they were, and the layer's output is
    the sum over top_k of the second GEMM's rows of this rank's pairs."""
    legacy, masked = _routes_all_experts(), _sums_local_slots()
    T, top_k = topk_ids.shape
    E, E_global, n_pairs = wants[0][0].shape[0], expert_map.numel(), topk_ids.numel()
    assert rec.adapter.fell_back == {} and rec.adapter.served.get(MOE) == 2
    c1, c2 = [c[1] for c in rec.named("moe_gemm")]

    # vLLM's routing call and what it returned
    ((args, kw, (sorted_ids, expert_ids, npp)),) = spy.calls
    real = importlib.import_module("vllm.model_executor.layers.fused_moe.moe_align_block_size").moe_align_block_size
    call = inspect.signature(real).bind(*args, **kw)
    call.apply_defaults()
    call = call.arguments
    assert call["topk_ids"] is topk_ids and call["num_experts"] == E_global and call["expert_map"] is expert_map
    assert call.get("ignore_invalid_experts", False) == (not legacy)
    block = call["block_size"]
    for c in (c1, c2):
        assert c["sorted_ids"] is sorted_ids and c["expert_ids"] is expert_ids and c["npp"] is npp
        assert c["block"] == block and c["topk_weights"] is topk_weights

    # the routing itself: every pair of this rank's experts exactly once, in a block of its local expert; the other
    # ranks' pairs in -1 blocks (0.11) or nowhere (0.14 on: no -1, padded count of the local runs only)
    local = expert_map.long()[topk_ids.long()].flatten()  # each pair's expert on this rank, -1: another rank's
    mine = local >= 0
    assert mine.any() and (~mine).any(), "both kinds of pair are tested"
    blocks = int(npp) // block
    ids = sorted_ids[: blocks * block].view(blocks, block).long()
    served = (expert_ids[:blocks] >= 0) & (expert_ids[:blocks] < E)
    if legacy:
        assert (expert_ids[:blocks] == -1).any() and served.any() and ((expert_ids[:blocks] == -1) | served).all()
    else:
        assert served.all(), "0.14 on: only local expert ids in the routing"
        counts = torch.bincount(local[mine], minlength=E)
        assert int(npp) == int(((counts + block - 1) // block * block).sum())
        assert not torch.isin(torch.arange(n_pairs)[~mine], sorted_ids.long()).any(), "dropped pairs routed nowhere"
    pairs = ids[served]
    owner = expert_ids[:blocks][served].long()[:, None].expand_as(pairs)
    real_pair = pairs < n_pairs
    assert torch.equal(torch.sort(pairs[real_pair]).values, torch.arange(n_pairs)[mine])
    assert torch.equal(owner[real_pair], local[pairs[real_pair]])

    # both GEMMs: the local experts' weights, vLLM's buffers as c_or_none, rows of dropped pairs untouched
    for c, (ww, ws, wz) in zip((c1, c2), wants):
        assert c["w"].shape[0] == E and np.array_equal(c["w"].numpy(), ww.numpy()) and _same(c["scales"], ws)
        assert (c["zeros"] is None) if wz is None else np.array_equal(c["zeros"].numpy(), wz.numpy())
        assert c["c"] is not None and c["c_in"] is not None, "vLLM's output buffer (c_or_none) must reach w4a16"
        assert _same(c["out"][~mine], c["c_in"][~mine]), "rows of other ranks' pairs must be left as they were"
    H, inter = c2["n"], c2["k"]
    assert _same(c1["a"], x) and (c1["m"], c1["top_k"], c1["n"], c1["k"], c1["mul"]) == (T, top_k, 2 * inter, H, False)
    assert (c2["m"], c2["top_k"], c2["mul"]) == (T * top_k, 1, True)
    h = c1["out"][mine]
    assert _same(c2["a"][mine], torch.nn.functional.silu(h[:, :inter]) * h[:, inter:])
    rows = c2["out"].view(T, top_k, H)
    if masked:
        assert _same(y, torch.sum(rows.masked_fill(~mine.view(T, top_k, 1), 0), dim=1))
    else:
        assert not c2["c_in"].any(), "vLLM zeroes the second GEMM's output under expert parallelism"
        assert not c2["out"][~mine].any() and _same(y, torch.sum(rows, dim=1))


@pytest.mark.parametrize("method", ["awq", "gptq"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_marlin_moe_expert_parallel_on_w4a16(rec, monkeypatch, method, dtype):
    """One rank under expert parallelism: vLLM's fused_marlin_moe with an expert_map, 4 local experts of 8. 0.11
    routes over all experts, marks other ranks' blocks -1 and calls the GEMMs with is_ep=True (skip those blocks);
    0.14 on routes this rank's pairs only (ignore_invalid_experts=True), with local expert ids, and zeroes the second
    GEMM's output first (0.14, 0.15) or sums only this rank's slots (0.33). Either way both GEMMs must be served by
    w4a16 with those buffers as they are, writing nothing for other ranks' pairs (check_expert_parallel; on a GPU:
    test_vllm_moe_standin_gpu.py)."""
    from vllm.scalar_type import scalar_types

    H, inter, top_k, G, T = 256, 128, 2, 64, 16
    expert_map = torch.tensor([-1, 0, -1, 1, 2, -1, 3, -1], dtype=torch.int32)  # global 8, this rank: 1, 3, 4, 6
    E, E_global = 4, expert_map.numel()
    fm = _fused_module()
    spy = AlignSpy()
    monkeypatch.setattr(fm, "moe_align_block_size", spy)
    no_gpu_queries(monkeypatch)
    is_ep = _is_ep_spy(rec, monkeypatch)
    seed = 77 + (method == "gptq") + 2 * (dtype == torch.bfloat16)
    qw13, qz13, s13 = _experts(method, E, H, 2 * inter, G, dtype, seed)
    qw2, qz2, s2 = _experts(method, E, inter, H, G, dtype, seed + 1)
    w13, sc13, z13 = _vllm_process(method, qw13, qz13, s13, H, 2 * inter, G)
    w2, sc2, z2 = _vllm_process(method, qw2, qz2, s2, inter, H, G)
    x = torch.randn(T, H).to(dtype)
    topk_weights, topk_ids = torch.topk(torch.softmax(torch.randn(T, E_global), dim=-1), top_k, dim=-1)
    topk_ids = topk_ids.to(torch.int32)
    rec.calls.clear()
    extra = {"gating_output": None} if "gating_output" in inspect.signature(fm.fused_marlin_moe).parameters else {}
    with cpu_kernels():  # 0.33 sums the top_k rows with vLLM's moe_sum under expert parallelism
        y = fm.fused_marlin_moe(
            x,
            w13,
            w2,
            None,
            None,
            sc13,
            sc2,
            topk_weights=topk_weights,
            topk_ids=topk_ids,
            quant_type_id=(scalar_types.uint4 if method == "awq" else scalar_types.uint4b8).id,
            global_num_experts=E_global,
            activation_func=_silu_and_mul,
            expert_map=expert_map,
            w1_zeros=z13,
            w2_zeros=z2,
            workspace=torch.zeros(256, dtype=torch.int32),
            **extra,
        )

    assert is_ep == ([True, True] if _routes_all_experts() else [None, None])
    wants = (_want(method, qw13, qz13, s13, H, 2 * inter, G), _want(method, qw2, qz2, s2, inter, H, G))
    check_expert_parallel(rec, spy, x, topk_weights, topk_ids, expert_map, wants, y)


# ---------------------------------------------------------------------------------------------- what stays on vLLM
def _moe_args(dtype=torch.float16, type_name="uint4", block=16, K=256, N=128, **over):
    """A call of this vLLM's MoE GEMM op (E = 4, T = 3, top_k = 2), its arguments in the order of its schema."""
    from vllm.scalar_type import scalar_types

    E, T, top_k = 4, 3, 2
    topk_ids = torch.tensor([[0, 1], [1, 2], [3, 0]], dtype=torch.int32)
    sorted_ids, expert_ids, npp = align_cpu(topk_ids, block, E)
    e = torch.empty(0, dtype=torch.int32)
    v = dict(
        a=torch.randn(T, K).to(dtype),
        c_or_none=None,
        b_q_weight=torch.zeros(E, K // 16, 2 * N, dtype=torch.int32),
        b_bias_or_none=None,
        b_scales=torch.ones(E, K // 128, N).to(dtype),
        a_scales=None,
        global_scale=None,
        b_zeros_or_none=torch.zeros(E, K // 128, N // 8, dtype=torch.int32),
        g_idx_or_none=e,
        perm_or_none=e,
        workspace=torch.zeros(128, dtype=torch.int32),
        sorted_token_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_past_padded=npp,
        topk_weights=torch.rand(T, top_k),
        moe_block_size=block,
        top_k=top_k,
        mul_topk_weights=False,
        b_type_id=getattr(scalar_types, type_name).id,
        b_q_type_id=getattr(scalar_types, type_name).id,  # 0.11's name
        is_ep=False,  # 0.11
        size_m=T,
        size_n=N,
        size_k=K,
        is_full_k=True,
        use_atomic_add=False,
        use_fp32_reduce=True,
        is_zp_float=False,
        thread_k=-1,
        thread_n=-1,
        blocks_per_sm=-1,
    )
    v.update(over)
    names = GEN.arg_names(MOE)
    assert not set(over) - set(names), "argument not in this vLLM's schema"
    return tuple(v[n] for n in names)


def test_supported_moe_call_is_served(rec):
    out = _moe_op()(*_moe_args())
    (c,) = rec.named("moe_gemm")
    assert _same(out, c[1]["out"]) and rec.adapter.fell_back == {}


def test_expert_parallel_call_is_served(rec, monkeypatch):
    """A call whose routing holds blocks of other ranks' experts (expert id -1; with is_ep=True where the schema has
    it, 0.11) is served, the routing buffers reaching w4a16 as they are."""
    topk_ids = torch.tensor([[0, 1], [1, 2], [3, 0]], dtype=torch.int32)
    expert_map = torch.tensor([0, -1, 1, -1], dtype=torch.int32)  # this rank holds experts 0 and 2
    sorted_ids, expert_ids, npp = align_cpu(topk_ids, 16, 4, expert_map)
    assert (expert_ids[: int(npp) // 16] == -1).any()
    K, N, E = 256, 128, 2
    over = dict(
        sorted_token_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_past_padded=npp,
        b_q_weight=torch.zeros(E, K // 16, 2 * N, dtype=torch.int32),
        b_scales=torch.ones(E, K // 128, N).half(),
        b_zeros_or_none=torch.zeros(E, K // 128, N // 8, dtype=torch.int32),
    )
    if "is_ep" in GEN.arg_names(MOE):
        over["is_ep"] = True
    is_ep = _is_ep_spy(rec, monkeypatch)
    out = _moe_op()(*_moe_args(**over))
    (c,) = rec.named("moe_gemm")
    assert _same(out, c[1]["out"]) and rec.adapter.fell_back == {} and c[1]["expert_ids"] is expert_ids
    assert is_ep == [over.get("is_ep")]


_CASES = {
    "a_scales": dict(a_scales=torch.ones(3)),
    "global_scale": dict(global_scale=torch.ones(1)),
    "uint8b128": dict(type_name="uint8b128", b_zeros_or_none=None),
    "uint4 without zero points": dict(b_zeros_or_none=None),
    "is_zp_float": dict(is_zp_float=True),
    "fp32": dict(dtype=torch.float32),
    "block 128": dict(block=128),
    "K=96": dict(
        K=96,
        b_q_weight=torch.zeros(4, 6, 256, dtype=torch.int32),
        b_scales=torch.ones(4, 1, 128).half(),
        b_zeros_or_none=torch.zeros(4, 1, 16, dtype=torch.int32),
    ),
    "act-order": dict(
        g_idx_or_none=torch.zeros(4, 256, dtype=torch.int32),
        perm_or_none=torch.arange(256, dtype=torch.int32).repeat(4, 1),
    ),
    "is_full_k=False": dict(is_full_k=False),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_unsupported_moe_goes_to_vllms_kernel(rec, case):
    kw = _CASES[case]
    if any(k in ("g_idx_or_none", "is_full_k") for k in kw) and "is_full_k" not in GEN.arg_names(MOE):
        pytest.skip("this vLLM's MoE GEMM takes no act-order arguments")
    if "a_scales" in kw and "a_scales" not in GEN.arg_names(MOE):
        pytest.skip("this vLLM's MoE GEMM takes no activation scales")
    with pytest.raises(NotImplementedError, match=f"_moe_C::{MOE}"):  # vLLM's own (CUDA) kernel was reached
        _moe_op()(*_moe_args(**kw))
    assert rec.named("moe_gemm") == [] and rec.adapter.fell_back == {MOE: 1}


def test_w4a16_refusal_goes_to_vllms_kernel(rec, monkeypatch):
    """A call w4a16 itself rejects (here: its shape check) runs on vLLM's kernel instead."""
    import w4a16.moe

    def refuse(*a, **k):
        raise ValueError("w4a16: b_scales must be [E, K/G, N]")

    monkeypatch.setattr(w4a16.moe, "_grouped", refuse)
    with pytest.raises(NotImplementedError, match=f"_moe_C::{MOE}"):
        _moe_op()(*_moe_args())
    assert rec.adapter.fell_back == {MOE: 1} and rec.adapter.served.get(MOE) is None


def test_w4a16_device_failure_is_raised_not_hidden(rec, monkeypatch):
    """A launch or CUDA failure is not a refusal: vLLM's kernel would run on a broken context and hide it."""
    import w4a16
    import w4a16.moe

    def fail(status):
        def grouped(*a, **k):
            raise w4a16.W4A16Error(status, "simulated", "w4a16_moe_marlin_gemm")

        return grouped

    for status in (24, 25, 40):  # W4A16_ERR_CUDA, _LAUNCH_FAILED, _INTERNAL
        monkeypatch.setattr(w4a16.moe, "_grouped", fail(status))
        with pytest.raises(w4a16.W4A16Error) as e:
            _moe_op()(*_moe_args())
        assert e.value.status == status
    assert rec.adapter.fell_back == {}
    monkeypatch.setattr(w4a16.moe, "_grouped", fail(3))  # W4A16_ERR_INVALID_SHAPE: a refusal
    with pytest.raises(NotImplementedError, match=f"_moe_C::{MOE}"):
        _moe_op()(*_moe_args())
    assert rec.adapter.fell_back == {MOE: 1}


def test_uninstall_restores_vllms_moe_kernel(rec):
    adapter_mod.uninstall()
    with pytest.raises(NotImplementedError, match=f"_moe_C::{MOE}"):
        _moe_op()(*_moe_args())
    assert rec.named("moe_gemm") == []


def test_moe_op_compiles_fullgraph(rec):
    """torch.compile traces vLLM's MoE op with its fake implementation; the compiled graph reaches w4a16."""
    import vllm._custom_ops as ops

    fake = getattr(ops, "moe_wna16_marlin_gemm_fake", None)
    if fake is not None and len(inspect.signature(fake).parameters) != len(GEN.arg_names(MOE)):
        pytest.skip(
            f"vLLM {VERSION}'s own fake implementation of {MOE} does not take its schema's arguments, so "
            "torch.compile cannot trace the op on any kernel"
        )
    args = _moe_args()
    fn = torch.compile(lambda a: _moe_op()(a, *args[1:]), fullgraph=True, backend="aot_eager")
    out = fn(args[0])
    (c,) = rec.named("moe_gemm")
    assert _same(out, c[1]["out"]) and _same(c[1]["a"], args[0])
