// The warp-specialised tile for dense GEMMs, both weight layouts ("rows-128", "ws-64", "ws-32" with mma.sync math
// warps; "wgmma-ws-128", "wgmma-ws-64" with wgmma, sm_90a): launched through the MoE launch on the identity routing,
// like the MoE kernel's rows-64 / rows-32 tiles (csrc/moe.c).
//
// Why: the rows-64 tile (4 warps of 64 x 64, every thread issuing copies, a block barrier per stage) runs its loop at
// about 57% of the mma.sync pipe, stalled on fixed-latency dependencies (docs/PERFORMANCE.md "Session 16"). Here a
// block is two math warpgroups (8 warps) and one producer warpgroup:
// - one producer thread fills a stage: the activations by TMA (a tensor map built per launch, 128-byte swizzle), the
//   AWQ weights by TMA too, the Marlin weight rows and the scale and zero-point rows by bulk copies, all completing on
//   the stage's "full" mbarrier by bytes; the math threads arrive on the stage's "empty" mbarrier when done with it.
//   No block barrier in the main loop, no copy plans in the math warps' registers. (A producer warpgroup of 16-byte
//   cp.async copies spent 20-25% of the wgmma form's time; docs/PERFORMANCE.md v45, v46.)
// - an mma.sync math warp computes BM rows x 32 channels (four n8 blocks) over every k of a stage: each dequantised
//   weight fragment feeds MT m16 tiles (8 at BM = 128), half the dequantisation per MMA of the rows-64 warp tile.
// - a wgmma math warpgroup multiplies its 128 channels, the product transposed as in gemm_sm90.cuh: the dequantised
//   weights are wgmma's register operand, the activation tile its shared-memory operand by descriptor. Unlike
//   gemm_sm90.cuh's block, the two warpgroups never wait for each other (no block barrier), so one dequantises while
//   the other's batch runs.
// - registers: 384 threads leave 168 per thread at launch, too few for 128 fp32 sums plus double-buffered fragments
//   (the first version, with one producer warp and no reallocation, ran at 1.4x rows-64's time with single-buffered
//   A fragments). setmaxnreg moves them: producer 40, math 232. setmaxnreg exists only in the architecture-specific
//   targets (sm_90a, sm_120a, sm_121a), so this file is built for those alone and the host plans the tile only where
//   w4a16_probe_ws finds the image (csrc/device.c).
// Work split: block b of gridDim.x takes units [b U / B, (b + 1) U / B) of the U = tiles x k-tiles (tile, k-tile)
// units, channel tiles fastest; with one block per tile that is a whole tile each, with fewer blocks stream-K (partial
// tiles' fp32 sums through the workspace, added in block order, so deterministic: by the tile's last block as the
// rows-64 stream-K kernel does (stream_k.cuh), or where the plan says so by a second grid, fixup_kernel).
#include "common.cuh"
#include "gemm_sm90_dense.cuh" // make_tensor_map
#include "launch.h"
#include "moe_launch.h"
#include "stream_k.cuh"
#include "wgmma.cuh"
#include <cuda_runtime.h>
#include <type_traits>

namespace w4a16 {
namespace moe {
namespace ws {

constexpr int MATH_WARPS = 8, PRODUCERS = 128, THREADS = W4A16_MOE_WS_THREADS, BN = 256, BK = 64, SLOTS = 2;
static_assert(THREADS == MATH_WARPS * 32 + PRODUCERS, "two math warpgroups and a producer warpgroup");
// registers per thread after setmaxnreg: 128 x 40 + 256 x 232 = 64512 of the SM's 65536
constexpr int PRODUCER_REGS = 40, MATH_REGS = 232;
constexpr int MAX_STAGES = 8;

// A stage: the activation tile (BM rows of BK k: 128-byte rows, 16-byte chunks XOR-swizzled by row, the 128-byte
// swizzle TMA writes, which ldmatrix and wgmma's descriptor read), the packed weights (Marlin: BK / 16 rows of 2 BN
// words; AWQ: BK rows of BN / 8 words, 128-byte rows in the same swizzle), two scale rows and two zero-point rows
// (G = 32 puts two groups in a stage). Stages start on 1024-byte swizzle atoms.
template <int LAYOUT, int MT> struct Tile {
    static constexpr int BM = 16 * MT;
    static constexpr int A_BYTES = BM * BK * 2;
    static constexpr int B_BYTES = LAYOUT == W4A16_LAYOUT_AWQ ? BK * BN / 2 : (BK / 16) * 2 * BN * 4;
    static constexpr int S_BYTES = SLOTS * BN * 2, Z_BYTES = SLOTS * (BN / 8) * 4;
    static constexpr int STAGE = (A_BYTES + B_BYTES + S_BYTES + Z_BYTES + 1023) / 1024 * 1024;
    static constexpr int SROW = BN + 8, OUT = BM * SROW * 2; // the staged output tile, rows padded by 16 bytes
    // + the slack that aligns the first stage
    static constexpr int smem(int stages) { return (stages * STAGE > OUT ? stages * STAGE : OUT) + 1024; }
};

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// (the mbarrier helpers, by pointer or by shared-window address, and the TMA / bulk copies: wgmma.cuh)
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
// Named barrier 2: the math warps' epilogue. barrier.sync, not
// bar.sync (= barrier.sync.aligned): a warp may arrive diverged (after the mbarrier polls and the epilogue's
// per-thread branches), which the aligned form does not allow (compute-sanitizer synccheck reports it).
__device__ __forceinline__ void bar_sync(int id, int threads) {
    asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <typename T, int LAYOUT, int MT, bool WG>
__global__ void __launch_bounds__(THREADS, 1)
    ws_kernel(const w4a16_moe_launch p, const __grid_constant__ CUtensorMap amap,
              const __grid_constant__ CUtensorMap bmap) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(__CUDA_ARCH_FEAT_SM120_ALL) &&           \
    !defined(__CUDA_ARCH_FEAT_SM121_ALL)
    __trap(); // a stub: never planned (w4a16_probe_ws fails), no setmaxnreg on this target
#else
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (WG) { // wgmma exists only in the sm_90a image: a stub elsewhere, never planned
        __trap();
        return;
    }
#endif
    using D = Dtype<T>;
    using TL = Tile<LAYOUT, MT>;
    constexpr bool AWQ = LAYOUT == W4A16_LAYOUT_AWQ;
    constexpr int BM = TL::BM, A_BYTES = TL::A_BYTES, B_BYTES = TL::B_BYTES, S_BYTES = TL::S_BYTES;
    constexpr int STAGE = TL::STAGE, SROW = TL::SROW;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // 1024-byte aligned stages, so that the swizzle TMA applies (by address) is the one the readers undo (Tile adds
    // the slack)
    unsigned char *const smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    __shared__ uint64_t full[MAX_STAGES], empty[MAX_STAGES], seg_done;
    __shared__ int s_flag;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int M = p.M, N = p.N, K = p.K, stages = p.stages, gshift = p.gshift;
    const int nkt = K / BK, ntn = (N + BN - 1) / BN, g_last = (K - 1) >> gshift;
    const long long U = (long long)p.grid_blocks * ntn * nkt, B = gridDim.x;
    // the fixup grid (launched with programmatic stream serialization) may be scheduled now: its blocks take SMs as
    // this grid's leave and wait there for all of it, so its launch overlaps this grid's tail
    if (p.sk_fixup) pdl_launch_dependents();
    if (tid == 0) {
        for (int s = 0; s < stages; s++) {
            mbar_init(&full[s], 1);                // the producer thread's expect-tx; then the copies' bytes
            mbar_init(&empty[s], MATH_WARPS * 32); // every math thread once done reading the stage
        }
        mbar_init(&seg_done, MATH_WARPS * 32); // every math thread once a segment's epilogue is done
        // the copies (the async proxy) complete on these barriers: their initialisation is visible to it first
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    // Each role loops over the block's segments (a partial tile, whole tiles, a partial tile) in its own branch after
    // its setmaxnreg: code after a join would have to fit the smaller budget. Between segments the epilogue's staged
    // output overlaps the stage buffers: the producer starts a segment's copies once every math thread has arrived
    // on seg_done after the last one's epilogue (an mbarrier, so the math warps themselves do not wait).
    auto for_segments = [&](bool producer, auto &&body) {
        long long u = blockIdx.x * U / B;
        const long long u1 = (blockIdx.x + 1) * U / B;
        for (int seg = 0; u < u1; seg++) {
            const int t = (int)(u / nkt), k0 = (int)(u % nkt), nk = (int)min((long long)(nkt - k0), u1 - u);
            if (seg > 0) {
                if (producer) {
                    mbar_wait(&seg_done, (seg - 1) & 1);
                } else {
                    // the epilogue's ordinary stores to the stage buffers come before the next segment's copies
                    // (the async proxy) write there
                    fence_proxy_async_smem();
                    mbar_arrive(&seg_done);
                }
            }
            body(seg, t, k0, nk, (t / ntn) * BM, (t % ntn) * BN);
            u += nk;
        }
    };
    // The ring position of the stages this role filled (producer) or consumed (math) so far: slot, and the parity of
    // the barrier phase it waits for; advanced by one per stage, without dividing by the runtime depth (an integer
    // division per stage cost ~15 instructions of a math warp's ~250 at 32 rows).
    int slot = 0;
    uint32_t phase = 0;
    auto advance = [&] {
        if (++slot == stages) {
            slot = 0;
            phase ^= 1;
        }
    };
    if (warp >= MATH_WARPS) {
        // one thread fills a stage by TMA (the activations through `amap`; the AWQ weights through `bmap`, 128-byte
        // rows in the 128-byte swizzle) and bulk copies (the Marlin weight rows, the scale and zero-point rows)
        setmaxnreg_dec<PRODUCER_REGS>();
        if (tid != MATH_WARPS * 32) return; // one thread issues every copy
        const uint32_t *Bw = static_cast<const uint32_t *>(p.B);
        const T *S = static_cast<const T *>(p.scales);
        const uint32_t *Z = static_cast<const uint32_t *>(p.zeros);
        const uint32_t full0 = smem_u32(&full[0]), empty0 = smem_u32(&empty[0]);
        for_segments(true, [&](int seg, int t, int k0, int nk, int m0, int n0) {
            (void)seg;
            (void)t;
            // the tile's share of a weight row (Marlin: 2 words a channel), of a scale row and of a zero-point row
            const int ch = min(BN, N - n0);
            const uint32_t b_bytes = ch * 8, s_bytes = ch * 2, z_bytes = Z ? ch / 2 : 0;
            const uint32_t bytes =
                A_BYTES + (AWQ ? BK * BN / 2 : (BK / 16) * b_bytes) + SLOTS * (s_bytes + z_bytes); // TMA boxes: whole
            for (int s = 0; s < nk; s++, advance()) {
                const int kt = k0 + s;
                mbar_wait(empty0 + 8 * slot, phase ^ 1); // a fresh barrier passes parity 1 at once
                unsigned char *st = smem + slot * STAGE;
                const uint32_t bar = full0 + 8 * slot;
                mbar_expect_tx(bar, bytes);
                tma_load_2d(st, &amap, kt * BK, m0, bar); // rows past M are zero-filled (and counted)
                if constexpr (AWQ)
                    tma_load_2d(st + A_BYTES, &bmap, n0 / 8, kt * BK, bar);
                else
#pragma unroll
                    for (int i = 0; i < BK / 16; i++)
                        bulk_load(st + A_BYTES + i * (2 * BN * 4), Bw + (size_t)(kt * (BK / 16) + i) * (2 * N) + 2 * n0,
                                  b_bytes, bar);
                const int g0 = (kt * BK) >> gshift;
#pragma unroll
                for (int i = 0; i < SLOTS; i++) {
                    const int g = min(g0 + i, g_last);
                    bulk_load(st + A_BYTES + B_BYTES + i * BN * 2, S + (size_t)g * N + n0, s_bytes, bar);
                    if (Z)
                        bulk_load(st + A_BYTES + B_BYTES + S_BYTES + i * (BN / 8) * 4, Z + (size_t)g * (N / 8) + n0 / 8,
                                  z_bytes, bar);
                }
            }
        });
    } else {
        setmaxnreg_inc<MATH_REGS>();
        // the lane's ldmatrix row of each m16 tile at k16 step kk: row lane % 16, 16-byte chunk 2 kk + lane / 16, XOR-
        // swizzled by the row (row % 8 = lane % 8 in every m16 tile): computed once, not per step
        int a_off[BK / 16];
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) a_off[kk] = (lane & 15) * BK + (((kk * 2 + (lane >> 4)) ^ (lane & 7)) * 8);
        for_segments(false, [&](int seg, int t, int k0, int nk, int m0, int n0) {
            // ---- math warp `warp`: channels 32 warp .. + 32 of the tile, i.e. half h of 64-channel group gq
            const int q = lane & 3, r = lane >> 2, gq = warp >> 1, h = warp & 1;
            const bool has_zeros = p.zeros != nullptr, channelwise = p.marlin_channelwise != 0;
            float acc[MT][4][4];
            if constexpr (!WG) zero_sums(acc); // (wgmma: the first MMA of a segment overwrites)
            GroupConst<T> gc[4];
            int cur_group = -1;
            // the packed weights of the warp's four n8 blocks at k16 step kk: Marlin the lane's 8 bytes of them;
            // AWQ rows 2q, 2q + 1, 2q + 8, 2q + 9 of word r of the 64-channel group (blocks 4h .. 4h + 3 are
            // nibbles 4h .. 4h + 3 of those words)
            const int f_off = A_BYTES + gq * 512 + (2 * lane + h) * 8;
            // TMA's AWQ rows: 128 bytes (word w of row R in 16-byte chunk (w / 4) ^ (R % 8)); rows 2q, 2q + 8 of a k16
            // step share one chunk order, 2q + 1, 2q + 9 the next (conflict-free over the warp)
            const int w_awq = gq * 8 + r;
            const int f_o0 = A_BYTES + 2 * q * 128 + ((((w_awq >> 2) ^ (2 * q)) << 4) | ((w_awq & 3) << 2));
            const int f_o1 = A_BYTES + (2 * q + 1) * 128 + ((((w_awq >> 2) ^ (2 * q + 1)) << 4) | ((w_awq & 3) << 2));
            auto fetch = [&](const unsigned char *st, int kk) {
                uint4 f;
                if constexpr (AWQ) {
                    const unsigned char *b = st + kk * 16 * 128;
                    f = make_uint4(*reinterpret_cast<const uint32_t *>(b + f_o0),
                                   *reinterpret_cast<const uint32_t *>(b + f_o1),
                                   *reinterpret_cast<const uint32_t *>(b + f_o0 + 8 * 128),
                                   *reinterpret_cast<const uint32_t *>(b + f_o1 + 8 * 128));
                } else {
                    const uint2 v = *reinterpret_cast<const uint2 *>(st + f_off + kk * (2 * BN) * 4);
                    f = make_uint4(v.x, v.y, 0u, 0u);
                }
                return f;
            };
            // The B fragments b[j] (n8 block j of the warp: channel column r, k 2q.. and 2q + 8..) of k16 step kk of
            // the stage at st (k-tile kt; gs its first group): the group constants when a group starts, the next
            // step's packed weights into fr, this step's dequantised.
            auto dequant_step = [&](const unsigned char *st, int kt, int gs, int kk, uint4 &fr, uint32_t(&b)[4][2]) {
                const int g = (kt * BK + 16 * kk) >> gshift;
                if (kk % 2 == 0 && g != cur_group) { // groups start at multiples of 32 k (G >= 32)
                    cur_group = g;
                    const int sl = min(g, g_last) - min(gs, g_last);
                    const T *sS = reinterpret_cast<const T *>(st + A_BYTES + B_BYTES) + sl * BN + gq * 64;
                    const uint32_t *sZ =
                        reinterpret_cast<const uint32_t *>(st + A_BYTES + B_BYTES + S_BYTES) + sl * (BN / 8) + gq * 8;
                    uint32_t sc[4];
                    if constexpr (AWQ) { // position = column: block 4h + j, slot r is column 8r + ORDER[4h + j]
                        const uint4 v = *reinterpret_cast<const uint4 *>(sS + 8 * r);
                        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            const int c = awq_order(4 * h + j);
                            sc[j] = prmt(w[c / 2], 0u, c % 2 ? 0x3232u : 0x1010u);
                        }
                    } else if (channelwise) {
                        // channelwise Marlin scales: in 32 columns, position 8i + t holds column
                        // 2i + {0,1,8,9,16,17,24,25}[t]; block m = 4h + j
                        const uint16_t *s16 = reinterpret_cast<const uint16_t *>(sS);
#pragma unroll
                        for (int j = 0; j < 4; j++)
                            sc[j] = prmt(s16[32 * h + 8 * (r / 2) + 2 * j + (r % 2)], 0u, 0x1010u);
                    } else { // grouped: position 8r + m holds column r + 8m
                        const uint2 v = *reinterpret_cast<const uint2 *>(sS + 8 * r + 4 * h);
#pragma unroll
                        for (int j = 0; j < 4; j++) sc[j] = prmt(j < 2 ? v.x : v.y, 0u, j % 2 ? 0x3232u : 0x1010u);
                    }
                    const uint32_t zw = has_zeros ? sZ[r] : 0x88888888u; // uint4b8: zero point 8
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        gc[j] = make_group_const_bits<T>(
                            sc[j], (zw >> (4 * (AWQ ? 4 * h + j : awq_reverse(4 * h + j)))) & 0xF);
                }
                const uint4 f = fr;
                if (kk + 1 < BK / 16) fr = fetch(st, kk + 1);
                if constexpr (AWQ) { // nibbles 4h + j of rows (2q, 2q + 1) and (2q + 8, 2q + 9), paired by prmt
                    const uint32_t sel = h ? 0x7632u : 0x5410u;
                    const uint32_t x01 = prmt(f.x, f.y, sel), x89 = prmt(f.z, f.w, sel);
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const uint32_t x0 = x01 >> (8 * (j / 2)), x8 = x89 >> (8 * (j / 2));
                        b[j][0] = j % 2 == 0 ? dq_lo<T>(x0, gc[j]) : dq_hi<T>(x0, gc[j]);
                        b[j][1] = j % 2 == 0 ? dq_lo<T>(x8, gc[j]) : dq_hi<T>(x8, gc[j]);
                    }
                } else {
                    b[0][0] = dq_lo<T>(f.x, gc[0]);
                    b[0][1] = dq_hi<T>(f.x, gc[0]);
                    b[1][0] = dq_lo<T>(f.x >> 8, gc[1]);
                    b[1][1] = dq_hi<T>(f.x >> 8, gc[1]);
                    b[2][0] = dq_lo<T>(f.y, gc[2]);
                    b[2][1] = dq_hi<T>(f.y, gc[2]);
                    b[3][0] = dq_lo<T>(f.y >> 8, gc[3]);
                    b[3][1] = dq_hi<T>(f.y >> 8, gc[3]);
                }
            };
            if constexpr (!WG) {
                for (int s = 0; s < nk; s++, advance()) {
                    const int kt = k0 + s;
                    mbar_wait(&full[slot], phase);
                    const unsigned char *st = smem + slot * STAGE;
                    const int gs = (kt * BK) >> gshift;
                    uint4 fr = fetch(st, 0);
#pragma unroll
                    for (int kk = 0; kk < BK / 16; kk++) {
                        uint32_t b[4][2];
                        dequant_step(st, kt, gs, kk, fr, b);
                        const T *sA = reinterpret_cast<const T *>(st) + a_off[kk];
                        auto load_a = [&](int mt, uint32_t(&fa)[4]) { ldmatrix_x4(fa, sA + mt * 16 * BK); };
                        uint32_t fa[2][4];
                        load_a(0, fa[0]);
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            if (mt + 1 < MT) load_a(mt + 1, fa[(mt + 1) & 1]);
#pragma unroll
                            for (int j = 0; j < 4; j++) D::mma(acc[mt][j], fa[mt & 1], b[j]);
                        }
                    }
                    mbar_arrive(&empty[slot]);
                }
            } else {
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
                // wgmma (sm_90a): the product transposed as in gemm_sm90.cuh, channels the MMA's M dimension. The
                // warp's four n8 blocks are its 16-row share of two m64 wgmmas (blocks 2ii and 2ii + 1: rows r and
                // r + 8), the stage's activation tile (128-byte rows, chunks XOR-swizzled by row: the 128-byte
                // swizzle, as TMA writes it) their B operand by descriptor. A stage (four k16 steps, eight wgmmas of
                // the warpgroup) is a batch: its fragments are dequantised while the batch before runs on the other
                // register buffer. (Half-stage batches measured the same: docs/PERFORMANCE.md v45.)
                float(&wacc)[2][BM / 2] = reinterpret_cast<float(&)[2][BM / 2]>(acc);
                uint32_t fa[2][4][8]; // [stage parity][k16 step][wgmma ii x 4 registers]
#pragma unroll
                for (int x = 0; x < 2; x++)
#pragma unroll
                    for (int y = 0; y < 4; y++)
#pragma unroll
                        for (int e = 0; e < 8; e++) fa[x][y][e] = 0;
                // Batch order: issue a stage, wait until only it runs (wait_group 1), then dequantise the next stage
                // into the other buffer while it does. Stages alternate buffers, so the loop takes them in pairs.
                // (Dequantising before a wait_group 0 lets ptxas sink the arithmetic below the wait, out of the
                // running batch's shadow.)
                auto dequant_stage = [&](const unsigned char *st, int kt, uint32_t(&f)[4][8]) {
                    const int gs = (kt * BK) >> gshift;
                    uint4 fr = fetch(st, 0);
#pragma unroll
                    for (int kk = 0; kk < 4; kk++) {
                        uint32_t b[4][2];
                        dequant_step(st, kt, gs, kk, fr, b);
#pragma unroll
                        for (int ii = 0; ii < 2; ii++) {
                            f[kk][4 * ii + 0] = b[2 * ii][0];
                            f[kk][4 * ii + 1] = b[2 * ii + 1][0];
                            f[kk][4 * ii + 2] = b[2 * ii][1];
                            f[kk][4 * ii + 3] = b[2 * ii + 1][1];
                        }
                    }
                };
                // the stage's descriptor once; a k16 step is 32 bytes further, 2 in the descriptor's address field
                // (which cannot carry out of its 14 bits inside the 228 KB window)
                auto issue = [&](const unsigned char *st, uint32_t(&f)[4][8], int first) {
                    const uint64_t desc = smem_desc_sw128(st);
                    wgmma_fence();
#pragma unroll
                    for (int kk = 0; kk < 4; kk++)
#pragma unroll
                        for (int ii = 0; ii < 2; ii++)
                            wgmma_m64k16<T, BM>(wacc[ii], &f[kk][4 * ii], desc + 2 * kk, !(first && kk == 0));
                    wgmma_commit();
                };
                const uint32_t full0 = smem_u32(&full[0]), empty0 = smem_u32(&empty[0]);
                auto acquire = [&]() { // the next stage's slot has landed (TMA: the async proxy wrote it)
                    mbar_wait(full0 + 8 * slot, phase);
                    return static_cast<const unsigned char *>(smem + slot * STAGE);
                };
                const unsigned char *st = acquire();
                dequant_stage(st, k0, fa[0]);
                int prev = 0;
                // stage s from buffer X: issue it, retire stage s - 1 (its slot back to the producer), dequantise
                // stage s + 1 into the other buffer
                auto step = [&](auto xc, int s) {
                    constexpr int X = decltype(xc)::value;
                    issue(st, fa[X], s == 0);
                    wgmma_wait<1>();
                    fence_operands(fa[X ^ 1]);
                    if (s > 0) mbar_arrive(empty0 + 8 * prev);
                    prev = slot;
                    advance();
                    if (s + 1 < nk) {
                        st = acquire();
                        dequant_stage(st, k0 + s + 1, fa[X ^ 1]);
                    }
                };
                for (int s = 0; s < nk; s += 2) {
                    step(std::integral_constant<int, 0>(), s);
                    if (s + 1 < nk) step(std::integral_constant<int, 1>(), s + 1);
                }
                wgmma_wait<0>();
#pragma unroll
                for (int ii = 0; ii < 2; ii++) fence_operands(wacc[ii]);
                mbar_arrive(empty0 + 8 * prev);
#endif // (elsewhere the stub at the top has returned)
            }

            // ---- epilogue (math warps only: named barrier 2)
            if (nk < nkt) {
                // a partial tile: its fp32 sums to this block's workspace slot (0 for the segment its range starts
                // in, 1 for the one it ends in); fixup_kernel adds the parts after this grid (p.sk_fixup), or else
                // the block that completes the tile adds every part in block order
                float4 *const part = static_cast<float4 *>(p.partials) + warp * MT * 4 * 32 + lane;
                if (p.sk_fixup) {
                    sk_store_part<MT, 4, MATH_WARPS * MT * 4 * 32>(acc, part, seg == 0 ? 0 : 1);
                    return;
                }
                auto arrive = [&](int add, int total) {
                    __threadfence(); // the sums are visible device-wide before the counter says so
                    bar_sync(2, MATH_WARPS * 32);
                    if (tid == 0) {
                        const int prev = atomicAdd(p.counters + t, add);
                        s_flag = prev + add == total;
                        if (s_flag) p.counters[t] = 0;
                    }
                    bar_sync(2, MATH_WARPS * 32);
                    if (!s_flag) return false;
                    __threadfence();
                    return true;
                };
                if (!sk_partial<MT, 4, MATH_WARPS * MT * 4 * 32>(acc, part, seg == 0 ? 0 : 1, t, nk, nkt, U, B, arrive))
                    return;
            }
            // (acc + bias) in T staged in shared memory (every math warp is past its last stage: the barrier), then
            // copied out as 16-byte chunks of each row
            T *stg = reinterpret_cast<T *>(smem);
            const T *bias = p.bias ? static_cast<const T *>(p.bias) + n0 : nullptr;
            bar_sync(2, MATH_WARPS * 32);
            if constexpr (WG) { // rows r + 8 hh of wgmma ii: channel column r of block j = 2 ii + hh; tokens 8c + 2q +
                                // e
                const float(&wacc)[2][BM / 2] = reinterpret_cast<const float(&)[2][BM / 2]>(acc);
#pragma unroll
                for (int ii = 0; ii < 2; ii++)
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        const int j = 2 * ii + hh;
                        const int c = AWQ ? gq * 64 + 8 * r + awq_order(4 * h + j) : warp * 32 + 8 * j + r;
                        const float bv = bias && n0 + c < N ? D::to_float(bias[c]) : 0.f;
#pragma unroll
                        for (int cc = 0; cc < BM / 8; cc++)
#pragma unroll
                            for (int e = 0; e < 2; e++)
                                stg[(8 * cc + 2 * q + e) * SROW + c] =
                                    D::from_float(wacc[ii][4 * cc + 2 * hh + e] + bv);
                    }
            } else {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) { // rows r and r + 8 of the m16 tile
                        T *srow = stg + (mt * 16 + r + 8 * hh) * SROW;
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            float x[2] = {acc[mt][j][2 * hh], acc[mt][j][2 * hh + 1]};
                            if constexpr (AWQ) { // slot 2q + c2 of block 4h + j: column 16q + 8 c2 + ORDER[4h + j]
#pragma unroll
                                for (int c2 = 0; c2 < 2; c2++) {
                                    const int c = gq * 64 + 16 * q + 8 * c2 + awq_order(4 * h + j);
                                    if (bias && n0 + c < N) x[c2] += D::to_float(bias[c]);
                                    srow[c] = D::from_float(x[c2]);
                                }
                            } else { // columns 8j + 2q, + 1 of the warp's 32
                                const int c = warp * 32 + 8 * j + 2 * q;
                                if (bias && n0 + c < N) { // bias is only 4-byte aligned: column pairs
                                    const typename D::T2 bv = *reinterpret_cast<const typename D::T2 *>(bias + c);
                                    x[0] += D::to_float(bv.x);
                                    x[1] += D::to_float(bv.y);
                                }
                                typename D::T2 v;
                                v.x = D::from_float(x[0]);
                                v.y = D::from_float(x[1]);
                                *reinterpret_cast<uint32_t *>(srow + c) = as_u32(v);
                            }
                        }
                    }
            }
            bar_sync(2, MATH_WARPS * 32);
            T *C = static_cast<T *>(p.C);
            constexpr int CPR = BN / 8;
            for (int i = tid; i < BM * CPR; i += MATH_WARPS * 32) {
                const int row = i / CPR, cc = i % CPR;
                if (m0 + row >= M || n0 + cc * 8 >= N) continue;
                *reinterpret_cast<uint4 *>(C + (size_t)(m0 + row) * N + n0 + cc * 8) =
                    *reinterpret_cast<const uint4 *>(stg + row * SROW + cc * 8);
            }
        });
    }
#endif
}

// Stream-K's parts added by a second grid on the same stream, where the plan says so (p.sk_fixup: tiles split among
// two or more blocks on average, csrc/plan.c plan_ws): stream order makes every part complete, so no block waits on a
// counter, and the tile's 16-row shares are added in parallel, not by one block after the others. Block (t, sh) adds
// rows 16 sh .. 16 sh + 15 of tile t from every part in block order (the sums of the in-kernel fixup, so the output is
// bit-identical) and stores them with the bias. Its warps and lanes read the fragments the GEMM's math warps and lanes
// wrote: the mma.sync warp's m16 tile sh, n8 blocks 0-3; the wgmma form's token groups 2 sh, 2 sh + 1 of both wgmmas.
template <typename T, int LAYOUT, int MT, bool WG>
__global__ void __launch_bounds__(MATH_WARPS * 32) fixup_kernel(const w4a16_moe_launch p) {
    using D = Dtype<T>;
    constexpr bool AWQ = LAYOUT == W4A16_LAYOUT_AWQ;
    constexpr int SROW = BN + 8, TILE_F4 = MATH_WARPS * MT * 4 * 32, BM = 16 * MT;
    __shared__ __align__(16) T stg[16 * SROW];
    const int M = p.M, N = p.N, nkt = p.K / BK, ntn = (N + BN - 1) / BN;
    const long long U = (long long)p.grid_blocks * ntn * nkt, B = p.sk_blocks;
    const int t = blockIdx.x, sh = blockIdx.y;
    const int c0 = sk_block_of((long long)t * nkt, U, B), c1 = sk_block_of((long long)t * nkt + nkt - 1, U, B);
    // every part is written once the GEMM grid has completed; every block waits, so that this grid never completes
    // before that one (a later kernel's wait on this grid then covers the GEMM's whole tiles too)
    pdl_wait();
    const int m0 = (t / ntn) * BM, n0 = (t % ntn) * BN;
    if (c0 == c1 || m0 + 16 * sh >= M) return; // a whole tile (its block stored it), or a share past the last row
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, q = lane & 3, r = lane >> 2, gq = warp >> 1,
              h = warp & 1;
    const float4 *const part = static_cast<const float4 *>(p.partials) + warp * MT * 4 * 32 + lane;
    int off[4]; // the thread's four float4 of share sh in a part
#pragma unroll
    for (int f = 0; f < 4; f++)
        off[f] = WG ? ((sh / 2 + (f / 2) * (MT / 2)) * 4 + 2 * (sh % 2) + f % 2) * 32 : (sh * 4 + f) * 32;
    float sum[4][4] = {};
    for (int c = c0; c <= c1; c += 4) { // four parts' loads in flight, then their additions in block order
        float4 v[4][4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (c + k <= c1) {
                const float4 *src = part + ((size_t)(c + k) * 2 + sk_slot(c + k, t, nkt, U, B)) * TILE_F4;
#pragma unroll
                for (int f = 0; f < 4; f++) v[k][f] = __ldcg(src + off[f]);
            }
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (c + k <= c1)
#pragma unroll
                for (int f = 0; f < 4; f++) {
                    sum[f][0] += v[k][f].x;
                    sum[f][1] += v[k][f].y;
                    sum[f][2] += v[k][f].z;
                    sum[f][3] += v[k][f].w;
                }
    }
    // (sum + bias) in T staged in shared memory as ws_kernel's epilogue stages it, then 16-byte chunks of each row
    const T *bias = p.bias ? static_cast<const T *>(p.bias) + n0 : nullptr;
#pragma unroll
    for (int f = 0; f < 4; f++) {
        if constexpr (WG) { // wgmma f / 2: channel column r of block 2 (f / 2) + hh; tokens 8 (f % 2) + 2q + e
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int j = 2 * (f / 2) + hh;
                const int c = AWQ ? gq * 64 + 8 * r + awq_order(4 * h + j) : warp * 32 + 8 * j + r;
                const float bv = bias && n0 + c < N ? D::to_float(bias[c]) : 0.f;
#pragma unroll
                for (int e = 0; e < 2; e++)
                    stg[(8 * (f % 2) + 2 * q + e) * SROW + c] = D::from_float(sum[f][2 * hh + e] + bv);
            }
        } else { // n8 block f: rows r, r + 8
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                T *srow = stg + (r + 8 * hh) * SROW;
#pragma unroll
                for (int c2 = 0; c2 < 2; c2++) {
                    const int c =
                        AWQ ? gq * 64 + 16 * q + 8 * c2 + awq_order(4 * h + f) : warp * 32 + 8 * f + 2 * q + c2;
                    const float bv = bias && n0 + c < N ? D::to_float(bias[c]) : 0.f;
                    srow[c] = D::from_float(sum[f][2 * hh + c2] + bv);
                }
            }
        }
    }
    __syncthreads();
    T *C = static_cast<T *>(p.C);
    constexpr int CPR = BN / 8;
    for (int i = tid; i < 16 * CPR; i += MATH_WARPS * 32) {
        const int row = i / CPR, cc = i % CPR;
        if (m0 + 16 * sh + row >= M || n0 + cc * 8 >= N) continue;
        *reinterpret_cast<uint4 *>(C + (size_t)(m0 + 16 * sh + row) * N + n0 + cc * 8) =
            *reinterpret_cast<const uint4 *>(stg + row * SROW + cc * 8);
    }
}

using KernelFn = void (*)(w4a16_moe_launch, CUtensorMap, CUtensorMap);
using FixupFn = void (*)(w4a16_moe_launch);
// A tile's warp rows in m16 tiles: 128 x 256 -> 8, ws-64 -> 4, ws-32 -> 2.
constexpr int mt_of(int tile) { return w4a16_moe_tile_rows(tile) / 16; }
// A launch's GEMM kernel and its stream-K fixup
struct Kernels {
    KernelFn gemm;
    FixupFn fixup;
};
template <int LAYOUT, int MT, bool WG> Kernels kernels_mt(const w4a16_moe_launch &a) {
    if (a.dtype == 0) return {ws_kernel<__half, LAYOUT, MT, WG>, fixup_kernel<__half, LAYOUT, MT, WG>};
    return {ws_kernel<__nv_bfloat16, LAYOUT, MT, WG>, fixup_kernel<__nv_bfloat16, LAYOUT, MT, WG>};
}
template <int LAYOUT> Kernels kernels_of_layout(const w4a16_moe_launch &a) {
    switch (a.tile) {
    case W4A16_MOE_TILE_WS32:
        return kernels_mt<LAYOUT, 2, false>(a);
    case W4A16_MOE_TILE_WS64:
        return kernels_mt<LAYOUT, 4, false>(a);
    case W4A16_MOE_TILE_WG64:
        return kernels_mt<LAYOUT, 4, true>(a);
    case W4A16_MOE_TILE_WG128:
        return kernels_mt<LAYOUT, 8, true>(a);
    default:
        return kernels_mt<LAYOUT, 8, false>(a);
    }
}
Kernels kernels_of(const w4a16_moe_launch &a) {
    return a.layout == W4A16_LAYOUT_AWQ ? kernels_of_layout<W4A16_LAYOUT_AWQ>(a)
                                        : kernels_of_layout<W4A16_LAYOUT_MARLIN>(a);
}
template <int LAYOUT> int smem_of_layout(const w4a16_moe_launch &a) {
    switch (mt_of(a.tile)) { // (both forms: the stage does not depend on the math warps' MMA)
    case 2:
        return Tile<LAYOUT, 2>::smem(a.stages);
    case 4:
        return Tile<LAYOUT, 4>::smem(a.stages);
    default:
        return Tile<LAYOUT, 8>::smem(a.stages);
    }
}
int smem_of(const w4a16_moe_launch &a) {
    return a.layout == W4A16_LAYOUT_AWQ ? smem_of_layout<W4A16_LAYOUT_AWQ>(a) : smem_of_layout<W4A16_LAYOUT_MARLIN>(a);
}
template <int TILE> constexpr bool smem_formula_holds() {
    constexpr int MT = mt_of(TILE);
    for (int s = 2; s <= MAX_STAGES; s++)
        if (Tile<W4A16_LAYOUT_MARLIN, MT>::smem(s) != w4a16_moe_smem_bytes(TILE, W4A16_LAYOUT_MARLIN, s) ||
            Tile<W4A16_LAYOUT_AWQ, MT>::smem(s) != w4a16_moe_smem_bytes(TILE, W4A16_LAYOUT_AWQ, s))
            return false;
    return Tile<W4A16_LAYOUT_MARLIN, MT>::BM == w4a16_moe_tile_rows(TILE);
}
static_assert(smem_formula_holds<W4A16_MOE_TILE_128>() && smem_formula_holds<W4A16_MOE_TILE_WS64>() &&
                  smem_formula_holds<W4A16_MOE_TILE_WS32>() && smem_formula_holds<W4A16_MOE_TILE_WG128>() &&
                  smem_formula_holds<W4A16_MOE_TILE_WG64>(),
              "moe_launch.h w4a16_moe_smem_bytes differs from the warp-specialised tiles' shared memory");

} // namespace ws
} // namespace moe
} // namespace w4a16

// One block per tile (a.grid_blocks row tiles x the channel tiles), or stream-K over a.sk_blocks blocks.
extern "C" int w4a16_launch_ws(const w4a16_moe_launch *a) {
    using namespace w4a16::moe::ws;
    if (!w4a16_moe_tile_ws(a->tile) || a->stages < 2 || a->stages > MAX_STAGES || a->K % BK ||
        a->N % (a->layout == W4A16_LAYOUT_MARLIN ? 64 : 32))
        return cudaErrorInvalidValue;
    cudaLaunchConfig_t c = {};
    const unsigned ntiles = (a->N + BN - 1) / BN;
    c.gridDim = dim3(a->sk_blocks > 0 ? (unsigned)a->sk_blocks : ntiles * (unsigned)a->grid_blocks);
    c.blockDim = dim3(THREADS);
    c.dynamicSmemBytes = smem_of(*a);
    c.stream = static_cast<cudaStream_t>(a->stream);
    // the tensor maps (by value in the kernel's parameters: nothing to free, graph-capturable): the activations in
    // boxes of the tile's rows x 64 k, the AWQ weights in boxes of 64 k rows x 32 words (256 channels)
    CUtensorMap amap = {}, bmap = {};
    const int rows = w4a16_moe_tile_rows(a->tile);
    cudaError_t e = a->dtype == 0 ? w4a16::make_tensor_map<__half>(&amap, a->A, a->M, a->K, a->K, rows)
                                  : w4a16::make_tensor_map<__nv_bfloat16>(&amap, a->A, a->M, a->K, a->K, rows);
    if (e == cudaSuccess && a->layout == W4A16_LAYOUT_AWQ)
        e = w4a16::encode_tensor_map(&bmap, CU_TENSOR_MAP_DATA_TYPE_UINT32, 4, a->B, a->K, a->N / 8, a->N / 8, BN / 8,
                                     BK);
    if (e != cudaSuccess) return e;
    const Kernels k = kernels_of(*a);
    e = cudaLaunchKernelEx(&c, k.gemm, *a, amap, bmap);
    if (e != cudaSuccess || a->sk_blocks <= 0 || !a->sk_fixup) return e;
    // the fixup: a block per 16-row share of each tile (the whole tiles' blocks return at once)
    cudaLaunchConfig_t f = {};
    f.gridDim = dim3(ntiles * (unsigned)a->grid_blocks, (unsigned)rows / 16);
    f.blockDim = dim3(MATH_WARPS * 32);
    f.stream = c.stream;
    cudaLaunchAttribute at;
    w4a16::set_pdl(f, at, true);
    return cudaLaunchKernelEx(&f, k.fixup, *a);
}

extern "C" int w4a16_prepare_ws(const w4a16_moe_launch *a, int *blocks_per_sm) {
    using namespace w4a16::moe::ws;
    if (!w4a16_moe_tile_ws(a->tile) || a->stages < 2 || a->stages > MAX_STAGES) return cudaErrorInvalidValue;
    const int smem = smem_of(*a);
    cudaError_t err = (cudaError_t)w4a16_set_kernel_smem((const void *)kernels_of(*a).gemm, smem, a->carveout);
    if (err != cudaSuccess) return err;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, kernels_of(*a).gemm, THREADS, smem);
}

extern "C" int w4a16_probe_ws(void) {
    using namespace w4a16::moe::ws;
#ifndef W4A16_WS_IMAGES
    return cudaErrorInvalidDeviceFunction; // built without an sm_90a / sm_120a / sm_121a target: only a stub
#endif
    cudaFuncAttributes attr;
    cudaError_t e = cudaSuccess;
    for (int tile :
         {W4A16_MOE_TILE_128, W4A16_MOE_TILE_WS64, W4A16_MOE_TILE_WS32, W4A16_MOE_TILE_WG128, W4A16_MOE_TILE_WG64})
        for (int layout = 0; layout < 2; layout++)
            for (int dtype = 0; dtype < 2 && e == cudaSuccess; dtype++) {
                w4a16_moe_launch a = {};
                a.tile = tile;
                a.layout = layout;
                a.dtype = dtype;
                const Kernels k = kernels_of(a);
                e = cudaFuncGetAttributes(&attr, k.gemm);
                if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, k.fixup);
            }
    return e;
}
