// Template instances of the GEMM for one (dtype, layout). The Makefile compiles this file once per pair with
// -DW4A16_INST_DTYPE=0|1 -DW4A16_INST_LAYOUT=0|1 so that make -j builds the four in parallel.
#include "gemm.cuh"
#include "instance.h"

namespace w4a16 {
cudaError_t W4A16_NAME_(launch_gemm_)(const GemmArgs &a, int cfg, int splits, int smem, cudaStream_t s) {
    switch (cfg) {
#define W4A16_CASE_(id, name, MT, WM, NH, WN, WK, KS, MINB) \
    case id: return launch_gemm<W4A16_T_, W4A16_INST_LAYOUT, MT, WM, NH, WN, WK, KS, MINB>(a, splits, smem, s);
        W4A16_GEMM_CONFIGS(W4A16_CASE_)
#undef W4A16_CASE_
    }
    return cudaErrorInvalidValue;
}
cudaError_t W4A16_NAME_(probe_gemm_)(int cfg, cudaFuncAttributes *attr) {
    switch (cfg) {
#define W4A16_CASE_(id, name, MT, WM, NH, WN, WK, KS, MINB) \
    case id: return cudaFuncGetAttributes(attr, gemm_kernel<W4A16_T_, W4A16_INST_LAYOUT, MT, WM, NH, WN, WK, KS, MINB>);
        W4A16_GEMM_CONFIGS(W4A16_CASE_)
#undef W4A16_CASE_
    }
    return cudaErrorInvalidValue;
}
} // namespace w4a16
