"""Bad input from Python, without a GPU: the numpy formats and the framework-free layer raise a specific exception
naming the argument and its value, before anything runs (no silent wrong answer, no value truncated to 32 bits).
The torch ops' checks are in test_torch_validation.py."""

import re

import numpy as np
import pytest
import w4a16
from w4a16 import formats

FAKE = 1 << 20  # an aligned address that is never dereferenced: every call here fails validation first


def rng():
    return np.random.default_rng()


def q4(rows, cols):
    return rng().integers(0, 16, size=(rows, cols), dtype=np.uint8)


# ---------------------------------------------------------------- w4a16.formats
@pytest.mark.parametrize("pack", [formats.awq_pack, formats.gptq_pack, formats.marlin_pack])
@pytest.mark.parametrize("bad", [16, -1, 255])
def test_pack_rejects_values_outside_0_15(pack, bad):
    q = q4(128, 64).astype(np.int16)
    q[5, 7] = bad
    with pytest.raises(ValueError, match=rf"q\[5, 7\]={bad} is outside 0\.\.15"):
        pack(q)


@pytest.mark.parametrize("pack", [formats.awq_pack, formats.gptq_pack, formats.marlin_pack])
def test_pack_rejects_floats(pack):
    q = q4(128, 64).astype(np.float32) + 0.7  # would be truncated to the integers below
    with pytest.raises(TypeError, match="q must be an integer array, got float32"):
        pack(q)


@pytest.mark.parametrize(
    "pack,shape,text",
    [
        (formats.awq_pack, (16, 12), "N=12 must be a multiple of 8"),
        (formats.gptq_pack, (12, 16), "K=12 must be a multiple of 8"),
        (formats.marlin_pack, (128, 32), "N=32 must be a positive multiple of 64"),
        (formats.marlin_pack, (128, 48), "N=48 must be a positive multiple of 64"),
        (formats.marlin_pack, (24, 64), "K=24 must be a positive multiple of 16"),
        (formats.awq_pack, (16,), "q must be 2-D, got shape (16,)"),
    ],
)
def test_pack_rejects_shapes(pack, shape, text):
    with pytest.raises(ValueError, match=re.escape(text)):
        pack(np.zeros(shape, dtype=np.uint8))


@pytest.mark.parametrize("unpack", [formats.awq_unpack, formats.gptq_unpack])
def test_unpack_wants_32_bit_words(unpack):
    words = rng().integers(0, 2**31, size=(8, 8)).astype(np.int64)  # would be read as twice as many 32-bit words
    with pytest.raises(TypeError, match="packed must be an int32 or uint32 array, got int64"):
        unpack(words)


@pytest.mark.parametrize("N", [32, 48, 100])
def test_marlin_repack_awq_rejects_n_the_library_rejects(N):
    qw = np.zeros((128, N // 8), dtype=np.int32)
    with pytest.raises(ValueError, match=f"N={N // 8 * 8} must be a positive multiple of 64"):
        formats.marlin_repack_awq(qw)


@pytest.mark.parametrize("N", [32, 48])
def test_awq_quantize_rejects_n_the_library_rejects(N):
    w = rng().standard_normal((128, N)).astype(np.float32)
    with pytest.raises(ValueError, match=f"N={N} must be a positive multiple of 64"):
        formats.awq_quantize(w, 128)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_awq_quantize_rejects_non_finite(bad):
    w = rng().standard_normal((256, 64)).astype(np.float32)
    w[200, 3] = bad
    with pytest.raises(ValueError, match=rf"w\[200, 3\]={bad} is not finite \(1 non-finite value"):
        formats.awq_quantize(w, 128)


@pytest.mark.parametrize(
    "K,G,text",
    [
        (256, 48, "group_size=48 is not one of 32, 64, 128, -1"),
        (192, 128, "K=192 is not a multiple of group_size=128"),
        (256, 0, "group_size=0 is not one of 32, 64, 128, -1"),
    ],
)
def test_awq_quantize_rejects_group_sizes(K, G, text):
    with pytest.raises(ValueError, match=re.escape(text)):
        formats.awq_quantize(np.ones((K, 64), dtype=np.float32), G)


def test_awq_quantize_rejects_non_real_input():
    with pytest.raises(TypeError, match="w must be a real-valued array"):
        formats.awq_quantize(np.ones((128, 64), dtype=np.complex64), 128)
    with pytest.raises(ValueError, match=re.escape("w must be 2-D [K, N], got shape (128,)")):
        formats.awq_quantize(np.ones(128, dtype=np.float32), 128)


@pytest.mark.parametrize("bad", ["short", "duplicate", "out_of_range", "2d", "float"])
def test_marlin_repack_gptq_rejects_bad_perm(bad):
    K, N = 256, 64
    qg = formats.gptq_pack(q4(K, N))
    perm = rng().permutation(K)
    exc, text = ValueError, None
    if bad == "short":
        perm, text = perm[: K // 2], "perm has 128 entries, expected K=256"
    elif bad == "duplicate":
        perm[10] = perm[11]
        text = f"perm is not a permutation of 0..255: {perm[11]} appears twice"
    elif bad == "out_of_range":
        perm[3] = K
        text = "perm[3]=256 is outside [0, K=256)"
    elif bad == "2d":
        perm, text = perm.reshape(2, -1), "perm must be 1-D [K], got shape (2, 128)"
    else:
        perm, exc, text = perm.astype(np.float64), TypeError, "perm must be an integer array, got float64"
    with pytest.raises(exc, match=re.escape(text)):
        formats.marlin_repack_gptq(qg, perm)


def test_marlin_repack_gptq_perm_is_applied():
    K, N = 256, 64
    q = q4(K, N)
    perm = rng().permutation(K)
    assert (formats.marlin_repack_gptq(formats.gptq_pack(q), perm) == formats.marlin_pack(q[perm])).all()


@pytest.mark.parametrize(
    "args,text",
    [
        ((np.zeros((2, 128), np.float16), 256, 64, 128), "scales has shape (2, 128), expected (2, size_n=64)"),
        ((np.zeros((2, 128), np.float16), 512, 128, 128), "scales has shape (2, 128), expected (4, 128)"),
        ((np.zeros((1, 32), np.float16), 256, 32, -1), "size_n=32 must be a positive multiple of 64"),
        ((np.zeros((2, 64), np.float16), 256, 64, 96), "group_size=96 is not one of 32, 64, 128, -1"),
        (
            (np.zeros((2, 64), np.int32), 256, 64, 128),
            "scales must be a float array (or uint16 / int16 raw fp16 / bf16 bits), got int32",
        ),
    ],
)
def test_marlin_permute_scales_checks_sizes(args, text):
    with pytest.raises((ValueError, TypeError), match=re.escape(text)):
        formats.marlin_permute_scales(*args)


@pytest.mark.parametrize(
    "qz,groups,size_n,text",
    [
        (np.zeros((2, 16), np.int32), 2, 64, "qzeros has shape (2, 16), expected (2, size_n/8=8)"),
        (np.zeros((2, 8), np.int32), 3, 64, "qzeros has shape (2, 8), expected (3, size_n/8=8)"),
        (np.zeros((2, 4), np.int32), 2, 32, "size_n=32 must be a positive multiple of 64"),
        (np.zeros((2, 8), np.int64), 2, 64, "qzeros must be an int32 or uint32 array, got int64"),
    ],
)
def test_awq_to_marlin_zero_points_checks_sizes(qz, groups, size_n, text):
    with pytest.raises((ValueError, TypeError), match=re.escape(text)):
        formats.awq_to_marlin_zero_points(qz, groups, size_n)


def test_awq_dequantize_checks_shapes():
    qw, qz, s = formats.awq_quantize(rng().standard_normal((256, 128)).astype(np.float32), 64)
    with pytest.raises(ValueError, match=re.escape("qzeros has shape (3, 16), expected (K/G=4, N/8=16)")):
        formats.awq_dequantize(qw, qz[:3], s, 64)
    with pytest.raises(ValueError, match=re.escape("scales has shape (4, 64), expected (K/G=4, N=128)")):
        formats.awq_dequantize(qw, qz, s[:, :64], 64)
    with pytest.raises(ValueError, match=re.escape("scales has shape (4, 128), expected (K/G=2, N=128)")):
        formats.awq_dequantize(qw, qz[:2], s, 128)  # the group size does not match the tensors
    assert formats.awq_dequantize(qw, qz, s, 64).shape == (256, 128)


# ---------------------------------------------------------------- framework-free layer (ctypes)
def gemm_args(**kw):
    """Positional arguments of awq_gemm / marlin_gemm (the same order), the ones named in kw replaced."""
    a = dict(
        A=FAKE,
        qweight=FAKE,
        scales=FAKE,
        qzeros=FAKE,
        bias=0,
        C=FAKE,
        M=1,
        N=64,
        K=128,
        group_size=128,
        dtype=w4a16.FP16,
        workspace=0,
        workspace_bytes=0,
    )
    assert set(kw) <= set(a)
    a.update(kw)
    return list(a.values())


@pytest.mark.parametrize(
    "name,value",
    [
        ("N", 2**32 + 512),
        ("M", 2**31),
        ("K", 2**32 + 128),
        ("group_size", 2**32 + 64),
        ("dtype", 2**32),
        ("M", -(2**31) - 1),
    ],
)
def test_sizes_past_32_bits_are_refused(name, value):
    # group_size=48 (rejected by the library) would make a truncated call fail too: only an overflow report passes
    kw = {"group_size": 48, name: value}
    with pytest.raises(w4a16.W4A16Error) as e:
        w4a16.awq_gemm(*gemm_args(**kw))
    assert e.value.status == 7 and f"{name}={value} does not fit" in e.value.detail and "w4a16_awq_gemm" in str(e.value)


def test_flags_and_workspace_bytes_are_not_wrapped():
    with pytest.raises(w4a16.W4A16Error) as e:  # c_uint would keep only FLAG_PDL
        w4a16.marlin_gemm(*gemm_args(group_size=48), flags=(1 << 32) | w4a16.FLAG_PDL)
    assert e.value.status == 8 and f"flags={(1 << 32) | 2} does not fit" in e.value.detail
    with pytest.raises(w4a16.W4A16Error) as e:  # c_size_t would make -1 the largest workspace there is
        w4a16.awq_gemm(*gemm_args(workspace=FAKE, workspace_bytes=-1, group_size=48))
    assert e.value.status == 8 and "workspace_bytes=-1 is negative" in e.value.detail


@pytest.mark.parametrize(
    "name,value,text",
    [
        ("N", 64.0, "N must be an integer, got float 64.0"),
        ("M", "1", "M must be an integer, got str '1'"),
        ("K", True, "K must be an integer, got bool True"),
        ("A", 1.5, "A must be a device address (int) or None, got float 1.5"),
        ("qweight", -16, "qweight=-16 is not an address"),
        ("C", 2**64, f"C={2**64} is not an address"),
    ],
)
def test_argument_types(name, value, text):
    with pytest.raises((TypeError, w4a16.W4A16Error), match=re.escape(text)):
        w4a16.awq_gemm(*gemm_args(**{name: value}))


def test_numpy_integers_are_accepted():
    with pytest.raises(w4a16.W4A16Error) as e:  # passes the ctypes boundary, fails the library's group check
        w4a16.awq_gemm(*gemm_args(M=np.int64(4), N=np.int32(64), group_size=np.int64(48)))
    assert e.value.status == 4 and "group_size=48" in e.value.detail


@pytest.mark.parametrize("gemm", [w4a16.awq_gemm, w4a16.marlin_gemm])
def test_m_zero_names_m_not_a_null_pointer(gemm):
    # an empty activation tensor has no storage: its address is 0, but the cause is M = 0
    with pytest.raises(w4a16.W4A16Error) as e:
        gemm(*gemm_args(A=0, C=0, M=0))
    assert e.value.status == 3 and "M=0 must be at least 1" in e.value.detail


def test_other_entry_points_check_32_bits():
    with pytest.raises(w4a16.W4A16Error, match="N=4294967360 does not fit"):
        w4a16.workspace_size_staged(2**32 + 64, 4096)
    with pytest.raises(w4a16.W4A16Error, match="K=4294967424 does not fit"):
        w4a16.marlin_repack_awq(FAKE, FAKE + 4096, 2**32 + 128, 64)
    with pytest.raises(w4a16.W4A16Error, match="K_out=4294967424 does not fit"):
        w4a16.permute_cols(FAKE, FAKE, FAKE + 4096, 1, 128, 2**32 + 128, w4a16.FP16)
    with pytest.raises(w4a16.W4A16Error, match="device=4294967296 does not fit"):
        w4a16.device_info(2**32)


# ---------------------------------------------------------------- act-order helpers at the top level
def test_top_level_act_order_api():
    for name in ("act_order_sort", "act_order_plan", "permute_cols", "gather_rows"):
        assert callable(getattr(w4a16, name)) and name in w4a16.__all__


def test_act_order_sort_is_a_stable_argsort():
    K, G = 512, 128
    g_idx = rng().permutation(K) // G
    perm, sorted_g = w4a16.act_order_sort(g_idx, G)
    assert perm.dtype == np.int32 and (perm == np.argsort(g_idx, kind="stable")).all()
    assert (sorted_g == np.arange(K) // G).all()


def test_act_order_sort_checks():
    with pytest.raises(TypeError, match="g_idx must be an integer array, got float64"):
        w4a16.act_order_sort(np.zeros(256), 128)
    with pytest.raises(ValueError, match=re.escape("g_idx must be 1-D [K], got shape (2, 128)")):
        w4a16.act_order_sort(np.zeros((2, 128), dtype=np.int32), 128)
    with pytest.raises(w4a16.W4A16Error) as e:
        w4a16.act_order_sort(np.full(256, 2, dtype=np.int32), 128)
    assert e.value.status == 8 and "g_idx[0]=2 is outside" in e.value.detail
    with pytest.raises(ValueError, match=r"g_idx\[1\]=4294967296 does not fit in int32"):
        w4a16.act_order_sort(np.array([0, 2**32] + [0] * 126, dtype=np.int64), 128)
    with pytest.raises(w4a16.W4A16Error) as e:  # cut groups
        w4a16.act_order_sort(np.r_[np.zeros(100), np.ones(156)].astype(np.int32), 128)
    assert e.value.status == 26


def test_act_order_plan_blocks_lie_in_one_group():
    K, groups = 1000, 9
    g_idx = rng().integers(0, groups, size=K)
    row_src, block_group = w4a16.act_order_plan(g_idx, groups)
    Kp = len(row_src)
    assert Kp % 128 == 0 and len(block_group) == Kp // 32
    real = row_src[row_src >= 0]
    assert sorted(real.tolist()) == list(range(K))  # every source row exactly once
    for b in range(Kp // 32):
        rows = row_src[32 * b : 32 * b + 32]
        assert (g_idx[rows[rows >= 0]] == block_group[b]).all()
    with pytest.raises(w4a16.W4A16Error) as e:
        w4a16.act_order_plan(g_idx, 4)
    assert e.value.status == 8


def test_permute_cols_and_gather_rows_check_arguments():
    with pytest.raises(w4a16.W4A16Error) as e:
        w4a16.permute_cols(FAKE, FAKE, FAKE, 1, 128, 128, w4a16.FP16)
    assert e.value.status == 8 and "same buffer" in e.value.detail
    with pytest.raises(w4a16.W4A16Error) as e:
        w4a16.gather_rows(FAKE, 4, FAKE, FAKE + 4096, 8, 0, w4a16.FP16)
    assert e.value.status == 3 and "cols=0" in e.value.detail
    with pytest.raises(w4a16.W4A16Error, match="rows_out=4294967304 does not fit"):
        w4a16.gather_rows(FAKE, 4, FAKE, FAKE + 4096, 2**32 + 8, 64, w4a16.FP16)
