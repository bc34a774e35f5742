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

from . import _lib
from . import _moe_lib as raw
from ._moe_lib import align_sizes  # noqa: F401 (re-exported)

_DT = {torch.float16: _lib.FP16, torch.bfloat16: _lib.BF16}
_workspaces = {}


def _check(cond, msg):
    if not cond:
        raise ValueError(f"w4a16: {msg}")


def _cuda_contig(name, t, dtype=None):
    _check(t.is_cuda, f"{name} must be a CUDA tensor (got {t.device})")
    _check(t.is_contiguous(), f"{name} must be contiguous")
    if dtype is not None:
        _check(
            t.dtype in dtype if isinstance(dtype, tuple) else t.dtype == dtype,
            f"{name} has dtype {t.dtype}, expected {dtype}",
        )


def _ptr(t):
    return t.data_ptr() if t is not None else 0


def _stream(t):
    return torch.cuda.current_stream(t.device).cuda_stream


def _group(size_k, scale_rows):
    return -1 if scale_rows == 1 else size_k // scale_rows


def prepare(device=None):
    """Allocate (once) and return the zeroed MoE workspace of `device` (default: current CUDA device)."""
    idx = torch.device(device if device is not None else "cuda").index
    idx = torch.cuda.current_device() if idx is None else idx
    ws = _workspaces.get(idx)
    if ws is None:
        if torch.cuda.is_current_stream_capturing():  # it would live in the graph's pool, zeroed by every replay
            raise RuntimeError(
                "w4a16: the MoE workspace of cuda:%d does not exist yet; call w4a16.moe.prepare() (or "
                "run the layer once) before capturing a CUDA graph" % idx
            )
        with torch.cuda.device(idx):
            ws = torch.zeros(raw.workspace_size(), dtype=torch.uint8, device=f"cuda:{idx}")
        _workspaces[idx] = ws
    return ws


def choose_block_size(num_tokens, top_k, num_experts):
    """Routing block size for a layer: the smallest of 16 / 32 / 64 that holds the average expert's pairs."""
    avg = num_tokens * top_k / num_experts
    return 16 if avg <= 16 else 32 if avg <= 32 else 64


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
    _cuda_contig("topk_ids", topk_ids, torch.int32)
    for n, t in (
        ("sorted_token_ids", sorted_token_ids),
        ("experts_ids", experts_ids),
        ("num_tokens_post_pad", num_tokens_post_pad),
    ):
        _cuda_contig(n, t, torch.int32)
    _check(topk_ids.dim() == 2, "topk_ids must be [num_tokens, top_k]")
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
    _cuda_contig("a", a, (torch.float16, torch.bfloat16))
    _cuda_contig("b_q_weight", w, torch.int32)
    _cuda_contig("b_scales", scales, a.dtype)
    for n, t in (("sorted_token_ids", sorted_ids), ("expert_ids", expert_ids), ("num_tokens_past_padded", npp)):
        _cuda_contig(n, t, torch.int32)
    _check(tuple(a.shape) == (size_m, size_k), f"a has shape {tuple(a.shape)}, expected (size_m, size_k)")
    E = w.shape[0]
    if layout == "marlin":
        _check(tuple(w.shape) == (E, size_k // 16, 2 * size_n), "b_q_weight must be [E, size_k/16, 2 size_n]")
    else:
        _check(tuple(w.shape) == (E, size_k, size_n // 8), "qweight must be [E, size_k, size_n/8]")
    _check(scales.dim() == 3 and scales.shape[0] == E and scales.shape[2] == size_n, "b_scales must be [E, K/G, N]")
    groups = scales.shape[1]
    if zeros is not None:
        _cuda_contig("b_zeros", zeros, torch.int32)
        _check(tuple(zeros.shape) == (E, groups, size_n // 8), "b_zeros must be [E, K/G, N/8]")
    if bias is not None:
        _cuda_contig("b_bias", bias, a.dtype)
        _check(tuple(bias.shape) == (E, size_n), "b_bias must be [E, size_n]")
    tw = None
    if mul_topk_weights:
        _check(topk_weights is not None, "mul_topk_weights needs topk_weights")
        _cuda_contig("topk_weights", topk_weights, torch.float32)
        _check(topk_weights.numel() == size_m * top_k, "topk_weights must have size_m * top_k entries")
        tw = topk_weights
    if c is None:  # rows of pairs routed nowhere (expert ids outside [0, E)) stay zero
        c = torch.zeros((size_m * top_k, size_n), dtype=a.dtype, device=a.device)
    else:
        _cuda_contig("c", c, a.dtype)
        _check(tuple(c.shape) == (size_m * top_k, size_n), "c must be [size_m * top_k, size_n]")
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
            _group(size_k, groups),
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


@torch.library.custom_op("w4a16::moe_wna16_marlin_gemm", mutates_args=())
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
    return _vllm_grouped(locals())


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


@torch.library.custom_op("w4a16::moe_wna16_marlin_gemm_v0_15", mutates_args=())
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
    return _vllm_grouped(locals())


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
    _check(num_bits == 4, "only 4-bit weights")
    _cuda_contig("b_q_weight", b_q_weight, torch.int32)
    E = b_q_weight.shape[0]
    _check(tuple(b_q_weight.shape) == (E, size_k // 8, size_n), "b_q_weight must be [E, size_k/8, size_n]")
    has_perm = perm is not None and perm.numel() > 0
    if has_perm:
        _cuda_contig("perm", perm, torch.int32)
        _check(perm.numel() == E * size_k, "perm must be [E, size_k]")
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
    _check(num_bits == 4, "only 4-bit weights")
    _cuda_contig("b_q_weight", b_q_weight, torch.int32)
    E = b_q_weight.shape[0]
    _check(tuple(b_q_weight.shape) == (E, size_k, size_n // 8), "b_q_weight must be [E, size_k, size_n/8]")
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
    _cuda_contig("s", s, (torch.float16, torch.bfloat16))
    _check(s.dim() == 3 and s.shape[2] == size_n, "s must be [E, K/G, size_n]")
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
    _check(num_bits == 4, "only 4-bit weights")
    _cuda_contig("q_zp_packed", q_zp_packed, torch.int32)
    _check(q_zp_packed.dim() == 3 and q_zp_packed.shape[1] == size_k, "q_zp_packed must be [E, groups, size_n/8]")
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
    _check(layout in ("marlin", "awq"), f"layout must be 'marlin' or 'awq', not {layout!r}")
    _check(x.dim() == 2 and topk_ids.dim() == 2 and topk_ids.shape[0] == x.shape[0], "x [T, H], topk_ids [T, top_k]")
    T, H = x.shape
    top_k, E = topk_ids.shape[1], w13.shape[0]
    n13 = w13.shape[2] // 2 if layout == "marlin" else w13.shape[2] * 8
    inter = n13 // 2
    ids = topk_ids.to(torch.int32).contiguous()
    tw = topk_weights.to(torch.float32).contiguous()
    bs = block_size or choose_block_size(T, top_k, E)
    sorted_ids, expert_ids, npp = align(ids, E, bs)
    if layout == "marlin":
        g = lambda a, w, s, z, b, M, k, n, K, weights: _grouped(  # noqa: E731
            "marlin", a, None, w, b, s, z, sorted_ids, expert_ids, npp, weights, weights is not None, bs, k, M, n, K
        )
    else:
        g = lambda a, w, s, z, b, M, k, n, K, weights: _grouped(  # noqa: E731
            "awq", a, None, w, b, s, z, sorted_ids, expert_ids, npp, weights, weights is not None, bs, k, M, n, K
        )
    h = g(x.contiguous(), w13, w13_scales, w13_zeros, w13_bias, T, top_k, n13, H, None)  # [T top_k, 2I]
    act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
    y = g(act.contiguous(), w2, w2_scales, w2_zeros, w2_bias, T * top_k, 1, H, inter, tw)  # [T top_k, H]
    return y.view(T, top_k, H).sum(dim=1)
