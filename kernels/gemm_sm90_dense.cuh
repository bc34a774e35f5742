// Dense fp16/bf16 GEMM for Hopper (sm_90a) on wgmma with both operands in shared memory: the second half of the
// staged large-M path (csrc/api.c), after kernels/convert.cu has dequantised a slab of weights into the caller's
// workspace as Wt [N, K] (K contiguous, like A).
//
// C[M, N] (row stride ldc) = A[M, K] * Wt[N, K]^T (+ bias[N]), computed transposed like gemm_sm90.cuh: channels are
// the MMA's M dimension (each warpgroup 64 of them), tokens its N (TM per block). Both operands reach shared memory
// by TMA (one thread issues a stage: an A box and a Wt box through tensor maps, zero-filled past M, N and K, written
// in the 128-byte swizzle that wgmma reads by descriptor); no thread touches an operand on its way to the tensor cores.
// mbarriers pace the pipeline instead of a block-wide barrier: `full[s]` completes when slot s has landed, `empty[s]`
// when both warpgroups finished the batch that read it; thread 0 refills the slot of batch i - 2 at step i, released
// one step earlier, so it rarely waits. One wgmma batch (4 k16 steps) runs while the next is issued (wait_group 1).
// docs/PERFORMANCE.md v14: a cp.async version of this kernel ran 7-15% slower at M = 4096.
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
    // tile): each warpgroup writes its 64 channels for EPI_TOK tokens at a time.
    static constexpr int EPI_TOK = 64, C_PITCH = 64 + 8, EPI_BYTES = WG * EPI_TOK * C_PITCH * 2;
    // + 128 for the mbarriers, + alignment slack for the 1024-byte swizzle atoms
    __host__ __device__ static constexpr int smem_bytes(int stages) { return stages * STAGE_BYTES + EPI_BYTES + 128 + 1024; }
};

// Persistent: min(tiles, SMs) blocks walk the tiles (stride gridDim.x, in the banded raster order). The producer warp
// runs ahead across tile boundaries, so a block's next tile is already loading while its warpgroups write C.
template <typename T, int TM, int WG, int STAGES, int SW = 16>
__global__ void __launch_bounds__(128 * WG + 32, 1)
    gemm_sm90_dense_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                           const DenseArgs p) {
    using D = Dtype<T>;
    using Shape = DenseShape<T, TM, WG>;
    constexpr int BN = Shape::BN, STAGE_BYTES = Shape::STAGE_BYTES, A_BYTES = Shape::A_BYTES;
    constexpr int EPI_TOK = Shape::EPI_TOK, C_PITCH = Shape::C_PITCH;
    static_assert(STAGES >= 2 && TM % EPI_TOK == 0, "pipeline and epilogue shape");

    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem =
        smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
    T *sC_all = reinterpret_cast<T *>(smem + STAGES * STAGE_BYTES);
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
    T *C = static_cast<T *>(p.C);
    T *sC = sC_all + wg * EPI_TOK * C_PITCH;
    const int wtid = tid & 127, q = lane & 3, r = lane >> 2;
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

        // Epilogue: EPI_TOK tokens at a time through this warpgroup's buffer (named barrier 1 + wg, 128 threads)
        float bv[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int ch = n0 + 16 * (warp & 3) + r + 8 * h;
            bv[h] = bias && ch < p.N ? D::to_float(bias[ch]) : 0.f;
        }
#pragma unroll
        for (int pass = 0; pass < TM / EPI_TOK; pass++) {
            asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory"); // the previous pass's reads are done
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int ch = 16 * (warp & 3) + r + 8 * h;
#pragma unroll
                for (int c = 0; c < EPI_TOK / 8; c++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        sC[(8 * c + 2 * q + e) * C_PITCH + ch] =
                            D::from_float(acc[4 * (c + pass * EPI_TOK / 8) + 2 * h + e] + bv[h]);
            }
            asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
#pragma unroll
            for (int c = wtid; c < EPI_TOK * 8; c += 128) {
                const int row = c >> 3, col = (c & 7) * 8, m = m0 + pass * EPI_TOK + row;
                if (m < p.M && n0 + col < p.N)
                    *reinterpret_cast<uint4 *>(C + (size_t)m * p.ldc + n0 + col) =
                        *reinterpret_cast<const uint4 *>(sC + row * C_PITCH + col);
            }
        }
    }
}

typedef CUresult (*TensorMapEncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                         const cuuint64_t *, const cuuint32_t *, const cuuint32_t *,
                                         CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                         CUtensorMapFloatOOBfill);
// A 2-D tensor map over rows x K (K contiguous) read in boxes of `box_rows` x 64 with the 128-byte swizzle.
template <typename T>
inline cudaError_t make_tensor_map(CUtensorMap *map, const void *base, int rows, int K, int box_rows) {
    static TensorMapEncodeTiled encode = nullptr; // the driver's; one lookup per process (idempotent if racy)
    if (!encode) {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult q;
        cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn) return e != cudaSuccess ? e : cudaErrorNotSupported;
        encode = reinterpret_cast<TensorMapEncodeTiled>(fn);
    }
    const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)K * 2};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, elem[2] = {1, 1};
    CUresult r = encode(map, std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                        2, const_cast<void *>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <typename T, int TM, int WG, int STAGES>
cudaError_t launch_gemm_sm90_dense(const DenseArgs &a, cudaStream_t stream) {
    using Shape = DenseShape<T, TM, WG>;
    const int smem_bytes = Shape::smem_bytes(STAGES);
    int dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
    const int tiles = ((a.M + TM - 1) / TM) * ((a.N + Shape::BN - 1) / Shape::BN);
    const int grid = tiles < sms ? tiles : sms;
    CUtensorMap ma, mw;
    e = make_tensor_map<T>(&ma, a.A, a.M, a.K, TM);
    if (e == cudaSuccess) e = make_tensor_map<T>(&mw, a.W, a.N, a.K, Shape::BN);
    if (e != cudaSuccess) return e;
    auto kern = gemm_sm90_dense_kernel<T, TM, WG, STAGES>;
    e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (e != cudaSuccess) return e;
    kern<<<grid, Shape::THREADS, smem_bytes, stream>>>(ma, mw, a);
    return cudaGetLastError();
}

} // namespace w4a16
