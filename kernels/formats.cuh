// Weight formats: what the GEMM kernels know about how a format stores 4-bit weights, group scales and zero points,
// as one traits type per format (configs.h W4A16_LAYOUT_*). The operand tiles (tiles.cuh), the decode kernel
// (gemm_decode.cuh), the epilogues (gemm.cuh, gemm_sm90.cuh) read these instead of testing the layout: a new format
// is a new traits block here, the host's stage size in configs.h, its converters and tests.
//
// Both formats give a thread (q = lane % 4, r = lane / 4) of an m16n8k16 MMA, for each n8 block j of a 64-column
// group, the k rows 2q, 2q+1 and 2q+8, 2q+9 of one column (slot r of block j) as two k-pair registers.
#pragma once
#include "common.cuh"
#include "configs.h"

namespace w4a16 {

template <int LAYOUT> struct WeightFormat;

// AutoAWQ "gemm": qweight [K, N/8], nibble i of word c holds column 8c + ORDER[i]; qzeros [K/G, N/8] packed the same
// way; scales [K/G, N] in column order. A thread reads word r of its 64 columns: block j is nibble j, column
// 8r + ORDER[j], so the blocks of a slot are 8 adjacent columns.
template <> struct WeightFormat<W4A16_LAYOUT_AWQ> {
    static constexpr int KROW = 1;      // k rows per stored row
    static constexpr int PAD_WORDS = 4; // per shared-memory row: a fragment's 4 row loads hit distinct banks
    static constexpr bool CHANNELWISE_PERM = false;       // scales of G = K are stored like grouped ones
    static constexpr bool HIGH_K_IN_HIGH_NIBBLES = false; // (Marlin) k rows 8-15 of a register are high nibbles
    static constexpr bool SLOT_BLOCKS_ADJACENT = true;    // the 8 blocks of a slot are 8 adjacent columns (C stores)
    static constexpr bool SLOT_PAIRS_ADJACENT = false;    // slots 2q, 2q + 1 of a block are adjacent columns
    // 32-bit words of one stored row of n columns
    __host__ __device__ static constexpr int row_words(int n) { return n / 8; }
    __device__ static __forceinline__ int column(int j, int slot) { return 8 * slot + awq_order(j); }
    // the scale (in the thread's 8 adjacent scales) and the zero-point nibble of block m
    __device__ static __forceinline__ int scale_index(int m) { return awq_order(m); }
    __device__ static __forceinline__ int zero_nibble(int m) { return m; }
    // scales of G = K are stored like grouped ones (CHANNELWISE_PERM false: this map is not used)
    __device__ static __forceinline__ int channelwise_scale_pos(int m, int r) { return 8 * r + awq_order(m); }
    // never called (CHANNELWISE_PERM is false): G = K scales are read as grouped ones
    template <typename T> __device__ static __forceinline__ void channelwise_scales(const T *, int, uint32_t *) {}
    // A tile's copy plan (tiles.cuh WeightTile): words between stages and between a thread's chunks (RSTEP stored
    // rows), and thread tid's first 16-byte chunk: row tid / CPR, chunk ch = tid % CPR of the tile at (k_begin, n0)
    // (8 columns a word: 32 columns a chunk), its source, its shared-memory offset (rows of SROW words), its first k
    // (-1: past N).
    template <int BK, int RSTEP, int CPR, int CHUNKS, int SROW>
    __device__ static __forceinline__ void plan_copy(const uint32_t *B, int N, int n0, int k_begin, int tid,
                                                     size_t &stride, size_t &cstride, const uint32_t *&src,
                                                     uint32_t &dst, int &k) {
        const size_t rowstride = (size_t)(N / 8);
        stride = (size_t)(BK / KROW) * rowstride;
        cstride = (size_t)RSTEP * rowstride;
        const int row = tid / CPR, ch = tid % CPR;
        bool on = tid < CHUNKS;
        on = on && n0 + ch * 32 < N;
        src = B + (on ? (size_t)(k_begin + row) * (N / 8) + (n0 + ch * 32) / 8 : 0);
        dst = (row * SROW + ch * 4) * 4;
        k = on ? k_begin + row * KROW : -1;
    }

    // Raw words of k16 step kk (of a stage at sB, rows of SROW words) for warp (wn, wh): rows 2q, 2q+1, 2q+8, 2q+9 of
    // word r.
    template <int NH, int SROW>
    __device__ static __forceinline__ void fetch(const uint32_t *sB, int kk, int wn, int wh, int lane, uint32_t fb[4]) {
        const int q = lane & 3, r = lane >> 2;
        const uint32_t *rowp = sB + (kk * 16 + 2 * q) * SROW + wn * 8 + r;
        fb[0] = rowp[0];
        fb[1] = rowp[SROW];
        fb[2] = rowp[8 * SROW];
        fb[3] = rowp[9 * SROW];
    }
    // The B fragments of this warp's NB = 8 / NH blocks (half wh of the group's 8) from the raw words.
    template <typename T, int NH, int NB>
    __device__ static __forceinline__ void dequant(const uint32_t fb[4], int wh, const GroupConst<T> (&gc)[NB],
                                                   uint32_t b[NB][2]) {
        if constexpr (NH == 4) {
            // blocks 2wh, 2wh + 1: byte wh of each row word (nibbles 2wh, 2wh + 1)
            const uint32_t sel = wh >= 2 ? 0x7632u : 0x5410u, sh = 8 * (wh & 1);
            uint32_t x0 = prmt(fb[0], fb[1], sel) >> sh, x8 = prmt(fb[2], fb[3], sel) >> sh;
            b[0][0] = dq_lo<T>(x0, gc[0]);
            b[0][1] = dq_lo<T>(x8, gc[0]);
            b[1][0] = dq_hi<T>(x0, gc[1]);
            b[1][1] = dq_hi<T>(x8, gc[1]);
        } else {
            // nibbles 0-3 of each row word are blocks 0-3 (low half-words), nibbles 4-7 blocks 4-7
            const uint32_t sel_lo = NH == 1 ? 0x5410u : (wh ? 0x7632u : 0x5410u);
            uint32_t lo01 = prmt(fb[0], fb[1], sel_lo), hi01 = prmt(fb[0], fb[1], 0x7632);
            uint32_t lo89 = prmt(fb[2], fb[3], sel_lo), hi89 = prmt(fb[2], fb[3], 0x7632);
#pragma unroll
            for (int j = 0; j < NB; j++) {
                uint32_t x0 = (j < 4 ? lo01 : hi01) >> (8 * ((j % 4) / 2));
                uint32_t x8 = (j < 4 ? lo89 : hi89) >> (8 * ((j % 4) / 2));
                if (j % 2 == 0) {
                    b[j][0] = dq_lo<T>(x0, gc[j]);
                    b[j][1] = dq_lo<T>(x8, gc[j]);
                } else {
                    b[j][0] = dq_hi<T>(x0, gc[j]);
                    b[j][1] = dq_hi<T>(x8, gc[j]);
                }
            }
        }
    }

    // Decode kernel (weights as the MMA's A operand, pair i = MMA rows g and g + 8): blocks i and i + 4, columns
    // 8g + 2i and 8g + 2i + 1; constant c = 2i + row of pair i is column 8g + c.
    __device__ static __forceinline__ int decode_column(int g, int c) { return 8 * g + c; }
    static constexpr bool DECODE_COLUMNS_ADJACENT = true; // a thread's 8 constants are 8 adjacent columns
    __device__ static __forceinline__ int decode_zero_nibble(int i, int row, int c) { return i + 4 * row; }
    // what the stored value of constant c's weights is multiplied by (an in-place high nibble carries 16)
    template <int HI_MUL> __device__ static __forceinline__ int decode_weight_scale(int i) {
        return (i & 1) ? HI_MUL : 1;
    }
    // The A operand of pair i from the raw words: block i is nibble i % 2 of byte i / 2
    template <typename Dq>
    __device__ static __forceinline__ void decode_operand(const uint32_t *fb, int i, uint32_t a[4]) {
        const uint32_t lo01 = prmt(fb[0], fb[1], 0x5410), hi01 = prmt(fb[0], fb[1], 0x7632);
        const uint32_t lo89 = prmt(fb[2], fb[3], 0x5410), hi89 = prmt(fb[2], fb[3], 0x7632);
        const int sh = 8 * (i / 2);
        if (i % 2 == 0) {
            a[0] = Dq::lo(lo01 >> sh);
            a[1] = Dq::lo(hi01 >> sh);
            a[2] = Dq::lo(lo89 >> sh);
            a[3] = Dq::lo(hi89 >> sh);
        } else {
            a[0] = Dq::hi(lo01 >> sh);
            a[1] = Dq::hi(hi01 >> sh);
            a[2] = Dq::hi(lo89 >> sh);
            a[3] = Dq::hi(hi89 >> sh);
        }
    }
};

// Marlin (public IST-DASLab layout, [K/16, 2N]): lane i's 16 bytes of a 16-row tile hold the fragments of the 4 16x16
// tiles of its 64 columns; block j, slot r is column 8j + r. Zero points [K/G, N/8] in Marlin's nibble order; scales
// permuted (scale_perm; scale_perm_single when G = K).
template <> struct WeightFormat<W4A16_LAYOUT_MARLIN> {
    static constexpr int KROW = 16;
    static constexpr int PAD_WORDS = 0;
    static constexpr bool CHANNELWISE_PERM = true;
    static constexpr bool HIGH_K_IN_HIGH_NIBBLES = true;
    static constexpr bool SLOT_BLOCKS_ADJACENT = false;
    static constexpr bool SLOT_PAIRS_ADJACENT = true;
    __host__ __device__ static constexpr int row_words(int n) { return 2 * n; }
    __device__ static __forceinline__ int column(int j, int slot) { return 8 * j + slot; }
    // grouped: position 8r + m holds column r + 8m
    __device__ static __forceinline__ int scale_index(int m) { return m; }
    __device__ static __forceinline__ int zero_nibble(int m) { return awq_reverse(m); }
    // channelwise (scale_perm_single): within each 32 columns, position 8i + t holds column 2i +
    // {0,1,8,9,16,17,24,25}[t]
    __device__ static __forceinline__ int channelwise_scale_pos(int m, int r) {
        return 32 * (m / 4) + 8 * (r / 2) + 2 * (m % 4) + (r % 2);
    }
    // The scales of the 8 blocks of slot r (both half-words) when G = K, from a stage's scale row sS of the thread's
    // 64 columns: channelwise_scale_pos written out (the call form compiles to other code).
    template <typename T> __device__ static __forceinline__ void channelwise_scales(const T *sS, int r, uint32_t s[8]) {
        const uint16_t *s16 = reinterpret_cast<const uint16_t *>(sS);
#pragma unroll
        for (int m = 0; m < 8; m++) s[m] = prmt(s16[32 * (m / 4) + 8 * (r / 2) + 2 * (m % 4) + (r % 2)], 0u, 0x1010u);
    }
    // A tile's copy plan, as AWQ's: a stored row is 16 k, 2 words a column, so a 16-byte chunk holds 2 columns.
    template <int BK, int RSTEP, int CPR, int CHUNKS, int SROW>
    __device__ static __forceinline__ void plan_copy(const uint32_t *B, int N, int n0, int k_begin, int tid,
                                                     size_t &stride, size_t &cstride, const uint32_t *&src,
                                                     uint32_t &dst, int &k) {
        const size_t rowstride = (size_t)(2 * N);
        stride = (size_t)(BK / KROW) * rowstride;
        cstride = (size_t)RSTEP * rowstride;
        const int row = tid / CPR, ch = tid % CPR;
        bool on = tid < CHUNKS;
        on = on && 2 * n0 + ch * 4 < 2 * N;
        src = B + (on ? (size_t)(k_begin / 16 + row) * (2 * N) + 2 * n0 + ch * 4 : 0);
        dst = (row * SROW + ch * 4) * 4;
        k = on ? k_begin + row * KROW : -1;
    }

    // The lane's 16 bytes (NH = 1), or this warp's half (tiles 2wh, 2wh + 1) or quarter (tile wh) of them.
    template <int NH, int SROW>
    __device__ static __forceinline__ void fetch(const uint32_t *sB, int kk, int wn, int wh, int lane, uint32_t fb[4]) {
        if constexpr (NH == 1) {
            uint4 v = reinterpret_cast<const uint4 *>(sB + kk * SROW + wn * 128)[lane];
            fb[0] = v.x;
            fb[1] = v.y;
            fb[2] = v.z;
            fb[3] = v.w;
        } else if constexpr (NH == 2) {
            uint2 v = reinterpret_cast<const uint2 *>(sB + kk * SROW + wn * 128 + lane * 4 + 2 * wh)[0];
            fb[0] = v.x;
            fb[1] = v.y;
        } else {
            fb[0] = sB[kk * SROW + wn * 128 + lane * 4 + wh];
        }
    }
    template <typename T, int NH, int NB>
    __device__ static __forceinline__ void dequant(const uint32_t fb[4], int wh, const GroupConst<T> (&gc)[NB],
                                                   uint32_t b[NB][2]) {
#pragma unroll
        for (int t = 0; t < NB / 2; t++) {
            uint32_t w = fb[t];
            b[2 * t][0] = dq_lo<T>(w, gc[2 * t]);
            b[2 * t][1] = dq_hi<T>(w, gc[2 * t]);
            b[2 * t + 1][0] = dq_lo<T>(w >> 8, gc[2 * t + 1]);
            b[2 * t + 1][1] = dq_hi<T>(w >> 8, gc[2 * t + 1]);
        }
    }

    // Decode kernel: pair i is blocks 2i, 2i + 1 (columns 16i + g, 16i + 8 + g); constant c is column 8c + g.
    __device__ static __forceinline__ int decode_column(int g, int c) { return 8 * c + g; }
    static constexpr bool DECODE_COLUMNS_ADJACENT = false;
    __device__ static __forceinline__ int decode_zero_nibble(int i, int row, int c) { return awq_reverse(c); }
    template <int HI_MUL> __device__ static __forceinline__ int decode_weight_scale(int i) { return 1; }
    template <typename Dq>
    __device__ static __forceinline__ void decode_operand(const uint32_t *fb, int i, uint32_t a[4]) {
        const uint32_t w = fb[i];
        a[0] = Dq::lo(w);
        a[1] = Dq::lo(w >> 8);
        a[2] = Dq::hi(w);
        a[3] = Dq::hi(w >> 8);
    }
};

} // namespace w4a16
