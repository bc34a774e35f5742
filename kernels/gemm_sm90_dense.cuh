// Dense fp16/bf16 GEMM for Hopper (sm_90a) on wgmma with both operands in shared memory: the second half of the
// staged large-M path (csrc/api.c), after kernels/convert.cu has dequantised a slab of weights into the caller's
// workspace as Wt [N, K] (K contiguous, like A).
//
// C[M, N] (row stride ldc) = A[M, K] * Wt[N, K]^T (+ bias[N]), computed transposed like gemm_sm90.cuh: channels are
// the MMA's M dimension (each warpgroup 64 of them), tokens its N (TM per block). Both operands reach shared memory
// by TMA (one thread issues a stage: an A box and a Wt box through tensor maps, zero-filled past M, N and K, written
// in the 128-byte swizzle that wgmma reads by descriptor); no thread touches an operand on its way to the tensor cores.
// mbarriers pace the pipeline instead of a block-wide barrier: `full[s]` completes when slot s has landed, `empty[s]`
// when both warpgroups finished the batch that read it. A producer warp (one lane) issues every stage, running ahead
// across tiles: the kernel is persistent (min(tiles, SMs) blocks). One wgmma batch (4 k16 steps) runs while the next
// is issued (wait_group 1). C leaves through shared memory by TMA store (stmatrix.trans into a swizzled box), so the
// next tile is already loading while a warpgroup writes its results.
// TMA rather than cp.async: no thread spends issue slots on copies (docs/PERFORMANCE.md, "Profile and kernel choices").
//
// Preconditions (host): M >= 1, N a multiple of 64, K a multiple of 8 (16-byte rows), 16-byte aligned A, Wt, C and
// ldc a multiple of 8.
#pragma once
#include "common.cuh"
#include "wgmma.cuh"

namespace w4a16 {

struct DenseArgs {
    const void *A, *W, *bias;
    void *C;
    int M, N, K, ldc;
};

template <typename T, int TM, int WG> struct DenseShape {
    // WG consumer warpgroups (64 channels each) and one producer warp that issues every TMA load
    static constexpr int THREADS = 128 * WG + 32, BN = 64 * WG, BK = 64;
    static constexpr int A_BYTES = TM * BK * 2, STAGE_BYTES = A_BYTES + BN * BK * 2; // 128-byte rows: multiples of 1024
    // The epilogue stages C through a buffer of its own (the producer is already filling the pipeline for the next
    // tile) and stores it by TMA: per warpgroup a box of EPI_TOK tokens x its 64 channels (128-byte rows, 128-byte
    // swizzle), two passes for 256 tokens.
    static constexpr int EPI_TOK = 128, EPI_BYTES = WG * EPI_TOK * 64 * 2;
    // + 128 for the mbarriers, + alignment slack for the 1024-byte swizzle atoms
    __host__ __device__ static constexpr int smem_bytes(int stages) {
        return stages * STAGE_BYTES + EPI_BYTES + 128 + 1024;
    }
};

// Persistent: min(tiles, SMs) blocks walk the tiles (stride gridDim.x, in the banded raster order). The producer warp
// runs ahead across tile boundaries, so a block's next tile is already loading while its warpgroups write C.
template <typename T, int TM, int WG, int STAGES, int SW = 16>
__global__ void __launch_bounds__(128 * WG + 32, 1)
    gemm_sm90_dense_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                           const __grid_constant__ CUtensorMap map_c, const DenseArgs p) {
    using D = Dtype<T>;
    using Shape = DenseShape<T, TM, WG>;
    constexpr int BN = Shape::BN, STAGE_BYTES = Shape::STAGE_BYTES, A_BYTES = Shape::A_BYTES;
    constexpr int EPI_TOK = Shape::EPI_TOK;
    static_assert(STAGES >= 2 && TM % EPI_TOK == 0 && STAGE_BYTES % 1024 == 0, "pipeline and epilogue shape");

    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem =
        smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
    unsigned char *sC_all = smem + STAGES * STAGE_BYTES; // 1024-byte aligned: the swizzle pattern of the TMA store
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + STAGES * STAGE_BYTES + Shape::EPI_BYTES);
    uint64_t *empty = full + STAGES;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
    const int tiles_m = (p.M + TM - 1) / TM, tiles_n = (p.N + BN - 1) / BN, ntiles = tiles_m * tiles_n;
    const int nk = (p.K + 63) / 64;
    // Raster: bands of SW channel tiles, the token tiles of a band in order, so that the blocks resident at a time
    // share few A rows and few weight rows (L2 reuse); SW = 0 keeps the plain order.
    auto tile_of = [&](int t, int &tm, int &tn) {
        if (SW > 0) {
            const int per_band = SW * tiles_m, band = t / per_band;
            const int width = min(SW, tiles_n - band * SW), idx = t - band * per_band;
            tn = band * SW + idx % width;
            tm = idx / width;
        } else {
            tm = t % tiles_m;
            tn = t / tiles_m;
        }
    };
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full + s, 1);
            mbar_init(empty + s, WG);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == WG) { // producer warp: one lane issues every stage; g counts k-tiles over all of this block's tiles
        if (lane == 0) {
            int g = 0;
            for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
                int tm, tn;
                tile_of(t, tm, tn);
                for (int kt = 0; kt < nk; kt++, g++) {
                    const int slot = g % STAGES;
                    if (g >= STAGES) mbar_wait(empty + slot, (g / STAGES - 1) & 1);
                    unsigned char *st = smem + slot * STAGE_BYTES;
                    mbar_expect_tx(full + slot, STAGE_BYTES);
                    tma_load_2d(st, &map_a, kt * 64, tm * TM, full + slot);
                    tma_load_2d(st + A_BYTES, &map_w, kt * 64, tn * BN, full + slot);
                }
            }
        }
        return;
    }

    const T *bias = static_cast<const T *>(p.bias);
    unsigned char *sC = sC_all + wg * (EPI_TOK * 128);
    const int wtid = tid & 127;
    float acc[TM / 2];
    int g = 0;
    for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
        int tm, tn;
        tile_of(t, tm, tn);
        const int m0 = tm * TM, n0 = tn * BN + 64 * wg; // this warpgroup's 64 channels
        for (int i = 0; i < nk; i++, g++) {
            const int slot = g % STAGES;
            mbar_wait(full + slot, (g / STAGES) & 1);
            const unsigned char *st = smem + slot * STAGE_BYTES;
            const unsigned char *ws = st + A_BYTES + wg * (64 * 64 * 2);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ks++)
                wgmma_m64k16_ss<T, TM>(acc, smem_desc_sw128(ws + ks * 32), smem_desc_sw128(st + ks * 32), i + ks > 0);
            wgmma_commit();
            wgmma_wait<1>(); // the previous batch is done: release its slot
            if (i > 0 && wtid == 0) mbar_arrive(empty + (g - 1) % STAGES);
        }
        wgmma_wait<0>();
        fence_operands(acc);
        if (wtid == 0) mbar_arrive(empty + (g - 1) % STAGES);

        // Epilogue, EPI_TOK tokens at a time: stmatrix.trans turns the accumulator fragments (channel rows, token
        // columns) into token rows of 8 channels (16 bytes) in the swizzled box; one thread then stores the box by
        // TMA (clipped at M and N) and, before the buffer is written again, waits until the store has read it.
        // Lane t gives the address of row t % 8 of matrix t / 8 of each x4; the matrices are (rows r, token group c),
        // (rows r + 8, c), (r, c + 1), (r + 8, c + 1): h = j & 1, c + (j >> 1) below.
        float bv[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int ch = n0 + 16 * (warp & 3) + (lane >> 2) + 8 * h;
            bv[h] = bias && ch < p.N ? D::to_float(bias[ch]) : 0.f;
        }
        const int mj = lane >> 3, mi = lane & 7; // matrix, row of it that this lane addresses
        const uint32_t row_addr = static_cast<uint32_t>(__cvta_generic_to_shared(sC)) + mi * 128 +
                                  (((2 * (warp & 3) + (mj & 1)) ^ mi) << 4) + (mj >> 1) * (8 * 128);
#pragma unroll
        for (int pass = 0; pass < TM / EPI_TOK; pass++) {
            if (wtid == 0) bulk_wait_read<0>();
            named_barrier_sync<128>(1 + wg); // the buffer is free
#pragma unroll
            for (int cc = 0; cc < EPI_TOK / 16; cc++) { // token columns 16 cc .. 16 cc + 15 of this pass
                const int c = pass * (EPI_TOK / 8) + 2 * cc;
                uint32_t r[4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int ci = c + (j >> 1), h = j & 1;
                    r[j] = as_u32(D::pair2(acc[4 * ci + 2 * h] + bv[h], acc[4 * ci + 2 * h + 1] + bv[h]));
                }
                stmatrix_x4_trans(row_addr + cc * (16 * 128), r);
            }
            fence_proxy_async_smem(); // the generic-proxy writes, before the TMA engine reads them
            named_barrier_sync<128>(1 + wg);
            if (wtid == 0) tma_store_2d(&map_c, n0, m0 + pass * EPI_TOK, sC);
        }
    }
    // The last stores must have read the buffer before the block exits (their writes complete with the grid).
    if (wtid == 0) bulk_wait_read<0>();
}

typedef CUresult (*TensorMapEncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                         const cuuint64_t *, const cuuint32_t *, const cuuint32_t *,
                                         CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                         CUtensorMapFloatOOBfill);
// A 2-D tensor map over rows x cols elements of `esize` bytes of `type` (cols contiguous, rows `ld` elements apart) in
// boxes of box_rows x box_cols with the 128-byte swizzle (box_cols x esize = 128 bytes).
inline cudaError_t encode_tensor_map(CUtensorMap *map, CUtensorMapDataType type, int esize, const void *base, int rows,
                                     int cols, int ld, int box_cols, int box_rows) {
    static TensorMapEncodeTiled encode = nullptr; // the driver's; one lookup per process (idempotent if racy)
    if (!encode) {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult q;
        cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn)
            return e != cudaSuccess ? e : cudaErrorNotSupported;
        encode = reinterpret_cast<TensorMapEncodeTiled>(fn);
    }
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ld * esize};
    const cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows}, elem[2] = {1, 1};
    CUresult r =
        encode(map, type, 2, const_cast<void *>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}
// The operands (ld = K) and C (K = the slab's channels, ld = ldc) as rows x K in T, boxes of `box_rows` x 64.
template <typename T>
inline cudaError_t make_tensor_map(CUtensorMap *map, const void *base, int rows, int K, int ld, int box_rows) {
    return encode_tensor_map(
        map, std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
        base, rows, K, ld, 64, box_rows);
}

// Persistent grid of `grid` blocks (the host plan: one per SM, fewer when there are fewer tiles).
template <typename T, int TM, int WG, int STAGES>
cudaError_t launch_gemm_sm90_dense(const DenseArgs &a, int grid, cudaStream_t stream) {
    using Shape = DenseShape<T, TM, WG>;
    const int smem_bytes = Shape::smem_bytes(STAGES);
    CUtensorMap ma, mw, mc;
    cudaError_t e = make_tensor_map<T>(&ma, a.A, a.M, a.K, a.K, TM);
    if (e == cudaSuccess) e = make_tensor_map<T>(&mw, a.W, a.N, a.K, a.K, Shape::BN);
    if (e == cudaSuccess) e = make_tensor_map<T>(&mc, a.C, a.M, a.N, a.ldc, Shape::EPI_TOK);
    if (e != cudaSuccess) return e;
    auto kern = gemm_sm90_dense_kernel<T, TM, WG, STAGES>;
    e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (e != cudaSuccess) return e;
    kern<<<grid, Shape::THREADS, smem_bytes, stream>>>(ma, mw, mc, a);
    return cudaGetLastError();
}

} // namespace w4a16
