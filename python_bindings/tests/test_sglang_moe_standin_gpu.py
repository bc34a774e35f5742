"""The SGLang adapter's MoE hook on a GPU, against a stand-in of SGLang's moe_wna16_marlin_gemm generated from the
recorded signature (tests/engines/schemas/sglang-*.json "moe_params"; SGLang is not installed on the GPU machine:
tests/engines/test_sglang_moe.py runs the hook under the real SGLang's MoE layers on CPU).

An expert layer is run the way SGLang 0.5.23's fused_marlin_moe runs it: its block size choice, routing buffers in
SGLang's format (the pairs of padded tokens, routed to -1, in a first run of -1 blocks; [padded count, -1 blocks]),
intermediate caches poisoned with NaN and passed as c_or_none, the Marlin-ordered bias, mul_topk_weights and
zero_inactive_output on the second GEMM. The output must match an fp32 reference computed per expert from the
checkpoint tensors, the padded tokens' rows must be exactly zero, and the stand-in (SGLang's kernel) must never run.
The same layer is then captured in a CUDA graph (w4a16's MoE workspace created by the load-time hook) and replayed
on new inputs. Expert parallelism (is_ep=True, an expert map's routing, -1 blocks in SGLang's order or scattered)
is checked against the same kind of reference over one rank's experts."""

import json
import pathlib
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU: the SGLang MoE stand-in tests run on a GPU machine", allow_module_level=True)

import w4a16.moe as moe  # noqa: E402
from w4a16 import formats  # noqa: E402
from w4a16.engines import _common  # noqa: E402
from w4a16.engines import sglang as adapter  # noqa: E402

SCHEMA = json.loads(
    sorted((pathlib.Path(__file__).resolve().parents[2] / "tests" / "engines" / "schemas").glob("sglang-*.json"))[
        -1
    ].read_text()
)
UINT4 = types.SimpleNamespace(id=SCHEMA["scalar_type_ids"]["uint4"], name="uint4", size_bits=4)
UINT4B8 = types.SimpleNamespace(id=SCHEMA["scalar_type_ids"]["uint4b8"], name="uint4b8", size_bits=4)


class StandIn:
    """SGLang's moe_wna16_marlin_gemm with the recorded parameters; reaching it is recorded and fails the call."""

    def __init__(self):
        self.calls = []
        ns = {"_record": self.calls.append}
        params = SCHEMA["moe_params"]["moe_wna16_marlin_gemm"]
        exec(
            f"def moe_wna16_marlin_gemm({params}):\n    _record(1)\n    raise RuntimeError('SGLang kernel reached')", ns
        )
        self.fn = ns["moe_wna16_marlin_gemm"]
        self.hooks = adapter.make_moe_hooks(UINT4.id, UINT4B8.id, self.fn)

    def gemm(self, **kw):
        return self.hooks["moe_wna16_marlin_gemm"](self.fn, **kw)


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.setattr(adapter, "_state", {"act_order_whole": True, "act_order_groups": set(), "logged": set()})
    return StandIn()


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
    w = torch.from_numpy(np.stack(ws)).cuda()
    sc = torch.from_numpy(np.stack(ss)).to(dtype).cuda()
    z = torch.from_numpy(np.stack(zs)).cuda() if kind == "awq" else None
    return w, sc, z, torch.from_numpy(np.stack(ref)).cuda()


def sglang_routing(topk_ids, block, E, prefix_count=True):
    """SGLang's moe_align_block_size output (its buffer sizes; -1 pairs first, then each expert's, each run padded to
    a multiple of block with the pair count; [padded count, -1 blocks], or [padded count] where prefix_count is False
    as under expert parallelism), the tails past the runs poisoned (SGLang leaves them unwritten)."""
    ids = topk_ids.cpu()
    numel = ids.numel()
    cap = numel * block if numel < E + 1 else numel + (E + 1) * (block - 1)
    cap = (cap + 3) // 4 * 4
    sorted_ids = torch.zeros(cap, dtype=torch.int32)  # tail: row 0 (must not be read)
    expert_ids = torch.full(((cap + block - 1) // block,), -1, dtype=torch.int32)
    flat, pos, inactive = ids.flatten(), 0, 0
    for e in [-1] + list(range(E)):
        idx = ((flat < 0) if e < 0 else (flat == e)).nonzero().flatten().to(torch.int32)
        if idx.numel():
            nb = (idx.numel() + block - 1) // block
            sorted_ids[pos : pos + nb * block] = numel
            sorted_ids[pos : pos + idx.numel()] = idx
            expert_ids[pos // block : pos // block + nb] = e
            inactive += nb if e < 0 else 0
            pos += nb * block
    npp = [pos, inactive] if prefix_count else [pos]
    return sorted_ids.cuda(), expert_ids.cuda(), torch.tensor(npp, dtype=torch.int32).cuda()


def _layer(standin, x, tw, ids, w13, s13, z13, b13, w2, s2, z2, b2, E, inter, block, routing, cache13, ep=False):
    """fused_marlin_moe's two GEMMs (SiLU-and-mul between), on SGLang's caches; returns (h, rows, out). ep: as with an
    expert map (is_ep=True, the sorted-id hints off)."""
    T, top_k = ids.shape
    H = x.shape[1]
    sorted_ids, expert_ids, npp = routing
    common = dict(
        global_scale_or_none=None,
        g_idx_or_none=None,
        perm_or_none=None,
        workspace=torch.zeros(64, dtype=torch.int32, device="cuda"),
        sorted_token_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_post_padded=npp,
        topk_weights=tw,
        moe_block_size=block,
        is_ep=ep,
        expert_ids_are_sorted=not ep,
        has_inactive_prefix_count=not ep,
        is_k_full=True,
        use_atomic_add=True,
        use_fp32_reduce=True,
        is_zp_float=False,
    )
    perm_bias = lambda b: None if b is None else _common.marlin_bias_unpermute(b)  # noqa: E731 (its own inverse)
    c1 = cache13[: T * top_k * 2 * inter].view(T * top_k, 2 * inter)
    h = standin.gemm(
        a=x,
        c_or_none=c1,
        b_q_weight=w13,
        b_bias_or_none=perm_bias(b13),
        b_scales=s13,
        b_zeros_or_none=z13,
        top_k=top_k,
        mul_topk_weights=False,
        b_q_type=UINT4 if z13 is not None else UINT4B8,
        size_m=T,
        size_n=2 * inter,
        size_k=H,
        **common,
    )
    h_copy = h.clone()
    act = (torch.nn.functional.silu(h[:, :inter].float()) * h[:, inter:].float()).to(x.dtype)
    c3 = cache13[: T * top_k * H].view(T * top_k, H)
    c3.fill_(float("nan"))
    rows = standin.gemm(
        a=act,
        c_or_none=c3,
        b_q_weight=w2,
        b_bias_or_none=perm_bias(b2),
        b_scales=s2,
        b_zeros_or_none=z2,
        top_k=1,
        mul_topk_weights=True,
        zero_inactive_output=True,
        b_q_type=UINT4 if z2 is not None else UINT4B8,
        size_m=T * top_k,
        size_n=H,
        size_k=inter,
        **common,
    )
    return h_copy, rows, rows.view(T, top_k, H).float().sum(dim=1)


def _reference(x, tw, ids, r13, r2, b13, b2, inter, dtype):
    T, top_k = ids.shape
    xf, ref = x.float(), torch.zeros(T, x.shape[1], device="cuda")
    for t in range(T):
        for k in range(top_k):
            e = int(ids[t, k])
            if e < 0:
                continue
            g = xf[t] @ r13[e] + (b13[e].float() if b13 is not None else 0)
            a = (torch.nn.functional.silu(g[:inter]) * g[inter:]).to(dtype).float()
            ref[t] += tw[t, k] * (a @ r2[e] + (b2[e].float() if b2 is not None else 0))
    return ref


def _inputs(kind, dtype, T, E, bias, seed):
    rng = np.random.default_rng(seed)
    H, inter, top_k, G = 256, 128, 2, 64
    w13, s13, z13, r13 = _experts(kind, E, H, 2 * inter, G, dtype, rng)
    w2, s2, z2, r2 = _experts(kind, E, inter, H, G, dtype, rng)
    b13 = (torch.randn(E, 2 * inter, device="cuda") * 0.1).to(dtype) if bias else None
    b2 = (torch.randn(E, H, device="cuda") * 0.1).to(dtype) if bias else None
    return H, inter, top_k, (w13, s13, z13, r13), (w2, s2, z2, r2), b13, b2


def _route(T, E, top_k, padded):
    tw, ids = torch.topk(torch.softmax(torch.randn(T, E, device="cuda"), -1), top_k, dim=-1)
    ids = ids.to(torch.int32)
    if padded:  # SGLang's CUDA-graph padding: the padded tokens' pairs routed to -1, their weights zeroed
        ids[-padded:] = -1
        tw[-padded:] = 0
    return tw, ids


@pytest.mark.parametrize("kind", ["awq", "gptq"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T,E,bias,padded", [(3, 8, True, 1), (40, 4, False, 5), (64, 8, True, 0)])
def test_sglang_moe_layer_vs_fp32(standin, kind, dtype, T, E, bias, padded):
    H, inter, top_k, (w13, s13, z13, r13), (w2, s2, z2, r2), b13, b2 = _inputs(
        kind, dtype, T, E, bias, T * 100 + E + bias
    )
    x = torch.randn(T, H, device="cuda").to(dtype)
    tw, ids = _route(T, E, top_k, padded)
    block = next((b for b in (8, 16, 32, 48) if T * top_k / E / b < 0.9), 64)  # fused_marlin_moe's choice
    routing = sglang_routing(ids, block, E)
    cache13 = torch.full((T * top_k * max(2 * inter, H),), float("nan"), device="cuda", dtype=dtype)
    h, rows, out = _layer(standin, x, tw, ids, w13, s13, z13, b13, w2, s2, z2, b2, E, inter, block, routing, cache13)
    torch.cuda.synchronize()
    assert standin.calls == [] and adapter._state.get("moe_served") == 2
    live = (ids >= 0).view(-1)
    assert not torch.isnan(h[live]).any(), "every routed pair's row written"
    assert torch.isnan(h[~live]).all(), "nothing written for pairs routed to -1 (zero_inactive_output=False)"
    assert torch.equal(rows[~live], torch.zeros_like(rows[~live])), "-1 pairs' rows zeroed (zero_inactive_output)"
    assert not torch.isnan(rows).any()
    ref = _reference(x, tw, ids, r13, r2, b13, b2, inter, dtype)
    err = ((out - ref).norm() / ref.norm()).item()
    assert err < 2e-2, err
    if padded:
        assert torch.equal(out[-padded:], torch.zeros_like(out[-padded:]))


@pytest.mark.parametrize("kind", ["awq", "gptq"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scattered", [False, True], ids=["sglang-order", "scattered"])
def test_sglang_moe_expert_parallel_vs_fp32(standin, kind, dtype, scattered):
    """One rank of expert parallelism as SGLang 0.5.23 runs it with an expert map (compressed-tensors WNA16 Marlin
    MoE): rank 1 of 2 over 8 experts; the dispatcher maps the router's ids to local ids 0..3 and the other rank's to -1;
    the routing is made over the 8 global experts (-1 blocks, one-word padded count) and both GEMMs get is_ep=True with
    the sorted hints off. SGLang's kernel skips the -1 blocks wherever they are, so a second routing moves them between
    the others ("scattered"). Rows of the other rank's pairs: untouched (NaN) after the first GEMM, zero after the
    second (zero_inactive_output); the layer must match an fp32 reference over this rank's experts."""
    E_global, E, T = 8, 4, 24
    H, inter, top_k, (w13, s13, z13, r13), (w2, s2, z2, r2), b13, b2 = _inputs(
        kind, dtype, T, E, True, 5150 + (kind == "gptq") + 2 * (dtype == torch.bfloat16) + 4 * scattered
    )
    x = torch.randn(T, H, device="cuda").to(dtype)
    tw, global_ids = _route(T, E_global, top_k, 0)
    mapping = torch.full((E_global,), -1, dtype=torch.int32, device="cuda")
    mapping[E:] = torch.arange(E, dtype=torch.int32, device="cuda")  # rank 1: global experts 4..7
    ids = torch.where(global_ids < 0, -1, mapping[global_ids.clamp_min(0).long()])  # the dispatcher's mapping
    assert (ids >= 0).any() and (ids < 0).any()
    block = next((b for b in (8, 16, 32, 48) if T * top_k / E / b < 0.9), 64)  # fused_marlin_moe's (E: local)
    sorted_ids, expert_ids, npp = sglang_routing(ids, block, E_global, prefix_count=False)
    if scattered:  # the same blocks in another order: -1 blocks between the experts' blocks
        nb = int(npp[0]) // block
        order = torch.roll(torch.arange(nb, device="cuda"), nb // 2)  # SGLang's -1 blocks (first) to the middle
        assert nb > 1 and int(expert_ids[order[0]]) >= 0 and (expert_ids[order[1:nb]] == -1).any()
        sorted_ids[: nb * block] = sorted_ids[: nb * block].view(nb, block)[order].flatten()
        expert_ids[:nb] = expert_ids[:nb][order]
    cache13 = torch.full((T * top_k * max(2 * inter, H),), float("nan"), device="cuda", dtype=dtype)
    routing = (sorted_ids, expert_ids, npp)
    args = (w13, s13, z13, b13, w2, s2, z2, b2, E, inter, block, routing, cache13)
    h, rows, out = _layer(standin, x, tw, ids, *args, ep=True)
    torch.cuda.synchronize()
    assert standin.calls == [] and adapter._state.get("moe_served") == 2
    mine = (ids >= 0).view(-1)
    assert not torch.isnan(h[mine]).any(), "every pair of this rank's experts written"
    assert torch.isnan(h[~mine]).all(), "nothing written for the other rank's pairs (zero_inactive_output=False)"
    assert torch.equal(rows[~mine], torch.zeros_like(rows[~mine])), "the other rank's rows zeroed"
    assert not torch.isnan(rows).any()
    ref = _reference(x, tw, ids, r13, r2, b13, b2, inter, dtype)
    err = ((out - ref).norm() / ref.norm()).item()
    assert err < 2e-2, err


@pytest.mark.parametrize("kind", ["awq", "gptq"])
def test_sglang_moe_layer_in_cuda_graph(standin, kind):
    """Decode as SGLang runs it: w4a16's MoE workspace created while the experts load (marlin_moe_permute_scales'
    hook), the layer captured in a CUDA graph, replayed on new tokens and routing: the same bits as eager calls."""
    dtype, T, E = torch.float16, 4, 8
    H, inter, top_k, (w13, s13, z13, _), (w2, s2, z2, _), b13, b2 = _inputs(kind, dtype, T, E, True, 77)
    dev = torch.device("cuda", torch.cuda.current_device())
    moe._workspaces.pop(dev.index, None)
    _common._device_ok.pop(dev.index, None)
    s_ckpt = torch.rand(E, H // 64, 2 * inter, device="cuda").to(dtype)
    out = standin.hooks["marlin_moe_permute_scales"](lambda s, *a: s.clone(), s_ckpt, H, 2 * inter, 64)
    assert torch.equal(out, s_ckpt) and dev.index in moe._workspaces, "workspace created at load time"

    block = 8
    x = torch.empty(T, H, device="cuda", dtype=dtype)
    tw = torch.empty(T, top_k, device="cuda")
    ids = torch.empty(T, top_k, device="cuda", dtype=torch.int32)
    routing = [t.clone() for t in sglang_routing(torch.zeros(T, top_k, dtype=torch.int32), block, E)]
    cache13 = torch.empty(T * top_k * max(2 * inter, H), device="cuda", dtype=dtype)
    args = (w13, s13, z13, b13, w2, s2, z2, b2, E, inter, block, routing, cache13)

    def fill(seed, padded):
        torch.manual_seed(seed)
        x.copy_(torch.randn(T, H, device="cuda").to(dtype))
        w, i = _route(T, E, top_k, padded)
        tw.copy_(w)
        ids.copy_(i)
        for dst, src in zip(routing, sglang_routing(i, block, E)):
            dst.copy_(src)

    fill(1, 0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _layer(standin, x, tw, ids, *args)  # warm-up on the side stream, as CUDA-graph capture wants
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, _, out_g = _layer(standin, x, tw, ids, *args)
    for seed, padded in ((2, 1), (3, 0), (4, 2)):
        fill(seed, padded)
        graph.replay()
        got = out_g.clone()
        _, _, want = _layer(standin, x, tw, ids, *args)
        torch.cuda.synchronize()
        assert torch.equal(got, want), (seed, padded)
        if padded:
            assert torch.equal(got[-padded:], torch.zeros_like(got[-padded:]))
    assert standin.calls == []
