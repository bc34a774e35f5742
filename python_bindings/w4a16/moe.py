"""Mixture-of-experts ops over libw4a16 (w4a16.h, "mixture of experts"): the routing, the grouped int4 GEMMs with
vLLM's `moe_wna16_marlin_gemm` argument lists, the stacked-expert repack ops, and `fused_moe`, a whole expert layer
(GEMM -> SiLU-and-mul -> GEMM -> weighted sum over top-k) usable without vLLM.

All ops are torch custom ops with fake implementations (torch.compile traces them, CUDA graphs capture them), run on
the current CUDA stream, allocate their outputs with torch and nothing else, except that the grouped GEMMs use one
zero-initialised split-K workspace per device (a few MB, allocated on first use: call `prepare()` before capturing a
CUDA graph). Ops that share a device's workspace must not run concurrently on different streams.

Weights are stacked per expert: Marlin layout weight [E, K/16, 2N], scales [E, K/G, N] (Marlin-permuted), zero points
[E, K/G, N/8] (AWQ) or None (symmetric GPTQ); or the AWQ checkpoint layout qweight [E, K, N/8], scales [E, K/G, N],
qzeros [E, K/G, N/8]. For fused_moe, w13 holds the gate and up projections stacked along N (N = 2 I, gate first)
and w2 the down projection (K = I)."""

from typing import Optional

import torch
from torch import Tensor

from . import _checks_torch as ct
from . import _moe_lib as raw
from ._moe_lib import align_sizes  # noqa: F401 (re-exported)
from .torch import _DT, _stream, _workspace

_workspaces = {}
_I32 = torch.int32
_IN_CAPTURE = (
    "w4a16: the MoE workspace of cuda:%d does not exist yet; call w4a16.moe.prepare() (or run the layer once) "
    "before capturing a CUDA graph"
)


def _check(op, cond, msg):
    if not cond:
        ct._fail(op, msg)


def _ptr(t):
    return t.data_ptr() if t is not None else 0


def prepare(device=None):
    """Allocate (once) and return the zeroed MoE workspace of `device` (default: current CUDA device)."""
    return _workspace(_workspaces, raw.workspace_size, device, _IN_CAPTURE)


def choose_block_size(num_tokens, top_k, num_experts):
    """Routing block size for a layer: the smallest of 16 / 32 / 64 that the average expert's pairs fill to less than
    90% (at an average of exactly one block, about half the experts spill into a second, nearly empty block)."""
    avg = num_tokens * top_k / num_experts
    return 16 if avg < 0.9 * 16 else 32 if avg < 0.9 * 32 else 64


# ---------------------------------------------------------------- routing
@torch.library.custom_op(
    "w4a16::moe_align_block_size", mutates_args=("sorted_token_ids", "experts_ids", "num_tokens_post_pad")
)
def moe_align_block_size(
    topk_ids: Tensor,
    num_experts: int,
    block_size: int,
    sorted_token_ids: Tensor,
    experts_ids: Tensor,
    num_tokens_post_pad: Tensor,
) -> None:
    """vLLM's moe_align_block_size: topk_ids [T, top_k] int32 -> the pair indices grouped by expert, each run padded to
    a multiple of block_size with T * top_k; the expert of each block (-1 past the runs); the padded count."""
    op = "moe_align_block_size"
    ct.tensor(op, "topk_ids", topk_ids, _I32, 2, "[num_tokens, top_k]")
    bufs = {
        "sorted_token_ids": sorted_token_ids,
        "experts_ids": experts_ids,
        "num_tokens_post_pad": num_tokens_post_pad,
    }
    for n, t in bufs.items():
        ct.tensor(op, n, t, _I32, t.dim() if isinstance(t, Tensor) else 1, "(int32)")
    ct.devices(op, {"topk_ids": topk_ids, **bufs}, dict.fromkeys(("topk_ids", *bufs), 4))
    T, k = topk_ids.shape
    with torch.cuda.device(topk_ids.device):
        raw.align_block_size(
            topk_ids.data_ptr(),
            T,
            k,
            num_experts,
            block_size,
            sorted_token_ids.data_ptr(),
            sorted_token_ids.numel(),
            experts_ids.data_ptr(),
            experts_ids.numel(),
            num_tokens_post_pad.data_ptr(),
            _stream(topk_ids),
        )


@moe_align_block_size.register_fake
def _(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids, num_tokens_post_pad):
    return None


def align(topk_ids: Tensor, num_experts: int, block_size: int):
    """Routing buffers allocated here: (sorted_token_ids, expert_ids, num_tokens_post_padded)."""
    sc, bc = align_sizes(topk_ids.shape[0], topk_ids.shape[1], num_experts, block_size)
    dev = topk_ids.device
    sorted_ids = torch.empty(sc, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(bc, dtype=torch.int32, device=dev)
    npp = torch.empty(1, dtype=torch.int32, device=dev)
    moe_align_block_size(topk_ids, num_experts, block_size, sorted_ids, expert_ids, npp)
    return sorted_ids, expert_ids, npp


# ---------------------------------------------------------------- grouped GEMMs
def _grouped(
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
    op = f"moe_{layout}_gemm"
    ct.tensor(op, "a", a, ct.FLOATS, 2, "[size_m, size_k]")
    ct.shape(op, "a", a, (size_m, size_k), "[size_m, size_k]")
    wname = "b_q_weight" if layout == "marlin" else "qweight"
    ct.tensor(op, wname, w, _I32, 3, "[E, ...]")
    E = w.shape[0]
    if layout == "marlin":
        ct.shape(op, wname, w, (E, size_k // 16, 2 * size_n), "[E, size_k/16, 2 size_n]")
    else:
        ct.shape(op, wname, w, (E, size_k, size_n // 8), "[E, size_k, size_n/8]")
    ct.tensor(op, "b_scales", scales, a.dtype, 3, "[E, K/G, N]")
    groups = scales.shape[1]
    G = ct.group_from_rows(op, "b_scales", groups, size_k)
    ct.shape(op, "b_scales", scales, (E, groups, size_n), "[E, K/G, N]")
    routing = {"sorted_token_ids": sorted_ids, "expert_ids": expert_ids, "num_tokens_past_padded": npp}
    for n, t in routing.items():
        ct.tensor(op, n, t, _I32, t.dim() if isinstance(t, Tensor) else 1, "(int32)")
    if zeros is not None:
        ct.tensor(op, "b_zeros", zeros, _I32, 3, "[E, K/G, N/8]")
        ct.shape(op, "b_zeros", zeros, (E, groups, size_n // 8), "[E, K/G, N/8]")
    if bias is not None:
        ct.tensor(op, "b_bias", bias, a.dtype, 2, "[E, size_n]")
        ct.shape(op, "b_bias", bias, (E, size_n), "[E, size_n]")
    tw = None
    if mul_topk_weights:
        _check(op, topk_weights is not None, "mul_topk_weights needs topk_weights")
        ct.tensor(op, "topk_weights", topk_weights, torch.float32, topk_weights.dim(), "[size_m, top_k]")
        _check(op, topk_weights.numel() == size_m * top_k, "topk_weights must have size_m * top_k entries")
        tw = topk_weights
    if c is not None:
        ct.tensor(op, "c", c, a.dtype, 2, "[size_m * top_k, size_n]")
        ct.shape(op, "c", c, (size_m * top_k, size_n), "[size_m * top_k, size_n]")
    small = dict.fromkeys(("b_bias", "topk_weights", *routing), 4)
    named = {"a": a, wname: w, "b_scales": scales, "b_zeros": zeros, "b_bias": bias, "topk_weights": tw, "c": c}
    ct.devices(op, {**named, **routing}, small)
    if c is None:  # rows of pairs routed nowhere (expert ids outside [0, E)) stay zero
        c = torch.zeros((size_m * top_k, size_n), dtype=a.dtype, device=a.device)
    with torch.cuda.device(a.device):
        ws = prepare(a.device)
        raw.grouped_gemm(
            layout,
            a.data_ptr(),
            w.data_ptr(),
            scales.data_ptr(),
            _ptr(zeros),
            _ptr(bias),
            _ptr(tw),
            c.data_ptr(),
            sorted_ids.data_ptr(),
            expert_ids.data_ptr(),
            npp.data_ptr(),
            sorted_ids.numel(),
            expert_ids.numel(),
            block_size,
            size_m,
            top_k,
            E,
            size_n,
            size_k,
            G,
            _DT[a.dtype],
            ws.data_ptr(),
            ws.numel(),
            _stream(a),
        )
    return c


def _unsupported(a_scales=None, global_scale=None, g_idx=None, perm=None, is_zp_float=False, is_k_full=True):
    if a_scales is not None or global_scale is not None:
        raise NotImplementedError(
            "w4a16: activation / global scales (int8 or fp8 activations, nvfp4) are not "
            "supported: w4a16 runs fp16 / bf16 activations with 4-bit weights"
        )
    if (g_idx is not None and g_idx.numel() > 0) or (perm is not None and perm.numel() > 0) or not is_k_full:
        raise NotImplementedError("w4a16: act-order MoE weights (g_idx / perm) are not supported by the grouped GEMM")
    if is_zp_float:
        raise NotImplementedError("w4a16: floating-point zero points are not supported (AWQ zero points are int4)")


# the arguments of vLLM's moe_wna16_marlin_gemm (both argument lists) that the grouped GEMM takes, in _grouped's order
_VLLM_GROUPED_ARGS = (
    "a",
    "c_or_none",
    "b_q_weight",
    "b_bias_or_none",
    "b_scales",
    "b_zeros_or_none",
    "sorted_token_ids",
    "expert_ids",
    "num_tokens_past_padded",
    "topk_weights",
    "mul_topk_weights",
    "moe_block_size",
    "top_k",
    "size_m",
    "size_n",
    "size_k",
)


def _vllm_grouped(args: dict) -> Tensor:
    """The Marlin-layout grouped GEMM of one vLLM op call, given the op's arguments by name."""
    return _grouped("marlin", *(args[n] for n in _VLLM_GROUPED_ARGS))


def _vllm_grouped_op(args: dict) -> Tensor:
    """_vllm_grouped for the torch custom ops: vLLM's op writes into c_or_none and returns it, but a custom op's
    output may not alias an input, so c_or_none is declared mutated (torch.compile sees the write) and the result is
    returned as a copy of it (pass c_or_none=None to avoid the copy: the op then allocates its output)."""
    c = _vllm_grouped(args)
    return c.clone() if c is args["c_or_none"] else c


@torch.library.custom_op("w4a16::moe_wna16_marlin_gemm", mutates_args=("c_or_none",))
def moe_wna16_marlin_gemm(
    a: Tensor,
    c_or_none: Optional[Tensor],
    b_q_weight: Tensor,
    b_bias_or_none: Optional[Tensor],
    b_scales: Tensor,
    a_scales: Optional[Tensor],
    global_scale: Optional[Tensor],
    b_zeros_or_none: Optional[Tensor],
    workspace: Tensor,
    sorted_token_ids: Tensor,
    expert_ids: Tensor,
    num_tokens_past_padded: Tensor,
    topk_weights: Tensor,
    moe_block_size: int,
    top_k: int,
    mul_topk_weights: bool,
    b_type_id: int,
    size_m: int,
    size_n: int,
    size_k: int,
    use_atomic_add: bool,
    use_fp32_reduce: bool,
    is_zp_float: bool,
    thread_k: int,
    thread_n: int,
    blocks_per_sm: int,
) -> Tensor:
    """vLLM's newest `_moe_C::moe_wna16_marlin_gemm` argument list (26). The weight type follows the zero points
    (given: uint4 with zero points, AWQ; None: uint4b8, GPTQ); workspace, use_atomic_add, use_fp32_reduce (w4a16
    always accumulates in fp32) and the thread / blocks hints are accepted and not needed."""
    _unsupported(a_scales, global_scale, is_zp_float=is_zp_float)
    return _vllm_grouped_op(locals())


@moe_wna16_marlin_gemm.register_fake
def _(
    a,
    c_or_none,
    b_q_weight,
    b_bias_or_none,
    b_scales,
    a_scales,
    global_scale,
    b_zeros_or_none,
    workspace,
    sorted_token_ids,
    expert_ids,
    num_tokens_past_padded,
    topk_weights,
    moe_block_size,
    top_k,
    mul_topk_weights,
    b_type_id,
    size_m,
    size_n,
    size_k,
    use_atomic_add,
    use_fp32_reduce,
    is_zp_float,
    thread_k,
    thread_n,
    blocks_per_sm,
):
    return a.new_empty((size_m * top_k, size_n))


@torch.library.custom_op("w4a16::moe_wna16_marlin_gemm_v0_15", mutates_args=("c_or_none",))
def moe_wna16_marlin_gemm_v0_15(
    a: Tensor,
    c_or_none: Optional[Tensor],
    b_q_weight: Tensor,
    b_bias_or_none: Optional[Tensor],
    b_scales: Tensor,
    a_scales: Optional[Tensor],
    global_scale: Optional[Tensor],
    b_zeros_or_none: Optional[Tensor],
    g_idx_or_none: Optional[Tensor],
    perm_or_none: Optional[Tensor],
    workspace: Tensor,
    sorted_token_ids: Tensor,
    expert_ids: Tensor,
    num_tokens_past_padded: Tensor,
    topk_weights: Tensor,
    moe_block_size: int,
    top_k: int,
    mul_topk_weights: bool,
    b_type_id: int,
    size_m: int,
    size_n: int,
    size_k: int,
    is_full_k: bool,
    use_atomic_add: bool,
    use_fp32_reduce: bool,
    is_zp_float: bool,
    thread_k: int,
    thread_n: int,
    blocks_per_sm: int,
) -> Tensor:
    """vLLM 0.15.1's argument list (29: the newest one plus g_idx, perm and is_full_k; act-order is refused)."""
    _unsupported(a_scales, global_scale, g_idx_or_none, perm_or_none, is_zp_float, is_full_k)
    return _vllm_grouped_op(locals())


@moe_wna16_marlin_gemm_v0_15.register_fake
def _(
    a,
    c_or_none,
    b_q_weight,
    b_bias_or_none,
    b_scales,
    a_scales,
    global_scale,
    b_zeros_or_none,
    g_idx_or_none,
    perm_or_none,
    workspace,
    sorted_token_ids,
    expert_ids,
    num_tokens_past_padded,
    topk_weights,
    moe_block_size,
    top_k,
    mul_topk_weights,
    b_type_id,
    size_m,
    size_n,
    size_k,
    is_full_k,
    use_atomic_add,
    use_fp32_reduce,
    is_zp_float,
    thread_k,
    thread_n,
    blocks_per_sm,
):
    return a.new_empty((size_m * top_k, size_n))


@torch.library.custom_op("w4a16::moe_awq_gemm", mutates_args=())
def moe_awq_gemm(
    a: Tensor,
    qweight: Tensor,
    scales: Tensor,
    qzeros: Tensor,
    bias: Optional[Tensor],
    topk_weights: Optional[Tensor],
    sorted_token_ids: Tensor,
    expert_ids: Tensor,
    num_tokens_past_padded: Tensor,
    moe_block_size: int,
    top_k: int,
    size_m: int,
    size_n: int,
    size_k: int,
) -> Tensor:
    """The grouped GEMM on AutoAWQ checkpoint tensors as stored (qweight [E, K, N/8], scales [E, K/G, N],
    qzeros [E, K/G, N/8]); rows multiplied by topk_weights when given."""
    return _grouped(
        "awq",
        a,
        None,
        qweight,
        bias,
        scales,
        qzeros,
        sorted_token_ids,
        expert_ids,
        num_tokens_past_padded,
        topk_weights,
        topk_weights is not None,
        moe_block_size,
        top_k,
        size_m,
        size_n,
        size_k,
    )


@moe_awq_gemm.register_fake
def _(
    a,
    qweight,
    scales,
    qzeros,
    bias,
    topk_weights,
    sorted_token_ids,
    expert_ids,
    num_tokens_past_padded,
    moe_block_size,
    top_k,
    size_m,
    size_n,
    size_k,
):
    return a.new_empty((size_m * top_k, size_n))


# ---------------------------------------------------------------- stacked converters
@torch.library.custom_op("w4a16::gptq_marlin_moe_repack", mutates_args=())
def gptq_marlin_moe_repack(b_q_weight: Tensor, perm: Tensor, size_k: int, size_n: int, num_bits: int) -> Tensor:
    """vLLM's gptq_marlin_moe_repack: [E, K/8, N] (+ perm [E, K], empty for none) -> [E, K/16, 2N]."""
    op = "gptq_marlin_moe_repack"
    ct.num_bits(op, num_bits)
    ct.tensor(op, "b_q_weight", b_q_weight, _I32, 3, "[E, size_k/8, size_n]")
    E = b_q_weight.shape[0]
    ct.shape(op, "b_q_weight", b_q_weight, (E, size_k // 8, size_n), "[E, size_k/8, size_n]")
    has_perm = perm is not None and perm.numel() > 0
    if has_perm:
        ct.tensor(op, "perm", perm, _I32, perm.dim(), "[E, size_k]")
        _check(op, perm.numel() == E * size_k, f"perm has shape {tuple(perm.shape)}, expected [E, size_k]")
    ct.devices(op, {"b_q_weight": b_q_weight, "perm": perm if has_perm else None}, {"perm": 4})
    out = torch.empty((E, size_k // 16, size_n * 2), dtype=torch.int32, device=b_q_weight.device)
    with torch.cuda.device(b_q_weight.device):
        raw.repack_gptq(
            b_q_weight.data_ptr(),
            perm.data_ptr() if has_perm else 0,
            out.data_ptr(),
            E,
            size_k,
            size_n,
            _stream(b_q_weight),
        )
    return out


@gptq_marlin_moe_repack.register_fake
def _(b_q_weight, perm, size_k, size_n, num_bits):
    return b_q_weight.new_empty((b_q_weight.shape[0], size_k // 16, size_n * 2))


@torch.library.custom_op("w4a16::awq_marlin_moe_repack", mutates_args=())
def awq_marlin_moe_repack(b_q_weight: Tensor, perm: Tensor, size_k: int, size_n: int, num_bits: int) -> Tensor:
    """vLLM's awq_marlin_moe_repack: [E, K, N/8] -> [E, K/16, 2N] (perm is unused by AWQ, as in vLLM)."""
    op = "awq_marlin_moe_repack"
    ct.num_bits(op, num_bits)
    ct.tensor(op, "b_q_weight", b_q_weight, _I32, 3, "[E, size_k, size_n/8]")
    E = b_q_weight.shape[0]
    ct.shape(op, "b_q_weight", b_q_weight, (E, size_k, size_n // 8), "[E, size_k, size_n/8]")
    ct.devices(op, {"b_q_weight": b_q_weight})
    out = torch.empty((E, size_k // 16, size_n * 2), dtype=torch.int32, device=b_q_weight.device)
    with torch.cuda.device(b_q_weight.device):
        raw.repack_awq(b_q_weight.data_ptr(), out.data_ptr(), E, size_k, size_n, _stream(b_q_weight))
    return out


@awq_marlin_moe_repack.register_fake
def _(b_q_weight, perm, size_k, size_n, num_bits):
    return b_q_weight.new_empty((b_q_weight.shape[0], size_k // 16, size_n * 2))


@torch.library.custom_op("w4a16::marlin_moe_permute_scales", mutates_args=())
def marlin_moe_permute_scales(s: Tensor, size_k: int, size_n: int, group_size: int) -> Tensor:
    """Scales [E, K/G, N] -> Marlin order per expert."""
    op = "marlin_moe_permute_scales"
    ct.size(op, "size_k", size_k, 16)
    ct.size(op, "size_n", size_n, 64)
    G = ct.group_size(op, "group_size", group_size, size_k)
    ct.tensor(op, "s", s, ct.FLOATS, 3, "[E, size_k/group_size, size_n]")
    ct.shape(op, "s", s, (s.shape[0], size_k // G, size_n), "[E, size_k/group_size, size_n]")
    ct.devices(op, {"s": s})
    out = torch.empty_like(s)
    with torch.cuda.device(s.device):
        raw.permute_scales(
            s.data_ptr(), out.data_ptr(), s.shape[0], size_k, size_n, group_size, _DT[s.dtype], _stream(s)
        )
    return out


@marlin_moe_permute_scales.register_fake
def _(s, size_k, size_n, group_size):
    return torch.empty_like(s)


@torch.library.custom_op("w4a16::moe_awq_to_marlin_zero_points", mutates_args=())
def moe_awq_to_marlin_zero_points(q_zp_packed: Tensor, size_k: int, size_n: int, num_bits: int) -> Tensor:
    """AWQ qzeros [E, K/G, N/8] -> Marlin zero points per expert (vLLM's moe_awq_to_marlin_zero_points; size_k is
    the number of groups, as there)."""
    op = "moe_awq_to_marlin_zero_points"
    ct.num_bits(op, num_bits)
    ct.size(op, "size_k (the number of groups)", size_k, 1)
    ct.size(op, "size_n", size_n, 64)
    ct.tensor(op, "q_zp_packed", q_zp_packed, _I32, 3, "[E, size_k, size_n/8]")
    E = q_zp_packed.shape[0]
    ct.shape(op, "q_zp_packed", q_zp_packed, (E, size_k, size_n // 8), "[E, size_k, size_n/8]")
    ct.devices(op, {"q_zp_packed": q_zp_packed})
    out = torch.empty_like(q_zp_packed)
    # rows are what matters here: size_k groups of 32 rows (one group: G = -1)
    with torch.cuda.device(q_zp_packed.device):
        raw.awq_zero_points(
            q_zp_packed.data_ptr(),
            out.data_ptr(),
            q_zp_packed.shape[0],
            size_k * 32,
            size_n,
            32 if size_k > 1 else -1,
            _stream(q_zp_packed),
        )
    return out


@moe_awq_to_marlin_zero_points.register_fake
def _(q_zp_packed, size_k, size_n, num_bits):
    return torch.empty_like(q_zp_packed)


# ---------------------------------------------------------------- a whole expert layer
def fused_moe(
    x: Tensor,
    w13: Tensor,
    w2: Tensor,
    w13_scales: Tensor,
    w2_scales: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    w13_zeros: Optional[Tensor] = None,
    w2_zeros: Optional[Tensor] = None,
    layout: str = "marlin",
    w13_bias: Optional[Tensor] = None,
    w2_bias: Optional[Tensor] = None,
    block_size: Optional[int] = None,
) -> Tensor:
    """An MoE layer: out[t] = sum_k topk_weights[t, k] * down_e(silu(gate_e(x[t])) * up_e(x[t])), e = topk_ids[t, k].

    x [T, H] fp16/bf16; topk_ids [T, top_k] (int32 or int64; ids outside [0, E) contribute nothing); topk_weights
    [T, top_k]. layout "marlin": w13 [E, H/16, 4I], w2 [E, I/16, 2H] (scales Marlin-permuted; zero points for AWQ,
    None for GPTQ); layout "awq": AutoAWQ tensors as stored, w13 [E, H, 2I/8], w2 [E, I, H/8], zero points required.
    Returns [T, H]."""
    _check("fused_moe", layout in ("marlin", "awq"), f"layout must be 'marlin' or 'awq', not {layout!r}")
    ok = x.dim() == 2 and topk_ids.dim() == 2 and topk_ids.shape[0] == x.shape[0]
    _check("fused_moe", ok, "x [T, H], topk_ids [T, top_k]")
    T, H = x.shape
    top_k, E = topk_ids.shape[1], w13.shape[0]
    n13 = w13.shape[2] // 2 if layout == "marlin" else w13.shape[2] * 8
    inter = n13 // 2
    ids = topk_ids.to(torch.int32).contiguous()
    tw = topk_weights.to(torch.float32).contiguous()
    bs = block_size or choose_block_size(T, top_k, E)
    sorted_ids, expert_ids, npp = align(ids, E, bs)

    def g(a, w, s, z, b, M, k, n, K, weights):
        return _grouped(
            layout, a, None, w, b, s, z, sorted_ids, expert_ids, npp, weights, weights is not None, bs, k, M, n, K
        )

    h = g(x.contiguous(), w13, w13_scales, w13_zeros, w13_bias, T, top_k, n13, H, None)  # [T top_k, 2I]
    act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
    y = g(act.contiguous(), w2, w2_scales, w2_zeros, w2_bias, T * top_k, 1, H, inter, tw)  # [T top_k, H]
    return y.view(T, top_k, H).sum(dim=1)
