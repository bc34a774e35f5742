// w4a16 int4 dequant-GEMM: one kernel template for every weight format (the 16-token tiles have their own decode
// kernel, gemm_decode.cuh, which shares this file's split-K pieces and tiles.cuh).
//
//   C[M,N] = A[M,K] * dequant(W) (+ bias),  A/C/scales/bias in T (fp16 or bf16), fp32 accumulation.
//
// Block tile BM x BN, BK = 16 * WK * KS per stage (configs.h). Warps: WM along M, WN along N (64 columns each, split
// between NH warps of 8/NH n8 blocks when NH = 2), WK along
// K (their partial sums are added through shared memory at the end). A multi-stage cp.async.cg pipeline
// brings A, the packed weights, and the two scale / zero-point rows a stage can touch into shared memory;
// one __syncthreads per stage. Each warp computes (16*MT) x 64 with mma.sync m16n8k16: A fragments by
// ldmatrix.x4 from an XOR-swizzled tile, B fragments dequantised in registers with the magic-number trick.
//
// Weight formats: everything format-specific (where a thread's weights, scales and zero points lie, how they are
// dequantised, which column a C slot is) comes from WeightFormat<LAYOUT> (formats.cuh).
//
// Split-K across blocks (gridDim.z > 1) writes fp32 partials to the workspace; the last block of a tile to
// arrive (per-tile counter) adds them in split order (deterministic), writes C and resets the counter.
//
// Preconditions (checked on the host before launch): N % 64 == 0, K % 32 == 0, K % G == 0, G >= 32,
// 16-byte aligned A, C, weights, scales, zeros; 4-byte aligned bias; splits <= number of k-tiles.
#pragma once
#include "launch.h"
#include "tiles.cuh"

namespace w4a16 {

// The kernels' argument: one struct, filled by the host (kernels/launch.h) and passed by value.
using GemmArgs = w4a16_gemm_args;

// One compiled GEMM kernel: its entry point, threads per block and (wgmma configs) its own dynamic shared memory.
struct GemmKernelRef {
    void (*fn)(GemmArgs) = nullptr;
    int threads = 0;
    int smem_bytes = 0;
};

// ---- pieces both GEMM kernels (this one and gemm_sm90.cuh) share

// The k-tiles of this block's K split (blockIdx.z of gridDim.z): [*kt_begin, *kt_begin + return value).
__device__ __forceinline__ int split_k_tiles(int num_kt, int *kt_begin) {
    const int splits = gridDim.z, split = blockIdx.z;
    *kt_begin = (int)((long long)split * num_kt / splits);
    return (int)((long long)(split + 1) * num_kt / splits) - *kt_begin;
}

// The copies of one pipeline stage: activations (ActTile) then packed weights with their group rows (WeightTile),
// through per-thread plans fixed for the whole K loop, which is the block's K split: k-tiles [kt_begin, kt_begin + nk).
template <typename T, typename ATile, typename WTile, int BK> struct StageCopy {
    ATile at;
    WTile wt;
    int kt_begin, nk;               // this block's k-tiles (split_k_tiles)
    int gshift, g_last, slots_used; // group of row k = k >> gshift; last group; scale rows a stage touches

    __device__ __forceinline__ void plan(const GemmArgs &p, int m0, int n0, int tid) {
        int begin;
        const int count = split_k_tiles((p.K + BK - 1) / BK, &begin);
        plan(p, m0, n0, tid, begin, count);
    }
    // The same for an explicit k-tile range [kt_begin_, kt_begin_ + nk_) (stream-K segments).
    __device__ __forceinline__ void plan(const GemmArgs &p, int m0, int n0, int tid, int kt_begin_, int nk_) {
        kt_begin = kt_begin_;
        nk = nk_;
        gshift = p.gshift;
        g_last = (p.K - 1) >> gshift;
        slots_used = (BK >> gshift) > 1 ? (BK >> gshift) : 1; // stages start at multiples of BK: groups aligned
        at.plan(static_cast<const T *>(p.A), p.M, p.K, m0, kt_begin * BK, tid);
        wt.plan(p.B, static_cast<const T *>(p.scales), p.zeros, p.N, n0, kt_begin * BK, slots_used, tid);
    }
    // Copies k-tile kt into the stage buffer `st`: the weights with their group rows, then the activations (the
    // activation plan advances by BK per call: k-tiles in order).
    __device__ __forceinline__ void issue_w(const GemmArgs &p, unsigned char *st, int kt) {
        wt.issue(st + ATile::BYTES, p.B, p.N, p.K, kt * BK, gshift, g_last);
    }
    __device__ __forceinline__ void issue_a(const GemmArgs &p, unsigned char *st) {
        at.issue(st, static_cast<const T *>(p.A), p.K);
    }
    __device__ __forceinline__ void issue(const GemmArgs &p, unsigned char *st, int kt) {
        issue_w(p, st, kt);
        issue_a(p, st);
    }
    // The first `count` k-tiles from kt0 into consecutive buffers of `bytes` from `st`, one commit group each: all
    // their weights first, then pdl_wait() (the grids this one depends on may write A and C), then the activations.
    __device__ __forceinline__ void prologue(const GemmArgs &p, unsigned char *st, int bytes, int kt0, int count,
                                             int groups) {
        for (int s = 0; s < count; s++) issue_w(p, st + s * bytes, kt0 + s);
        pdl_wait();
        for (int s = 0; s < groups; s++) {
            if (s < count) issue_a(p, st + s * bytes);
            cp_async_commit();
        }
    }
};

// Split-K partials: four accumulators per slot, as fp32 or (W4A16_FLAG_REDUCE_IN_DTYPE) rounded to T in half the bytes.
template <typename T> __device__ __forceinline__ void store_partial(float4 *dst, const float *x, bool in_dtype) {
    using D = Dtype<T>;
    if (in_dtype) {
        typename D::T2 lo, hi;
        lo.x = D::from_float(x[0]);
        lo.y = D::from_float(x[1]);
        hi.x = D::from_float(x[2]);
        hi.y = D::from_float(x[3]);
        __stcg(reinterpret_cast<uint2 *>(dst), make_uint2(as_u32(lo), as_u32(hi)));
    } else {
        __stcg(dst, make_float4(x[0], x[1], x[2], x[3]));
    }
}
template <typename T> __device__ __forceinline__ float4 load_partial(const float4 *src, bool in_dtype) {
    using D = Dtype<T>;
    if (!in_dtype) return __ldcg(src);
    uint2 u = __ldcg(reinterpret_cast<const uint2 *>(src));
    auto lo = D::from_bits(u.x), hi = D::from_bits(u.y);
    return make_float4(D::to_float(lo.x), D::to_float(lo.y), D::to_float(hi.x), D::to_float(hi.y));
}
// The decode kernel's cp.async pipeline: `stages` buffers of BYTES in a ring, advanced by pointer (no run-time
// modulo of the profile's stage count). prologue() issues k-tiles 0 .. stages - 2 (and holds the block's pdl_wait);
// step(i) waits for k-tile i, makes it visible to the block (one barrier), issues k-tile i + stages - 1 into the
// buffer k-tile i - 1 used, and returns k-tile i's buffer. issue(j, buffer) copies k-tile j of the block's range.
template <int BYTES> struct StageRing {
    unsigned char *const base, *const end;
    unsigned char *cur, *pf;
    const int stages, nk;
    __device__ __forceinline__ StageRing(unsigned char *smem, int stages_, int nk_)
        : base(smem), end(smem + stages_ * BYTES), cur(smem), pf(smem + (stages_ - 1) * BYTES), stages(stages_),
          nk(nk_) {}
    __device__ __forceinline__ unsigned char *next(unsigned char *b) const {
        return b + BYTES == end ? base : b + BYTES;
    }
    // k-tiles 0 .. stages - 2 of the block's range [kt_begin, kt_begin + nk), weights before pdl_wait().
    template <typename Copy> __device__ __forceinline__ void prologue(Copy &copy, const GemmArgs &p, int kt_begin) {
        copy.prologue(p, base, BYTES, kt_begin, min(stages - 1, nk), stages - 1);
    }
    template <typename Issue> __device__ __forceinline__ const unsigned char *step(int i, Issue issue) {
        cp_async_wait_dyn(stages - 2);
        __syncthreads();
        if (i + stages - 1 < nk) issue(i + stages - 1, pf);
        cp_async_commit();
        pf = next(pf);
        const unsigned char *st = cur;
        cur = next(cur);
        return st;
    }
};

// The tile kernel's pipeline: STAGES buffers of BYTES, a compile-time count, so that the copy waits are immediates and
// the ring is a shared-memory offset (no generic pointers to rebuild per k-tile). prologue() fills every buffer
// (k-tiles 0 .. STAGES - 1), first() waits for k-tile 0 and makes it visible. advance(), called in k-tile i once this
// thread has read all it needs of k-tile i's buffer, waits for k-tile i + 1 and makes it visible (one barrier: after it
// no warp reads k-tile i's buffer again) and returns its buffer; refill(i) then issues k-tile i + STAGES into k-tile
// i's buffer, so every copy has STAGES - 1 k-tiles' time to land.
template <int BYTES, int STAGES> struct TileRing {
    static_assert(STAGES >= 2 && STAGES <= 8, "cp.async.wait_group takes 0 .. 7");
    unsigned char *const base;
    uint32_t cur = 0, prev = 0; // offsets of k-tile i's and k-tile i - 1's buffers
    const int nk;
    __device__ __forceinline__ TileRing(unsigned char *smem, int nk_) : base(smem), nk(nk_) {}
    template <typename Copy> __device__ __forceinline__ void prologue(Copy &copy, const GemmArgs &p, int kt_begin) {
        copy.prologue(p, base, BYTES, kt_begin, min(STAGES, nk), STAGES);
    }
    __device__ __forceinline__ const unsigned char *first() {
        cp_async_wait<STAGES - 1>();
        __syncthreads();
        return base;
    }
    __device__ __forceinline__ const unsigned char *advance() {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        prev = cur;
        cur = cur + BYTES == STAGES * BYTES ? 0 : cur + BYTES;
        return base + cur;
    }
    template <typename Issue> __device__ __forceinline__ void refill(int i, Issue issue) {
        if (i + STAGES < nk) issue(i + STAGES, base + prev);
        cp_async_commit();
    }
};

// K split across the WK warps of a block (after the main loop, whose buffers it reuses): warps wk > 0 write their
// NSLOT slots of 4 fp32 accumulators (slot(s)) to shared memory and return false; the wk == 0 warp of the same WMN
// position adds them in warp order and returns true.
template <int NSLOT, int WK, int WMN, typename Slot>
__device__ __forceinline__ bool reduce_k_warps(unsigned char *smem, int wk, int warp_mn, int lane, Slot slot) {
    __syncthreads(); // every warp is done reading the pipeline buffers
    float4 *red = reinterpret_cast<float4 *>(smem);
    if (wk > 0) {
        float4 *dst = red + ((wk - 1) * WMN + warp_mn) * (NSLOT * 32);
#pragma unroll
        for (int s = 0; s < NSLOT; s++) {
            const float *x = slot(s);
            dst[s * 32 + lane] = make_float4(x[0], x[1], x[2], x[3]);
        }
    }
    __syncthreads();
    if (wk > 0) return false;
    for (int w = 1; w < WK; w++) {
        const float4 *src = red + ((w - 1) * WMN + warp_mn) * (NSLOT * 32);
#pragma unroll
        for (int s = 0; s < NSLOT; s++) {
            const float4 v = src[s * 32 + lane];
            float *x = slot(s);
            x[0] += v.x;
            x[1] += v.y;
            x[2] += v.z;
            x[3] += v.w;
        }
    }
    return true;
}

// After the block's partials are written: true in the last block of the tile to arrive, which also resets the tile's
// counter so the workspace is left zeroed. `sync` is a barrier over the threads that take part (tid 0 among them).
template <typename Sync>
__device__ __forceinline__ bool last_arrival(int *counters, int tile, int splits, int tid, Sync sync) {
    __shared__ int s_last;
    __threadfence();
    sync();
    if (tid == 0) {
        int prev = atomicAdd(counters + tile, 1);
        s_last = prev == splits - 1;
        if (s_last) counters[tile] = 0;
    }
    sync();
    if (!s_last) return false;
    __threadfence();
    return true;
}

// Split-K across blocks (gridDim.z splits) for the NSLOT slots of 4 fp32 accumulators a thread holds: slot s is
// slot(s) and lies at float4 offset + s * stride of each split's tile_f4-float4 partials. Stores this block's partials
// and returns whether it is the last block of the tile to arrive; there every slot becomes the sum over the splits in
// split order (deterministic). Slots with live(s) false (rows past M) are neither stored nor summed; `sync` is a
// barrier over the threads that take part (tid 0 among them).
template <typename T, int NSLOT, typename Slot, typename Live, typename Sync>
__device__ __forceinline__ bool split_k_reduce(const GemmArgs &p, int tile_f4, int offset, int stride, int tid,
                                               Slot slot, Live live, Sync sync) {
    const int tile = blockIdx.y * gridDim.x + blockIdx.x, splits = gridDim.z;
    float4 *all = p.partials + (size_t)tile * splits * tile_f4 + offset;
    float4 *mine = all + (size_t)blockIdx.z * tile_f4;
#pragma unroll
    for (int s = 0; s < NSLOT; s++)
        if (live(s)) store_partial<T>(mine + s * stride, slot(s), p.reduce_dtype);
    if (!last_arrival(p.counters, tile, splits, tid, sync)) return false;
    if constexpr (NSLOT <= 8) {
        // U splits' partials of every slot are loaded before any is added, so that U x NSLOT (16) loads are in flight
        // instead of one chain per slot paying the L2 latency once per split. The sums build up in the slots
        // themselves (no second set of registers) and in split order (deterministic).
        constexpr int U = 16 / NSLOT > 4 ? 4 : 16 / NSLOT;
#pragma unroll
        for (int s = 0; s < NSLOT; s++) {
            float *x = slot(s);
            x[0] = x[1] = x[2] = x[3] = 0.f;
        }
        for (int sp0 = 0; sp0 < splits; sp0 += U) {
            float4 v[U][NSLOT];
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int s = 0; s < NSLOT; s++)
                    if (sp0 + u < splits && live(s))
                        v[u][s] = load_partial<T>(all + (size_t)(sp0 + u) * tile_f4 + s * stride, p.reduce_dtype);
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int s = 0; s < NSLOT; s++)
                    if (sp0 + u < splits && live(s)) {
                        float *x = slot(s);
                        x[0] += v[u][s].x;
                        x[1] += v[u][s].y;
                        x[2] += v[u][s].z;
                        x[3] += v[u][s].w;
                    }
        }
    } else { // enough slots for as many loads in flight
#pragma unroll
        for (int s = 0; s < NSLOT; s++)
            if (live(s)) {
                float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
                for (int sp = 0; sp < splits; sp++) { // fixed order: deterministic
                    float4 v = load_partial<T>(all + (size_t)sp * tile_f4 + s * stride, p.reduce_dtype);
                    sum.x += v.x;
                    sum.y += v.y;
                    sum.z += v.z;
                    sum.w += v.w;
                }
                float *x = slot(s);
                x[0] = sum.x;
                x[1] = sum.y;
                x[2] = sum.z;
                x[3] = sum.w;
            }
    }
    return true;
}

// Stream-K (the mma.sync tile kernel; csrc/plan.c sizes it): blocks [0, sk_blocks) divide the k-tiles of the first
// sk_tiles tiles evenly as one range in tile-major order, so every block has the same work whatever the tile count;
// block sk_blocks + i computes tile sk_tiles + i whole. A block's range is cut at tile boundaries into segments.
// First k-tile of stream-K block b of `blocks` sharing `total` k-tiles (the host keeps total < 2^31): b * total /
// blocks, in 32-bit arithmetic (q = total / blocks, rem = total % blocks; b * rem < blocks^2).
__device__ __forceinline__ int sk_begin(int b, int q, int rem, int blocks) { return b * q + b * rem / blocks; }

// Segment `seg` of this block's stream-K work: tile *tile, its k-tiles [*kt, *kt + *nk); false when the block has no
// such segment. Blocks [0, sk_blocks) walk their range of the first sk_tiles tiles' k-tiles, cut at tile boundaries;
// each later block computes one tile whole. Recomputed from the block index each time, so that no loop state is held
// in registers across a segment.
__device__ __forceinline__ bool stream_k_segment(const GemmArgs &p, int num_kt, int seg, int *tile, int *kt, int *nk) {
    if ((int)blockIdx.x < p.sk_blocks) {
        const int blocks = p.sk_blocks, total = p.sk_tiles * num_kt, q = total / blocks, rem = total % blocks;
        const int start = sk_begin(blockIdx.x, q, rem, blocks), stop = sk_begin(blockIdx.x + 1, q, rem, blocks);
        const int t0 = start / num_kt;
        *tile = t0 + seg;
        *kt = seg == 0 ? start - t0 * num_kt : 0;
        const int from = *tile * num_kt + *kt;
        if (from >= stop) return false;
        *nk = min(num_kt - *kt, stop - from);
        return true;
    }
    if (seg > 0) return false;
    *tile = p.sk_tiles + (int)blockIdx.x - p.sk_blocks;
    *kt = 0;
    *nk = num_kt;
    return true;
}

// A segment that covers part of a tile: its NSLOT slots of 4 fp32 sums go to the workspace, in the first (`first`:
// the block's first segment) or second partial slot of this block (a block has at most two partial segments: the
// tail of one tile and the head of another). The last of the tile's blocks to arrive adds the blocks' sums in block
// order (deterministic) and returns true. Slot s, its liveness and the barrier as in split_k_reduce.
template <typename T, int NSLOT, typename Slot, typename Live, typename Sync>
__device__ __forceinline__ bool stream_k_reduce(const GemmArgs &p, int tile, int num_kt, bool first, int tile_f4,
                                                int offset, int stride, int tid, Slot slot, Live live, Sync sync) {
    const int blocks = p.sk_blocks, total = p.sk_tiles * num_kt, q = total / blocks, rem = total % blocks;
    float4 *base = p.partials + offset;
    float4 *mine = base + (size_t)(2 * blockIdx.x + (first ? 0 : 1)) * tile_f4;
#pragma unroll
    for (int s = 0; s < NSLOT; s++)
        if (live(s)) store_partial<T>(mine + s * stride, slot(s), p.reduce_dtype);
    // the tile's blocks b0 .. b1: walk from this one to the blocks holding its first and last k-tiles
    const int x0 = tile * num_kt, x1 = x0 + num_kt;
    int b0 = blockIdx.x, b1 = blockIdx.x;
    while (sk_begin(b0, q, rem, blocks) > x0) b0--;
    while (sk_begin(b1 + 1, q, rem, blocks) < x1) b1++;
    if (!last_arrival(p.counters, tile, b1 - b0 + 1, tid, sync)) return false;
    // Block b's partial: its first slot when it starts inside this tile (every block after b0 does), else its second.
    auto part = [&](int b) -> const float4 * {
        return base + (size_t)(2 * b + (b > b0 || sk_begin(b0, q, rem, blocks) == x0 ? 0 : 1)) * tile_f4;
    };
    if constexpr (NSLOT <= 8) {
        // Each block's partials of every slot are loaded before any is added (NSLOT loads in flight per L2 round
        // trip; more blocks at once spill under the register budget); the sums build up in the slots themselves, in
        // block order (deterministic).
#pragma unroll
        for (int s = 0; s < NSLOT; s++) {
            float *x = slot(s);
            x[0] = x[1] = x[2] = x[3] = 0.f;
        }
        for (int b = b0; b <= b1; b++) {
            const float4 *src = part(b);
            float4 v[NSLOT];
#pragma unroll
            for (int s = 0; s < NSLOT; s++)
                if (live(s)) v[s] = load_partial<T>(src + s * stride, p.reduce_dtype);
#pragma unroll
            for (int s = 0; s < NSLOT; s++)
                if (live(s)) {
                    float *x = slot(s);
                    x[0] += v[s].x;
                    x[1] += v[s].y;
                    x[2] += v[s].z;
                    x[3] += v[s].w;
                }
        }
    } else {
        // Many slots: the first block's partials straight into the slots (all NSLOT loads in flight, no extra
        // registers), then each later block's two slots at a time.
        {
            const float4 *src = part(b0);
#pragma unroll
            for (int s = 0; s < NSLOT; s++)
                if (live(s)) {
                    const float4 v = load_partial<T>(src + s * stride, p.reduce_dtype);
                    float *x = slot(s);
                    x[0] = v.x;
                    x[1] = v.y;
                    x[2] = v.z;
                    x[3] = v.w;
                }
        }
        for (int b = b0 + 1; b <= b1; b++) { // block order: deterministic
            const float4 *src = part(b);
            constexpr int U = 2; // more spills under the large tiles' register budget
#pragma unroll
            for (int s0 = 0; s0 < NSLOT; s0 += U) {
                float4 v[U];
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (s0 + u < NSLOT && live(s0 + u)) v[u] = load_partial<T>(src + (s0 + u) * stride, p.reduce_dtype);
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (s0 + u < NSLOT && live(s0 + u)) {
                        float *x = slot(s0 + u);
                        x[0] += v[u].x;
                        x[1] += v[u].y;
                        x[2] += v[u].z;
                        x[3] += v[u].w;
                    }
            }
        }
    }
    return true;
}

template <typename T, int LAYOUT, int MT, int WM, int NH, int WN, int WK, int KS, int MINB, int STAGES>
__global__ void __launch_bounds__(32 * WM * NH * WN * WK, MINB) gemm_kernel(const GemmArgs p) {
    using D = Dtype<T>;
    constexpr int THREADS = 32 * WM * NH * WN * WK;
    constexpr int WMN = WM * NH * WN;    // warps per K slice
    constexpr int NB = 8 / NH;           // n8 blocks per warp
    constexpr int ABUF = MT > 4 ? 1 : 2; // A fragments double-buffered unless registers are short
    constexpr int BM = 16 * MT * WM, BN = 64 * WN, BK = 16 * WK * KS;
    using ATile = ActTile<T, BM, BK, THREADS>;
    using WTile = WeightTile<T, LAYOUT, BN, BK, NH, THREADS>;
    constexpr int A_BYTES = ATile::BYTES;
    constexpr int STAGE_BYTES = A_BYTES + WTile::BYTES;

    extern __shared__ __align__(16) unsigned char smem[];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WM, wh = (warp / WM) % NH, wn = (warp / (WM * NH)) % WN, wk = warp / WMN;
    const int j0 = wh * NB; // first n8 block of this warp inside its 64-column group
    const int q = lane & 3, r = lane >> 2;
    const int M = p.M, N = p.N;
    const int tiles_m = (M + BM - 1) / BM, num_kt = (p.K + BK - 1) / BK;

    // ---- one segment: k-tiles [kt_begin, kt_begin + nk) of the tile at (m0, n0); full when nk == num_kt
    __shared__ int seg_info[3]; // tile, partial (nk < num_kt), first segment of the block
    auto gemm_segment = [&](const int m0, const int n0, const int kt_begin, const int nk) {
        // ---- producer: per-thread copy plans fixed for the segment; each stage advances them by BK.
        StageCopy<T, ATile, WTile, BK> copy;
        copy.plan(p, m0, n0, tid, kt_begin, nk);
        const int gshift = copy.gshift, g_last = copy.g_last; // group of row k = k >> gshift (31 for one group)

        float acc[MT][NB][4];
        zero_sums(acc);

        auto load_group = [&](const unsigned char *st, int sl) {
            copy.wt.group(st + A_BYTES, sl, wn, wh, lane, p.zeros != nullptr, p.marlin_channelwise);
        };

        // ---- fragments, double-buffered across k16 steps (A only when registers allow)
        uint32_t fa[ABUF][MT][4];
        auto load_a = [&](const unsigned char *st, int ks, int buf) {
            const T *sA = reinterpret_cast<const T *>(st);
            const int kk = wk * KS + ks;
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                int row = wm * MT * 16 + mt * 16 + (lane & 15);
                int ch = kk * 2 + (lane >> 4);
                ldmatrix_x4(fa[buf][mt], sA + row * BK + ((ch ^ (row & 7)) * 8));
            }
        };
        auto load_frags = [&](const unsigned char *st, int ks, int buf) {
            if constexpr (ABUF == 2) load_a(st, ks, buf);
            copy.wt.fetch(st + A_BYTES, wk * KS + ks, wn, wh, lane,
                          buf); // each warp owns a contiguous K range of the stage
        };
        auto compute = [&](int buf) { // the MMAs of a k16 step from its fragments (A in fa[0] when ABUF == 1)
            uint32_t b[NB][2];
            copy.wt.dequant(buf, wh, b);
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < NB; j++) D::mma(acc[mt][j], fa[ABUF == 2 ? buf : 0][mt], b[j]);
        };

        // ---- main loop, one barrier per k-tile, placed before the k-tile's last k16 step: every read of k-tile i's
        // buffer (fragments of steps 1 .. KS - 1, its group constants) comes before it, and after it the warps have
        // that step's MMAs to issue while k-tile i + 1's first fragments load, instead of all of them waiting for
        // shared memory right after the barrier. The copies of k-tile i + stages refill k-tile i's buffer right after
        // that barrier (TileRing::advance / refill).
        static_assert(KS % 2 == 0, "the fragment buffers alternate per k16 step, across k-tiles too");
        TileRing<STAGE_BYTES, STAGES> ring(smem, nk);
        auto issue = [&](int j, unsigned char *buf) { copy.issue(p, buf, kt_begin + j); };
        ring.prologue(copy, p, kt_begin);
        const unsigned char *st = ring.first();
        load_frags(st, 0, 0);
        int cur_group = -1;
        for (int i = 0; i < nk; i++) {
            const int k0 = (kt_begin + i) * BK;
            const int kw = k0 + wk * KS * 16; // this warp's contiguous K range of the stage: [kw, kw + 16 KS)
            // k16 step ks: fragments of step ks + 1 (of the next k-tile after the barrier, at the last step), then
            // the MMAs of step ks. A fragments that are not double-buffered are loaded for step ks itself, at the
            // last step before the barrier (st is refilled after it).
            auto run_step = [&](int ks) {
                if (ks + 1 < KS) {
                    load_frags(st, ks + 1, (ks + 1) & 1);
                    if constexpr (ABUF == 1) load_a(st, ks, 0);
                } else {
                    if constexpr (ABUF == 1) load_a(st, ks, 0);
                    if (i + 1 < nk) {
                        load_frags(ring.advance(), 0, 0);
                        ring.refill(i, issue);
                    }
                }
                compute(ks & 1);
            };
            if ((kw >> gshift) == ((kw + 16 * KS - 1) >> gshift)) { // one group: its constants at most once per stage
                const int g = kw >> gshift;
                if (g != cur_group) {
                    cur_group = g;
                    load_group(st, min(g, g_last) - (k0 >> gshift));
                }
#pragma unroll
                for (int ks = 0; ks < KS; ks++) run_step(ks);
            } else { // small groups: a new group may start at any k16 step
#pragma unroll
                for (int ks = 0; ks < KS; ks++) {
                    const int g = (kw + ks * 16) >> gshift;
                    if (g != cur_group) {
                        cur_group = g;
                        load_group(st, min(g, g_last) - (k0 >> gshift));
                    }
                    run_step(ks);
                }
            }
            st = ring.base + ring.cur;
        }
        cp_async_wait_all();
        if (p.pdl) pdl_launch_dependents(); // main loop done: the next GEMM may start its weight loads

        // ---- K-split warps: add partial sums through shared memory
        const int warp_mn = warp % WMN;
        if constexpr (WK > 1) {
            if (!reduce_k_warps<MT * NB, WK, WMN>(smem, wk, warp_mn, lane,
                                                  [&](int s) -> float * { return acc[s / NB][s % NB]; }))
                return;
        }
        // From here only the WMN warps with wk == 0 remain.
        constexpr int EPI_THREADS = 32 * WMN;
        // the segment's tile from shared memory: nothing of it stays live in registers through the main loop
        const int e_tile = seg_info[0], e_partial = seg_info[1], e_first = seg_info[2];
        const int row_base = e_tile % tiles_m * BM + wm * MT * 16;

        // ---- part of a tile: partials to the workspace, the tile's last arriving block reduces
        if (e_partial) {
            auto epi_sync = []() { asm volatile("bar.sync 1, %0;\n" ::"n"(EPI_THREADS)); }; // only the epilogue warps
            auto slot = [&](int s) -> float * { return acc[s / NB][s % NB]; };
            auto live = [&](int s) { return row_base + (s / NB) * 16 < M; };
            if (!stream_k_reduce<T, MT * NB>(p, e_tile, num_kt, e_first, WMN * MT * NB * 32,
                                             warp_mn * (MT * NB * 32) + lane, 32, tid, slot, live, epi_sync))
                return;
        }

        // ---- store C (+ bias)
        T *C = static_cast<T *>(p.C);
        const T *bias = static_cast<const T *>(p.bias);
        const int col_base = e_tile / tiles_m * BN + wn * 64;
        if (col_base >= N) return;
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int h = 0; h < 2; h++) { // rows r and r + 8 of the m16 tile
                const int row = row_base + mt * 16 + r + 8 * h;
                if (row >= M) continue;
                T *crow = C + (size_t)row * N + col_base;
                // Two store patterns, by the format's column map (WeightFormat::column(j, slot)): the blocks of a slot
                // are 8 adjacent columns (AWQ: column 8 slot + ORDER[j]), or the slots 2q, 2q + 1 of a block are 2
                // (Marlin).
                if constexpr (WeightFormat<LAYOUT>::SLOT_BLOCKS_ADJACENT && NH == 1) {
                    // slots 2q, 2q+1 of block j are columns 16q + ORDER[j] and 16q + 8 + ORDER[j]: 16 adjacent columns
                    __align__(16) T out[16];
#pragma unroll
                    for (int j = 0; j < NB; j++) {
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            int c = 16 * q + 8 * e + awq_order(j);
                            float v = acc[mt][j][2 * h + e];
                            if (bias) v += D::to_float(bias[col_base + c]);
                            out[8 * e + awq_order(j)] = D::from_float(v);
                        }
                    }
                    reinterpret_cast<uint4 *>(crow + 16 * q)[0] = reinterpret_cast<uint4 *>(out)[0];
                    reinterpret_cast<uint4 *>(crow + 16 * q)[1] = reinterpret_cast<uint4 *>(out)[1];
                } else if constexpr (WeightFormat<LAYOUT>::SLOT_BLOCKS_ADJACENT) {
                    // half of the blocks: every other column of 16q .. 16q + 15
#pragma unroll
                    for (int j = 0; j < NB; j++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            int c = 16 * q + 8 * e + awq_order(j0 + j);
                            float v = acc[mt][j][2 * h + e];
                            if (bias) v += D::to_float(bias[col_base + c]);
                            crow[c] = D::from_float(v);
                        }
                } else {
                    static_assert(WeightFormat<LAYOUT>::SLOT_PAIRS_ADJACENT,
                                  "the C store needs one of the two patterns");
#pragma unroll
                    for (int j = 0; j < NB; j++) { // slots 2q, 2q + 1: one paired store
                        int c = 8 * (j0 + j) + 2 * q;
                        float v0 = acc[mt][j][2 * h], v1 = acc[mt][j][2 * h + 1];
                        if (bias) {
                            v0 += D::to_float(bias[col_base + c]);
                            v1 += D::to_float(bias[col_base + c + 1]);
                        }
                        typename D::T2 o;
                        o.x = D::from_float(v0);
                        o.y = D::from_float(v1);
                        *reinterpret_cast<typename D::T2 *>(crow + c) = o;
                    }
                }
            }
        }
    };

    // ---- this block's work (stream-K, see stream_k_reduce), one segment (a tile's k-tiles [kt, kt + nk)) per
    // iteration; recomputed from the block index each time, so no loop state is held in registers across a segment.
    for (int seg = 0;; seg++) {
        int tile, kt, nk;
        if (!stream_k_segment(p, num_kt, seg, &tile, &kt, &nk)) break;
        if (seg > 0) __syncthreads(); // the previous segment's epilogue may still read the shared buffers
        if (tid == 0) {               // read after the main loop's first barrier
            seg_info[0] = tile;
            seg_info[1] = nk < num_kt;
            seg_info[2] = seg == 0;
        }
        gemm_segment(tile % tiles_m * BM, tile / tiles_m * BN, kt, nk);
    }
}

} // namespace w4a16
