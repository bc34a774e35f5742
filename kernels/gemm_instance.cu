// Template instances of the GEMM for one (dtype, layout). The Makefile compiles this file once per pair with
// -DW4A16_INST_DTYPE=0|1 -DW4A16_INST_LAYOUT=0|1 so that make -j builds the four in parallel.
#include <type_traits>

#include "gemm_decode.cuh"
#include "instance.h"

#ifndef W4A16_DECODE_SWAPPED /* experiments: -DW4A16_DECODE_SWAPPED=0 runs the 16-token tiles on gemm_kernel */
#define W4A16_DECODE_SWAPPED 1
#endif
#ifndef W4A16_DECODE_TB2 /* experiments: -DW4A16_DECODE_TB2=0 runs M 9-16 on gemm_kernel everywhere */
#define W4A16_DECODE_TB2 1
#endif

namespace w4a16 {
// The 16-token tiles (MT = WM = NH = 1) run the decode kernel (gemm_decode.cuh): 8 tokens per MMA when M <= 8.
template <typename T, int LAYOUT, int MT, int WM, int NH, int WN, int WK, int KS, int MINB>
constexpr bool is_decode_tile() { return W4A16_DECODE_SWAPPED && MT == 1 && WM == 1 && NH == 1; }

template <typename T, int LAYOUT, int MT, int WM, int NH, int WN, int WK, int KS, int MINB>
cudaError_t launch_tile(const GemmArgs &a, int splits, int smem, cudaStream_t s) {
    if constexpr (is_decode_tile<T, LAYOUT, MT, WM, NH, WN, WK, KS, MINB>()) {
        if (a.M <= 8) return launch_gemm_decode<T, LAYOUT, WN, WK, KS, MINB, 1>(a, splits, smem, s);
        // 16 tokens need ~160 registers: only under the 168 of a 3-blocks-per-SM budget (cfg5), or the 2-block budget
        // of the Marlin fp16 instance (configs.h, W4A16_DECODE16_MINB).
        constexpr int MINB16 = W4A16_DECODE16_MINB(MINB, LAYOUT, (std::is_same<T, __half>::value ? 0 : 1));
        if constexpr (W4A16_DECODE_TB2 && MINB <= 3) return launch_gemm_decode<T, LAYOUT, WN, WK, KS, MINB16, 2>(a, splits, smem, s);
        else return launch_gemm<T, LAYOUT, MT, WM, NH, WN, WK, KS, MINB>(a, splits, smem, s);
    } else {
        return launch_gemm<T, LAYOUT, MT, WM, NH, WN, WK, KS, MINB>(a, splits, smem, s);
    }
}
template <typename T, int LAYOUT, int MT, int WM, int NH, int WN, int WK, int KS, int MINB>
cudaError_t probe_tile(cudaFuncAttributes *attr) {
    if constexpr (is_decode_tile<T, LAYOUT, MT, WM, NH, WN, WK, KS, MINB>())
        return cudaFuncGetAttributes(attr, gemm_decode_kernel<T, LAYOUT, WN, WK, KS, MINB, 1>);
    else
        return cudaFuncGetAttributes(attr, gemm_kernel<T, LAYOUT, MT, WM, NH, WN, WK, KS, MINB>);
}
cudaError_t W4A16_NAME_(launch_gemm_)(const GemmArgs &a, int cfg, int splits, int smem, cudaStream_t s) {
    switch (cfg) {
#define W4A16_CASE_(id, name, MT, WM, NH, WN, WK, KS, MINB) \
    case id: return launch_tile<W4A16_T_, W4A16_INST_LAYOUT, MT, WM, NH, WN, WK, KS, MINB>(a, splits, smem, s);
        W4A16_GEMM_CONFIGS(W4A16_CASE_)
#undef W4A16_CASE_
    }
    return cudaErrorInvalidValue;
}
cudaError_t W4A16_NAME_(probe_gemm_)(int cfg, cudaFuncAttributes *attr) {
    switch (cfg) {
#define W4A16_CASE_(id, name, MT, WM, NH, WN, WK, KS, MINB) \
    case id: return probe_tile<W4A16_T_, W4A16_INST_LAYOUT, MT, WM, NH, WN, WK, KS, MINB>(attr);
        W4A16_GEMM_CONFIGS(W4A16_CASE_)
#undef W4A16_CASE_
    }
    return cudaErrorInvalidValue;
}
} // namespace w4a16
