/* Compiled GEMM tile configurations: one list, read by the kernels (template instances) and by the
 * host (profiles, shared-memory sizing). Plain C so csrc/ can include it.
 *
 *   X(id, symbol, name, MT, WM, NH, WN, WK, KS, MINB)
 *   MT  m16 tiles per warp          BM = 16 * MT * WM   rows of A per block
 *   WM  warps along M               BN = 64 * WN        columns of C per block (64 per warp group)
 *   NH  warps sharing a 64-column group (1: a warp owns 8 n8 blocks; 2: each owns 4, so a warp can hold more rows)
 *   WN  warps along N               BK = 16 * WK * KS   k per pipeline stage
 *   WK  warps along K (reduced through shared memory at the end)
 *   KS  k16 steps per warp per stage
 *   MINB blocks per SM the register budget is capped for (__launch_bounds__)
 * The 16-token tiles (MT = WM = NH = 1: cfg0, cfg5) run the decode kernel of gemm_decode.cuh.
 */
#ifndef W4A16_KERNEL_CONFIGS_H
#define W4A16_KERNEL_CONFIGS_H

#define W4A16_GEMM_CONFIGS(X)                                                                                          \
    X(0, DECODE, "m16n128k128", 1, 1, 1, 2, 2, 4, 4) /* decode: 4 warps, 2-way K split in the block, 4 blocks/SM */    \
    X(1, MID, "m64n128k128h", 4, 1, 2, 2, 2, 4, 1)   /* M 17-64: 8 warps of 64x32, 2-way K split */                    \
    X(2, LARGE_MARLIN, "m128n256k64h", 8, 1, 2, 4, 1, 4, 1) /* large M, Marlin: a B fragment feeds 8 m16 tiles */      \
    X(3, LARGE_AWQ, "m128n256k64", 4, 2, 1, 4, 1, 4, 1)     /* large M, AWQ: 8 warps of 64x64 (16-byte C stores) */    \
    X(4, MID2, "m64n128k64", 4, 1, 1, 2, 2, 2, 1)           /* M 65-256: 4 warps of 64x64, 2-way K split */            \
    X(5, DECODE_DEEP, "m16n128k256", 1, 1, 1, 2, 2, 8, 3)   /* decode, K split across blocks: 8 k16 steps a warp-stage \
                                                             */                                                        \
    X(6, WIDE64, "m64n256k64h", 4, 1, 2, 4, 1, 4, 1) /* M 17-256 on 100 KB SMs: 8 warps of 64x32, 4 stages in 69 KB */ \
    X(7, WIDE32, "m32n256k64h", 2, 1, 2, 4, 1, 4, 1) /* M 17-32 on 100 KB SMs: 8 warps of 32x32, each weight           \
                                                        dequantised once for 32 rows */

/* The (config, pipeline stages) pairs the mma.sync tile kernel is compiled for: its stage count is a template
 * parameter (immediate copy waits, a ring of constant size), so each pair is its own instance. Every tile choice of
 * every profile that runs the tile kernel is one of these (tests/test_profiles.c checks it).
 *   X(config id, stages) */
#define W4A16_TILE_STAGES(X) X(1, 3) X(1, 4) X(2, 3) X(2, 4) X(3, 3) X(3, 4) X(6, 4) X(7, 3)

/* Named config ids (W4A16_CFG_DECODE, ...) for the profiles. */
enum {
#define W4A16_CFG_ENUM_(id, sym, name, MT, WM, NH, WN, WK, KS, MINB) W4A16_CFG_##sym = id,
    W4A16_GEMM_CONFIGS(W4A16_CFG_ENUM_)
#undef W4A16_CFG_ENUM_
};
enum { W4A16_NUM_GEMM_CONFIGS = 8 };

/* Whether the tile kernel of config `id` is compiled with `stages` pipeline stages (W4A16_TILE_STAGES); the smallest
 * stage count compiled for it, 0 for none. */
static inline int w4a16_tile_stages_compiled(int id, int stages) {
#define W4A16_TS_IS_(c, s)                                                                                             \
    if (id == c && stages == s) return 1;
    W4A16_TILE_STAGES(W4A16_TS_IS_)
#undef W4A16_TS_IS_
    return 0;
}
static inline int w4a16_tile_min_stages(int id) {
    for (int s = 2; s <= 8; s++)
        if (w4a16_tile_stages_compiled(id, s)) return s;
    return 0;
}

/* Hopper wgmma GEMM tiles (sm_90a only; kernels/gemm_sm90.cuh):
 *   X(id, symbol, TM, NH, WG, STAGES, MINB, KPB)
 *   TM tokens per block (the wgmma N), WG warpgroups, NH warps per 64-channel group: BN = 64 * 4 * WG / NH channels,
 *   STAGES pipeline slots, MINB blocks per SM, KPB k16 steps per wgmma batch (two batches per stage at least). */
#define W4A16_WGMMA_CONFIGS(X)                                                                                         \
    X(0, T256, 256, 4, 2, 5, 1, 2)    /* M > 128: 256 tokens x 128 channels (5 x 38 KB) */                             \
    X(1, T128, 128, 2, 2, 5, 1, 2)    /* M 65-128: 128 tokens x 256 channels (5 x 27 KB) */                            \
    X(2, T64, 64, 4, 2, 6, 2, 2)      /* M 17-64: 64 tokens x 128 channels, two blocks per SM (6 x 14 KB) */           \
    X(3, T64_WIDE, 64, 2, 2, 5, 2, 2) /* M 17-64, very wide layers: 64 x 256 (5 x 19 KB: two blocks per SM) */

enum {
#define W4A16_WG_ENUM_(id, sym, TM, NH, WG, ST, MINB, KPB) W4A16_WGMMA_##sym = id,
    W4A16_WGMMA_CONFIGS(W4A16_WG_ENUM_)
#undef W4A16_WG_ENUM_
};
enum { W4A16_NUM_WGMMA_CONFIGS = 4 };

/* The staged large-M path (sm_90a, kernels/gemm_sm90_dense.cuh): dense GEMM tile of 256 tokens x 128 channels,
 * 2 warpgroups, 4 stages of 48 KB; the weights are dequantised in slabs of a multiple of 128 channels. */
enum { W4A16_DENSE_TM = 256, W4A16_DENSE_WG = 2, W4A16_DENSE_STAGES = 4, W4A16_DENSE_BN = 64 * W4A16_DENSE_WG };

static inline int w4a16_wgmma_tm(int id) {
#define W4A16_WG_TM_(i, sym, TM, NH, WG, ST, MINB, KPB)                                                                \
    if (id == i) return TM;
    W4A16_WGMMA_CONFIGS(W4A16_WG_TM_)
#undef W4A16_WG_TM_
    return 0;
}
static inline int w4a16_wgmma_bn(int id) {
#define W4A16_WG_BN_(i, sym, TM, NH, WG, ST, MINB, KPB)                                                                \
    if (id == i) return 64 * 4 * WG / NH;
    W4A16_WGMMA_CONFIGS(W4A16_WG_BN_)
#undef W4A16_WG_BN_
    return 0;
}
static inline int w4a16_wgmma_threads(int id) {
#define W4A16_WG_THREADS_(i, sym, TM, NH, WG, ST, MINB, KPB)                                                           \
    if (id == i) return 128 * WG;
    W4A16_WGMMA_CONFIGS(W4A16_WG_THREADS_)
#undef W4A16_WG_THREADS_
    return 0;
}
static inline int w4a16_wgmma_stages(int id) {
#define W4A16_WG_STAGES_(i, sym, TM, NH, WG, ST, MINB, KPB)                                                            \
    if (id == i) return ST;
    W4A16_WGMMA_CONFIGS(W4A16_WG_STAGES_)
#undef W4A16_WG_STAGES_
    return 0;
}
static inline int w4a16_wgmma_minb(int id) {
#define W4A16_WG_MINB_(i, sym, TM, NH, WG, ST, MINB, KPB)                                                              \
    if (id == i) return MINB;
    W4A16_WGMMA_CONFIGS(W4A16_WG_MINB_)
#undef W4A16_WG_MINB_
    return 0;
}

/* Weight formats the GEMM kernels read (their storage: kernels/formats.cuh). */
enum { W4A16_LAYOUT_AWQ = 0, W4A16_LAYOUT_MARLIN = 1 };

typedef struct w4a16_gemm_config {
    int id;
    const char *name;
    int mt, wm, nh, wn, wk, ks, minb;
} w4a16_gemm_config;

/* The 16-token configs (MT = WM = NH = 1) run the decode kernel of kernels/gemm_decode.cuh. */
static inline int w4a16_cfg_is_decode(const w4a16_gemm_config *c) { return c->mt == 1 && c->wm == 1 && c->nh == 1; }
/* 16 tokens per MMA need about 160 registers: the decode kernel runs M > 8 (one or more 16-row tiles) with its
 * 16-token instance, built for W4A16_DECODE16_MINB blocks per SM: at most 3, and 2 for the Marlin layout in fp16
 * (dtype 0), whose registers spill under the 3-block budget. A macro: the kernel instances need a constant expression,
 * and the host's plan reads the same rule. */
#define W4A16_DECODE16_MINB(minb, layout, dtype)                                                                       \
    ((layout) == W4A16_LAYOUT_MARLIN && (dtype) == 0 && (minb) > 2 ? 2 : (minb) > 3 ? 3 : (minb))
static inline int w4a16_cfg_bm(const w4a16_gemm_config *c) { return 16 * c->mt * c->wm; }
static inline int w4a16_cfg_bn(const w4a16_gemm_config *c) { return 64 * c->wn; }
static inline int w4a16_cfg_bk(const w4a16_gemm_config *c) { return 16 * c->wk * c->ks; }
static inline int w4a16_cfg_threads(const w4a16_gemm_config *c) { return 32 * c->wm * c->nh * c->wn * c->wk; }

/* Bytes of a stage's packed weights in a weight format (kernels/formats.cuh, WeightTile::B_BYTES): bk / KROW stored
 * rows of row_words(bn) + PAD_WORDS words (AWQ: rows of k, padded by 4 words so the 4 row loads of a fragment hit
 * distinct banks; Marlin: rows of 16 k). constexpr in C++: kernels/gemm_instance.cu checks it against B_BYTES. */
#ifdef __cplusplus
#define W4A16_CONSTEXPR_ constexpr
#else
#define W4A16_CONSTEXPR_
#endif
static inline W4A16_CONSTEXPR_ int w4a16_format_stage_bytes(int layout, int bk, int bn) {
    return layout == W4A16_LAYOUT_AWQ ? bk * (bn / 8 + 4) * 4 : (bk / 16) * (2 * bn) * 4;
}

/* Bytes of one pipeline stage: A tile, weight tile, and the scale / zero-point rows of the groups a stage can
 * touch (BK / 32: group sizes are at least 32). */
static inline int w4a16_cfg_stage_bytes(const w4a16_gemm_config *c, int layout) {
    int bm = w4a16_cfg_bm(c), bn = w4a16_cfg_bn(c), bk = w4a16_cfg_bk(c), slots = bk / 32;
    int a = bm * bk * 2;
    int b = w4a16_format_stage_bytes(layout, bk, bn);
    int s = slots * bn * 2;
    int z = slots * (bn / 8) * 4;
    return a + b + s + z;
}

/* Bytes to reduce the K-split warps' accumulators at the end (reuses the pipeline buffer). */
static inline int w4a16_cfg_reduce_bytes(const w4a16_gemm_config *c) {
    return (c->wk - 1) * c->wm * c->wn * c->mt * 8 * 32 * 16; /* NH warps split the 8 blocks: same total */
}

static inline int w4a16_cfg_smem_bytes(const w4a16_gemm_config *c, int layout, int stages) {
    int p = stages * w4a16_cfg_stage_bytes(c, layout), r = w4a16_cfg_reduce_bytes(c);
    return p > r ? p : r;
}

#endif
