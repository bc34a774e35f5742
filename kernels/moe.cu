// Mixture-of-experts kernels: the routing (pairs grouped by expert, padded to the block size) and the grouped int4
// GEMM that multiplies each block of pairs by its expert's weights.
//
// Grouped GEMM: one block of 4 warps computes one routing block (block_size <= 64 pairs of one expert, BM = 16 MT rows)
// x BN output channels. A's rows are gathered through sorted_ids while they are copied into shared memory (rows of
// padding entries are zero-filled and never stored). A stage holds BK k: the gathered A tile (16-byte chunks
// XOR-swizzled by row for ldmatrix), the expert's packed weights, and the scale / zero-point rows of the groups the
// stage touches (copied only into stages where a group starts). Each warp takes 64 channels x some k16 steps of every
// stage (mma.sync m16n8k16, B fragments dequantised in registers with common.cuh's magic-number helpers); warps that
// split K take one contiguous region of the block's k each (a stage holds the next KS k16 steps of every region), and
// their fp32 sums are added in warp order through shared memory at the end, so a row's result does not depend on
// which other rows share its block.
//
// Split K across blocks (gridDim.z > 1; the 16 x 64 tile for MoE calls and the dense rows-16 plans, the 32-row tiles
// for the dense rows-32 and rows-32n plans): where the routing blocks x channel tiles leave most of the GPU's block
// slots empty (decode: T x top_k pairs in a few routing blocks), each tile's k-tiles are divided among gridDim.z
// blocks. Each writes its fp32 sums to the caller's workspace; the last block of the tile to arrive (an atomic counter
// per tile, reset by that block) adds the splits' sums in split order, so the result is the same bits on every run
// whichever block arrives last. Dense rows-64 plans, and rows-32 plans of more than one wave, share k-tiles by stream-K
// instead (gemm_kernel, SPLIT = 2), with the same counter and the same fixed order (the 32-row tile's K-split warps add
// their sums in the block first).
#include "common.cuh"
#include "configs.h"
#include "launch.h"
#include "moe_launch.h"
#include "stream_k.cuh"
#include <cuda_runtime.h>

namespace w4a16 {
namespace moe {

constexpr int THREADS = W4A16_MOE_THREADS, WARPS = 4;

// ---------------------------------------------------------------- routing
// One block: per-expert counts in shared memory, a warp scan of the padded counts, then every pair is scattered to
// its expert's run. Entries outside [0, E) are dropped.
__global__ void __launch_bounds__(1024)
    align_kernel(const int32_t *ids, int n, int E, int bs, int32_t *sorted, int sorted_cap, int32_t *expert_ids,
                 int blocks_cap, int32_t *npp) {
    extern __shared__ int sm[];
    int *cnt = sm, *off = sm + E, *fill = sm + 2 * E + 1; // off has E + 1 entries
    const int tid = threadIdx.x, nt = blockDim.x;
    for (int e = tid; e < E; e += nt) cnt[e] = fill[e] = 0;
    __syncthreads();
    for (int i = tid; i < n; i += nt) {
        const int e = ids[i];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (tid < 32) { // lane l scans a contiguous range of experts, the warp adds the ranges' sums
        const int per = (E + 31) / 32, e0 = tid * per, e1 = min(E, e0 + per);
        int sum = 0;
        for (int e = e0; e < e1; e++) sum += (cnt[e] + bs - 1) / bs * bs;
        int incl = sum;
        for (int d = 1; d < 32; d <<= 1) {
            const int v = __shfl_up_sync(0xFFFFFFFFu, incl, d);
            if (tid >= d) incl += v;
        }
        int run = incl - sum;
        for (int e = e0; e < e1; e++) {
            off[e] = run;
            run += (cnt[e] + bs - 1) / bs * bs;
        }
        if (tid == 31) off[E] = incl;
    }
    __syncthreads();
    const int total = off[E];
    if (tid == 0) *npp = total;
    for (int i = tid; i < sorted_cap; i += nt) sorted[i] = n;
    for (int b = tid; b < blocks_cap; b += nt) {
        int e = -1;
        if ((long long)b * bs < total) { // the last expert whose run starts at or before the block
            const int x = b * bs;
            int lo = 0, hi = E - 1;
            while (lo < hi) {
                const int mid = (lo + hi + 1) / 2;
                if (off[mid] <= x)
                    lo = mid;
                else
                    hi = mid - 1;
            }
            e = lo;
        }
        expert_ids[b] = e;
    }
    __syncthreads(); // the pad values are in place before the scatter overwrites some of them
    for (int i = tid; i < n; i += nt) {
        const int e = ids[i];
        if (e >= 0 && e < E) sorted[off[e] + atomicAdd(&fill[e], 1)] = i;
    }
}

// ---------------------------------------------------------------- grouped GEMM
// Tile of one block (4 warps): BM = 16 MT rows (the routing block), BN = 64 WN channels, BK = 16 WK KS k per stage;
// warp (wn, wk) computes the BM x 64 channels of group wn over k16 steps wk KS .. wk KS + KS - 1 of each stage, which
// hold the next KS k16 steps of its k region.
// The tiles (Cfg below, chosen per call by csrc/moe.c; for dense calls by csrc/plan.c): 16 rows x 64 channels, the 4
// warps splitting 128 k (the most blocks and bytes in flight where few blocks exist; the tile MoE plans split K across
// blocks for); 16 x 128, 2 channel groups x 2-way K split of 64 k; 16 x 256, each warp 64 channels over whole 64-k
// stages (the fewest instructions per weight, where blocks are plentiful); 32 rows: 128 channels, 2-way K split, or
// (dense calls) 64 channels with the 16 x 64 tile's 4-way split, each weight dequantised once for both m16 tiles; 64
// rows: 256 channels, no K split (each weight fragment feeds 4 m16 tiles, the A tile is reused by 4 warps).
__device__ __forceinline__ void add4(float4 &a, const float4 b) {
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
}

template <int LAYOUT, int MT, int WN, int KS> struct Tile {
    static constexpr int WK = WARPS / WN;
    static constexpr int BM = 16 * MT, BN = 64 * WN, BK = 16 * WK * KS;
    static constexpr int SLOTS = BK / 32; // scale / zero-point rows a stage can touch (G >= 32)
    // the activation tile's XOR swizzle (chunk ^ (row & 7)) stays inside a row only with 8 or more 16-byte chunks
    static_assert(BK % 64 == 0, "k per stage: a multiple of 64");
    static constexpr int A_BYTES = BM * BK * 2;
    static constexpr int SB = BN / 8 + 4; // AWQ: padded words per row, a fragment's 4 row loads hit distinct banks
    static constexpr int B_BYTES = LAYOUT == W4A16_LAYOUT_AWQ ? BK * SB * 4 : (BK / 16) * 2 * BN * 4;
    static constexpr int S_BYTES = SLOTS * BN * 2, Z_BYTES = SLOTS * (BN / 8) * 4;
    static constexpr int STAGE = A_BYTES + B_BYTES + S_BYTES + Z_BYTES;
    static constexpr int RED = WK > 1 ? WARPS *MT * 8 * 32 * 16 : 0;            // every warp's accumulators as float4
    static constexpr int A_PER = BM * (BK / 8) / THREADS;                       // 16-byte chunks per thread and stage
    static constexpr int B_CPR = LAYOUT == W4A16_LAYOUT_AWQ ? BN / 32 : BN / 2; // chunks per smem row
    static constexpr int B_ROWS = LAYOUT == W4A16_LAYOUT_AWQ ? BK : BK / 16;
    static constexpr int B_PER = B_ROWS * B_CPR / THREADS;
    static_assert(A_PER * THREADS == BM * (BK / 8) && B_PER * THREADS == B_ROWS * B_CPR, "whole chunks per thread");
    static_assert(SLOTS * (BN / 8) <= 64 && SLOTS * (BN / 32) <= 32, "scale and zero-point copy threads");
    // WK = 1: the output tile staged in T for the epilogue's copy, rows padded by 8 (16 bytes) so that a fragment's
    // 8 rows hit distinct banks
    static constexpr int SROW = BN + 8, OUT = WK == 1 ? BM * SROW * 2 : 0;
    static constexpr int smem(int stages) {
        const int m = stages * STAGE > RED ? stages * STAGE : RED;
        return m > OUT ? m : OUT;
    }
};

// cp.async of a weight chunk with the L2 prefetch size 128B: an AWQ row of the 16-row tile is a BN / 2-byte piece
// whose neighbours belong to the next channel tiles, which run at the same time (channel-fast grid), so one 128-byte
// fetch serves 128 / (BN / 2) blocks.
__device__ __forceinline__ void cp_async16_l2_128(void *smem, const void *gmem, bool pred) {
    uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    int n = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}

// After a block wrote its part of a tile's sums to the workspace and adds `add` to the tile's counter: whether it
// completed it (the counter reached `total`; then the counter is reset, leaving the workspace zeroed as it was found,
// and the other parts' sums are visible to it). `flag` is a shared int no thread reads any more: s_src[0], read only
// while the copy plans were built, because a static shared variable of its own took the 32-row tile's split kernel past
// three blocks per 100 KB SM.
__device__ __forceinline__ bool last_to_arrive(int *counter, int add, int total, int &flag) {
    __threadfence(); // the sums are visible device-wide before the counter says so
    __syncthreads();
    if (threadIdx.x == 0) {
        const int prev = atomicAdd(counter, add);
        flag = prev + add == total;
        if (flag) *counter = 0;
    }
    __syncthreads();
    const bool last = flag != 0;
    if (last) __threadfence();
    return last;
}

// Resident blocks the register allocation must allow (csrc/moe.c counts blocks per SM from the occupancy API): 4 for
// the 16-row tiles (<= 128 registers), 3 for the 32-row ones (<= 168); unbounded, the compiler took 135 and 180.
constexpr int min_blocks(int mt) { return mt == 1 ? 4 : mt == 2 ? 3 : 1; }

// A stream-K segment's place in the division (SPLIT = 2): the block's workspace slot of a partial tile, the tile's
// index (also its arrival counter's), the units and blocks of the division (stream_k.cuh).
struct SkSeg {
    int slot, tile;
    long long U, B;
};

// One tile (routing block blk x channel tile ntile) over k-tiles [kt0, kt0 + nk). SPLIT: 0 the whole K; 1 K split
// across gridDim.z blocks; 2 a stream-K segment (sk). The split kinds are separate instances, so the unsplit kernels
// carry none of their code.
template <typename T, int LAYOUT, int MT, int WN, int KS, int SPLIT>
__device__ __forceinline__ void tile_gemm(const w4a16_moe_launch &p, const int blk, const int ntile, const int kt0,
                                          const int nk, const SkSeg &sk) {
    using D = Dtype<T>;
    using TL = Tile<LAYOUT, MT, WN, KS>;
    constexpr int WK = TL::WK, BM = TL::BM, BN = TL::BN, BK = TL::BK, SB = TL::SB;
    constexpr int A_BYTES = TL::A_BYTES, B_BYTES = TL::B_BYTES, S_BYTES = TL::S_BYTES, STAGE = TL::STAGE;
    constexpr int CH = BK / 8; // A chunks per row
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ int s_src[BM], s_dst[BM]; // per row: A row and C row, -1 for padding

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, q = lane & 3, r = lane >> 2;
    const int wn = warp % WN, wk = warp / WN;
    // grid: routing blocks x channel tiles, channel tiles fastest where n_fast (whenever the routing blocks fit
    // gridDim.y: the live routing blocks launch first, and the blocks that run together read neighbouring pieces of
    // one expert's weights and the same gathered rows)
    const bool n_fast = p.n_fast != 0;
    const int n0 = ntile * BN, bs = p.block_size;
    // the block's routing (padded count, expert, its rows' pair ids) loaded together: three independent loads instead
    // of a chain (the buffers hold grid_blocks blocks, so every index here is inside them); no routing buffers: a dense
    // GEMM (the rows-64 / rows-32 / rows-16 plans), pair i = row i, every block of expert 0
    const bool dense = p.sorted_ids == nullptr;
    const int npp = dense ? p.sorted_capacity : *p.num_post_padded, e = dense ? 0 : p.expert_ids[blk];
    int id = -1;
    if (tid < BM && tid < bs && (long long)blk * bs + tid < p.sorted_capacity)
        id = dense ? blk * bs + tid : p.sorted_ids[(size_t)blk * bs + tid];
    if ((long long)blk * bs >= (long long)npp || e < 0 || e >= p.num_experts) return; // uniform over the block
    const int N = p.N, K = p.K, stages = p.stages, gshift = p.gshift;
    const int nkt = (K + BK - 1) / BK, splits = SPLIT == 1 ? (int)gridDim.z : 1;
    const int g_last = (K - 1) >> gshift, groups = g_last + 1;
    const T *A = static_cast<const T *>(p.A);
    // k of the stages: each K-split warp group wk owns region wk of the block's k range (kb + wk RL .. + RL, RL =
    // nk RK), and stage s holds RK k of every region (kb + w RL + s RK ..). A warp so walks contiguous k and rebuilds
    // its group constants once per group, not once per stage (G = 128 on the 16 x 64 tile: every 4th stage, not
    // every one). Regions past K (the last region of a K tail) are zero-filled like any chunk past K.
    constexpr int RK = 16 * KS;
    const int kb = kt0 * BK, RL = nk * RK;
    auto region_k = [&](int x) { return kb + (x / RK) * RL + x % RK; }; // k of offset x (0 .. BK) of the first stage
    // a copy plan for every stage: a chunk advances by RK k per stage and is inside K while the stage's offset in its
    // region (koff = s RK) is below its limit; where K is a multiple of BK and the tile lies inside N, none of the
    // weight chunks needs the test
    const bool full = K % BK == 0 && n0 + BN <= N;

    // ---- per-thread copy plans. Chunks past K or past N are zero-filled: zero activations and finite dequantised
    // zero weights add nothing.
    const uint32_t *B = static_cast<const uint32_t *>(p.B);
    const uint32_t *b_src[TL::B_PER];
    int b_lim[TL::B_PER]; // the chunk is copied while koff < b_lim: K - (first k of its row at koff 0), 0 past N
    uint32_t b_dst[TL::B_PER];
    const size_t b_step = LAYOUT == W4A16_LAYOUT_AWQ ? (size_t)RK * (N / 8) : (size_t)KS * (2 * N);
#pragma unroll
    for (int i = 0; i < TL::B_PER; i++) {
        const int c = tid + i * THREADS, row = c / TL::B_CPR, ch = c % TL::B_CPR;
        if constexpr (LAYOUT == W4A16_LAYOUT_AWQ) {
            const bool on = n0 + ch * 32 < N;
            const int k = region_k(row);
            b_src[i] = B + (size_t)e * K * (N / 8) + (on ? (size_t)k * (N / 8) + n0 / 8 + ch * 4 : 0);
            b_dst[i] = A_BYTES + (row * SB + ch * 4) * 4;
            b_lim[i] = on ? K - k : 0;
        } else {
            const bool on = n0 + ch * 2 < N;
            const int k16 = region_k(16 * row) / 16;
            b_src[i] = B + (size_t)e * (K / 16) * (2 * N) + (on ? (size_t)k16 * (2 * N) + 2 * n0 + ch * 4 : 0);
            b_dst[i] = A_BYTES + (row * 2 * BN + ch * 4) * 4;
            b_lim[i] = on ? K - 16 * k16 : 0;
        }
    }
    // scale / zero-point rows: SPR per region and stage (two where G = 32 < RK = 64); slot w SPR + j of a stage holds
    // the j-th group of region w's RK k, copied only where a group starts in it (or it is the region's first stage)
    const int spr = (RK >> gshift) > 1 ? (RK >> gshift) : 1;
    const T *s_base = nullptr;
    int s_k = 0, s_j = 0;
    uint32_t s_dsto = 0;
    if (tid < WK * spr * (BN / 8)) {
        const int ch = tid % (BN / 8), sl = tid / (BN / 8);
        s_k = region_k(sl / spr * RK), s_j = sl % spr;
        if (n0 + ch * 8 < N) s_base = static_cast<const T *>(p.scales) + (size_t)e * groups * N + n0 + ch * 8;
        s_dsto = A_BYTES + B_BYTES + (sl * BN + ch * 8) * 2;
    }
    const uint32_t *z_base = nullptr;
    int z_k = 0, z_j = 0;
    uint32_t z_dsto = 0;
    if (p.zeros && tid >= 64 && tid < 64 + WK * spr * (BN / 32)) {
        const int t2 = tid - 64, ch = t2 % (BN / 32), sl = t2 / (BN / 32);
        z_k = region_k(sl / spr * RK), z_j = sl % spr;
        if (n0 + ch * 32 < N)
            z_base = static_cast<const uint32_t *>(p.zeros) + (size_t)e * groups * (N / 8) + n0 / 8 + ch * 4;
        z_dsto = A_BYTES + B_BYTES + TL::S_BYTES + (sl * (BN / 8) + ch * 4) * 4;
    }
    auto group_row = [&](int k, int koff, int j, bool &copy) { // the row slot j of a region's stage holds, if new
        const int g0 = (k + koff) >> gshift;
        copy = koff == 0 || g0 != (k + koff - RK) >> gshift;
        return min(g0 + j, g_last);
    };
    // weights of the stage at region offset koff, with their scale and zero-point rows where a group starts
    auto issue_w = [&](int koff, unsigned char *st) {
#pragma unroll
        for (int i = 0; i < TL::B_PER; i++) {
            const bool ok = full || koff < b_lim[i];
            if (LAYOUT == W4A16_LAYOUT_AWQ && MT == 1 && n_fast)
                cp_async16_l2_128(st + b_dst[i], ok ? b_src[i] : B, ok);
            else
                cp_async16(st + b_dst[i], ok ? b_src[i] : B, ok);
            b_src[i] += b_step;
        }
        bool copy;
        if (s_base) {
            const int g = group_row(s_k, koff, s_j, copy);
            if (copy) cp_async16(st + s_dsto, s_base + (size_t)g * N, true);
        }
        if (z_base) {
            const int g = group_row(z_k, koff, z_j, copy);
            if (copy) cp_async16(st + z_dsto, z_base + (size_t)g * (N / 8), true);
        }
    };
    // the first stages' weights need only the expert: they are on their way while the rows are gathered (and, with
    // programmatic dependent launch, while the previous grid finishes writing A)
    for (int s = 0; s < stages - 1 && s < nk; s++) issue_w(s * RK, smem + s * STAGE);
    if (p.pdl) pdl_wait();
    if (tid < BM) {
        const bool ok = id >= 0 && id < p.M * p.top_k;
        s_src[tid] = ok ? id / p.top_k : -1;
        s_dst[tid] = ok ? id : -1;
    }
    __syncthreads();
    const T *a_src[TL::A_PER];
    int a_lim[TL::A_PER]; // copied while koff < a_lim: K - (first k of the chunk at koff 0), 0 for padding rows
    uint32_t a_dst[TL::A_PER];
#pragma unroll
    for (int i = 0; i < TL::A_PER; i++) {
        const int c = tid + i * THREADS, row = c / CH, ch = c % CH, src = s_src[row];
        const int k = region_k(8 * ch);
        a_lim[i] = src >= 0 ? K - k : 0;
        a_src[i] = A + (src >= 0 ? (size_t)src * K + k : 0);
        a_dst[i] = (row * BK + ((ch ^ (row & 7)) * 8)) * 2;
    }
    auto issue_a = [&](int koff, unsigned char *st) { // the gathered activation rows of the stage
#pragma unroll
        for (int i = 0; i < TL::A_PER; i++) {
            const bool ok = koff < a_lim[i];
            cp_async16(st + a_dst[i], ok ? a_src[i] : A, ok);
            a_src[i] += RK;
        }
    };

    float acc[MT][8][4];
    zero_sums(acc);

    for (int s = 0; s < stages - 1; s++) { // one commit group per stage (the first also holds the weights above)
        if (s < nk) issue_a(s * RK, smem + s * STAGE);
        cp_async_commit();
    }
    const bool has_zeros = p.zeros != nullptr, channelwise = p.marlin_channelwise != 0;
    // the packed weights a thread needs for k16 step kk of a stage: AWQ rows 2q, 2q+1, 2q+8, 2q+9 of word r of the
    // warp's 64 channels; Marlin the lane's 16 bytes of them
    auto fetch = [&](const unsigned char *st, int kk, uint32_t(&f)[4]) {
        if constexpr (LAYOUT == W4A16_LAYOUT_AWQ) {
            const uint32_t *rowp =
                reinterpret_cast<const uint32_t *>(st + A_BYTES) + (kk * 16 + 2 * q) * SB + wn * 8 + r;
            f[0] = rowp[0];
            f[1] = rowp[SB];
            f[2] = rowp[8 * SB];
            f[3] = rowp[9 * SB];
        } else {
            const uint4 v = reinterpret_cast<const uint4 *>(st + A_BYTES + (kk * (2 * BN) + wn * 128) * 4)[lane];
            f[0] = v.x;
            f[1] = v.y;
            f[2] = v.z;
            f[3] = v.w;
        }
    };
    GroupConst<T> gc[8];
    int cur_group = -1;
    // ring of stage buffers without divisions: the stage read at step i and the one refilled (read at step i - 1)
    unsigned char *const ring_end = smem + stages * STAGE;
    unsigned char *rd = smem, *wr = smem + (stages - 1) * STAGE;
    const int kw = region_k(wk * RK); // the warp's region
    for (int i = 0, koff = 0; i < nk; i++, koff += RK) {
        if (stages == 4) // the depths csrc/moe.c plans (2-4): immediates, not cp_async_wait_dyn's jump table
            cp_async_wait<2>();
        else if (stages == 3)
            cp_async_wait<1>();
        else
            cp_async_wait<0>();
        __syncthreads(); // stage i is visible; every warp is done with stage i - 1, whose buffer is refilled now
        if (i + stages - 1 < nk) {
            issue_w(koff + (stages - 1) * RK, wr);
            issue_a(koff + (stages - 1) * RK, wr);
        }
        cp_async_commit();
        wr = wr + STAGE == ring_end ? smem : wr + STAGE;
        const unsigned char *st = rd;
        rd = rd + STAGE == ring_end ? smem : rd + STAGE;
        uint32_t fr[2][4]; // packed weights of two k16 steps
        fetch(st, wk * KS, fr[0]);
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const int kk = wk * KS + ks, g = (kw + koff + 16 * ks) >> gshift;
            // group constants of the warp's 8 n8 blocks (column of block j, slot r: AWQ 8r + ORDER[j], Marlin
            // 8j + r), from the stage's slot of group g. Regions and stages start at multiples of 32 k and G >= 32,
            // so a group can start only at even steps: no test, so no branch, between a step's MMAs and the next
            // step's dequantisation otherwise.
            if (ks % 2 == 0 && g != cur_group) {
                cur_group = g;
                const int sl = wk * spr + min(g, g_last) - min((kw + koff) >> gshift, g_last);
                const T *sS = reinterpret_cast<const T *>(st + A_BYTES + B_BYTES) + sl * BN + wn * 64;
                const uint32_t *sZ =
                    reinterpret_cast<const uint32_t *>(st + A_BYTES + B_BYTES + S_BYTES) + sl * (BN / 8) + wn * 8;
                uint32_t s[8];
                if (LAYOUT == W4A16_LAYOUT_MARLIN && channelwise) {
                    // channelwise Marlin scales: in 32 columns, position 8i + t holds column
                    // 2i + {0,1,8,9,16,17,24,25}[t]
                    const uint16_t *s16 = reinterpret_cast<const uint16_t *>(sS);
#pragma unroll
                    for (int m = 0; m < 8; m++)
                        s[m] = prmt(s16[32 * (m / 4) + 8 * (r / 2) + 2 * (m % 4) + (r % 2)], 0u, 0x1010u);
                } else { // AWQ: position = column; Marlin grouped: position 8r + m holds column r + 8m
                    const uint4 v = *reinterpret_cast<const uint4 *>(sS + 8 * r);
                    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                    for (int m = 0; m < 8; m++) {
                        const int c = LAYOUT == W4A16_LAYOUT_AWQ ? awq_order(m) : m;
                        s[m] = prmt(w[c / 2], 0u, c % 2 ? 0x3232u : 0x1010u);
                    }
                }
                const uint32_t zw = has_zeros ? sZ[r] : 0x88888888u; // uint4b8: zero point 8
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const uint32_t z = (zw >> (4 * (LAYOUT == W4A16_LAYOUT_AWQ ? j : awq_reverse(j)))) & 0xF;
                    gc[j] = make_group_const_bits<T>(s[j], z);
                }
            }
            // the next k16 step's packed weights are read before this one's are dequantised and multiplied, and
            // the next m16 tile's A fragment before this one's products (mma and ldmatrix do not reorder)
            if (ks + 1 < KS) fetch(st, kk + 1, fr[(ks + 1) & 1]);
            const uint32_t *f = fr[ks & 1];
            // B fragments of k16 step kk (rows 2q, 2q+1 | 2q+8, 2q+9 of column slot r in each block)
            uint32_t b[8][2];
            if constexpr (LAYOUT == W4A16_LAYOUT_AWQ) {
                const uint32_t lo01 = prmt(f[0], f[1], 0x5410u), hi01 = prmt(f[0], f[1], 0x7632u);
                const uint32_t lo89 = prmt(f[2], f[3], 0x5410u), hi89 = prmt(f[2], f[3], 0x7632u);
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const uint32_t x0 = (j < 4 ? lo01 : hi01) >> (8 * ((j % 4) / 2));
                    const uint32_t x8 = (j < 4 ? lo89 : hi89) >> (8 * ((j % 4) / 2));
                    b[j][0] = j % 2 == 0 ? dq_lo<T>(x0, gc[j]) : dq_hi<T>(x0, gc[j]);
                    b[j][1] = j % 2 == 0 ? dq_lo<T>(x8, gc[j]) : dq_hi<T>(x8, gc[j]);
                }
            } else {
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    b[2 * t][0] = dq_lo<T>(f[t], gc[2 * t]);
                    b[2 * t][1] = dq_hi<T>(f[t], gc[2 * t]);
                    b[2 * t + 1][0] = dq_lo<T>(f[t] >> 8, gc[2 * t + 1]);
                    b[2 * t + 1][1] = dq_hi<T>(f[t] >> 8, gc[2 * t + 1]);
                }
            }
            const T *sA = reinterpret_cast<const T *>(st);
            const int ch = kk * 2 + (lane >> 4);
            auto load_a = [&](int mt, uint32_t(&fa)[4]) {
                const int row = mt * 16 + (lane & 15);
                ldmatrix_x4(fa, sA + row * BK + ((ch ^ (row & 7)) * 8));
            };
            uint32_t fa[2][4];
            load_a(0, fa[0]);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                // every m16 tile, also those past the block's rows (zero-filled padding, never stored): a test there
                // would close a basic block before the MMAs, and the compiler could not interleave the next step's
                // dequantisation with them (docs/PERFORMANCE.md "MoE m7")
                if (mt + 1 < MT) load_a(mt + 1, fa[(mt + 1) & 1]);
#pragma unroll
                for (int j = 0; j < 8; j++) D::mma(acc[mt][j], fa[mt & 1], b[j]);
            }
        }
    }
    cp_async_wait_all();
    if (p.pdl) pdl_launch_dependents(); // main loop done: the next GEMM may start its weight copies

    // ---- epilogue: (acc + bias[e]) * topk_weights to the pairs' rows of C
    T *C = static_cast<T *>(p.C);
    const T *brow = p.bias ? static_cast<const T *>(p.bias) + (size_t)e * N : nullptr;
    // Marlin: one n8 block's sums (rows r, r + 8; columns 8j + 2q, + 1), stored as column pairs
    auto store = [&](int mt, int j, int col_base, float4 sum) {
        for (int h = 0; h < 2; h++) { // rows r and r + 8 of the m16 tile
            const int dst = s_dst[mt * 16 + r + 8 * h];
            if (dst < 0) continue;
            const float tw = p.topk_weights ? p.topk_weights[dst] : 1.f;
            T *crow = C + (size_t)dst * N;
            const float v[2] = {h ? sum.z : sum.x, h ? sum.w : sum.y};
            const int c = col_base + 8 * j + 2 * q;
            const float x0 = v[0] + (brow ? D::to_float(brow[c]) : 0.f);
            const float x1 = v[1] + (brow ? D::to_float(brow[c + 1]) : 0.f);
            typename D::T2 o;
            o.x = D::from_float(x0 * tw);
            o.y = D::from_float(x1 * tw);
            *reinterpret_cast<typename D::T2 *>(crow + c) = o;
        }
    };
    // AWQ: C slot 2q + c2 of block j is column 16q + 8 c2 + ORDER[j], so over the 8 blocks a lane holds 8 contiguous
    // columns of row r + 8h for each c2: one 16-byte store instead of 8 scattered 2-byte ones. x[o]: column
    // 16q + 8 c2 + o, the sum of component 2h + c2 of block awq_reverse(o).
    auto store_awq = [&](int mt, int h, int c2, int col_base, const float(&x)[8]) {
        const int dst = s_dst[mt * 16 + r + 8 * h];
        if (dst < 0) return;
        const float tw = p.topk_weights ? p.topk_weights[dst] : 1.f;
        const int c0 = col_base + 16 * q + 8 * c2;
        uint32_t w[4];
#pragma unroll
        for (int o = 0; o < 8; o += 2) {
            float x0 = x[o], x1 = x[o + 1];
            if (brow) { // bias is only 4-byte aligned: column pairs
                const typename D::T2 bv = *reinterpret_cast<const typename D::T2 *>(brow + c0 + o);
                x0 += D::to_float(bv.x);
                x1 += D::to_float(bv.y);
            }
            typename D::T2 v;
            v.x = D::from_float(x0 * tw);
            v.y = D::from_float(x1 * tw);
            w[o / 2] = as_u32(v);
        }
        *reinterpret_cast<uint4 *>(C + (size_t)dst * N + c0) = make_uint4(w[0], w[1], w[2], w[3]);
    };
    if constexpr (WK == 1) {
        // (no tile with K whole in each warp has a K-splitting instance: w4a16_moe_tile_can_split)
        static_assert(SPLIT != 1, "K split across blocks: tiles that split K among their warps (WK > 1) only");
        if constexpr (SPLIT == 2) {
            if (nk < nkt) {
                // a partial tile of stream-K: its fp32 sums to this block's workspace slot as they lie in the
                // registers; the block that completes the tile's k-tiles adds every part in block order into its
                // accumulators and stores as an unsplit block does
                if (!sk_partial<MT, 8, WARPS * MT * 8 * 32>(
                        acc, static_cast<float4 *>(p.partials) + warp * MT * 8 * 32 + lane, sk.slot, sk.tile, nk, nkt,
                        sk.U, sk.B,
                        [&](int add, int total) { return last_to_arrive(p.counters + sk.tile, add, total, s_src[0]); }))
                    return;
            }
        }
        // the block's outputs ((acc + bias) * topk weight, in T) staged in shared memory, then copied out as whole
        // 16-byte chunks of each routed row: 8 lanes write 128 contiguous bytes, where the fragments hold 4 bytes
        // (Marlin) or 16 bytes (AWQ) of each of 8 rows
        constexpr int SROW = TL::SROW;
        T *stg = reinterpret_cast<T *>(smem);
        __syncthreads();        // every warp is done with the pipeline buffers
        const int cw = wn * 64; // the warp's 64 columns in the tile
        if (n0 + cw < N) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if (mt * 16 >= bs) break;
#pragma unroll
                for (int h = 0; h < 2; h++) { // rows r and r + 8 of the m16 tile: accumulator components 2h, 2h + 1
                    const int row = mt * 16 + r + 8 * h, dst = s_dst[row];
                    if (dst < 0) continue;
                    const float tw = p.topk_weights ? p.topk_weights[dst] : 1.f;
                    T *srow = stg + row * SROW + cw;
                    const T *bcol = brow ? brow + n0 + cw : nullptr;
                    auto pair = [&](int c, float x0, float x1) { // columns c, c + 1 (bias only 4-byte aligned)
                        if (bcol) {
                            const typename D::T2 bv = *reinterpret_cast<const typename D::T2 *>(bcol + c);
                            x0 += D::to_float(bv.x);
                            x1 += D::to_float(bv.y);
                        }
                        typename D::T2 v;
                        v.x = D::from_float(x0 * tw);
                        v.y = D::from_float(x1 * tw);
                        return as_u32(v);
                    };
                    if constexpr (LAYOUT == W4A16_LAYOUT_AWQ) {
#pragma unroll
                        for (int c2 = 0; c2 < 2; c2++) { // columns 16q + 8 c2 + o: block awq_reverse(o), slot c2
                            const int c = 16 * q + 8 * c2;
                            uint32_t w[4];
#pragma unroll
                            for (int o = 0; o < 8; o += 2)
                                w[o / 2] = pair(c + o, acc[mt][awq_reverse(o)][2 * h + c2],
                                                acc[mt][awq_reverse(o + 1)][2 * h + c2]);
                            *reinterpret_cast<uint4 *>(srow + c) = make_uint4(w[0], w[1], w[2], w[3]);
                        }
                    } else {
#pragma unroll
                        for (int j = 0; j < 8; j++) // columns 8j + 2q, + 1
                            *reinterpret_cast<uint32_t *>(srow + 8 * j + 2 * q) =
                                pair(8 * j + 2 * q, acc[mt][j][2 * h], acc[mt][j][2 * h + 1]);
                    }
                }
            }
        }
        __syncthreads();
        constexpr int CPR = BN / 8; // 16-byte chunks per staged row
        for (int i = tid; i < BM * CPR; i += THREADS) {
            const int row = i / CPR, cc = i % CPR, dst = s_dst[row]; // rows past the block's are -1
            if (dst < 0 || n0 + cc * 8 >= N) continue;
            *reinterpret_cast<uint4 *>(C + (size_t)dst * N + n0 + cc * 8) =
                *reinterpret_cast<const uint4 *>(stg + row * SROW + cc * 8);
        }
    } else {
        __syncthreads(); // the pipeline buffers become the reduction buffer
        float4 *red = reinterpret_cast<float4 *>(smem);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                red[((warp * MT + mt) * 8 + j) * 32 + lane] =
                    make_float4(acc[mt][j][0], acc[mt][j][1], acc[mt][j][2], acc[mt][j][3]);
        __syncthreads();
        // one n8 block's sums over the K-split warps, added in warp order
        auto warp_sum = [&](int gn, int mt, int j) {
            float4 sum = red[(((0 * WN + gn) * MT + mt) * 8 + j) * 32 + lane];
#pragma unroll
            for (int w = 1; w < WK; w++) add4(sum, red[(((w * WN + gn) * MT + mt) * 8 + j) * 32 + lane]);
            return sum;
        };
        // AWQ stores a lane's 8 contiguous columns of one row: units (channel group gn, m16 tile mt, accumulator
        // component hc = 2h + c2) shared among the warps, each adding one component of the 8 blocks' sums
        constexpr int UNITS = WN * MT * 4;
        const float *redf = reinterpret_cast<const float *>(smem);
        if constexpr (SPLIT == 0) {
            if constexpr (LAYOUT == W4A16_LAYOUT_AWQ) {
                for (int u = warp; u < UNITS; u += WARPS) {
                    const int hc = u % 4, mt = (u / 4) % MT, gn = u / (4 * MT);
                    if (mt * 16 >= bs || n0 + gn * 64 >= N) continue;
                    float x[8];
#pragma unroll
                    for (int o = 0; o < 8; o++) {
                        const int j = awq_reverse(o);
                        x[o] = redf[((((0 * WN + gn) * MT + mt) * 8 + j) * 32 + lane) * 4 + hc];
#pragma unroll
                        for (int w = 1; w < WK; w++)
                            x[o] += redf[((((w * WN + gn) * MT + mt) * 8 + j) * 32 + lane) * 4 + hc];
                    }
                    store_awq(mt, hc / 2, hc % 2, n0 + gn * 64, x);
                }
            } else {
                // the WN x MT x 8 n8 blocks shared among the 4 warps; each sums the K-split warps' parts in warp order
                for (int bl = warp; bl < WN * MT * 8; bl += WARPS) {
                    const int j = bl % 8, mt = (bl / 8) % MT, gn = bl / (8 * MT);
                    if (mt * 16 >= bs || n0 + gn * 64 >= N) continue;
                    store(mt, j, n0 + gn * 64, warp_sum(gn, mt, j));
                }
            }
        } else {
            // as above into registers (NSL n8 blocks per warp: warp + 4 sl); then, where the tile's k is shared with
            // other blocks, this block's part to the workspace and the tile's sums, added in a fixed order by the
            // block that completes it (the same bits whichever block that is): SPLIT 1 the K splits in split order,
            // SPLIT 2 stream-K's parts in block order (stream_k.cuh)
            constexpr int NSL = WN * MT * 8 / WARPS, TILE_F4 = WN * MT * 8 * 32;
            float o[1][NSL][4];
            bool live[NSL];
#pragma unroll
            for (int sl = 0; sl < NSL; sl++) {
                const int bl = warp + WARPS * sl, j = bl % 8, mt = (bl / 8) % MT, gn = bl / (8 * MT);
                live[sl] = mt * 16 < bs && n0 + gn * 64 < N;
                const float4 v = warp_sum(gn, mt, j);
                o[0][sl][0] = v.x;
                o[0][sl][1] = v.y;
                o[0][sl][2] = v.z;
                o[0][sl][3] = v.w;
            }
            if constexpr (SPLIT == 1) {
                const int nblk = n_fast ? (int)gridDim.y : (int)gridDim.x;
                const int tile = ntile * nblk + blk;
                float4 *all = static_cast<float4 *>(p.partials) + (size_t)tile * splits * TILE_F4 + lane;
#pragma unroll
                for (int sl = 0; sl < NSL; sl++)
                    if (live[sl])
                        __stcg(all + (size_t)blockIdx.z * TILE_F4 + (warp + WARPS * sl) * 32,
                               make_float4(o[0][sl][0], o[0][sl][1], o[0][sl][2], o[0][sl][3]));
                if (!last_to_arrive(p.counters + tile, 1, splits, s_src[0])) return;
#pragma unroll
                for (int sl = 0; sl < NSL; sl++) {
                    if (!live[sl]) continue;
                    const float4 *src = all + (warp + WARPS * sl) * 32;
                    float4 sum = __ldcg(src);
                    for (int sp = 1; sp < splits; sp++) add4(sum, __ldcg(src + (size_t)sp * TILE_F4));
                    o[0][sl][0] = sum.x;
                    o[0][sl][1] = sum.y;
                    o[0][sl][2] = sum.z;
                    o[0][sl][3] = sum.w;
                }
            } else if (nk < nkt) {
                if (!sk_partial<1, NSL, TILE_F4, WARPS * 32>(
                        o, static_cast<float4 *>(p.partials) + warp * 32 + lane, sk.slot, sk.tile, nk, nkt, sk.U, sk.B,
                        [&](int add, int total) { return last_to_arrive(p.counters + sk.tile, add, total, s_src[0]); }))
                    return;
            }
            if constexpr (LAYOUT == W4A16_LAYOUT_AWQ) {
                // the totals go through shared memory (the reduction buffer, which every warp has read once all have
                // passed this barrier) to the wide stores
                float4 *tot = reinterpret_cast<float4 *>(smem);
                __syncthreads();
#pragma unroll
                for (int sl = 0; sl < NSL; sl++)
                    if (live[sl])
                        tot[(warp + WARPS * sl) * 32 + lane] =
                            make_float4(o[0][sl][0], o[0][sl][1], o[0][sl][2], o[0][sl][3]);
                __syncthreads();
                for (int u = warp; u < UNITS; u += WARPS) {
                    const int hc = u % 4, mt = (u / 4) % MT, gn = u / (4 * MT);
                    if (mt * 16 >= bs || n0 + gn * 64 >= N) continue;
                    float x[8];
#pragma unroll
                    for (int q8 = 0; q8 < 8; q8++)
                        x[q8] = redf[((((gn * MT + mt) * 8 + awq_reverse(q8)) * 32) + lane) * 4 + hc];
                    store_awq(mt, hc / 2, hc % 2, n0 + gn * 64, x);
                }
            } else {
#pragma unroll
                for (int sl = 0; sl < NSL; sl++) {
                    if (!live[sl]) continue;
                    const int bl = warp + WARPS * sl, j = bl % 8, mt = (bl / 8) % MT, gn = bl / (8 * MT);
                    store(mt, j, n0 + gn * 64, make_float4(o[0][sl][0], o[0][sl][1], o[0][sl][2], o[0][sl][3]));
                }
            }
        }
    }
}

// The grouped GEMM: grid routing blocks x channel tiles (channel tiles fastest where n_fast: whenever the routing
// blocks fit gridDim.y, so the live routing blocks launch first, and the blocks that run together read neighbouring
// pieces of one expert's weights and the same gathered rows) x K splits (SPLIT = 1: split z of gridDim.z takes
// k-tiles [z nkt / splits, (z + 1) nkt / splits), every split at least one); or, for a dense call (SPLIT = 2),
// gridDim.x stream-K blocks, each taking its range of (tile, k-tile) units as up to three segments: a partial tile,
// whole tiles, a partial tile.
template <typename T, int LAYOUT, int MT, int WN, int KS, int SPLIT>
__global__ void __launch_bounds__(THREADS, min_blocks(MT)) gemm_kernel(const w4a16_moe_launch p) {
    using TL = Tile<LAYOUT, MT, WN, KS>;
    const int nkt = (p.K + TL::BK - 1) / TL::BK; // nkt < 2^24, splits <= 16: int math
    if constexpr (SPLIT == 2) {
        const int ntn = (p.N + TL::BN - 1) / TL::BN;
        const long long U = (long long)p.grid_blocks * ntn * nkt, B = gridDim.x;
        long long u = blockIdx.x * U / B;
        const long long u1 = (blockIdx.x + 1) * U / B;
        for (int seg = 0; u < u1; seg++) {
            const int t = (int)(u / nkt), k0 = (int)(u % nkt), n = (int)min((long long)(nkt - k0), u1 - u);
            if (seg > 0) __syncthreads(); // the last segment's epilogue is done with shared memory
            tile_gemm<T, LAYOUT, MT, WN, KS, SPLIT>(p, t / ntn, t % ntn, k0, n, SkSeg{seg == 0 ? 0 : 1, t, U, B});
            u += n;
        }
    } else {
        const bool n_fast = p.n_fast != 0;
        const int blk = n_fast ? blockIdx.y : blockIdx.x, ntile = n_fast ? blockIdx.x : blockIdx.y;
        const int splits = SPLIT == 1 ? (int)gridDim.z : 1;
        const int kt0 = SPLIT == 1 ? (int)blockIdx.z * nkt / splits : 0;
        const int nk = SPLIT == 1 ? ((int)blockIdx.z + 1) * nkt / splits - kt0 : nkt;
        tile_gemm<T, LAYOUT, MT, WN, KS, SPLIT>(p, blk, ntile, kt0, nk, SkSeg{0, 0, 0, 0});
    }
}

// The tiles (W4A16_MOE_TILE_*, moe_launch.h): <MT, WN, KS> (see Tile).
template <int TILE> struct Cfg;
#define W4A16_MOE_CFG_(tile, mt, wn, ks)                                                                               \
    template <> struct Cfg<tile> { static constexpr int MT = mt, WN = wn, KS = ks; };
W4A16_MOE_CFG_(W4A16_MOE_TILE_16x64, 1, 1, 2)
W4A16_MOE_CFG_(W4A16_MOE_TILE_16x128, 1, 2, 2)
W4A16_MOE_CFG_(W4A16_MOE_TILE_16x256, 1, 4, 4)
W4A16_MOE_CFG_(W4A16_MOE_TILE_32, 2, 2, 2)
W4A16_MOE_CFG_(W4A16_MOE_TILE_64, 4, 4, 4)
W4A16_MOE_CFG_(W4A16_MOE_TILE_32x64, 2, 1, 2)
#undef W4A16_MOE_CFG_

template <int LAYOUT, int TILE> using TileOf = Tile<LAYOUT, Cfg<TILE>::MT, Cfg<TILE>::WN, Cfg<TILE>::KS>;

// The kernel of a launch (split: 1 the K-splitting one, 2 the stream-K one, where the tile has them; moe_launch.h)
// and its dynamic shared memory.
template <typename T, int LAYOUT, int TILE>
void kernel_of(const w4a16_moe_launch &a, int split, void (**kern)(w4a16_moe_launch), int *smem) {
    constexpr int MT = Cfg<TILE>::MT, WN = Cfg<TILE>::WN, KS = Cfg<TILE>::KS;
    *kern = gemm_kernel<T, LAYOUT, MT, WN, KS, 0>;
    if constexpr (w4a16_moe_tile_can_split(TILE))
        if (split == 1) *kern = gemm_kernel<T, LAYOUT, MT, WN, KS, 1>;
    if constexpr (w4a16_moe_tile_can_stream_k(TILE))
        if (split == 2) *kern = gemm_kernel<T, LAYOUT, MT, WN, KS, 2>;
    *smem = TileOf<LAYOUT, TILE>::smem(a.stages);
}

// Launches the kernel csrc/moe.c prepared (its shared memory and carveout attributes set on this device).
template <typename T, int LAYOUT, int TILE> cudaError_t launch(const w4a16_moe_launch &a) {
    constexpr int BN = TileOf<LAYOUT, TILE>::BN;
    void (*kern)(w4a16_moe_launch);
    int smem;
    kernel_of<T, LAYOUT, TILE>(a, w4a16_moe_launch_split(&a), &kern, &smem);
    // cudaLaunchKernelEx returns this launch's own status, where <<<>>> + cudaGetLastError would also report (and
    // clear) an earlier error of someone else's
    cudaLaunchConfig_t c = {};
    const unsigned ntiles = (a.N + BN - 1) / BN;
    c.gridDim = a.sk_blocks > 0 ? dim3(a.sk_blocks)
                : a.n_fast      ? dim3(ntiles, a.grid_blocks, a.splits)
                                : dim3(a.grid_blocks, ntiles, a.splits);
    c.blockDim = dim3(THREADS);
    c.dynamicSmemBytes = smem;
    c.stream = static_cast<cudaStream_t>(a.stream);
    cudaLaunchAttribute at;
    set_pdl(c, at, a.pdl);
    return cudaLaunchKernelEx(&c, kern, a);
}

template <typename T, int LAYOUT, int TILE> cudaError_t prepare(const w4a16_moe_launch &a, int split, int *n) {
    void (*kern)(w4a16_moe_launch);
    int smem;
    kernel_of<T, LAYOUT, TILE>(a, split, &kern, &smem);
    cudaError_t err = (cudaError_t)w4a16_set_kernel_smem((const void *)kern, smem, a.carveout);
    if (err != cudaSuccess) return err;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, kern, THREADS, smem);
}

// the rows and channels csrc/moe.c counts each tile with (w4a16_moe_tile_rows / _bn)
#define W4A16_MOE_CHECK_(tile, rows, bn)                                                                               \
    static_assert(TileOf<W4A16_LAYOUT_AWQ, tile>::BM == rows && TileOf<W4A16_LAYOUT_AWQ, tile>::BN == bn &&            \
                      w4a16_moe_tile_rows(tile) == rows && w4a16_moe_tile_bn(tile) == bn,                              \
                  "tile");
W4A16_MOE_CHECK_(W4A16_MOE_TILE_16x64, 16, 64)
W4A16_MOE_CHECK_(W4A16_MOE_TILE_16x128, 16, 128)
W4A16_MOE_CHECK_(W4A16_MOE_TILE_16x256, 16, 256)
W4A16_MOE_CHECK_(W4A16_MOE_TILE_32, 32, 128)
W4A16_MOE_CHECK_(W4A16_MOE_TILE_64, 64, 256)
W4A16_MOE_CHECK_(W4A16_MOE_TILE_32x64, 32, 64)
#undef W4A16_MOE_CHECK_
static_assert(TileOf<W4A16_LAYOUT_AWQ, W4A16_MOE_TILE_16x64>::BK == W4A16_MOE_SPLIT_BK &&
                  TileOf<W4A16_LAYOUT_AWQ, W4A16_MOE_TILE_16x64>::BM *
                          TileOf<W4A16_LAYOUT_AWQ, W4A16_MOE_TILE_16x64>::BN * 4 ==
                      W4A16_MOE_SPLIT_TILE_BYTES,
              "split-K sizes of csrc/moe.c");

template <typename T, int LAYOUT> cudaError_t launch_tile(const w4a16_moe_launch &a) {
    switch (a.tile) {
    case W4A16_MOE_TILE_128: // the warp-specialised tiles (kernels/tile_ws.cu)
    case W4A16_MOE_TILE_WS64:
    case W4A16_MOE_TILE_WS32:
    case W4A16_MOE_TILE_WG128:
    case W4A16_MOE_TILE_WG64:
        return (cudaError_t)w4a16_launch_ws(&a);
    case W4A16_MOE_TILE_16x64:
        return launch<T, LAYOUT, W4A16_MOE_TILE_16x64>(a);
    case W4A16_MOE_TILE_16x128:
        return launch<T, LAYOUT, W4A16_MOE_TILE_16x128>(a);
    case W4A16_MOE_TILE_16x256:
        return launch<T, LAYOUT, W4A16_MOE_TILE_16x256>(a);
    case W4A16_MOE_TILE_32:
        return launch<T, LAYOUT, W4A16_MOE_TILE_32>(a);
    case W4A16_MOE_TILE_32x64:
        return launch<T, LAYOUT, W4A16_MOE_TILE_32x64>(a);
    default:
        return launch<T, LAYOUT, W4A16_MOE_TILE_64>(a);
    }
}

template <typename T, int LAYOUT> cudaError_t prepare_tile(const w4a16_moe_launch &a, int split, int *n) {
    switch (a.tile) {
    case W4A16_MOE_TILE_128:
    case W4A16_MOE_TILE_WS64:
    case W4A16_MOE_TILE_WS32:
    case W4A16_MOE_TILE_WG128:
    case W4A16_MOE_TILE_WG64:
        return (cudaError_t)w4a16_prepare_ws(&a, n);
    case W4A16_MOE_TILE_16x64:
        return prepare<T, LAYOUT, W4A16_MOE_TILE_16x64>(a, split, n);
    case W4A16_MOE_TILE_16x128:
        return prepare<T, LAYOUT, W4A16_MOE_TILE_16x128>(a, split, n);
    case W4A16_MOE_TILE_16x256:
        return prepare<T, LAYOUT, W4A16_MOE_TILE_16x256>(a, split, n);
    case W4A16_MOE_TILE_32:
        return prepare<T, LAYOUT, W4A16_MOE_TILE_32>(a, split, n);
    case W4A16_MOE_TILE_32x64:
        return prepare<T, LAYOUT, W4A16_MOE_TILE_32x64>(a, split, n);
    default:
        return prepare<T, LAYOUT, W4A16_MOE_TILE_64>(a, split, n);
    }
}

// the host's formula (moe_launch.h) is the kernels' shared memory, for every tile and layout at every depth planned
template <int TILE> constexpr bool smem_formula_holds() {
    for (int s = 2; s <= 4; s++)
        if (TileOf<W4A16_LAYOUT_AWQ, TILE>::smem(s) != w4a16_moe_smem_bytes(TILE, W4A16_LAYOUT_AWQ, s) ||
            TileOf<W4A16_LAYOUT_MARLIN, TILE>::smem(s) != w4a16_moe_smem_bytes(TILE, W4A16_LAYOUT_MARLIN, s))
            return false;
    return true;
}
static_assert(smem_formula_holds<W4A16_MOE_TILE_16x64>() && smem_formula_holds<W4A16_MOE_TILE_16x128>() &&
                  smem_formula_holds<W4A16_MOE_TILE_16x256>() && smem_formula_holds<W4A16_MOE_TILE_32>() &&
                  smem_formula_holds<W4A16_MOE_TILE_64>() && smem_formula_holds<W4A16_MOE_TILE_32x64>(),
              "moe_launch.h w4a16_moe_smem_bytes differs from the tiles' shared memory");

} // namespace moe
} // namespace w4a16

extern "C" int w4a16_launch_moe_align(const int32_t *topk_ids, int num_entries, int num_experts, int block_size,
                                      int32_t *sorted_ids, int sorted_capacity, int32_t *expert_ids,
                                      int blocks_capacity, int32_t *num_post_padded, void *stream) {
    const size_t smem = (size_t)(3 * num_experts + 1) * sizeof(int);
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(1);
    c.blockDim = dim3(1024);
    c.dynamicSmemBytes = smem;
    c.stream = static_cast<cudaStream_t>(stream);
    return cudaLaunchKernelEx(&c, w4a16::moe::align_kernel, topk_ids, num_entries, num_experts, block_size, sorted_ids,
                              sorted_capacity, expert_ids, blocks_capacity, num_post_padded);
}

extern "C" int w4a16_moe_prepare(const w4a16_moe_launch *a, int split, int *blocks_per_sm) {
    using namespace w4a16::moe;
    if (a->dtype == 0)
        return a->layout == W4A16_LAYOUT_AWQ ? prepare_tile<__half, W4A16_LAYOUT_AWQ>(*a, split, blocks_per_sm)
                                             : prepare_tile<__half, W4A16_LAYOUT_MARLIN>(*a, split, blocks_per_sm);
    return a->layout == W4A16_LAYOUT_AWQ ? prepare_tile<__nv_bfloat16, W4A16_LAYOUT_AWQ>(*a, split, blocks_per_sm)
                                         : prepare_tile<__nv_bfloat16, W4A16_LAYOUT_MARLIN>(*a, split, blocks_per_sm);
}

extern "C" int w4a16_launch_moe_gemm(const w4a16_moe_launch *a) {
    using namespace w4a16::moe;
    if (a->dtype == 0)
        return a->layout == W4A16_LAYOUT_AWQ ? launch_tile<__half, W4A16_LAYOUT_AWQ>(*a)
                                             : launch_tile<__half, W4A16_LAYOUT_MARLIN>(*a);
    return a->layout == W4A16_LAYOUT_AWQ ? launch_tile<__nv_bfloat16, W4A16_LAYOUT_AWQ>(*a)
                                         : launch_tile<__nv_bfloat16, W4A16_LAYOUT_MARLIN>(*a);
}
