// The operand tiles both GEMM kernels share: how a pipeline stage of activations and of packed weights is copied
// into shared memory, and how a warp turns its share of the weight tile into dequantised fragments.
//
//  * ActTile: BM rows x BK columns of A, 16-byte chunks XOR-swizzled by row (chunk c of row r at c ^ (r & 7)).
//    With BK = 64 that is exactly the 128-byte-swizzled K-major layout wgmma reads through a descriptor, and
//    what ldmatrix reads without bank conflicts in the mma.sync kernel.
//  * WeightTile: BN columns x BK rows of packed int4 weights in a weight format (formats.cuh), the scale rows and
//    zero-point rows of the groups the stage touches. A warp owns NB = 8 / NH n8 column blocks of one 64-column
//    group (a half or a quarter of it when NH = 2 or 4). Per k16 step it produces, for each block j, the two k-pair
//    registers of the m16n8k16 B fragment: k rows 2q, 2q+1 and 2q+8, 2q+9 of column slot r (q = lane % 4,
//    r = lane / 4), which is column WeightFormat::column(j, r) of the 64-column group.
//    The same registers are the A fragment of a wgmma m64k16 when output channels are the MMA's rows (the
//    sm_90a kernel): rows r and r + 8 of a warp's 16 rows are blocks 2i and 2i + 1.
#pragma once
#include "common.cuh"
#include "configs.h"
#include "formats.cuh"

namespace w4a16 {

// One stage of a per-thread copy plan (a source pointer, first k and smem offset per 16-byte chunk), advanced by BK
// along K (`stride` elements of the source). Chunks with k < 0 are not this thread's (or lie outside the matrix);
// past K they are zero-filled, so the K tail adds nothing.
template <int BK, int PER, typename P>
__device__ __forceinline__ void issue_plan(unsigned char *st, const P *(&src)[PER], int (&k)[PER],
                                           const uint32_t (&dst)[PER], size_t stride, int K, const P *any) {
#pragma unroll
    for (int i = 0; i < PER; i++) {
        if (k[i] >= 0) {
            bool ok = k[i] < K;
            cp_async16(st + dst[i], ok ? src[i] : any, ok);
            src[i] += stride;
            k[i] += BK;
        }
    }
}

// A (activations) [M, K] row-major, one stage = BM x BK.
// When every thread copies the same number of chunks, all in one 16-byte column and THREADS / CH rows apart (a
// multiple of 8, so the swizzle of all of them is the same), the plan is one source pointer, one k, one
// shared-memory offset and a mask of the rows inside M: per stage one bounds check and an address add per chunk
// (the general plan keeps a pointer, k and offset per chunk and checks each).
template <typename T, int BM, int BK, int THREADS> struct ActTile {
    static constexpr int CH = BK / 8; // 16-byte chunks per row
    static_assert(CH % 8 == 0, "the XOR swizzle (chunk ^ (row & 7)) stays inside a row of a multiple of 8 chunks");
    static constexpr int BYTES = BM * BK * 2;
    static constexpr int CHUNKS = BM * CH, PER = (CHUNKS + THREADS - 1) / THREADS;
    static constexpr bool UNIFORM = CHUNKS % THREADS == 0 && THREADS % CH == 0 && (THREADS / CH) % 8 == 0 && PER <= 32;
    static constexpr int RSTEP = UNIFORM ? THREADS / CH : 1; // rows between a thread's chunks (uniform plan)
    static constexpr int NP = UNIFORM ? 1 : PER;             // per-chunk plan entries
    const T *src[NP];
    int k[NP]; // first k of the chunk; < 0 when the thread has no chunk there (or the row is >= M)
    uint32_t dst[NP];
    uint32_t rows; // uniform plan: bit i set when chunk i's row is < M
    size_t rstride;

    __device__ __forceinline__ void plan(const T *A, int M, int K, int m0, int k_begin, int tid) {
        if constexpr (UNIFORM) {
            const int row = tid / CH, ch = tid % CH;
            rows = 0;
#pragma unroll
            for (int i = 0; i < PER; i++) rows |= (m0 + row + i * RSTEP < M ? 1u : 0u) << i;
            k[0] = k_begin + ch * 8;
            src[0] = A + (size_t)(m0 + row) * K + k_begin + ch * 8; // only dereferenced for rows < M
            dst[0] = (row * BK + ((ch ^ (row & 7)) * 8)) * 2;
            rstride = (size_t)RSTEP * K;
        } else {
#pragma unroll
            for (int i = 0; i < PER; i++) {
                int c = tid + i * THREADS, row = c / CH, ch = c % CH;
                bool on = c < CHUNKS && m0 + row < M; // rows >= M are never stored, so never loaded
                k[i] = on ? k_begin + ch * 8 : -1;
                src[i] = A + (on ? (size_t)(m0 + row) * K + k_begin + ch * 8 : 0);
                dst[i] = (row * BK + ((ch ^ (row & 7)) * 8)) * 2;
            }
        }
    }
    // Copies the next stage into `st` and advances the plan by BK; past K the chunks are zero-filled.
    __device__ __forceinline__ void issue(unsigned char *st, const T *A, int K) {
        if constexpr (UNIFORM) {
            constexpr uint32_t ALL = PER == 32 ? 0xFFFFFFFFu : (1u << PER) - 1;
            unsigned char *d = st + dst[0];
            const T *s = src[0];
            if (k[0] < K && rows == ALL) { // every chunk inside the matrix
#pragma unroll
                for (int i = 0; i < PER; i++) cp_async16(d + i * RSTEP * BK * 2, s + i * rstride, true);
            } else {
                const bool ok = k[0] < K;
#pragma unroll
                for (int i = 0; i < PER; i++)
                    if (rows >> i & 1) cp_async16(d + i * RSTEP * BK * 2, ok ? s + i * rstride : A, ok);
            }
            src[0] += BK;
            k[0] += BK;
        } else {
            issue_plan<BK>(st, src, k, dst, BK, K, A);
        }
    }
};

template <typename T, int LAYOUT, int BN, int BK, int NH, int THREADS> struct WeightTile {
    using F = WeightFormat<LAYOUT>;
    static constexpr int NB = 8 / NH;                            // n8 blocks per warp
    static constexpr int SLOTS = BK / 32;                        // scale rows a stage can need (G >= 32)
    static constexpr int SROW = F::row_words(BN) + F::PAD_WORDS; // words per shared-memory row
    static constexpr int ROWS = BK / F::KROW;                    // stored rows per stage
    static constexpr int B_BYTES = ROWS * SROW * 4;
    static constexpr int S_BYTES = SLOTS * BN * 2, Z_BYTES = SLOTS * (BN / 8) * 4;
    static constexpr int BYTES = B_BYTES + S_BYTES + Z_BYTES;
    static constexpr int CPR = F::row_words(BN) / 4; // 16-byte chunks per smem row
    static constexpr int CHUNKS = ROWS * CPR, PER = (CHUNKS + THREADS - 1) / THREADS;
    static_assert(SLOTS * (BN / 8) <= THREADS, "one thread per scale chunk");

    // ---- producer: a per-thread copy plan fixed for the whole K loop. Every thread copies the same number of chunks,
    // all in one 16-byte column and RSTEP smem rows apart, so the plan is one source pointer, one shared-memory offset
    // and one flag for the column: a stage inside K costs an address add per chunk and no bounds check.
    static constexpr int KROW = F::KROW, ROW_BYTES = SROW * 4;
    static_assert(CHUNKS % THREADS == 0 && THREADS % CPR == 0, "each thread copies whole chunks of one column");
    static constexpr int RSTEP = THREADS / CPR;
    const uint32_t *src;
    int k; // k of the thread's first chunk; < 0: its column lies past N
    uint32_t dst;
    size_t stride;  // words between stages
    size_t cstride; // words between a thread's chunks

    // Scale / zero-point rows: thread tid < slots_used * BN / 8 copies one 16-byte chunk of scales (slot s_sl), and
    // tid < slots_used * BN / 32 one of zero points (slot z_sl); src points at the chunk's column in group 0, and is
    // null when the thread copies nothing (or the column lies past N: those columns are never stored).
    const T *s_src;
    const uint32_t *z_src;
    int s_sl, z_sl;
    uint32_t s_dst, z_dst; // smem offsets in slot 0

    __device__ __forceinline__ void plan(const uint32_t *B, const T *S, const uint32_t *Z, int N, int n0, int k_begin,
                                         int slots_used, int tid) {
        {
            const int ch = tid % (BN / 8), col = n0 + ch * 8;
            s_sl = tid / (BN / 8);
            s_src = tid < slots_used * (BN / 8) && col < N ? S + col : nullptr;
            s_dst = B_BYTES + (s_sl * BN + ch * 8) * (int)sizeof(T);
        }
        {
            const int ch = tid % (BN / 32), col = n0 + ch * 32;
            z_sl = tid / (BN / 32);
            z_src = Z && tid < slots_used * (BN / 32) && col < N ? Z + col / 8 : nullptr;
            z_dst = B_BYTES + S_BYTES + (z_sl * (BN / 8) + ch * 4) * 4;
        }
        F::template plan_copy<BK, RSTEP, CPR, CHUNKS, SROW>(B, N, n0, k_begin, tid, stride, cstride, src, dst, k);
    }
    // Copies the stage starting at k0 (a multiple of BK) into `st`: weights, then the scale / zero-point rows of
    // the groups it touches (clamped to the last group).
    __device__ __forceinline__ void issue(unsigned char *st, const uint32_t *B, int N, int K, int k0, int gshift,
                                          int g_last) {
        if (k >= 0) { // the thread's column lies inside N
            unsigned char *d = st + dst;
            const uint32_t *s = src;
            if (k0 + BK <= K) { // the whole stage lies inside K
#pragma unroll
                for (int i = 0; i < PER; i++) cp_async16_weights(d + i * RSTEP * ROW_BYTES, s + i * cstride);
            } else { // K tail: rows past K are zero-filled
#pragma unroll
                for (int i = 0; i < PER; i++) {
                    const bool ok = k + i * RSTEP * KROW < K;
                    cp_async16(d + i * RSTEP * ROW_BYTES, ok ? s + i * cstride : B, ok);
                }
            }
            src += stride;
            k += BK;
        }
        const int g0 = k0 >> gshift;
        if (s_src) cp_async16(st + s_dst, s_src + (size_t)min(g0 + s_sl, g_last) * N, true);
        if (z_src) cp_async16(st + z_dst, z_src + (size_t)min(g0 + z_sl, g_last) * (N / 8), true);
    }

    // ---- consumer: one warp's view (64-column group wn, half wh)
    GroupConst<T> gc[NB];
    uint32_t fb[2][4]; // raw packed weights of two k16 steps (WeightFormat::fetch)

    // Per-group constants of this thread's NB blocks from scale / zero slot `sl` of stage `st`.
    __device__ __forceinline__ void group(const unsigned char *st, int sl, int wn, int wh, int lane, bool has_zeros,
                                          bool marlin_channelwise) {
        const int r = lane >> 2, j0 = wh * NB;
        const T *sS = reinterpret_cast<const T *>(st + B_BYTES) + sl * BN + wn * 64;
        const uint32_t *sZ = reinterpret_cast<const uint32_t *>(st + B_BYTES + S_BYTES) + sl * (BN / 8) + wn * 8;
        uint32_t s[8]; // scale of block m in both half-words
        if (F::CHANNELWISE_PERM && marlin_channelwise) {
            F::template channelwise_scales<T>(sS, r, s);
        } else {
            uint4 v = *reinterpret_cast<const uint4 *>(sS + 8 * r);
            const uint32_t w[4] = {v.x, v.y, v.z, v.w}; // no local-memory copy of v: constant indices only
#pragma unroll
            for (int m = 0; m < 8; m++) {
                const int c = F::scale_index(m);
                s[m] = prmt(w[c / 2], 0u, c % 2 ? 0x3232u : 0x1010u); // one byte permute per scale pair
            }
        }
        uint32_t zw = has_zeros ? sZ[r] : 0x88888888u; // uint4b8: zero point 8
#pragma unroll
        for (int jj = 0; jj < NB; jj++) {
            const int m = j0 + jj;
            uint32_t z = (zw >> (4 * F::zero_nibble(m))) & 0xF;
            uint32_t sv = s[jj]; // selected with constant indices: a run-time index would put s in local memory
#pragma unroll
            for (int w = 1; w < NH; w++)
                if (wh == w) sv = s[w * NB + jj];
            gc[jj] = make_group_const_bits<T>(sv, z);
        }
    }

    // Raw packed words of k16 step kk (of the stage) into buffer `buf`.
    __device__ __forceinline__ void fetch(const unsigned char *st, int kk, int wn, int wh, int lane, int buf) {
        F::template fetch<NH, SROW>(reinterpret_cast<const uint32_t *>(st), kk, wn, wh, lane, fb[buf]);
    }

    // Dequantised B fragments of the NB blocks from buffer `buf`.
    __device__ __forceinline__ void dequant(int buf, int wh, uint32_t b[NB][2]) const {
        F::template dequant<T, NH, NB>(fb[buf], wh, gc, b);
    }
};

} // namespace w4a16
