"""The vLLM adapter's MoE GEMM on a GPU, against stand-ins defined from the recorded real schemas (vLLM is not installed
on the GPU machine; tests/engines/test_vllm_moe.py runs the adapter under the real vLLM's fused_marlin_moe on CPU).

For each recorded vLLM release whose MoE schema the adapter serves, the dense ops and `moe_wna16_marlin_gemm` are
defined in a namespace of their own with the recorded schemas; their CUDA kernels (the "vLLM kernels") only record
that they were called. The adapter installs over them, and an expert layer is run the way vLLM's fused_marlin_moe
runs it (vLLM-sized routing buffers, poisoned intermediate caches passed as c_or_none, the Marlin-ordered bias,
mul_topk_weights on the second GEMM); the output must match an fp32 reference computed per expert from the
checkpoint tensors. Under expert parallelism (vLLM 0.11's is_ep=True), the blocks of other ranks' experts (id -1) must
be skipped with nothing written for them; from 0.14 on (routing of this rank's pairs only, local expert ids) the rows
of the dropped pairs must stay as they were."""

import glob
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU: the vLLM MoE stand-in tests run on a GPU machine", allow_module_level=True)

import w4a16.moe as moe  # noqa: E402
from w4a16 import formats  # noqa: E402
from w4a16.engines import _common  # noqa: E402
from w4a16.engines import vllm as adapter_mod  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECORDS = [
    r
    for r in sorted(glob.glob(os.path.join(ROOT, "tests", "engines", "schemas", "vllm-*.json")))
    if (g := adapter_mod.generation_named(json.load(open(r))["version"])) is not None and g.moe is not None
]
MOE = adapter_mod.Generation.MOE
_libs = []


class StandIn:
    def __init__(self, record, tag):
        self.gen = adapter_mod.generation_named(record["version"])
        self.ns, self.moe_ns, self.calls = f"w4a16_msi_{tag}", f"w4a16_msi_moe_{tag}", []
        for ns, ops in ((self.ns, self.gen.schemas), (self.moe_ns, {MOE: None})):
            lib = torch.library.Library(ns, "DEF")
            _libs.append(lib)
            for name in ops:
                prefix = "_moe_C::" if ns == self.moe_ns else "_C::"
                lib.define(adapter_mod.strip_alias_marks(record["ops"][prefix + name].split("::", 1)[1]))
                lib.impl(name, self._kernel(name), "CUDA")
        self.ids = record["scalar_type_ids"]
        self.names = self.gen.arg_names(MOE)

    def _kernel(self, name):
        def kernel(*args):
            self.calls.append(name)
            raise RuntimeError(f"stand-in vLLM kernel {name} reached")

        return kernel

    def moe_gemm(self, **values):
        values.setdefault("g_idx_or_none", None)
        values.setdefault("perm_or_none", None)
        values.setdefault("is_full_k", True)
        values.setdefault("is_ep", False)  # 0.11
        values.setdefault("b_q_type_id", values.get("b_type_id"))  # 0.11's name
        op = getattr(getattr(torch.ops, self.moe_ns), MOE)
        return op(*(values[n] for n in self.names))


@pytest.fixture(scope="module", params=RECORDS, ids=[os.path.basename(r)[:-5] for r in RECORDS])
def env(request):
    record = json.load(open(request.param))
    s = StandIn(record, record["version"].replace(".", "_"))
    adapter_mod.uninstall()
    a = adapter_mod.install(
        record["version"],
        namespace=s.ns,
        moe_namespace=s.moe_ns,
        type_ids={"uint4": s.ids["uint4"], "uint4b8": s.ids["uint4b8"]},
    )
    assert a is not None and a.serves_moe
    s.adapter = a
    yield s
    adapter_mod.uninstall()


def _experts(kind, E, K, N, G, dtype, rng):
    """Per-expert checkpoints -> Marlin weight, scales, zeros (None for GPTQ) on the GPU, and fp32 weights [E, K, N]."""
    ws, ss, zs, ref = [], [], [], []
    for _ in range(E):
        if kind == "awq":
            qw, qz, s = formats.awq_quantize(rng.standard_normal((K, N)).astype(np.float32) * 0.05, G)
            s = torch.from_numpy(s.astype(np.float32)).to(dtype).float().numpy()  # the scales as the layer has them
            ws.append(formats.marlin_repack_awq(qw))
            zs.append(formats.awq_to_marlin_zero_points(qz, K // G, N))
            ref.append(formats.awq_dequantize(qw, qz, s, G))
        else:
            q = rng.integers(0, 16, size=(K, N), dtype=np.uint8)
            s = torch.from_numpy(rng.random((K // G, N)).astype(np.float32) * 0.01 + 0.002).to(dtype).float().numpy()
            ws.append(formats.marlin_repack_gptq(formats.gptq_pack(q)))
            ref.append((q.astype(np.float32) - 8) * np.repeat(s, G, axis=0))
        ss.append(formats.marlin_permute_scales(s, K, N, G))
    cuda = lambda xs, dt=None: (
        torch.from_numpy(np.stack(xs)).to(dt).cuda()
        if dt
        else torch.from_numpy(  # noqa: E731
            np.stack(xs)
        ).cuda()
    )
    return cuda(ws), cuda(ss, dtype), (cuda(zs) if kind == "awq" else None), torch.from_numpy(np.stack(ref)).cuda()


@pytest.mark.parametrize("kind", ["awq", "gptq"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T,E,bias", [(3, 8, True), (40, 4, False), (64, 8, True)])
def test_vllm_moe_layer_vs_fp32(env, kind, dtype, T, E, bias):
    rng = np.random.default_rng(T * 100 + E + bias)
    H, inter, top_k, G = 256, 128, 2, 64
    w13, s13, z13, r13 = _experts(kind, E, H, 2 * inter, G, dtype, rng)
    w2, s2, z2, r2 = _experts(kind, E, inter, H, G, dtype, rng)
    b13 = (torch.randn(E, 2 * inter, device="cuda") * 0.1).to(dtype) if bias else None
    b2 = (torch.randn(E, H, device="cuda") * 0.1).to(dtype) if bias else None
    x = torch.randn(T, H, device="cuda").to(dtype)
    tw, ids = torch.topk(torch.softmax(torch.randn(T, E, device="cuda"), -1), top_k, dim=-1)
    ids = ids.to(torch.int32)

    # vLLM's fused_marlin_moe: its block size choice, its buffer sizes, the routing, the two GEMMs on its caches
    block = next((b for b in (8, 16, 32, 48) if T * top_k / E / b < 0.9), 64)
    cap = min(ids.numel() * block, ids.numel() + E * (block - 1))
    # vLLM's routing kernel stands in as w4a16's (same output); the GEMMs get buffers of vLLM's sizes, views of
    # w4a16's, whose capacity rule rounds up to the block size
    wcap, wblocks = moe.align_sizes(T, top_k, E, block)
    sorted_full = torch.empty(max(cap, wcap), dtype=torch.int32, device="cuda")
    expert_full = torch.empty(max((cap + block - 1) // block, wblocks), dtype=torch.int32, device="cuda")
    npp = torch.empty(1, dtype=torch.int32, device="cuda")
    moe.moe_align_block_size(ids, E, block, sorted_full, expert_full, npp)
    sorted_ids, expert_ids = sorted_full[:cap], expert_full[: (cap + block - 1) // block]
    assert int(npp) <= cap
    cache13 = torch.full((T * top_k * max(2 * inter, H),), float("nan"), device="cuda", dtype=dtype)
    type_id = env.ids["uint4" if kind == "awq" else "uint4b8"]
    common = dict(
        a_scales=None,
        global_scale=None,
        workspace=torch.zeros(64, dtype=torch.int32, device="cuda"),
        sorted_token_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_past_padded=npp,
        topk_weights=tw,
        moe_block_size=block,
        b_type_id=type_id,
        use_atomic_add=False,
        use_fp32_reduce=True,
        is_zp_float=False,
        thread_k=-1,
        thread_n=-1,
        blocks_per_sm=-1,
    )
    perm_bias = lambda b: None if b is None else _common.marlin_bias_unpermute(b)  # the order is its own inverse
    c1 = cache13[: T * top_k * 2 * inter].view(T * top_k, 2 * inter)
    h = env.moe_gemm(
        a=x,
        c_or_none=c1,
        b_q_weight=w13,
        b_bias_or_none=perm_bias(b13),
        b_scales=s13,
        b_zeros_or_none=z13,
        top_k=top_k,
        mul_topk_weights=False,
        size_m=T,
        size_n=2 * inter,
        size_k=H,
        **common,
    )
    assert h.data_ptr() == c1.data_ptr() and not torch.isnan(h).any(), "every pair's row written in place"
    act = (torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]).contiguous()
    c3 = cache13[: T * top_k * H].view(T * top_k, H)
    c3.fill_(float("nan"))
    y = env.moe_gemm(
        a=act,
        c_or_none=c3,
        b_q_weight=w2,
        b_bias_or_none=perm_bias(b2),
        b_scales=s2,
        b_zeros_or_none=z2,
        top_k=1,
        mul_topk_weights=True,
        size_m=T * top_k,
        size_n=H,
        size_k=inter,
        **common,
    )
    out = y.view(T, top_k, H).sum(dim=1)
    torch.cuda.synchronize()
    assert env.calls == [] and env.adapter.fell_back.get(MOE) is None

    # fp32 reference per expert, from the checkpoint tensors (the intermediate rounded to dtype, as the layer does)
    xf, ref = x.float(), torch.zeros(T, H, device="cuda")
    for t in range(T):
        for k in range(top_k):
            e = int(ids[t, k])
            g = xf[t] @ r13[e] + (b13[e].float() if bias else 0)
            a = (torch.nn.functional.silu(g[:inter]) * g[inter:]).to(dtype).float()
            ref[t] += tw[t, k] * (a @ r2[e] + (b2[e].float() if bias else 0))
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < 2e-2, err


@pytest.mark.parametrize("kind", ["awq", "gptq"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_vllm_moe_expert_parallel_vs_fp32(env, kind, dtype):
    """One rank of expert parallelism as vLLM 0.11 runs it: routed over all 8 experts, the blocks' experts mapped
    through expert_map (-1: another rank's), the GEMMs called with is_ep=True and the second one's output zeroed first.
    Rows of the other ranks' pairs must stay as they were (poison after the first GEMM, zero after the second) and the
    layer must match an fp32 reference over this rank's experts."""
    rng = np.random.default_rng(4242 + (kind == "gptq") + 2 * (dtype == torch.bfloat16))
    H, inter, top_k, G, T = 256, 128, 2, 64, 24
    expert_map = torch.tensor([-1, 0, -1, 1, 2, -1, 3, -1], dtype=torch.int32, device="cuda")  # this rank: 1, 3, 4, 6
    E, E_global = 4, expert_map.numel()
    w13, s13, z13, r13 = _experts(kind, E, H, 2 * inter, G, dtype, rng)
    w2, s2, z2, r2 = _experts(kind, E, inter, H, G, dtype, rng)
    x = torch.randn(T, H, device="cuda").to(dtype)
    tw, ids = torch.topk(torch.softmax(torch.randn(T, E_global, device="cuda"), -1), top_k, dim=-1)
    ids = ids.to(torch.int32)
    local = expert_map[ids.long()]  # [T, top_k]: the pair's expert on this rank, -1 elsewhere
    assert (local >= 0).any() and (local < 0).any()

    block = next((b for b in (8, 16, 32, 48) if T * top_k / E / b < 0.9), 64)
    cap = ids.numel() + E_global * (block - 1)  # 0.11's buffer sizes
    wcap, wblocks = moe.align_sizes(T, top_k, E_global, block)
    sorted_full = torch.empty(max(cap, wcap), dtype=torch.int32, device="cuda")
    expert_full = torch.full((max((cap + block - 1) // block, wblocks),), -1, dtype=torch.int32, device="cuda")
    npp = torch.empty(1, dtype=torch.int32, device="cuda")
    moe.moe_align_block_size(ids, E_global, block, sorted_full, expert_full, npp)
    sorted_ids, expert_ids = sorted_full[:cap], expert_full[: (cap + block - 1) // block]
    routed = (expert_ids >= 0) & (expert_ids < E_global)
    expert_ids = torch.where(routed, expert_map[torch.where(routed, expert_ids, 0).long()], -1).to(torch.int32)
    common = dict(
        a_scales=None,
        global_scale=None,
        workspace=torch.zeros(64, dtype=torch.int32, device="cuda"),
        sorted_token_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_past_padded=npp,
        topk_weights=tw,
        moe_block_size=block,
        b_type_id=env.ids["uint4" if kind == "awq" else "uint4b8"],
        is_ep=True,
        use_atomic_add=False,
        use_fp32_reduce=True,
        is_zp_float=False,
        thread_k=-1,
        thread_n=-1,
        blocks_per_sm=-1,
    )
    c1 = torch.full((T * top_k, 2 * inter), float("nan"), device="cuda", dtype=dtype)
    h = env.moe_gemm(
        a=x,
        c_or_none=c1,
        b_q_weight=w13,
        b_bias_or_none=None,
        b_scales=s13,
        b_zeros_or_none=z13,
        top_k=top_k,
        mul_topk_weights=False,
        size_m=T,
        size_n=2 * inter,
        size_k=H,
        **common,
    )
    mine = (local >= 0).view(-1)
    assert h.data_ptr() == c1.data_ptr()
    assert not torch.isnan(h[mine]).any(), "every pair of this rank's experts written"
    assert torch.isnan(h[~mine]).all(), "nothing written for other ranks' pairs"
    act = (torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]).contiguous()
    c3 = torch.zeros(T * top_k, H, device="cuda", dtype=dtype)  # vLLM zeroes the output under expert parallelism
    y = env.moe_gemm(
        a=act,
        c_or_none=c3,
        b_q_weight=w2,
        b_bias_or_none=None,
        b_scales=s2,
        b_zeros_or_none=z2,
        top_k=1,
        mul_topk_weights=True,
        size_m=T * top_k,
        size_n=H,
        size_k=inter,
        **common,
    )
    torch.cuda.synchronize()
    assert env.calls == [] and env.adapter.fell_back.get(MOE) is None
    assert torch.equal(y[~mine], torch.zeros_like(y[~mine])) and not torch.isnan(y).any()
    out = y.view(T, top_k, H).sum(dim=1)

    xf, ref = x.float(), torch.zeros(T, H, device="cuda")
    for t in range(T):
        for k in range(top_k):
            e = int(local[t, k])
            if e < 0:
                continue
            g = xf[t] @ r13[e]
            a = (torch.nn.functional.silu(g[:inter]) * g[inter:]).to(dtype).float()
            ref[t] += tw[t, k] * (a @ r2[e])
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < 2e-2, err


@pytest.mark.parametrize("kind", ["awq", "gptq"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("output", ["zeroed", "stale"])
def test_vllm_moe_expert_parallel_local_ids_vs_fp32(env, kind, dtype, output):
    """One rank of expert parallelism as vLLM runs it from 0.14 on (no is_ep): the routing drops the pairs of other
    ranks' experts (moe_align_block_size with expert_map and ignore_invalid_experts=True), so the blocks hold this
    rank's pairs only, under local expert ids 0..3, and no block is -1. The second GEMM's output is zeroed first and
    every top_k row summed (0.14, 0.15: "zeroed"), or left as it was and only this rank's slots summed (0.33: "stale").
    Either way the rows of the dropped pairs must stay as they were (poison after the first GEMM, zero or poison after
    the second) and the layer must match an fp32 reference over this rank's experts."""
    if "is_ep" in env.names:
        pytest.skip("0.11 routes over all experts, other ranks' blocks -1: test_vllm_moe_expert_parallel_vs_fp32")
    rng = np.random.default_rng(4343 + (kind == "gptq") + 2 * (dtype == torch.bfloat16) + 4 * (output == "stale"))
    H, inter, top_k, G, T = 256, 128, 2, 64, 24
    expert_map = torch.tensor([-1, 0, -1, 1, 2, -1, 3, -1], dtype=torch.int32, device="cuda")  # this rank: 1, 3, 4, 6
    E, E_global = 4, expert_map.numel()
    w13, s13, z13, r13 = _experts(kind, E, H, 2 * inter, G, dtype, rng)
    w2, s2, z2, r2 = _experts(kind, E, inter, H, G, dtype, rng)
    x = torch.randn(T, H, device="cuda").to(dtype)
    tw, ids = torch.topk(torch.softmax(torch.randn(T, E_global, device="cuda"), -1), top_k, dim=-1)
    ids = ids.to(torch.int32)
    local = expert_map[ids.long()]  # [T, top_k]: the pair's expert on this rank, -1 elsewhere
    mine = (local >= 0).view(-1)
    assert mine.any() and (~mine).any()

    # vLLM's buffer sizes for the global expert count; the routing of the local expert ids, other ranks' pairs
    # dropped (w4a16's routing drops expert numbers outside [0, E), as vLLM's does with ignore_invalid_experts)
    block = next((b for b in (8, 16, 32, 48) if T * top_k / E / b < 0.9), 64)
    cap = ids.numel() + E_global * (block - 1)
    wcap, wblocks = moe.align_sizes(T, top_k, E_global, block)
    sorted_full = torch.empty(max(cap, wcap), dtype=torch.int32, device="cuda")
    expert_full = torch.empty(max((cap + block - 1) // block, wblocks), dtype=torch.int32, device="cuda")
    npp = torch.empty(1, dtype=torch.int32, device="cuda")
    moe.moe_align_block_size(local.to(torch.int32).contiguous(), E_global, block, sorted_full, expert_full, npp)
    sorted_ids, expert_ids = sorted_full[:cap], expert_full[: (cap + block - 1) // block]
    blocks = int(npp) // block
    routed = sorted_ids[: blocks * block].long()
    assert ((expert_ids[:blocks] >= 0) & (expert_ids[:blocks] < E)).all(), "local expert ids only, no -1 block"
    assert torch.equal(torch.sort(routed[routed < T * top_k]).values, mine.nonzero().flatten()), "this rank's pairs"
    common = dict(
        a_scales=None,
        global_scale=None,
        workspace=torch.zeros(64, dtype=torch.int32, device="cuda"),
        sorted_token_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_past_padded=npp,
        topk_weights=tw,
        moe_block_size=block,
        b_type_id=env.ids["uint4" if kind == "awq" else "uint4b8"],
        use_atomic_add=False,
        use_fp32_reduce=True,
        is_zp_float=False,
        thread_k=-1,
        thread_n=-1,
        blocks_per_sm=-1,
    )
    c1 = torch.full((T * top_k, 2 * inter), float("nan"), device="cuda", dtype=dtype)
    h = env.moe_gemm(
        a=x,
        c_or_none=c1,
        b_q_weight=w13,
        b_bias_or_none=None,
        b_scales=s13,
        b_zeros_or_none=z13,
        top_k=top_k,
        mul_topk_weights=False,
        size_m=T,
        size_n=2 * inter,
        size_k=H,
        **common,
    )
    assert h.data_ptr() == c1.data_ptr()
    assert not torch.isnan(h[mine]).any(), "every pair of this rank's experts written"
    assert torch.isnan(h[~mine]).all(), "nothing written for the dropped pairs"
    act = (torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]).contiguous()
    fill = 0.0 if output == "zeroed" else float("nan")
    c3 = torch.full((T * top_k, H), fill, device="cuda", dtype=dtype)
    y = env.moe_gemm(
        a=act,
        c_or_none=c3,
        b_q_weight=w2,
        b_bias_or_none=None,
        b_scales=s2,
        b_zeros_or_none=z2,
        top_k=1,
        mul_topk_weights=True,
        size_m=T * top_k,
        size_n=H,
        size_k=inter,
        **common,
    )
    torch.cuda.synchronize()
    assert env.calls == [] and env.adapter.fell_back.get(MOE) is None
    assert y.data_ptr() == c3.data_ptr() and not torch.isnan(y[mine]).any()
    if output == "zeroed":
        assert torch.equal(y[~mine], torch.zeros_like(y[~mine])), "the dropped pairs' rows stay zero"
        out = y.view(T, top_k, H).sum(dim=1)
    else:
        assert torch.isnan(y[~mine]).all(), "nothing written for the dropped pairs"
        out = torch.where(mine.view(T, top_k, 1), y.view(T, top_k, H), 0).sum(dim=1)

    xf, ref = x.float(), torch.zeros(T, H, device="cuda")
    for t in range(T):
        for k in range(top_k):
            e = int(local[t, k])
            if e < 0:
                continue
            g = xf[t] @ r13[e]
            a = (torch.nn.functional.silu(g[:inter]) * g[inter:]).to(dtype).float()
            ref[t] += tw[t, k] * (a @ r2[e])
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < 2e-2, err
