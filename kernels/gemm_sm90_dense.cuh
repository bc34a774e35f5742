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
    static constexpr int THREADS = 128 * WG, BN = 64 * WG, BK = 64;
    static constexpr int A_BYTES = TM * BK * 2, STAGE_BYTES = A_BYTES + BN * BK * 2; // 128-byte rows: multiples of 1024
    static constexpr int C_PITCH = BN + 8;
    // + 128 for the mbarriers after the stages, + alignment slack for the 1024-byte swizzle atoms
    __host__ __device__ static constexpr int smem_bytes(int stages) {
        return (stages * STAGE_BYTES > TM * C_PITCH * 2 ? stages * STAGE_BYTES : TM * C_PITCH * 2) + 128 + 1024;
    }
};

template <typename T, int TM, int WG, int STAGES, int SW = 16>
__global__ void __launch_bounds__(128 * WG, 1)
    gemm_sm90_dense_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                           const DenseArgs p) {
    using D = Dtype<T>;
    using Shape = DenseShape<T, TM, WG>;
    constexpr int THREADS = Shape::THREADS, BN = Shape::BN, STAGE_BYTES = Shape::STAGE_BYTES;
    constexpr int A_BYTES = Shape::A_BYTES;
    static_assert(STAGES >= 3, "the slot of batch i - 2 is refilled at step i");

    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem =
        smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
    static_assert(STAGES * STAGE_BYTES >= TM * Shape::C_PITCH * 2, "the barriers follow the stages and the C staging");
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + STAGES * STAGE_BYTES);
    uint64_t *empty = full + STAGES;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
    int tm = blockIdx.x, tn = blockIdx.y;
    // Raster: bands of SW channel tiles, the token tiles of a band in order, so that the blocks resident at a time
    // share few A rows and few weight rows (L2 reuse); SW = 0 keeps the grid order.
    if (SW > 0) {
        const int bid = blockIdx.y * gridDim.x + blockIdx.x, per_band = SW * gridDim.x, band = bid / per_band;
        const int width = min(SW, (int)gridDim.y - band * SW), idx = bid - band * per_band;
        tn = band * SW + idx % width;
        tm = idx / width;
    }
    const int m0 = tm * TM, n0 = tn * BN;
    const int nk = (p.K + 63) / 64;
    auto load = [&](int kt) {
        unsigned char *st = smem + (kt % STAGES) * STAGE_BYTES;
        uint64_t *bar = full + kt % STAGES;
        mbar_expect_tx(bar, STAGE_BYTES);
        tma_load_2d(st, &map_a, kt * 64, m0, bar);
        tma_load_2d(st + A_BYTES, &map_w, kt * 64, n0, bar);
    };
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full + s, 1);
            mbar_init(empty + s, WG);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        for (int s = 0; s < STAGES && s < nk; s++) load(s);
    }
    __syncthreads();

    float acc[TM / 2];
    for (int i = 0; i < nk; i++) {
        const int slot = i % STAGES;
        mbar_wait(full + slot, (i / STAGES) & 1);
        const unsigned char *st = smem + slot * STAGE_BYTES;
        const unsigned char *ws = st + A_BYTES + wg * (64 * 64 * 2);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ks++)
            wgmma_m64k16_ss<T, TM>(acc, smem_desc_sw128(ws + ks * 32), smem_desc_sw128(st + ks * 32), i + ks > 0);
        wgmma_commit();
        wgmma_wait<1>(); // batch i - 1 done: release its slot
        if (i > 0 && (tid & 127) == 0) mbar_arrive(empty + (i - 1) % STAGES);
        const int b = i - 2, kt = b + STAGES; // refill the slot of batch i - 2 with k-tile kt
        if (tid == 0 && b >= 0 && kt < nk) {
            mbar_wait(empty + b % STAGES, (b / STAGES) & 1);
            load(kt);
        }
    }
    wgmma_wait<0>();
    fence_operands(acc);
    __syncthreads(); // every load was consumed and every batch is done: stage C in the pipeline buffers

    T *sC = reinterpret_cast<T *>(smem);
    const T *bias = static_cast<const T *>(p.bias);
    const int q = lane & 3, r = lane >> 2;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int ch = 64 * wg + 16 * (warp & 3) + r + 8 * h;
        const float bv = bias && n0 + ch < p.N ? D::to_float(bias[n0 + ch]) : 0.f;
#pragma unroll
        for (int c = 0; c < TM / 8; c++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                sC[(8 * c + 2 * q + e) * Shape::C_PITCH + ch] = D::from_float(acc[4 * c + 2 * h + e] + bv);
    }
    __syncthreads();
    T *C = static_cast<T *>(p.C);
    constexpr int CPR = BN / 8;
#pragma unroll 4
    for (int c = tid; c < TM * CPR; c += THREADS) {
        const int row = c / CPR, col = (c % CPR) * 8;
        if (m0 + row < p.M && n0 + col < p.N)
            *reinterpret_cast<uint4 *>(C + (size_t)(m0 + row) * p.ldc + n0 + col) =
                *reinterpret_cast<const uint4 *>(sC + row * Shape::C_PITCH + col);
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
    dim3 grid((a.M + TM - 1) / TM, (a.N + Shape::BN - 1) / Shape::BN);
    CUtensorMap ma, mw;
    cudaError_t e = make_tensor_map<T>(&ma, a.A, a.M, a.K, TM);
    if (e == cudaSuccess) e = make_tensor_map<T>(&mw, a.W, a.N, a.K, Shape::BN);
    if (e != cudaSuccess) return e;
    auto kern = gemm_sm90_dense_kernel<T, TM, WG, STAGES>;
    e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (e != cudaSuccess) return e;
    kern<<<grid, Shape::THREADS, smem_bytes, stream>>>(ma, mw, a);
    return cudaGetLastError();
}

} // namespace w4a16
