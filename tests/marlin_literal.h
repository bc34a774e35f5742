/* A literal, obviously-correct implementation of formats.md section 3, step by step, for the tests only:
 * build the permutation lists exactly as the public Marlin code does, reshape/permute, then pack. */
#ifndef W4A16_MARLIN_LITERAL_H
#define W4A16_MARLIN_LITERAL_H
#include <stdint.h>
#include <stdlib.h>

/* perm[1024]: for lane i: 8 entries (2 blocks x 4 rows), repeated for j = 0..3 (+256 j) inside the lane loop,
 * then every 8 entries reordered by [0,2,4,6,1,3,5,7]. */
static void literal_marlin_perm(int perm[1024]) {
    int n = 0;
    for (int i = 0; i < 32; i++) {
        int perm1[8], m = 0, col = i / 4;
        for (int block = 0; block < 2; block++) {
            int rows[4] = {2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1};
            for (int r = 0; r < 4; r++) perm1[m++] = 16 * rows[r] + col + 8 * block;
        }
        for (int j = 0; j < 4; j++)
            for (int e = 0; e < 8; e++) perm[n++] = perm1[e] + 256 * j;
    }
    static const int interleave[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    int tmp[8];
    for (int g = 0; g < 128; g++) {
        for (int e = 0; e < 8; e++) tmp[e] = perm[8 * g + interleave[e]];
        for (int e = 0; e < 8; e++) perm[8 * g + e] = tmp[e];
    }
}

/* q[K, N] (values 0..15) -> Marlin [K/16, 2N]. */
static void literal_marlin_pack(const uint8_t *q, int K, int N, int32_t *out) {
    int perm[1024];
    literal_marlin_perm(perm);
    /* step 1: (K/16, 16, N/16, 16) -> permute (0, 2, 1, 3) -> (K/16, N*16) */
    uint8_t *tiles = (uint8_t *)malloc((size_t)K * N);
    for (int kt = 0; kt < K / 16; kt++)
        for (int tn = 0; tn < N / 16; tn++)
            for (int r = 0; r < 16; r++)
                for (int c = 0; c < 16; c++)
                    tiles[(size_t)kt * N * 16 + tn * 256 + r * 16 + c] = q[(size_t)(kt * 16 + r) * N + tn * 16 + c];
    /* step 2: res[:, p] = tiles[:, perm[p]] inside every chunk of 1024 */
    uint8_t *res = (uint8_t *)malloc((size_t)K * N);
    for (size_t chunk = 0; chunk < (size_t)K * N / 1024; chunk++)
        for (int p = 0; p < 1024; p++) res[chunk * 1024 + p] = tiles[chunk * 1024 + perm[p]];
    /* step 3: pack 8 consecutive values per int32, value i at bits 4i */
    for (size_t w = 0; w < (size_t)K * N / 8; w++) {
        uint32_t v = 0;
        for (int i = 0; i < 8; i++) v |= (uint32_t)res[8 * w + i] << (4 * i);
        out[w] = (int32_t)v;
    }
    free(tiles);
    free(res);
}

/* scale_perm (64 entries) and scale_perm_single (32 entries), as the public code builds them. */
static void literal_scale_perms(int sp[64], int sps[32]) {
    int n = 0;
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) sp[n++] = i + 8 * j;
    static const int offs[8] = {0, 1, 8, 9, 16, 17, 24, 25};
    n = 0;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 8; j++) sps[n++] = 2 * i + offs[j];
}

/* scales [rows, N] -> Marlin order; channelwise uses chunks of 32. */
static void literal_permute_scales(const uint16_t *s, int rows, int N, int channelwise, uint16_t *out) {
    int sp[64], sps[32];
    literal_scale_perms(sp, sps);
    int len = channelwise ? 32 : 64;
    const int *perm = channelwise ? sps : sp;
    for (size_t chunk = 0; chunk < (size_t)rows * N / len; chunk++)
        for (int p = 0; p < len; p++) out[chunk * len + p] = s[chunk * len + perm[p]];
}

/* unpacked zero points z[rows, N] -> Marlin zero points [rows, N/8]: scale_perm in chunks of 64, then every 8
 * reordered by [0,2,4,6,1,3,5,7], then packed plainly. */
static void literal_marlin_zeros(const uint8_t *z, int rows, int N, int32_t *out) {
    int sp[64], sps[32];
    literal_scale_perms(sp, sps);
    static const int interleave[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    size_t n = (size_t)rows * N;
    uint8_t *a = (uint8_t *)malloc(n), *b = (uint8_t *)malloc(n);
    for (size_t chunk = 0; chunk < n / 64; chunk++)
        for (int p = 0; p < 64; p++) a[chunk * 64 + p] = z[chunk * 64 + sp[p]];
    for (size_t g = 0; g < n / 8; g++)
        for (int e = 0; e < 8; e++) b[8 * g + e] = a[8 * g + interleave[e]];
    for (size_t w = 0; w < n / 8; w++) {
        uint32_t v = 0;
        for (int i = 0; i < 8; i++) v |= (uint32_t)b[8 * w + i] << (4 * i);
        out[w] = (int32_t)v;
    }
    free(a);
    free(b);
}
#endif
