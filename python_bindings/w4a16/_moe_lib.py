"""Framework-free layer of the mixture-of-experts entry points (w4a16.h, "mixture of experts"): ctypes on raw device
pointers (ints, 0 = NULL) and CUDA streams (ints, 0 = the default stream). Every non-OK status raises W4A16Error with
the library's message. w4a16.moe builds the torch ops on it."""

import ctypes

from . import _lib

_c = ctypes
_P, _I, _Z = _c.c_void_p, _c.c_int, _c.c_size_t
_raw = _lib._lib
for _name, _args in {
    "w4a16_moe_align_sizes": [_I, _I, _I, _I, _c.POINTER(_I), _c.POINTER(_I)],
    "w4a16_moe_align_block_size": [_P, _I, _I, _I, _I, _P, _I, _P, _I, _P, _P],
    "w4a16_moe_marlin_gemm": [
        _P,
        _P,
        _P,
        _P,
        _P,
        _P,
        _P,
        _P,
        _P,
        _P,
        _I,
        _I,
        _I,
        _I,
        _I,
        _I,
        _I,
        _I,
        _I,
        _I,
        _P,
        _Z,
        _P,
    ],
    "w4a16_moe_awq_gemm": [_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _I, _I, _I, _I, _P, _Z, _P],
    "w4a16_moe_workspace_size": [_c.POINTER(_Z)],
    "w4a16_moe_marlin_repack_awq": [_P, _P, _I, _I, _I, _P],
    "w4a16_moe_marlin_repack_gptq": [_P, _P, _P, _I, _I, _I, _P],
    "w4a16_moe_marlin_permute_scales": [_P, _P, _I, _I, _I, _I, _I, _P],
    "w4a16_moe_marlin_awq_zero_points": [_P, _P, _I, _I, _I, _I, _P],
}.items():
    getattr(_raw, _name).argtypes = _args
    getattr(_raw, _name).restype = _c.c_int


def _call(name, *args):
    _lib._check(getattr(_raw, name)(*args), name)


def _p(x):
    return x or None


def align_sizes(num_tokens, top_k, num_experts, block_size):
    """(sorted_capacity, blocks_capacity): the routing buffers' sizes (w4a16_moe_align_sizes)."""
    sc, bc = _I(), _I()
    _call(
        "w4a16_moe_align_sizes",
        int(num_tokens),
        int(top_k),
        int(num_experts),
        int(block_size),
        _c.byref(sc),
        _c.byref(bc),
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
        _p(topk_ids),
        num_tokens,
        top_k,
        num_experts,
        block_size,
        _p(sorted_ids),
        sorted_capacity,
        _p(expert_ids),
        blocks_capacity,
        _p(num_tokens_post_padded),
        _p(stream),
    )


def workspace_size():
    """Bytes of the MoE GEMMs' split-K workspace on the current device (w4a16_moe_workspace_size)."""
    n = _Z()
    _call("w4a16_moe_workspace_size", _c.byref(n))
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
        _p(A),
        _p(weight),
        _p(scales),
        _p(zeros),
        _p(bias),
        _p(topk_weights),
        _p(C),
        _p(sorted_ids),
        _p(expert_ids),
        _p(num_tokens_post_padded),
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
        _p(workspace),
        workspace_bytes,
        _p(stream),
    )


def repack_awq(qweight, out, num_experts, K, N, stream=0):
    _call("w4a16_moe_marlin_repack_awq", _p(qweight), _p(out), num_experts, K, N, _p(stream))


def repack_gptq(qweight, perm, out, num_experts, K, N, stream=0):
    _call("w4a16_moe_marlin_repack_gptq", _p(qweight), _p(perm), _p(out), num_experts, K, N, _p(stream))


def permute_scales(scales, out, num_experts, K, N, group_size, dtype, stream=0):
    _call("w4a16_moe_marlin_permute_scales", _p(scales), _p(out), num_experts, K, N, group_size, dtype, _p(stream))


def awq_zero_points(qzeros, out, num_experts, K, N, group_size, stream=0):
    _call("w4a16_moe_marlin_awq_zero_points", _p(qzeros), _p(out), num_experts, K, N, group_size, _p(stream))
