// sm_90a wgmma GEMM instances for one (dtype, layout); compiled only for sm_90a (see the Makefile), once per pair
// with -DW4A16_INST_DTYPE=0|1 -DW4A16_INST_LAYOUT=0|1.
#include "gemm_sm90.cuh"

#if !defined(W4A16_INST_DTYPE) || !defined(W4A16_INST_LAYOUT)
#error "compile with -DW4A16_INST_DTYPE and -DW4A16_INST_LAYOUT"
#endif
#if W4A16_INST_DTYPE == 0
#define W4A16_T_ __half
#else
#define W4A16_T_ __nv_bfloat16
#endif
#define W4A16_CAT3_(a, b, c) a##b##_##c
#define W4A16_NAME_(prefix, d, l) W4A16_CAT3_(prefix, d, l)

namespace w4a16 {
// The shipped tile and its experiment knobs (docs/PERFORMANCE.md v8 records what each setting measured):
//   W4A16_SM90_TM     tokens per tile: 256 (channels 128, NH = 4) or 128 (channels 256 with 2 warpgroups, NH = 2)
//   W4A16_SM90_WG     warpgroups per block: 2 (one block per SM) or 1 (two blocks per SM)
//   W4A16_SM90_KPB    k16 steps per wgmma batch: 2 (two batches per stage, so the fragment registers alternate)
//   W4A16_SM90_STAGES pipeline slots: 5 x 38 KB for 256 x 128 fits the 227 KB of an H100 / H200
#ifndef W4A16_SM90_TM
#define W4A16_SM90_TM 256
#endif
#ifndef W4A16_SM90_WG
#define W4A16_SM90_WG 2
#endif
#ifndef W4A16_SM90_KPB
#define W4A16_SM90_KPB 2
#endif
#ifndef W4A16_SM90_STAGES
#define W4A16_SM90_STAGES 5
#endif
constexpr int SM90_TM = W4A16_SM90_TM;
constexpr int SM90_NH = SM90_TM == 256 ? 4 : 2;
constexpr int SM90_WG = W4A16_SM90_WG;
constexpr int SM90_MINB = SM90_WG == 1 ? 2 : 1;
constexpr int SM90_KPB = W4A16_SM90_KPB;
constexpr int SM90_STAGES = W4A16_SM90_STAGES;

int W4A16_NAME_(sm90_tile_, W4A16_INST_DTYPE, W4A16_INST_LAYOUT)(int *tm, int *bn) {
    *tm = SM90_TM;
    *bn = Sm90Shape<W4A16_T_, W4A16_INST_LAYOUT, SM90_TM, SM90_NH, SM90_WG>::BN;
    return 0;
}
int W4A16_NAME_(sm90_smem_bytes_, W4A16_INST_DTYPE, W4A16_INST_LAYOUT)() {
    return Sm90Shape<W4A16_T_, W4A16_INST_LAYOUT, SM90_TM, SM90_NH, SM90_WG>::smem_bytes(SM90_STAGES);
}
cudaError_t W4A16_NAME_(launch_gemm_sm90_, W4A16_INST_DTYPE, W4A16_INST_LAYOUT)(const GemmArgs &a, int splits, cudaStream_t s) {
    return launch_gemm_sm90<W4A16_T_, W4A16_INST_LAYOUT, SM90_TM, SM90_NH, SM90_WG, SM90_STAGES, SM90_MINB, SM90_KPB>(a, splits, s);
}
cudaError_t W4A16_NAME_(probe_gemm_sm90_, W4A16_INST_DTYPE, W4A16_INST_LAYOUT)(cudaFuncAttributes *attr) {
    return cudaFuncGetAttributes(attr, gemm_sm90_kernel<W4A16_T_, W4A16_INST_LAYOUT, SM90_TM, SM90_NH, SM90_WG, SM90_STAGES, SM90_MINB, SM90_KPB>);
}
} // namespace w4a16
