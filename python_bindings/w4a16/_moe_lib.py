"""Framework-free layer of the mixture-of-experts entry points (w4a16.h, "mixture of experts"): ctypes on raw device
pointers (ints, 0 = NULL) and CUDA streams (ints, 0 = the default stream). Every non-OK status raises W4A16Error with
the library's message. w4a16.moe builds the torch ops on it."""

import ctypes

from . import _lib

_P, _I, _Z = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
_GEMM = [_P] * 10 + [_I] * 10 + [_P, _Z, _P]
_GEMM_NAMES = (
    "sorted_ids expert_ids num_tokens_post_padded sorted_capacity blocks_capacity block_size M top_k num_experts N K "
    "group_size dtype workspace workspace_bytes stream"
)
# Registered with _lib so that every entry point goes through its checked call path (w4a16._checks: an int past
# 32 bits or a negative address raises W4A16Error instead of reaching the library truncated). Out-parameters are
# passed as addresses (ints).
_SIGS = {
    "w4a16_moe_align_sizes": (
        [_I, _I, _I, _I, _P, _P],
        "num_tokens top_k num_experts block_size sorted_capacity blocks_capacity",
    ),
    "w4a16_moe_align_block_size": (
        [_P, _I, _I, _I, _I, _P, _I, _P, _I, _P, _P],
        "topk_ids num_tokens top_k num_experts block_size sorted_ids sorted_capacity expert_ids blocks_capacity "
        "num_tokens_post_padded stream",
    ),
    "w4a16_moe_marlin_gemm": (_GEMM, "A weight scales zeros bias topk_weights C " + _GEMM_NAMES),
    "w4a16_moe_awq_gemm": (_GEMM, "A qweight scales qzeros bias topk_weights C " + _GEMM_NAMES),
    "w4a16_moe_workspace_size": ([_P], "bytes"),
    "w4a16_moe_marlin_repack_awq": ([_P, _P, _I, _I, _I, _P], "awq_qweight marlin_weight num_experts K N stream"),
    "w4a16_moe_marlin_repack_gptq": (
        [_P, _P, _P, _I, _I, _I, _P],
        "gptq_qweight perm marlin_weight num_experts K N stream",
    ),
    "w4a16_moe_marlin_permute_scales": (
        [_P, _P, _I, _I, _I, _I, _I, _P],
        "scales marlin_scales num_experts K N group_size dtype stream",
    ),
    "w4a16_moe_marlin_awq_zero_points": (
        [_P, _P, _I, _I, _I, _I, _P],
        "awq_qzeros marlin_zeros num_experts K N group_size stream",
    ),
}
for _name, (_args, _names) in _SIGS.items():
    getattr(_lib._lib, _name).argtypes = _args
    getattr(_lib._lib, _name).restype = ctypes.c_int
    _lib._NAMES[_name] = _names
_call = _lib._call


def align_sizes(num_tokens, top_k, num_experts, block_size):
    """(sorted_capacity, blocks_capacity): the routing buffers' sizes (w4a16_moe_align_sizes)."""
    sc, bc = _I(), _I()
    _call(
        "w4a16_moe_align_sizes",
        num_tokens,
        top_k,
        num_experts,
        block_size,
        ctypes.addressof(sc),
        ctypes.addressof(bc),
    )
    return sc.value, bc.value


def align_block_size(
    topk_ids,
    num_tokens,
    top_k,
    num_experts,
    block_size,
    sorted_ids,
    sorted_capacity,
    expert_ids,
    blocks_capacity,
    num_tokens_post_padded,
    stream=0,
):
    _call(
        "w4a16_moe_align_block_size",
        topk_ids,
        num_tokens,
        top_k,
        num_experts,
        block_size,
        sorted_ids,
        sorted_capacity,
        expert_ids,
        blocks_capacity,
        num_tokens_post_padded,
        stream,
    )


def workspace_size():
    """Bytes of the MoE GEMMs' split-K workspace on the current device (w4a16_moe_workspace_size)."""
    n = _Z()
    _call("w4a16_moe_workspace_size", ctypes.addressof(n))
    return n.value


def grouped_gemm(
    layout,
    A,
    weight,
    scales,
    zeros,
    bias,
    topk_weights,
    C,
    sorted_ids,
    expert_ids,
    num_tokens_post_padded,
    sorted_capacity,
    blocks_capacity,
    block_size,
    M,
    top_k,
    num_experts,
    N,
    K,
    group_size,
    dtype,
    workspace=0,
    workspace_bytes=0,
    stream=0,
):
    """w4a16_moe_marlin_gemm (layout "marlin") or w4a16_moe_awq_gemm (layout "awq"); workspace 0 with 0 bytes: no
    K split."""
    name = {"marlin": "w4a16_moe_marlin_gemm", "awq": "w4a16_moe_awq_gemm"}[layout]
    _call(
        name,
        A,
        weight,
        scales,
        zeros,
        bias,
        topk_weights,
        C,
        sorted_ids,
        expert_ids,
        num_tokens_post_padded,
        sorted_capacity,
        blocks_capacity,
        block_size,
        M,
        top_k,
        num_experts,
        N,
        K,
        group_size,
        dtype,
        workspace,
        workspace_bytes,
        stream,
    )


def repack_awq(qweight, out, num_experts, K, N, stream=0):
    _call("w4a16_moe_marlin_repack_awq", qweight, out, num_experts, K, N, stream)


def repack_gptq(qweight, perm, out, num_experts, K, N, stream=0):
    _call("w4a16_moe_marlin_repack_gptq", qweight, perm, out, num_experts, K, N, stream)


def permute_scales(scales, out, num_experts, K, N, group_size, dtype, stream=0):
    _call("w4a16_moe_marlin_permute_scales", scales, out, num_experts, K, N, group_size, dtype, stream)


def awq_zero_points(qzeros, out, num_experts, K, N, group_size, stream=0):
    _call("w4a16_moe_marlin_awq_zero_points", qzeros, out, num_experts, K, N, group_size, stream)
