// sm_90a wgmma GEMM instances of one (dtype, layout) pair (kernels/instances.h); compiled only for sm_90a (see the
// Makefile).
#include "gemm_sm90.cuh"
#include "gemm_sm90_dense.cuh"
#include "instance.h"

namespace w4a16 {
// The kernel of one config, or (`sk`) its stream-K instance: the one-block-per-SM configs only, none for the others.
template <typename T, int L, int TM, int NH, int WG, int ST, int MINB, int KPB> static GemmKernelRef sm90_ref(int sk) {
    using S = Sm90Shape<T, L, TM, NH, WG>;
    if constexpr (MINB == 1) {
        if (sk) return {gemm_sm90_kernel<T, L, TM, NH, WG, ST, MINB, KPB, true>, S::THREADS, S::smem_bytes(ST)};
    } else if (sk) {
        return {};
    }
    return {gemm_sm90_kernel<T, L, TM, NH, WG, ST, MINB, KPB>, S::THREADS, S::smem_bytes(ST)};
}

// The kernel of wgmma config `id` (configs.h W4A16_WGMMA_CONFIGS), with its threads and shared memory; `sk`: its
// stream-K instance.
GemmKernelRef W4A16_NAME_(gemm_sm90_kernel_)(int id, int sk) {
    switch (id) {
#define W4A16_CASE_(i, sym, TM, NH, WG, ST, MINB, KPB)                                                                 \
    case i:                                                                                                            \
        return sm90_ref<W4A16_T_, W4A16_INST_LAYOUT, TM, NH, WG, ST, MINB, KPB>(sk);
        W4A16_WGMMA_CONFIGS(W4A16_CASE_)
#undef W4A16_CASE_
    }
    return {};
}

#if W4A16_INST_LAYOUT == 0 // the dense GEMM of the staged path has no weight layout: built once per dtype
#define W4A16_DENSE_INST_ gemm_sm90_dense_kernel<W4A16_T_, W4A16_DENSE_TM, W4A16_DENSE_WG, W4A16_DENSE_STAGES>
cudaError_t W4A16_NAME_(launch_dense_sm90_)(const DenseArgs &a, int grid, cudaStream_t s) {
    return launch_gemm_sm90_dense<W4A16_T_, W4A16_DENSE_TM, W4A16_DENSE_WG, W4A16_DENSE_STAGES>(a, grid, s);
}
cudaError_t W4A16_NAME_(probe_dense_sm90_)(cudaFuncAttributes *attr) {
    return cudaFuncGetAttributes(attr, W4A16_DENSE_INST_);
}
int W4A16_NAME_(dense_smem_bytes_)() {
    return DenseShape<W4A16_T_, W4A16_DENSE_TM, W4A16_DENSE_WG>::smem_bytes(W4A16_DENSE_STAGES);
}
#undef W4A16_DENSE_INST_
#endif
} // namespace w4a16
