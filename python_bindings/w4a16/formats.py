"""The AWQ, GPTQ and Marlin tensor formats in numpy, for tests, for quantising a
float matrix the AutoAWQ way, and for engines that repack on the CPU. The GPU converters of libw4a16 produce the
same bits (tests/test_gpu.c checks the C twins; python_bindings/tests check these against hand-computed words)."""
import numpy as np

AWQ_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])   # nibble i of a word holds column 8c + AWQ_ORDER[i]
AWQ_REVERSE = np.argsort(AWQ_ORDER)               # column j sits in nibble AWQ_REVERSE[j]


def _pack_rows8(vals):
    """[..., 8] values 0..15 -> int32 with value i at bits 4i."""
    v = vals.astype(np.uint32) & 0xF
    out = np.zeros(v.shape[:-1], dtype=np.uint32)
    for i in range(8):
        out |= v[..., i] << np.uint32(4 * i)
    return out.view(np.int32)


def _unpack8(words):
    w = words.view(np.uint32)
    return np.stack([(w >> np.uint32(4 * i)) & 0xF for i in range(8)], axis=-1).astype(np.uint8)


def awq_pack(q):
    """q [rows, N] (0..15) -> [rows, N/8] int32 in AWQ order (packed along N)."""
    rows, n = q.shape
    return _pack_rows8(q.reshape(rows, n // 8, 8)[:, :, AWQ_ORDER])


def awq_unpack(packed):
    rows, c = packed.shape
    return _unpack8(packed)[:, :, AWQ_REVERSE].reshape(rows, 8 * c)


def gptq_pack(q):
    """q [K, N] -> [K/8, N] int32, nibble i of row r = k 8r + i (packed along K)."""
    k, n = q.shape
    return _pack_rows8(q.reshape(k // 8, 8, n).transpose(0, 2, 1))


def gptq_unpack(packed):
    r, n = packed.shape
    return _unpack8(packed).transpose(0, 2, 1).reshape(8 * r, n)


def awq_quantize(w, group_size=128):
    """AutoAWQ's asymmetric quantiser on w [K, N] (float): per group of rows and column,
    s = (max - min) / 15, z = clamp(-round(min / s), 0, 15), q = clamp(round(w / s) + z, 0, 15).
    Returns (qweight [K, N/8], qzeros [K/G, N/8], scales [K/G, N] float16)."""
    k, n = w.shape
    g = k if group_size in (-1, k) else group_size
    wg = w.astype(np.float32).reshape(k // g, g, n)
    mx, mn = wg.max(axis=1), wg.min(axis=1)
    s = np.maximum((mx - mn) / 15.0, 1e-5).astype(np.float16)
    sf = s.astype(np.float32)
    z = np.clip(np.rint(-mn / sf), 0, 15)
    q = np.clip(np.rint(wg / sf[:, None, :]) + z[:, None, :], 0, 15).astype(np.uint8).reshape(k, n)
    return awq_pack(q), awq_pack(z.astype(np.uint8)), s


def awq_dequantize(qweight, qzeros, scales, group_size=128):
    """W [K, N] = (q - z) * s, rounded to the scales' dtype (what the GPU computes)."""
    q = awq_unpack(qweight).astype(np.float32)
    z = awq_unpack(qzeros).astype(np.float32)
    k = q.shape[0]
    g = k if group_size in (-1, k) else group_size
    s = scales.astype(np.float32)
    idx = np.arange(k) // g
    return ((q - z[idx]) * s[idx]).astype(scales.dtype)


def marlin_perm():
    """The 1024-entry weight permutation of the public Marlin code (j loop inside the lane loop)."""
    perm = []
    for i in range(32):
        col = i // 4
        perm1 = [16 * row + col + 8 * block for block in (0, 1)
                 for row in (2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1)]
        for j in range(4):
            perm.extend(p + 256 * j for p in perm1)
    return np.array(perm).reshape(-1, 8)[:, AWQ_ORDER].ravel()


def scale_perms():
    grouped = np.array([i + 8 * j for i in range(8) for j in range(8)])
    single = np.array([2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)])
    return grouped, single


def marlin_pack(q):
    """Unpacked int4 q [K, N] -> Marlin weight [K/16, 2N] int32."""
    k, n = q.shape
    t = q.reshape(k // 16, 16, n // 16, 16).transpose(0, 2, 1, 3).reshape(k // 16, n * 16)
    t = t.reshape(-1, 1024)[:, marlin_perm()].reshape(k // 16, n * 16)
    return _pack_rows8(t.reshape(k // 16, 2 * n, 8))


def marlin_repack_awq(qweight):
    return marlin_pack(awq_unpack(qweight))


def marlin_repack_gptq(qweight, perm=None):
    q = gptq_unpack(qweight)
    return marlin_pack(q[perm] if perm is not None else q)


def marlin_permute_scales(scales, size_k, size_n, group_size):
    grouped, single = scale_perms()
    p = grouped if group_size not in (-1, size_k) else single
    return scales.reshape(-1, len(p))[:, p].reshape(scales.shape)


def awq_to_marlin_zero_points(qzeros, num_groups, size_n):
    grouped, _ = scale_perms()
    z = awq_unpack(qzeros)
    z = z.reshape(-1, 64)[:, grouped].reshape(-1, 8)[:, AWQ_ORDER].reshape(num_groups, size_n)
    return _pack_rows8(z.reshape(num_groups, size_n // 8, 8))
