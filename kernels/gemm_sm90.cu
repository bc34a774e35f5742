// sm_90a wgmma GEMM instances for one (dtype, layout); compiled only for sm_90a (see the Makefile), once per pair
// with -DW4A16_INST_DTYPE=0|1 -DW4A16_INST_LAYOUT=0|1.
#include "gemm_sm90.cuh"
#include "gemm_sm90_dense.cuh"
#include "instance.h"

namespace w4a16 {
// Instances of the tiles listed in configs.h (W4A16_WGMMA_CONFIGS); docs/PERFORMANCE.md v8 records the variants
// that were measured against them.
int W4A16_NAME_(sm90_smem_bytes_)(int id) {
    switch (id) {
#define W4A16_CASE_(i, TM, NH, WG, ST, MINB, KPB) \
    case i: return Sm90Shape<W4A16_T_, W4A16_INST_LAYOUT, TM, NH, WG>::smem_bytes(ST);
        W4A16_WGMMA_CONFIGS(W4A16_CASE_)
#undef W4A16_CASE_
    }
    return 0;
}
cudaError_t W4A16_NAME_(launch_gemm_sm90_)(const GemmArgs &a, int id, int splits, cudaStream_t s) {
    switch (id) {
#define W4A16_CASE_(i, TM, NH, WG, ST, MINB, KPB) \
    case i: return launch_gemm_sm90<W4A16_T_, W4A16_INST_LAYOUT, TM, NH, WG, ST, MINB, KPB>(a, splits, s);
        W4A16_WGMMA_CONFIGS(W4A16_CASE_)
#undef W4A16_CASE_
    }
    return cudaErrorInvalidValue;
}
cudaError_t W4A16_NAME_(probe_gemm_sm90_)(int id, cudaFuncAttributes *attr) {
    switch (id) {
#define W4A16_CASE_(i, TM, NH, WG, ST, MINB, KPB) \
    case i: return cudaFuncGetAttributes(attr, gemm_sm90_kernel<W4A16_T_, W4A16_INST_LAYOUT, TM, NH, WG, ST, MINB, KPB>);
        W4A16_WGMMA_CONFIGS(W4A16_CASE_)
#undef W4A16_CASE_
    }
    return cudaErrorInvalidValue;
}

#if W4A16_INST_LAYOUT == 0 // the dense GEMM of the staged path has no weight layout: built once per dtype
#define W4A16_DENSE_INST_ gemm_sm90_dense_kernel<W4A16_T_, W4A16_DENSE_TM, W4A16_DENSE_WG, W4A16_DENSE_STAGES>
cudaError_t W4A16_NAME_(launch_dense_sm90_)(const DenseArgs &a, int sm_count, cudaStream_t s) {
    return launch_gemm_sm90_dense<W4A16_T_, W4A16_DENSE_TM, W4A16_DENSE_WG, W4A16_DENSE_STAGES>(a, sm_count, s);
}
cudaError_t W4A16_NAME_(probe_dense_sm90_)(cudaFuncAttributes *attr) { return cudaFuncGetAttributes(attr, W4A16_DENSE_INST_); }
int W4A16_NAME_(dense_smem_bytes_)() { return DenseShape<W4A16_T_, W4A16_DENSE_TM, W4A16_DENSE_WG>::smem_bytes(W4A16_DENSE_STAGES); }
#undef W4A16_DENSE_INST_
#endif
} // namespace w4a16
