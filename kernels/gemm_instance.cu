// The mma.sync GEMM kernels of one (dtype, layout) pair (kernels/instances.h): the template instance of each config
// of configs.h, chosen by the plan's kind and config. Which kind runs was decided by the host plan (csrc/plan.c).
#include <type_traits>

#include "gemm_decode.cuh"
#include "instance.h"

namespace w4a16 {
// The decode configs (MT = WM = NH = 1) have a decode kernel of 8 tokens per MMA and a 16-token one; the other configs
// have the tile kernel only, once per stage count of W4A16_TILE_STAGES. A kind (or stage count) a config was not
// compiled for yields no kernel.
template <typename T, int LAYOUT, int ID, int MT, int WM, int NH, int WN, int WK, int KS, int MINB>
GemmKernelRef tile_kernel(int stages) {
    constexpr int THREADS = 32 * WM * NH * WN * WK;
#define W4A16_TS_CASE_(c, s)                                                                                           \
    if constexpr (ID == c)                                                                                             \
        if (stages == s) return {gemm_kernel<T, LAYOUT, MT, WM, NH, WN, WK, KS, MINB, s>, THREADS, 0};
    W4A16_TILE_STAGES(W4A16_TS_CASE_)
#undef W4A16_TS_CASE_
    return {};
}

template <typename T, int LAYOUT, int ID, int MT, int WM, int NH, int WN, int WK, int KS, int MINB>
GemmKernelRef select_tile(int kind, int stages) {
    constexpr int THREADS = 32 * WM * NH * WN * WK, BN = 64 * WN, BK = 16 * WK * KS;
    // The host (plans, launches) sizes a stage with its own formula for the weight tile: it must agree with the tile
    // for every config and format compiled, or a kernel would run past the shared memory it was given.
    static_assert(WeightTile<T, LAYOUT, BN, BK, NH, THREADS>::B_BYTES == w4a16_format_stage_bytes(LAYOUT, BK, BN),
                  "configs.h w4a16_format_stage_bytes differs from tiles.cuh WeightTile::B_BYTES");
    if constexpr (MT == 1 && WM == 1 && NH == 1) {
        if (kind == W4A16_KERNEL_DECODE8) return {gemm_decode_kernel<T, LAYOUT, WN, WK, KS, MINB, 1>, THREADS, 0};
        constexpr int MINB16 = W4A16_DECODE16_MINB(MINB, LAYOUT, (std::is_same<T, __half>::value ? 0 : 1));
        if (kind == W4A16_KERNEL_DECODE16) return {gemm_decode_kernel<T, LAYOUT, WN, WK, KS, MINB16, 2>, THREADS, 0};
    } else if constexpr (!(ID == W4A16_CFG_LARGE_AWQ && LAYOUT == W4A16_LAYOUT_MARLIN)) {
        // (the Marlin layout's large tile is config 2: config 3 is never planned for it)
        if (kind == W4A16_KERNEL_MMA) return tile_kernel<T, LAYOUT, ID, MT, WM, NH, WN, WK, KS, MINB>(stages);
    }
    return {};
}

GemmKernelRef W4A16_NAME_(gemm_kernel_)(int kind, int cfg, int stages) {
    switch (cfg) {
#define W4A16_CASE_(id, sym, name, MT, WM, NH, WN, WK, KS, MINB)                                                       \
    case id:                                                                                                           \
        return select_tile<W4A16_T_, W4A16_INST_LAYOUT, id, MT, WM, NH, WN, WK, KS, MINB>(kind, stages);
        W4A16_GEMM_CONFIGS(W4A16_CASE_)
#undef W4A16_CASE_
    }
    return {};
}
} // namespace w4a16
