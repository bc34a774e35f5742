"""CPU tests of the MoE layer's framework-free bindings (run on CI): the ctypes signatures reach the library with the
right argument order, failures raise W4A16Error with the library's message, and nothing needs a GPU (every call
here is rejected by validation, before any device is touched, or is the host-side size query)."""

import pytest
import w4a16
from w4a16 import _moe_lib as raw


def test_align_sizes():
    assert raw.align_sizes(1, 8, 128, 16) == (8 + 8 * 15, (8 + 8 * 15) // 16)
    cap, blocks = raw.align_sizes(100, 2, 8, 64)
    assert cap == (200 + 8 * 63 + 63) // 64 * 64 and blocks == cap // 64
    with pytest.raises(w4a16.W4A16Error) as e:
        raw.align_sizes(1, 8, 4096, 16)
    assert e.value.name == "W4A16_ERR_INVALID_SHAPE" and "num_experts=4096" in str(e.value)


def test_grouped_gemm_argument_order():
    # the (N, K, G) = (64, 96, 32) shape check fires only if M, top_k, E, block size and capacities arrive in order
    ok = dict(
        A=256,
        weight=256,
        scales=256,
        zeros=256,
        bias=0,
        topk_weights=0,
        C=256,
        sorted_ids=256,
        expert_ids=256,
        num_tokens_post_padded=256,
        sorted_capacity=128,
        blocks_capacity=8,
        block_size=16,
        M=4,
        top_k=2,
        num_experts=8,
        N=64,
        K=96,
        group_size=32,
        dtype=w4a16.FP16,
    )
    for layout in ("marlin", "awq"):
        with pytest.raises(w4a16.W4A16Error) as e:
            raw.grouped_gemm(layout, **ok)
        assert e.value.name == "W4A16_ERR_INVALID_SHAPE" and "K=96" in str(e.value)
        with pytest.raises(w4a16.W4A16Error) as e:
            raw.grouped_gemm(layout, **dict(ok, block_size=12))
        assert "block_size=12" in str(e.value)
        with pytest.raises(w4a16.W4A16Error) as e:
            raw.grouped_gemm(layout, **dict(ok, sorted_ids=0))
        assert e.value.name == "W4A16_ERR_NULL_POINTER" and "sorted_ids is NULL" in str(e.value)
    with pytest.raises(w4a16.W4A16Error) as e:
        raw.grouped_gemm("awq", **dict(ok, zeros=0, K=128))
    assert "qzeros is NULL" in str(e.value)
    # the workspace pointer and its size arrive in their places (checked before the shapes)
    with pytest.raises(w4a16.W4A16Error) as e:
        raw.grouped_gemm("marlin", **dict(ok, workspace=0, workspace_bytes=4096))
    assert e.value.name == "W4A16_ERR_NULL_POINTER" and "workspace is NULL" in str(e.value)
    with pytest.raises(w4a16.W4A16Error) as e:
        raw.grouped_gemm("awq", **dict(ok, workspace=264, workspace_bytes=4096))
    assert e.value.name == "W4A16_ERR_MISALIGNED" and "workspace=" in str(e.value)


def test_routing_and_converters_reject():
    with pytest.raises(w4a16.W4A16Error) as e:
        raw.align_block_size(256, 4, 2, 8, 16, 256, 127, 256, 8, 256)
    assert "sorted_capacity=127" in str(e.value)
    with pytest.raises(w4a16.W4A16Error) as e:
        raw.repack_awq(256, 256, 2, 128, 64)
    assert e.value.name == "W4A16_ERR_INVALID_VALUE"
    with pytest.raises(w4a16.W4A16Error) as e:
        raw.repack_gptq(256, 258, 512, 2, 128, 64)
    assert "perm=" in str(e.value)
    with pytest.raises(w4a16.W4A16Error) as e:
        raw.permute_scales(256, 512, 2, 128, 64, 96, w4a16.FP16)
    assert "group_size=96" in str(e.value)
    with pytest.raises(w4a16.W4A16Error) as e:
        raw.awq_zero_points(256, 512, 0, 128, 64, 64)
    assert "num_experts=0" in str(e.value)


def test_sizes_past_32_bits_are_refused_not_truncated():
    # through the checked call path of w4a16._lib: a size past the C API's int would arrive as its low 32 bits
    with pytest.raises(w4a16.W4A16Error) as e:
        raw.align_sizes(2**32 + 1, 8, 128, 16)
    assert e.value.name == "W4A16_ERR_SIZE_OVERFLOW" and "num_tokens=4294967297" in str(e.value)
    with pytest.raises(w4a16.W4A16Error) as e:
        raw.grouped_gemm(
            "marlin", 256, 256, 256, 256, 0, 0, 256, 256, 256, 256, 128, 8, 16, 4, 2, 8, 2**32 + 64, 128, 32, 0
        )
    assert e.value.name == "W4A16_ERR_SIZE_OVERFLOW" and "N=4294967360" in str(e.value)
    with pytest.raises(w4a16.W4A16Error) as e:
        raw.permute_scales(256, 512, 2, 128, 64, 32, w4a16.FP16, stream=-1)
    assert e.value.name == "W4A16_ERR_INVALID_VALUE" and "stream=-1" in str(e.value)
