// sm_90a wgmma GEMM instances of one (dtype, layout) pair (kernels/instances.h); compiled only for sm_90a (see the
// Makefile).
#include "gemm_sm90.cuh"
#include "gemm_sm90_dense.cuh"
#include "instance.h"

namespace w4a16 {
// The kernel of wgmma config `id` (configs.h W4A16_WGMMA_CONFIGS), with its threads and shared memory.
GemmKernelRef W4A16_NAME_(gemm_sm90_kernel_)(int id) {
    switch (id) {
#define W4A16_CASE_(i, sym, TM, NH, WG, ST, MINB, KPB)                                                                 \
    case i:                                                                                                            \
        return {gemm_sm90_kernel<W4A16_T_, W4A16_INST_LAYOUT, TM, NH, WG, ST, MINB, KPB>,                              \
                Sm90Shape<W4A16_T_, W4A16_INST_LAYOUT, TM, NH, WG>::THREADS,                                           \
                Sm90Shape<W4A16_T_, W4A16_INST_LAYOUT, TM, NH, WG>::smem_bytes(ST)};
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
