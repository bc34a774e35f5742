// sm_90a wgmma GEMM instances for one (dtype, layout); compiled only for sm_90a (see the Makefile), once per pair
// with -DW4A16_INST_DTYPE=0|1 -DW4A16_INST_LAYOUT=0|1.
#include "gemm_sm90.cuh"
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
} // namespace w4a16
