// w4a16 int4 dequant-GEMM for Hopper (sm_90a) on wgmma, for M > 16.
//
// The product is computed transposed, C^T = dequant(W)^T * A^T: output channels are the MMA's M dimension and
// tokens its N dimension. That puts the dequantised weights in wgmma's register operand, straight from the
// same per-thread dequantisation as the mma.sync kernel (a warp's B fragments of two n8 blocks are exactly one
// warp's share of a wgmma m64k16 A operand), and the activations in its shared-memory operand, read through a
// descriptor from the same 128-byte-swizzled tile the cp.async pipeline already writes. No weight ever goes
// back to shared memory in fp16.
//
// Block: WG warpgroups; tile TM tokens x BN channels, BK = 64 per stage. Warp w owns NB = 8 / NH n8 blocks (quarter
// or half wh = w % NH of the 64-channel group w / NH); each warpgroup issues II = NB / 2 wgmma m64nTMk16 per k16
// step, one per pair of blocks (rows r and r + 8 of a warp's 16 rows are blocks 2ii and 2ii + 1, slot r).
// Shipped tiles: configs.h, W4A16_WGMMA_CONFIGS (64, 128 and 256 tokens; 2 warpgroups each).
// Pipeline: STAGES shared-memory slots; STAGES - 2 copies in flight, one slot being read by the wgmma batch
// still running, one being consumed. The fragments of a batch (KPB k16 steps) are dequantised while the previous
// batch runs, then that batch is waited for (wait_group 0: with register operands ptxas serialises every wgmma
// if a second batch could still be in flight) and the new one issued.
// Epilogue: accumulators (+ bias) -> shared memory as [token][channel] -> 16-byte coalesced stores.
//
// Split-K across blocks (gridDim.z > 1) as in gemm.cuh: partials in the workspace, the last block reduces.
//
// Preconditions (host): as gemm.cuh; splits <= number of k-tiles; TM x BN x splits x tiles within the workspace.
#pragma once
#include "gemm.cuh"
#include "wgmma.cuh"

namespace w4a16 {

constexpr int SM90_BK = 64;

// Tile of TM tokens x BN channels for WG warpgroups; a warp owns 8 / NH n8 blocks (NH warps share a 64-channel group).
template <typename T, int LAYOUT, int TM, int NH, int WG> struct Sm90Shape {
    static constexpr int THREADS = 128 * WG;
    static constexpr int BN = 64 * (THREADS / 32) / NH;
    using ATile = ActTile<T, TM, SM90_BK, THREADS>;
    using WTile = WeightTile<T, LAYOUT, BN, SM90_BK, NH, THREADS>;
    static constexpr int C_PITCH = BN + 8; // elements per staged C row (padding spreads the banks)
    static constexpr int STAGE_BYTES = (ATile::BYTES + WTile::BYTES + 1023) / 1024 * 1024;
    __host__ __device__ static constexpr int smem_bytes(int stages) {
        return (stages * STAGE_BYTES > TM * C_PITCH * (int)sizeof(T) ? stages * STAGE_BYTES
                                                                     : TM * C_PITCH * (int)sizeof(T)) +
               1024; // + alignment slack for the 1024-byte swizzle atoms
    }
};

template <typename T, int LAYOUT, int TM, int NH, int WG, int STAGES, int MINB, int KPB, bool SK = false>
__global__ void __launch_bounds__(128 * WG, MINB) gemm_sm90_kernel(const GemmArgs p) {
    using D = Dtype<T>;
    using Shape = Sm90Shape<T, LAYOUT, TM, NH, WG>;
    constexpr int THREADS = Shape::THREADS;
    using ATile = typename Shape::ATile;
    using WTile = typename Shape::WTile;
    constexpr int BN = Shape::BN, BK = SM90_BK, NB = 8 / NH, II = NB / 2, ACC = TM / 2, NBATCH = 4 / KPB;
    constexpr int STAGE_BYTES = Shape::STAGE_BYTES, C_PITCH = Shape::C_PITCH;
    // Fragments of batch b + 1 are written while batch b still reads its own registers: two buffers at least.
    static_assert(NBATCH >= 2, "the wgmma fragment registers need double buffering across batches");
    static_assert(ATile::BYTES % 1024 == 0, "wgmma tiles must stay 1024-byte aligned");

    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem =
        smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wn = warp / NH, wh = warp % NH, j0 = wh * NB;
    const int M = p.M, N = p.N;
    constexpr int AHEAD = STAGES - 2;
    constexpr int V = II * ACC / 4; // float4 of partial sums per thread
    const int num_kt = (p.K + BK - 1) / BK;

    // One segment: k-tiles [kt_begin, kt_begin + nk) of the tile at (m0, n0). `mode` 0: the whole tile, or the K split
    // of the grid's z (split-K); 1 / 2: part of stream-K tile `sk_tile`, this block's first / later segment.
    auto segment = [&](int m0, int n0, int kt_begin, int nk, int mode, int sk_tile) {
        StageCopy<T, ATile, WTile, BK> copy;
        copy.plan(p, m0, n0, tid, kt_begin, nk);
        const int gshift = copy.gshift, g_last = copy.g_last;
        auto load_stage = [&](int kt, int slot) { copy.issue(p, smem + slot * STAGE_BYTES, kt); };

        float acc[II][ACC]; // no initialisation: the first wgmma of each overwrites (scale-d = 0)

        copy.prologue(p, smem, STAGE_BYTES, kt_begin, min(AHEAD, nk), AHEAD);
        // A fragments of a stage's wgmma batches (KPB k16 steps each): [batch][k16 step][wgmma x 4 registers]
        uint32_t a[NBATCH][KPB][4 * II];
#pragma unroll
        for (int h = 0; h < NBATCH; h++)
#pragma unroll
            for (int kh = 0; kh < KPB; kh++)
#pragma unroll
                for (int e = 0; e < 4 * II; e++) a[h][kh][e] = 0;
        int cur_group = -1;
        int i = 0, slot = 0, pf_slot = AHEAD; // slots of stage i and of stage i + AHEAD
        do {                                  // nk >= 1: the host gives every split and segment at least one k-tile
            cp_async_wait<AHEAD - 1>();
            fence_proxy_async_smem();
            __syncthreads();
            {
                if (i + AHEAD < nk) load_stage(kt_begin + i + AHEAD, pf_slot);
                pf_slot = pf_slot + 1 == STAGES ? 0 : pf_slot + 1;
                cp_async_commit();
            }
            const unsigned char *st = smem + slot * STAGE_BYTES;
            slot = slot + 1 == STAGES ? 0 : slot + 1;
            const unsigned char *wst = st + ATile::BYTES;
            const int k0 = (kt_begin + i) * BK;
            uint64_t desc[4]; // the stage's activation tile at k16 steps 0..3
#pragma unroll
            for (int ks = 0; ks < 4; ks++) desc[ks] = smem_desc_sw128(st + ks * 32);
#pragma unroll
            for (int h = 0; h < NBATCH; h++) {
#pragma unroll
                for (int kh = 0; kh < KPB; kh++) {
                    const int ks = KPB * h + kh;
                    const int g = (k0 + ks * 16) >> gshift;
                    if (g != cur_group) {
                        cur_group = g;
                        copy.wt.group(wst, min(g, g_last) - (k0 >> gshift), wn, wh, lane, p.zeros != nullptr,
                                      p.marlin_channelwise);
                    }
                    copy.wt.fetch(wst, ks, wn, wh, lane, 0);
                    uint32_t b[NB][2];
                    copy.wt.dequant(0, wh, b);
#pragma unroll
                    for (int ii = 0; ii < II; ii++) {
                        a[h][kh][4 * ii + 0] = b[2 * ii][0];     // row r,     k 2q..2q+1
                        a[h][kh][4 * ii + 1] = b[2 * ii + 1][0]; // row r + 8, k 2q..2q+1
                        a[h][kh][4 * ii + 2] = b[2 * ii][1];     // row r,     k 2q+8..2q+9
                        a[h][kh][4 * ii + 3] = b[2 * ii + 1][1]; // row r + 8, k 2q+8..2q+9
                    }
                }
                wgmma_wait<0>();                              // the previous batch has finished reading its fragments
                fence_operands(a[(h + NBATCH - 1) % NBATCH]); // ... which stay in their registers until here, so the
                wgmma_fence(); // dequantisation above cannot have been given the same ones
#pragma unroll
                for (int kh = 0; kh < KPB; kh++)
#pragma unroll
                    for (int ii = 0; ii < II; ii++)
                        wgmma_m64k16<T, TM>(acc[ii], &a[h][kh][4 * ii], desc[KPB * h + kh], i + h + kh > 0);
                wgmma_commit();
            }
        } while (++i < nk);
        if (p.pdl) pdl_launch_dependents(); // main loop done: the next GEMM may start its weight loads
        wgmma_wait<0>();
#pragma unroll
        for (int ii = 0; ii < II; ii++) fence_operands(acc[ii]);
        cp_async_wait_all();

        // ---- K split across blocks, or part of a stream-K tile: fp32 (or T) partials to the workspace; the last
        // block of the tile adds them in split / block order (deterministic), resets the tile's counter and goes on
        // to the epilogue.
        auto vslot = [&](int v) -> float * { return &acc[v / (ACC / 4)][4 * (v % (ACC / 4))]; };
        auto all_live = [](int) { return true; };
        auto block_sync = []() { __syncthreads(); };
        if constexpr (!SK) {
            if (gridDim.z > 1 && !split_k_reduce<T, V>(p, V * THREADS, tid, THREADS, tid, vslot, all_live, block_sync))
                return;
        } else {
            if (mode > 0 && !stream_k_reduce<T, V>(p, sk_tile, num_kt, mode == 1, V * THREADS, tid, THREADS, tid, vslot,
                                                   all_live, block_sync))
                return;
        }
        __syncthreads(); // every warpgroup is done with the pipeline buffers: stage C there

        // ---- epilogue: this thread holds channels (blocks 2ii + h, slot r) x tokens 8c + 2q + e
        T *sC = reinterpret_cast<T *>(smem);
        const T *bias = static_cast<const T *>(p.bias);
        const int q = lane & 3, r = lane >> 2;
#pragma unroll
        for (int ii = 0; ii < II; ii++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int ch = 64 * wn + WeightFormat<LAYOUT>::column(j0 + 2 * ii + h, r);
                const float bv = bias && n0 + ch < N ? D::to_float(bias[n0 + ch]) : 0.f;
#pragma unroll
                for (int c = 0; c < TM / 8; c++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        sC[(8 * c + 2 * q + e) * C_PITCH + ch] = D::from_float(acc[ii][4 * c + 2 * h + e] + bv);
            }
        }
        __syncthreads();
        T *C = static_cast<T *>(p.C);
        constexpr int CPR = BN / 8; // 16-byte chunks per row
#pragma unroll 4
        for (int c = tid; c < TM * CPR; c += THREADS) {
            const int row = c / CPR, col = (c % CPR) * 8;
            if (m0 + row < M && n0 + col < N)
                *reinterpret_cast<uint4 *>(C + (size_t)(m0 + row) * N + n0 + col) =
                    *reinterpret_cast<const uint4 *>(sC + row * C_PITCH + col);
        }
    };

    if constexpr (!SK) { // grid (token tiles, channel tiles, K splits)
        int kt_begin;
        const int nk = split_k_tiles(num_kt, &kt_begin);
        segment(blockIdx.x * TM, blockIdx.y * BN, kt_begin, nk, 0, 0);
    } else {
        // Stream-K (csrc/plan.c), its own instance of the one-block-per-SM tiles: with the loop and stream_k_reduce in
        // the same kernel the plain calls ran up to 1.1x slower (the register allocation of the k loop changed), and
        // the two-block tiles' 128-register budget spills the loop state. One-dimensional grid, gemm.cuh's division
        // (stream_k_segment); tile t is token tile t % tiles_m of channel tile t / tiles_m.
        static_assert(MINB == 1, "stream-K instances of the one-block-per-SM tiles only");
        const int tiles_m = (M + TM - 1) / TM;
        for (int seg = 0;; seg++) {
            int t, kt, nk;
            if (!stream_k_segment(p, num_kt, seg, &t, &kt, &nk)) break;
            if (seg > 0) __syncthreads(); // the previous segment's epilogue may still read the shared buffers
            const int mode = nk < num_kt ? (seg == 0 ? 1 : 2) : 0;
            segment(t % tiles_m * TM, t / tiles_m * BN, kt, nk, mode, t);
        }
    }
}

} // namespace w4a16
