"""The AWQ, GPTQ and Marlin tensor formats in numpy (AutoAWQ "gemm", GPTQ, and the public Marlin layout; see
include/w4a16.h), for tests, for quantising a float matrix the AutoAWQ way, and for engines that repack on the CPU.
The GPU converters of libw4a16 produce the same bits (tests/test_gpu.c checks the C twins; python_bindings/tests
check these against hand-computed words).

Every function checks its arguments as the library does (values 0..15 in integer arrays, 32-bit words, N a multiple
of 64 and K of 16 where the library needs it, group sizes 32 / 64 / 128 / -1, tensor shapes against the sizes) and
raises TypeError or ValueError naming the argument and its value, instead of masking, truncating or reshaping."""

import numbers

import numpy as np

AWQ_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])  # nibble i of a word holds column 8c + AWQ_ORDER[i]
AWQ_REVERSE = np.argsort(AWQ_ORDER)  # column j sits in nibble AWQ_REVERSE[j]


GROUP_SIZES = (32, 64, 128, -1)  # what libw4a16 runs (a group size equal to K means one group, like -1)


def _fail(fn, msg, exc=ValueError):
    raise exc(f"w4a16.formats.{fn}: {msg}")


def _int(fn, name, v):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Integral, np.integer)):
        _fail(fn, f"{name} must be an integer, got {type(v).__name__} {v!r}", TypeError)
    return int(v)


def _array(fn, name, a, ndim, what=""):
    a = np.asarray(a)
    if a.ndim != ndim:
        _fail(fn, f"{name} must be {ndim}-D{what}, got shape {a.shape}")
    return a


def _nibbles(fn, q, name="q"):
    """q: a 2-D integer array of values 0..15 (4-bit values, unpacked)."""
    q = _array(fn, name, q, 2)
    if q.dtype.kind not in "iu":
        _fail(fn, f"{name} must be an integer array, got {q.dtype}", TypeError)
    bad = (q < 0) | (q > 15)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        _fail(fn, f"{name}[{r}, {c}]={q[r, c]} is outside 0..15 ({int(bad.sum())} such values): 4-bit values only")
    return q


def _words(fn, packed, name="packed"):
    """packed: a 2-D array of 32-bit words (an int64 array would be read as twice as many words)."""
    packed = _array(fn, name, packed, 2)
    if packed.dtype not in (np.int32, np.uint32):
        _fail(fn, f"{name} must be an int32 or uint32 array, got {packed.dtype}", TypeError)
    return np.ascontiguousarray(packed)


def _multiple(fn, name, v, m, positive=False):
    if (positive and v < m) or v % m:
        _fail(fn, f"{name}={v} must be a {'positive ' if positive else ''}multiple of {m}")


def _groups(fn, K, group_size):
    """Rows per group for K rows (K for G = -1 or G = K), as the library resolves it."""
    group_size = _int(fn, "group_size", group_size)
    if group_size in (-1, K):
        return K
    if group_size not in GROUP_SIZES:
        _fail(fn, f"group_size={group_size} is not one of 32, 64, 128, -1 (or K={K})")
    if K % group_size:
        _fail(fn, f"K={K} is not a multiple of group_size={group_size}")
    return group_size


def _shape(fn, name, a, expected, how):
    if tuple(a.shape) != tuple(expected):
        _fail(fn, f"{name} has shape {tuple(a.shape)}, expected {how}")


def _pack_rows8(vals):
    """[..., 8] values 0..15 -> int32 with value i at bits 4i."""
    v = vals.astype(np.uint32)  # callers checked 0..15
    out = np.zeros(v.shape[:-1], dtype=np.uint32)
    for i in range(8):
        out |= v[..., i] << np.uint32(4 * i)
    return out.view(np.int32)


def _unpack8(words):
    w = words.view(np.uint32)
    return np.stack([(w >> np.uint32(4 * i)) & 0xF for i in range(8)], axis=-1).astype(np.uint8)


def awq_pack(q):
    """q [rows, N] (0..15) -> [rows, N/8] int32 in AWQ order (packed along N)."""
    q = _nibbles("awq_pack", q)
    rows, n = q.shape
    _multiple("awq_pack", "N", n, 8)
    return _pack_rows8(q.reshape(rows, n // 8, 8)[:, :, AWQ_ORDER])


def awq_unpack(packed):
    """[rows, N/8] int32 in AWQ order -> [rows, N] uint8."""
    packed = _words("awq_unpack", packed)
    rows, c = packed.shape
    return _unpack8(packed)[:, :, AWQ_REVERSE].reshape(rows, 8 * c)


def gptq_pack(q):
    """q [K, N] -> [K/8, N] int32, nibble i of row r = k 8r + i (packed along K)."""
    q = _nibbles("gptq_pack", q)
    k, n = q.shape
    _multiple("gptq_pack", "K", k, 8)
    return _pack_rows8(q.reshape(k // 8, 8, n).transpose(0, 2, 1))


def gptq_unpack(packed):
    """[K/8, N] int32 packed along K -> [K, N] uint8."""
    packed = _words("gptq_unpack", packed)
    r, n = packed.shape
    return _unpack8(packed).transpose(0, 2, 1).reshape(8 * r, n)


def awq_quantize(w, group_size=128):
    """AutoAWQ's asymmetric quantiser on w [K, N] (float): per group of rows and column,
    s = (max - min) / 15, z = clamp(-round(min / s), 0, 15), q = clamp(round(w / s) + z, 0, 15).
    Returns (qweight [K, N/8], qzeros [K/G, N/8], scales [K/G, N] float16). N must be a multiple of 64 and
    group_size one of 32, 64, 128, -1 (what the library runs); every weight must be finite."""
    fn = "awq_quantize"
    w = _array(fn, "w", w, 2, " [K, N]")
    if w.dtype.kind not in "iuf":
        _fail(fn, f"w must be a real-valued array, got {w.dtype}", TypeError)
    k, n = w.shape
    _multiple(fn, "N", n, 64, positive=True)
    if k < 1:
        _fail(fn, f"K={k} must be at least 1")
    g = _groups(fn, k, group_size)
    finite = np.isfinite(w)
    if not finite.all():
        r, c = np.argwhere(~finite)[0]
        _fail(
            fn,
            f"w[{r}, {c}]={w[r, c]} is not finite ({int((~finite).sum())} non-finite value(s)): "
            "a NaN or infinite weight has no 4-bit code",
        )
    wg = w.astype(np.float32).reshape(k // g, g, n)
    mx, mn = wg.max(axis=1), wg.min(axis=1)
    s = np.maximum((mx - mn) / 15.0, 1e-5).astype(np.float16)
    sf = s.astype(np.float32)
    z = np.clip(np.rint(-mn / sf), 0, 15)
    q = np.clip(np.rint(wg / sf[:, None, :]) + z[:, None, :], 0, 15).astype(np.uint8).reshape(k, n)
    return awq_pack(q), awq_pack(z.astype(np.uint8)), s


def awq_dequantize(qweight, qzeros, scales, group_size=128):
    """W [K, N] = (q - z) * s, rounded to the scales' dtype (what the GPU computes).
    qweight [K, N/8], qzeros [K/G, N/8] (int32), scales [K/G, N] (float), N a multiple of 64."""
    fn = "awq_dequantize"
    qweight, qzeros = _words(fn, qweight, "qweight"), _words(fn, qzeros, "qzeros")
    scales = _array(fn, "scales", scales, 2)
    if scales.dtype.kind != "f" and scales.dtype not in (np.uint16, np.int16):
        _fail(
            fn, f"scales must be a float array (or uint16 / int16 raw fp16 / bf16 bits), got {scales.dtype}", TypeError
        )
    k, n = qweight.shape[0], 8 * qweight.shape[1]
    _multiple(fn, "N", n, 64, positive=True)
    g = _groups(fn, k, group_size)
    _shape(fn, "scales", scales, (k // g, n), f"(K/G={k // g}, N={n})")
    _shape(fn, "qzeros", qzeros, (k // g, n // 8), f"(K/G={k // g}, N/8={n // 8})")
    q = awq_unpack(qweight).astype(np.float32)
    z = awq_unpack(qzeros).astype(np.float32)
    s = scales.astype(np.float32)
    idx = np.arange(k) // g
    return ((q - z[idx]) * s[idx]).astype(scales.dtype)


def marlin_perm():
    """The 1024-entry weight permutation of the public Marlin code (j loop inside the lane loop)."""
    perm = []
    for i in range(32):
        col = i // 4
        perm1 = [
            16 * row + col + 8 * block
            for block in (0, 1)
            for row in (2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1)
        ]
        for j in range(4):
            perm.extend(p + 256 * j for p in perm1)
    return np.array(perm).reshape(-1, 8)[:, AWQ_ORDER].ravel()


def scale_perms():
    grouped = np.array([i + 8 * j for i in range(8) for j in range(8)])
    single = np.array([2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)])
    return grouped, single


def marlin_pack(q):
    """Unpacked int4 q [K, N] -> Marlin weight [K/16, 2N] int32 (K a multiple of 16, N of 64)."""
    q = _nibbles("marlin_pack", q)
    k, n = q.shape
    _multiple("marlin_pack", "K", k, 16, positive=True)
    _multiple("marlin_pack", "N", n, 64, positive=True)
    t = q.reshape(k // 16, 16, n // 16, 16).transpose(0, 2, 1, 3).reshape(k // 16, n * 16)
    t = t.reshape(-1, 1024)[:, marlin_perm()].reshape(k // 16, n * 16)
    return _pack_rows8(t.reshape(k // 16, 2 * n, 8))


def marlin_repack_awq(qweight):
    """AWQ qweight [K, N/8] -> Marlin weight [K/16, 2N]."""
    return marlin_pack(awq_unpack(qweight))


def marlin_repack_gptq(qweight, perm=None):
    """GPTQ qweight [K/8, N] -> Marlin weight [K/16, 2N]; row k of the result is source row perm[k] when perm (a
    permutation of 0..K-1, argsort(g_idx) for act-order) is given."""
    fn = "marlin_repack_gptq"
    q = gptq_unpack(qweight)
    if perm is None:
        return marlin_pack(q)
    k = q.shape[0]
    perm = np.asarray(perm)
    if perm.dtype.kind not in "iu":
        _fail(fn, f"perm must be an integer array, got {perm.dtype}", TypeError)
    _array(fn, "perm", perm, 1, " [K]")
    if len(perm) != k:
        _fail(fn, f"perm has {len(perm)} entries, expected K={k}")
    out = (perm < 0) | (perm >= k)
    if out.any():
        i = int(np.argmax(out))
        _fail(fn, f"perm[{i}]={perm[i]} is outside [0, K={k})")
    counts = np.bincount(perm, minlength=k)
    if (counts != 1).any():
        _fail(fn, f"perm is not a permutation of 0..{k - 1}: {int(np.argmax(counts > 1))} appears twice")
    return marlin_pack(q[perm])


def marlin_permute_scales(scales, size_k, size_n, group_size):
    """scales [K/G, N] (float, or the raw bits of fp16 / bf16 as uint16 / int16: numpy has no bfloat16) -> Marlin
    order; size_k, size_n and group_size must match the tensor."""
    fn = "marlin_permute_scales"
    size_k, size_n = _int(fn, "size_k", size_k), _int(fn, "size_n", size_n)
    scales = _array(fn, "scales", scales, 2)
    if scales.dtype.kind != "f" and scales.dtype not in (np.uint16, np.int16):
        _fail(
            fn, f"scales must be a float array (or uint16 / int16 raw fp16 / bf16 bits), got {scales.dtype}", TypeError
        )
    _multiple(fn, "size_n", size_n, 64, positive=True)
    _multiple(fn, "size_k", size_k, 16, positive=True)
    g = _groups(fn, size_k, group_size)
    rows = size_k // g
    _shape(
        fn,
        "scales",
        scales,
        (rows, size_n),
        f"({rows}, size_n={size_n})"
        if scales.shape[0] == rows
        else f"({rows}, {size_n}): size_k={size_k} rows in groups of {g}",
    )
    grouped, single = scale_perms()
    p = grouped if g != size_k else single
    return scales.reshape(-1, len(p))[:, p].reshape(scales.shape)


def awq_to_marlin_zero_points(qzeros, num_groups, size_n):
    """AWQ qzeros [num_groups, size_n/8] -> Marlin zero points of the same shape."""
    fn = "awq_to_marlin_zero_points"
    num_groups, size_n = _int(fn, "num_groups", num_groups), _int(fn, "size_n", size_n)
    qzeros = _words(fn, qzeros, "qzeros")
    _multiple(fn, "size_n", size_n, 64, positive=True)
    if num_groups < 1:
        _fail(fn, f"num_groups={num_groups} must be at least 1")
    _shape(fn, "qzeros", qzeros, (num_groups, size_n // 8), f"({num_groups}, size_n/8={size_n // 8})")
    grouped, _ = scale_perms()
    z = awq_unpack(qzeros)
    z = z.reshape(-1, 64)[:, grouped].reshape(-1, 8)[:, AWQ_ORDER].reshape(num_groups, size_n)
    return _pack_rows8(z.reshape(num_groups, size_n // 8, 8))
