/* Index maps of the AWQ and Marlin formats (AutoAWQ's packing; the public IST-DASLab / vLLM Marlin layout), as plain
 * inline functions so that the GPU converters (kernels/convert.cu) and their CPU twins (tests/ref/marlin_ref.c) share
 * one definition. The tests check both against an independent, literal implementation of the format's reshape/permute
 * steps. */
#ifndef W4A16_MARLIN_INDEX_H
#define W4A16_MARLIN_INDEX_H
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define W4A16_HD __host__ __device__ __forceinline__
#else
#define W4A16_HD static inline
#endif

/* ORDER = {0,2,4,6,1,3,5,7}: AWQ nibble i holds column 8c + ORDER[i]; Marlin reorders every 8 values by it.
 * REVERSE = {0,4,1,5,2,6,3,7}: column j of an 8-group sits in nibble REVERSE[j]. */
W4A16_HD int w4a16_awq_order(int i) { return (i % 4) * 2 + i / 4; }
W4A16_HD int w4a16_awq_reverse(int j) { return (j % 2) * 4 + j / 2; }

/* Marlin weight [K/16, 2N]: nibble t of word w of row kt comes from q[*k][*n]. Word w: 64-column chunk
 * c = w/128; inside it lane i = (w%128)/4 owns 4 adjacent words, one per 16x16 tile j = w%4. Before the
 * interleave, a lane's 8 entries are 2 blocks (columns i/4 and i/4 + 8) x rows 2q, 2q+1, 2q+8, 2q+9. */
W4A16_HD void w4a16_marlin_source(int kt, int w, int t, int *k, int *n) {
    int c = w / 128, u = w % 128, lane = u / 4, j = u % 4;
    int e = w4a16_awq_order(t);
    int block = e / 4, ri = e % 4, q = lane % 4;
    *k = 16 * kt + 2 * q + (ri & 1) + 8 * (ri >> 1);
    *n = 64 * c + 16 * j + lane / 4 + 8 * block;
}

/* Marlin scales: the column whose scale lands at position `pos` of a row. Grouped: chunks of 64, position
 * 8i + j <- column i + 8j. Channelwise: chunks of 32, position 8i + t <- column 2i + {0,1,8,9,16,17,24,25}[t]. */
W4A16_HD int w4a16_marlin_scale_source(int pos, int channelwise) {
    if (channelwise) {
        int h = pos / 32, p = pos % 32, i = p / 8, t = p % 8;
        return 32 * h + 2 * i + (t & 1) + 8 * (t >> 1);
    }
    int h = pos / 64, p = pos % 64;
    return 64 * h + p / 8 + 8 * (p % 8);
}

/* Inverse of w4a16_marlin_scale_source: the position of column n's scale in a Marlin scale row. */
W4A16_HD int w4a16_marlin_scale_pos(int n, int channelwise) {
    if (channelwise) {
        int h = n / 32, c = n % 32, r = c % 8;
        return 32 * h + 8 * (r / 2) + 2 * (c / 8) + (r % 2);
    }
    int h = n / 64, c = n % 64;
    return 64 * h + 8 * (c % 8) + c / 8;
}

/* Nibble (k, n) of a packed source: AWQ [K, N/8] packed along N, or GPTQ [K/8, N] packed along K, whose row k
 * is source row perm[k] when perm is given (act-order). */
W4A16_HD uint32_t w4a16_source_nibble(const int32_t *in, const int32_t *perm, int k, int n, int N, int is_gptq) {
    if (is_gptq) {
        int src = perm ? perm[k] : k;
        if (src < 0) return 8u; /* an empty (padding) row: zero in uint4b8 */
        return ((uint32_t)in[(size_t)(src / 8) * N + n] >> (4 * (src % 8))) & 0xFu;
    }
    return ((uint32_t)in[(size_t)k * (N / 8) + n / 8] >> (4 * w4a16_awq_reverse(n % 8))) & 0xFu;
}

/* One Marlin weight word (row kt, word w) gathered from a packed source. */
W4A16_HD uint32_t w4a16_marlin_word(const int32_t *in, const int32_t *perm, int kt, int w, int N, int is_gptq) {
    uint32_t res = 0;
    for (int t = 0; t < 8; t++) {
        int k, n;
        w4a16_marlin_source(kt, w, t, &k, &n);
        res |= w4a16_source_nibble(in, perm, k, n, N, is_gptq) << (4 * t);
    }
    return res;
}

/* Marlin zero points (from AWQ): nibble t of word w of a row holds the zero of this column. */
W4A16_HD int w4a16_marlin_zero_source(int w, int t) { return w4a16_marlin_scale_source(8 * w + w4a16_awq_order(t), 0); }
/* ... and column n's zero point is nibble w4a16_awq_reverse(p % 8) of word p / 8, p = w4a16_marlin_scale_pos(n, 0). */

#endif
