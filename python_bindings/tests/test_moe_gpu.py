"""GPU tests of w4a16.moe against a torch fp32 reference (run on the GPU machine; skipped, saying why, without torch or
a CUDA GPU)."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to PyTorch", allow_module_level=True)

import w4a16.moe as moe  # noqa: E402
import w4a16.torch as wt  # noqa: E402

DTYPES = [torch.float16, torch.bfloat16]
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def unpack_awq(packed):
    """[..., R, N/8] int32 -> [..., R, N] values 0..15 (nibble i of word c is column 8c + ORDER[i])."""
    shifts = torch.arange(8, device=packed.device, dtype=torch.int32) * 4
    nib = (packed.unsqueeze(-1) >> shifts) & 0xF  # [..., N/8, 8] by nibble
    out = torch.empty_like(nib)
    out[..., AWQ_ORDER] = nib
    return out.flatten(-2)


def make_awq_experts(E, K, N, G, dtype, g):
    groups = 1 if G == -1 else K // G
    qw = torch.randint(-(2**31), 2**31 - 1, (E, K, N // 8), dtype=torch.int32, device="cuda", generator=g)
    qz = torch.randint(-(2**31), 2**31 - 1, (E, groups, N // 8), dtype=torch.int32, device="cuda", generator=g)
    s = (torch.rand((E, groups, N), device="cuda", generator=g) * 0.01 + 0.005).to(dtype)
    q, z = unpack_awq(qw).float(), unpack_awq(qz).float()
    rows = K // groups
    w = ((q - z.repeat_interleave(rows, dim=1)) * s.float().repeat_interleave(rows, dim=1)).to(dtype).float()
    return qw, qz, s, w  # w: [E, K, N] dequantised, rounded to dtype


def make_gptq_experts(E, K, N, G, dtype, g):
    groups = 1 if G == -1 else K // G
    qw = torch.randint(-(2**31), 2**31 - 1, (E, K // 8, N), dtype=torch.int32, device="cuda", generator=g)
    s = (torch.rand((E, groups, N), device="cuda", generator=g) * 0.01 + 0.005).to(dtype)
    shifts = torch.arange(8, device="cuda", dtype=torch.int32) * 4
    q = ((qw.unsqueeze(2) >> shifts.view(1, 1, 8, 1)) & 0xF).reshape(E, K, N).float()  # nibble i of row r = k 8r + i
    w = ((q - 8) * s.float().repeat_interleave(K // groups, dim=1)).to(dtype).float()
    return qw, s, w


def routing(T, top_k, E, g):
    scores = torch.rand((T, E), device="cuda", generator=g)
    tw, ids = torch.topk(torch.softmax(scores, dim=-1), top_k, dim=-1)
    return tw.float(), ids.to(torch.int32)


def reference(x, w13, w2, tw, ids):
    """fp32 MoE: sum_k tw * (silu(x W_gate) * (x W_up)) W_down, the intermediate rounded to x's dtype as the
    kernels' output is."""
    T, top_k = ids.shape
    inter = w13.shape[2] // 2
    out = torch.zeros((T, w2.shape[2]), device="cuda")
    xf = x.float()
    for t in range(T):
        for k in range(top_k):
            e = int(ids[t, k])
            if e < 0 or e >= w13.shape[0]:
                continue
            h = (xf[t] @ w13[e]).to(x.dtype).float()
            a = (torch.nn.functional.silu(h[:inter]) * h[inter:]).to(x.dtype).float()
            out[t] += tw[t, k] * (a @ w2[e])
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["marlin-awq", "marlin-gptq", "awq"])
@pytest.mark.parametrize("T,E,top_k,G", [(1, 8, 2, 128), (7, 16, 4, 64), (40, 8, 2, -1), (130, 64, 8, 32)])
def test_fused_moe_vs_fp32(dtype, kind, T, E, top_k, G):
    g = torch.Generator(device="cuda")
    g.seed()
    H, inter = 256, 128
    x = (torch.rand((T, H), device="cuda", generator=g) * 2 - 1).to(dtype)
    tw, ids = routing(T, top_k, E, g)
    if kind == "marlin-gptq":
        q13, s13, w13 = make_gptq_experts(E, H, 2 * inter, G, dtype, g)
        q2, s2, w2 = make_gptq_experts(E, inter, H, G, dtype, g)
        m13 = moe.gptq_marlin_moe_repack(q13, torch.empty(0, dtype=torch.int32, device="cuda"), H, 2 * inter, 4)
        m2 = moe.gptq_marlin_moe_repack(q2, torch.empty(0, dtype=torch.int32, device="cuda"), inter, H, 4)
        args = dict(w13_zeros=None, w2_zeros=None)
        ms13 = moe.marlin_moe_permute_scales(s13, H, 2 * inter, G)
        ms2 = moe.marlin_moe_permute_scales(s2, inter, H, G)
        out = moe.fused_moe(x, m13, m2, ms13, ms2, tw, ids, **args)
    else:
        q13, z13, s13, w13 = make_awq_experts(E, H, 2 * inter, G, dtype, g)
        q2, z2, s2, w2 = make_awq_experts(E, inter, H, G, dtype, g)
        if kind == "awq":
            out = moe.fused_moe(x, q13, q2, s13, s2, tw, ids, w13_zeros=z13, w2_zeros=z2, layout="awq")
        else:
            m13 = moe.awq_marlin_moe_repack(q13, None, H, 2 * inter, 4)
            m2 = moe.awq_marlin_moe_repack(q2, None, inter, H, 4)
            out = moe.fused_moe(
                x,
                m13,
                m2,
                moe.marlin_moe_permute_scales(s13, H, 2 * inter, G),
                moe.marlin_moe_permute_scales(s2, inter, H, G),
                tw,
                ids,
                w13_zeros=moe.moe_awq_to_marlin_zero_points(z13, z13.shape[1], 2 * inter, 4),
                w2_zeros=moe.moe_awq_to_marlin_zero_points(z2, z2.shape[1], H, 4),
            )
    ref = reference(x, w13, w2, tw, ids)
    err = rel(out, ref)
    assert out.shape == (T, H) and out.dtype == dtype
    assert torch.isfinite(out.float()).all()
    assert err < (2e-2 if dtype == torch.bfloat16 else 5e-3), err


def _layer(kind, E, H, inter, G, dtype, g):
    """Stacked w13 / w2 experts of one kind: (fused_moe's weight arguments, dense w13, dense w2)."""
    q13, z13, s13, w13 = make_awq_experts(E, H, 2 * inter, G, dtype, g)
    q2, z2, s2, w2 = make_awq_experts(E, inter, H, G, dtype, g)
    if kind == "awq":
        return (q13, q2, s13, s2), dict(w13_zeros=z13, w2_zeros=z2, layout="awq"), w13, w2
    m13 = moe.awq_marlin_moe_repack(q13, None, H, 2 * inter, 4)
    m2 = moe.awq_marlin_moe_repack(q2, None, inter, H, 4)
    ms13, ms2 = moe.marlin_moe_permute_scales(s13, H, 2 * inter, G), moe.marlin_moe_permute_scales(s2, inter, H, G)
    return (
        (m13, m2, ms13, ms2),
        dict(
            w13_zeros=moe.moe_awq_to_marlin_zero_points(z13, z13.shape[1], 2 * inter, 4),
            w2_zeros=moe.moe_awq_to_marlin_zero_points(z2, z2.shape[1], H, 4),
        ),
        w13,
        w2,
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["marlin-awq", "awq"])
@pytest.mark.parametrize("T,E,top_k,G", [(1, 8, 2, 128), (4, 16, 4, 64), (3, 32, 4, -1)])
def test_fused_moe_split_k_vs_fp32(dtype, kind, T, E, top_k, G):
    """Decode sizes with a long K (hidden 2048: the first GEMM's K is split across blocks through the workspace)."""
    g = torch.Generator(device="cuda")
    g.seed()
    H, inter = 2048, 512
    x = (torch.rand((T, H), device="cuda", generator=g) * 2 - 1).to(dtype)
    tw, ids = routing(T, top_k, E, g)
    w, kw, w13, w2 = _layer(kind, E, H, inter, G, dtype, g)
    out = moe.fused_moe(x, *w, tw, ids, **kw)
    ref = reference(x, w13, w2, tw, ids)
    assert out.shape == (T, H) and torch.isfinite(out.float()).all()
    err = rel(out, ref)
    assert err < (2e-2 if dtype == torch.bfloat16 else 5e-3), err
    ws = moe.prepare(x.device)
    torch.cuda.synchronize()
    counters = ws[: torch.cuda.get_device_properties(0).multi_processor_count * 32].view(torch.int32)
    assert int(counters.abs().sum()) == 0  # every call leaves the split-K counters zeroed


def test_fused_moe_split_k_graph_replay():
    """The split-K layer captured in a CUDA graph: every replay gives the eager result bit for bit."""
    g = torch.Generator(device="cuda")
    g.seed()
    T, E, top_k, H, inter, dtype = 2, 16, 4, 2048, 512, torch.float16
    x = (torch.rand((T, H), device="cuda", generator=g) * 2 - 1).to(dtype)
    tw, ids = routing(T, top_k, E, g)
    w, kw, _, _ = _layer("marlin-awq", E, H, inter, 128, dtype, g)
    moe.prepare(x.device)
    eager = moe.fused_moe(x, *w, tw, ids, **kw)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        moe.fused_moe(x, *w, tw, ids, **kw)  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe.fused_moe(x, *w, tw, ids, **kw)
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


def test_stacked_repack_matches_per_expert():
    g = torch.Generator(device="cuda")
    g.seed()
    E, K, N, G = 3, 256, 128, 64
    qw, qz, s, _ = make_awq_experts(E, K, N, G, torch.float16, g)
    stacked = moe.awq_marlin_moe_repack(qw, None, K, N, 4)
    zs = moe.moe_awq_to_marlin_zero_points(qz, K // G, N, 4)
    ss = moe.marlin_moe_permute_scales(s, K, N, G)
    for e in range(E):
        assert torch.equal(stacked[e], wt.awq_marlin_repack(qw[e], K, N, 4))
        assert torch.equal(zs[e], wt.awq_to_marlin_zero_points(qz[e], K // G, N, 4))
        assert torch.equal(ss[e], wt.marlin_permute_scales(s[e], K, N, G))


@pytest.mark.parametrize("newest", [True, False])
def test_vllm_signatures(newest):
    """The op with vLLM's argument lists, driven the way vLLM's fused Marlin MoE drives it (routing, first GEMM with
    top_k, second with top_k = 1 and mul_topk_weights), against the per-expert reference of each GEMM."""
    g = torch.Generator(device="cuda")
    g.seed()
    T, E, top_k, K, N, G, bs = 9, 8, 2, 256, 128, 128, 16
    dtype = torch.float16
    qw, qz, s, w = make_awq_experts(E, K, N, G, dtype, g)
    mw = moe.awq_marlin_moe_repack(qw, None, K, N, 4)
    ms = moe.marlin_moe_permute_scales(s, K, N, G)
    mz = moe.moe_awq_to_marlin_zero_points(qz, K // G, N, 4)
    tw, ids = routing(T, top_k, E, g)
    sorted_ids, expert_ids, npp = moe.align(ids, E, bs)
    x = (torch.rand((T, K), device="cuda", generator=g) * 2 - 1).to(dtype)
    ws = torch.zeros(1024, dtype=torch.int32, device="cuda")
    name, args = ("moe_wna16_marlin_gemm", 26) if newest else ("moe_wna16_marlin_gemm_v0_15", 29)
    op = getattr(moe, name)
    assert len(getattr(torch.ops.w4a16, name).default._schema.arguments) == args

    def gemm(a, rows, k, mul, g_idx=None, c=None):
        """One GEMM through the op's argument list: vLLM 0.15.1's adds g_idx, perm (after the zero points) and
        is_full_k (after size_k)."""
        head = [a, c, mw, None, ms, None, None, mz] + ([] if newest else [g_idx, None])
        mid = [ws, sorted_ids, expert_ids, npp, tw, bs, k, mul, 0, rows, N, K] + ([] if newest else [True])
        return op(*head, *mid, False, True, False, -1, -1, -1)

    out = gemm(x, T, top_k, False)
    ref = torch.stack([x[t].float() @ w[int(ids[t, k])] for t in range(T) for k in range(top_k)])
    assert rel(out, ref) < 5e-3
    # with c_or_none (poisoned): every row written into c, and the result returned is a copy (a custom op's output
    # may not alias its input), the same as without c (the GEMM is deterministic)
    c = torch.full((T * top_k, N), float("nan"), dtype=dtype, device="cuda")
    out_c = gemm(x, T, top_k, False, c=c)
    assert out_c.data_ptr() != c.data_ptr()
    assert torch.equal(c, out) and torch.equal(out_c, out)
    # second GEMM: one row per pair (A [T top_k, K]), top_k = 1, rows weighted by topk_weights
    a2 = (torch.rand((T * top_k, K), device="cuda", generator=g) * 2 - 1).to(dtype)
    out2 = gemm(a2, T * top_k, 1, True)
    flat = ids.flatten()
    ref2 = torch.stack([tw.flatten()[i] * (a2[i].float() @ w[int(flat[i])]) for i in range(T * top_k)])
    assert rel(out2, ref2) < 5e-3
    if not newest:  # act-order is refused
        with pytest.raises(NotImplementedError):
            gemm(x, T, top_k, False, g_idx=torch.arange(K, device="cuda"))
