// Dense fp16/bf16 GEMM for Hopper (sm_90a) on wgmma with both operands in shared memory: the second half of the
// staged large-M path (csrc/api.c), after kernels/convert.cu has dequantised a slab of weights into the caller's
// workspace as Wt [N, K] (K contiguous, like A).
//
// C[M, N] (row stride ldc) = A[M, K] * Wt[N, K]^T (+ bias[N]), computed transposed like gemm_sm90.cuh: channels are
// the MMA's M dimension (each warpgroup 64 of them), tokens its N (TM per block). Both tiles are ActTile copies
// (cp.async, 128-byte swizzle = the K-major layout wgmma reads by descriptor), so no thread touches an operand
// between the copy and the tensor cores: per 64-k stage a warp issues its copies, one barrier and 4 wgmma.
// Pipeline: STAGES slots, STAGES - 2 copies in flight, one batch running while the next is issued (wait_group 1).
//
// Preconditions (host): M >= 1, N a multiple of 64, K a multiple of 8 (16-byte rows), 16-byte aligned A, Wt, C and
// ldc a multiple of 8; rows past M / N are neither loaded nor stored, k past K zero-filled.
#pragma once
#include "tiles.cuh"
#include "wgmma.cuh"

namespace w4a16 {

struct DenseArgs {
    const void *A, *W, *bias;
    void *C;
    int M, N, K, ldc;
};

template <typename T, int TM, int WG> struct DenseShape {
    static constexpr int THREADS = 128 * WG, BN = 64 * WG, BK = 64;
    using ATile = ActTile<T, TM, BK, THREADS>;
    using WTile = ActTile<T, BN, BK, THREADS>;
    static constexpr int STAGE_BYTES = ATile::BYTES + WTile::BYTES; // both multiples of 1024
    static constexpr int C_PITCH = BN + 8;
    __host__ __device__ static constexpr int smem_bytes(int stages) {
        return (stages * STAGE_BYTES > TM * C_PITCH * 2 ? stages * STAGE_BYTES : TM * C_PITCH * 2) + 1024;
    }
};

template <typename T, int TM, int WG, int STAGES, int SW = 16>
__global__ void __launch_bounds__(128 * WG, 1) gemm_sm90_dense_kernel(const DenseArgs p) {
    using D = Dtype<T>;
    using Shape = DenseShape<T, TM, WG>;
    using ATile = typename Shape::ATile;
    using WTile = typename Shape::WTile;
    constexpr int THREADS = Shape::THREADS, BN = Shape::BN, BK = Shape::BK, STAGE_BYTES = Shape::STAGE_BYTES;
    constexpr int AHEAD = STAGES - 2;
    static_assert(ATile::BYTES % 1024 == 0 && WTile::BYTES % 1024 == 0, "wgmma tiles must stay 1024-byte aligned");
    static_assert(STAGES >= 3, "a slot being read, one being issued, one in flight at least");

    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem =
        smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
    // Raster: bands of SW channel tiles, the token tiles of a band in order, so that the blocks resident at a time
    // share few A rows and few weight rows (L2 reuse); SW = 0 keeps the grid order.
    int tm = blockIdx.x, tn = blockIdx.y;
    if (SW > 0) {
        const int bid = blockIdx.y * gridDim.x + blockIdx.x, per_band = SW * gridDim.x, band = bid / per_band;
        const int width = min(SW, (int)gridDim.y - band * SW), idx = bid - band * per_band;
        tn = band * SW + idx % width;
        tm = idx / width;
    }
    const int m0 = tm * TM, n0 = tn * BN;
    const T *A = static_cast<const T *>(p.A), *W = static_cast<const T *>(p.W);
    const int nk = (p.K + BK - 1) / BK;

    ATile at;
    WTile wt;
    at.plan(A, p.M, p.K, m0, 0, tid);
    wt.plan(W, p.N, p.K, n0, 0, tid);
    auto load_stage = [&](int slot) {
        unsigned char *st = smem + slot * STAGE_BYTES;
        at.issue(st, A, p.K);
        wt.issue(st + ATile::BYTES, W, p.K);
    };
    for (int s = 0; s < AHEAD; s++) {
        if (s < nk) load_stage(s);
        cp_async_commit();
    }

    float acc[TM / 2]; // written by the first wgmma (scale-d = 0)
    int slot = 0, pf_slot = AHEAD;
    for (int i = 0; i < nk; i++) {
        cp_async_wait<AHEAD - 1>();
        fence_proxy_async_smem();
        __syncthreads(); // stage i landed; every warpgroup finished batch i - 2, whose slot is refilled below
        if (i + AHEAD < nk) load_stage(pf_slot);
        pf_slot = pf_slot + 1 == STAGES ? 0 : pf_slot + 1;
        cp_async_commit();
        const unsigned char *st = smem + slot * STAGE_BYTES;
        slot = slot + 1 == STAGES ? 0 : slot + 1;
        const unsigned char *ws = st + ATile::BYTES + wg * (64 * BK * 2); // this warpgroup's 64 channels
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ks++)
            wgmma_m64k16_ss<T, TM>(acc, smem_desc_sw128(ws + ks * 32), smem_desc_sw128(st + ks * 32), i + ks > 0);
        wgmma_commit();
        wgmma_wait<1>();
    }
    wgmma_wait<0>();
    fence_operands(acc);
    cp_async_wait_all();
    __syncthreads(); // all warpgroups are done with the pipeline buffers: stage C there

    // ---- epilogue: this thread holds channels 64 wg + 16 (warp % 4) + r (+ 8) x tokens 8c + 2q + e
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

template <typename T, int TM, int WG, int STAGES>
cudaError_t launch_gemm_sm90_dense(const DenseArgs &a, cudaStream_t stream) {
    using Shape = DenseShape<T, TM, WG>;
    auto kern = gemm_sm90_dense_kernel<T, TM, WG, STAGES>;
    const int smem_bytes = Shape::smem_bytes(STAGES);
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (e != cudaSuccess) return e;
    dim3 grid((a.M + TM - 1) / TM, (a.N + Shape::BN - 1) / Shape::BN);
    kern<<<grid, Shape::THREADS, smem_bytes, stream>>>(a);
    return cudaGetLastError();
}

} // namespace w4a16
