/* Architecture profiles as data: for each architecture of W4A16_PROFILE_LIST, which compiled tile (kernels/configs.h)
 * and how many pipeline stages run in each M regime, and the thresholds that choose between tiles. csrc/plan.c turns
 * a profile, a device and a call into a launch plan; csrc/device.c picks the profile per device. The measurements
 * behind each choice are in docs/PERFORMANCE.md ("Profile choices"). */
#include "internal.h"
#include <string.h>

static const w4a16_gemm_config configs[W4A16_NUM_GEMM_CONFIGS] = {
#define W4A16_CFG_ROW_(id, sym, name, MT, WM, NH, WN, WK, KS, MINB) {id, name, MT, WM, NH, WN, WK, KS, MINB},
    W4A16_GEMM_CONFIGS(W4A16_CFG_ROW_)
#undef W4A16_CFG_ROW_
};

const w4a16_gemm_config *w4a16_config(int id) { return id >= 0 && id < W4A16_NUM_GEMM_CONFIGS ? &configs[id] : NULL; }

/* Every profile's M regimes and tile thresholds: decode tiles up to M = small_max (16) (from M = 9 the MoE kernel's
 * 16-row tiles on the Marlin layout, and on wide layers in both: csrc/plan.c plan_rows16), then the 32 x 256 tile up to
 * M = 32 (rows-32 on wide layers, the decode tiles on narrow ones; where the warp-specialised tiles run, their 32-row
 * form in place of both but rows-32, W4A16_ROWS128), the deep decode tile when its tiles make fewer than
 * 2 per SM, the 4-warp mid tile once the 8-warp one's tiles alone fill every SM; from M = 33, where no wgmma tile runs,
 * the MoE kernel's 64 x 256 tile when its tiles fill 85% of one wave of its slots and 70% of all the waves they take,
 * else, with a workspace, with stream-K over its slots, each block at least 16 k-tiles, unless a 32-row plan splits K 3
 * ways or more (csrc/plan.c plan_rows64). Before all of these at M 17-64, below the wgmma tiles and off the layers
 * narrow at M 17-32, the MoE kernel's 32 x 64 tile where its K split across blocks makes 2 or more pieces of at most
 * 1792 k (plan_rows32n). */
#define W4A16_MMA_REGIMES(small_max)                                                                                   \
    .small_max_m = small_max, .mid_max_m = 64, .mid2_max_m = 256, .small_split_tiles_per_sm = 2,                       \
    .mid_wide_tiles_per_sm = 1, .deep_decode_min_kt = 4, .mid32_min_tiles_per_8sm = 1, .rows64_min_fill = 85,          \
    .rows64_min_wave_fill = 70, .rows64_sk_min_kt = 16, .rows32_keep_min_splits = 3, .rows32_max_k = 8192,             \
    .rows16_min_m = 9, .rows16_wide_fill = 40, .rows16_awq_wide_fill = 60, .rows32_sk_min_kt = 8,                      \
    .rows32_sk_wave_fill = 90, .rows32n_max_split_k = 1792

/* Tiles of the parts with 99 KB of shared memory per block (sm_86, 89, 120, 121): the 128-k decode tile also when
 * K is split (two of its 3-stage blocks fit a 100 KB SM); one 8-warp block per SM from M = 17: the 32 x 256 tile
 * (3 stages) up to M = 32, the 64 x 128 tile (3 stages), the 64 x 256 one (4 stages in 69 KB) for wide layers, for
 * layers whose 64 x 128 tiles could neither split nor balance their K (plan.c) and for M 65-256, the 128 x 256 tile
 * (3 stages) where its tiles keep the slots busy for 40 k-tiles or more, and from M = 257. */
#define W4A16_TILES_100KB                                                                                              \
    .small = {W4A16_CFG_DECODE, 3}, .small_split = {W4A16_CFG_DECODE, 3}, .mid32_max_m = 32,                           \
    .mid32 = {W4A16_CFG_WIDE32, 3}, .mid = {W4A16_CFG_MID, 3}, .mid_wide = {W4A16_CFG_WIDE64, 4},                      \
    .mid2 = {W4A16_CFG_WIDE64, 4}, .large = {W4A16_CFG_LARGE_MARLIN, 3}, .large_awq = {W4A16_CFG_LARGE_AWQ, 3},        \
    .mid2_large_kt_per_slot = 40

/* Tiles of the parts with 163 KB or more per block (sm_80, 90, 100) from M = 33: those of the 100 KB parts (the 64 x
 * 256 tile for wide layers and M 65-256, the 128 x 256 tile where it keeps the slots busy), with 4 stages for the 128 x
 * 256 tile. The 64 x 128 tile with 5 stages (4 warps, K split in the block) that M 65-256 ran before stream-K could not
 * share its k-tiles among idle SMs: the sm80 profile forced on the H100 took up to 2.0x the sm120 profile's time on the
 * same rows (docs/PERFORMANCE.md v27). */
#define W4A16_TILES_164KB_MID_LARGE                                                                                    \
    .mid = {W4A16_CFG_MID, 4}, .mid_wide = {W4A16_CFG_WIDE64, 4}, .mid2 = {W4A16_CFG_WIDE64, 4},                       \
    .large = {W4A16_CFG_LARGE_MARLIN, 4}, .large_awq = {W4A16_CFG_LARGE_AWQ, 4}, .mid2_large_kt_per_slot = 40
/* Their decode tiles (the deep one with 2 stages when K is split) to M = 16, the 32 x 256 tile (3 stages) to M = 32:
 * two 16-row decode tiles took 1.3-2.0x its time on the wide layers (v27). */
#define W4A16_TILES_164KB                                                                                              \
    .small = {W4A16_CFG_DECODE, 3}, .small_split = {W4A16_CFG_DECODE_DEEP, 2}, .mid32_max_m = 32,                      \
    .mid32 = {W4A16_CFG_WIDE32, 3}, W4A16_TILES_164KB_MID_LARGE

/* The warp-specialised 128 x 256 tile (kernels/tile_ws.cu; sm_90a / sm_120a / sm_121a images; both layouts: the AWQ
 * path then took 0.87-0.98x its time before, v34) in place of the 64 x 256 one from M = 65, in whole tiles where they
 * fill 90% of the waves they take (one block per SM makes a partly empty last wave cost more than rows-64's
 * two: 1.06-1.13x its time with rows-64's 70%), else stream-K. Under the sm120 profile on the H100 it took 0.75-0.92x
 * rows-64's time wherever it runs at M 80-1024 (docs/PERFORMANCE.md v32). Below M = 65 its 64-row form, its stream-K
 * blocks at least 4 k-tiles: 0.73-0.94x the time of rows-64's stream-K plans at M 33-64 but on one layer of 16 tiles
 * (llama3-8b.o: 0.95-1.03x; v33), and 0.93-0.98x rows-64's whole tiles where those fill 87% of its slots (v48),
 * and from M = 65 where the 128-row tile has no plan (narrow layers that ran rows-32: 0.75-0.97x at M 128-256, v35).
 * At M 17-32, where no rows-32 plan runs, its 32-row form, whole or with stream-K blocks of at least 8 k-tiles: 1.28 ->
 * 1.21x vLLM Marlin's time under sm120 and natively (v36). Their stream-K parts are added by a second grid where the
 * blocks number two or more per tile (the tile's last block otherwise waits for and adds 3-9 parts alone): 0.80-0.97x
 * the time on those layers at M 128-256 under both profiles; with fewer blocks per tile the second launch cost more
 * than it saved (llama3-8b.gate_up at M = 128-256: 1.03-1.06x; v48). */
#define W4A16_ROWS128                                                                                                  \
    .rows128_min_m = 65, .rows128_min_wave_fill = 90, .ws64_sk_min_kt = 4, .ws32_min_kt = 8,                           \
    .ws_fixup_min_blocks_per_tile = 2

enum { SMEM_100KB = 100 * 1024, SMEM_164KB = 164 * 1024, SMEM_228KB = 228 * 1024 };

static const w4a16_profile sm80 = {
    .name = "sm80",
    .arch = 80,
    .fallback = NULL,
    .smem_per_sm = SMEM_164KB,
    W4A16_MMA_REGIMES(16),
    W4A16_TILES_164KB,
};
static const w4a16_profile sm86 = {
    .name = "sm86",
    .arch = 86,
    .fallback = "sm80",
    .smem_per_sm = SMEM_100KB,
    W4A16_MMA_REGIMES(16),
    W4A16_TILES_100KB,
};
static const w4a16_profile sm89 = {
    .name = "sm89",
    .arch = 89,
    .fallback = "sm86",
    .smem_per_sm = SMEM_100KB,
    W4A16_MMA_REGIMES(16),
    W4A16_TILES_100KB,
};
/* Hopper: the deep decode tile with 3 stages (2 blocks per SM) split or not; M 17-32 on the tiles of the other
 * profiles (rows-32n where its K splits are short, rows-32 on wide layers, the warp-specialised 32-row tile, else the
 * 32 x 256 tile or decode tiles on narrow layers: 0.72-1.06x the 64-token wgmma tile's time there before ws-32,
 * docs/PERFORMANCE.md v30, v36, v41); from M = 33 the
 * sm_90a wgmma kernel (up to 256 tokens the 64-token tile where the 256-token one's blocks would get at most 24
 * k-tiles: v31), from M = 33 the wgmma form of the warp-specialised tiles where it has a plan (v45), from M = 4096
 * the staged path when the workspace holds a slab. */
static const w4a16_profile sm90 = {
    .name = "sm90",
    .arch = 90,
    .fallback = "sm80",
    .smem_per_sm = SMEM_228KB,
    W4A16_MMA_REGIMES(16),
    W4A16_ROWS128,
    .small = {W4A16_CFG_DECODE_DEEP, 3},
    .small_split = {W4A16_CFG_DECODE_DEEP, 3},
    .mid32_max_m = 32,
    .mid32 = {W4A16_CFG_WIDE32, 3},
    W4A16_TILES_164KB_MID_LARGE,
    .wgmma_min_m = 33,
    .wgmma_t128_min_m = 65,
    .wgmma_large_min_m = 129,
    .wgmma_t128_min_tiles = 32,
    .wgmma_wide_min_half_tiles_per_sm = 3,
    .wgmma_t64_max_kt = 24,
    .wgmma_sk_overhead_kt = 22,
    .wgmma_sk_act_l2_bytes = 25u << 20, /* half the H100's and H200's L2 */
    .staged_min_m = 4096, /* below it the wgmma-ws tiles took 0.76-0.88x the staged path's time at M = 1024; at 4096
                             the staged path 0.93-1.04x theirs (docs/PERFORMANCE.md v45) */
    .wgws_min_m = 33,
    .wgws_sk_min_kt = 8,
};
static const w4a16_profile sm100 = {
    .name = "sm100",
    .arch = 100,
    .fallback = "sm90",
    .smem_per_sm = SMEM_228KB,
    W4A16_MMA_REGIMES(16),
    W4A16_TILES_164KB,
};
static const w4a16_profile sm120 = {
    .name = "sm120",
    .arch = 120,
    .fallback = "sm89",
    .smem_per_sm = SMEM_100KB,
    W4A16_MMA_REGIMES(16),
    W4A16_ROWS128,
    W4A16_TILES_100KB,
};
static const w4a16_profile sm121 = {
    .name = "sm121",
    .arch = 121,
    .fallback = "sm120",
    .smem_per_sm = SMEM_100KB,
    W4A16_MMA_REGIMES(16),
    W4A16_ROWS128,
    W4A16_TILES_100KB,
};

#define W4A16_PROFILE_PTR_(n) &n,
static const w4a16_profile *const profiles[] = {W4A16_PROFILE_LIST(W4A16_PROFILE_PTR_)};
#undef W4A16_PROFILE_PTR_
#define W4A16_PROFILE_NAME_(n) #n,
static const char *const profile_names[] = {W4A16_PROFILE_LIST(W4A16_PROFILE_NAME_) NULL};
#undef W4A16_PROFILE_NAME_
#define W4A16_PROFILE_TEXT_(n) #n " "
static const char profile_text[] = W4A16_PROFILE_LIST(W4A16_PROFILE_TEXT_) "auto";
#undef W4A16_PROFILE_TEXT_
enum { NUM_PROFILES = sizeof profiles / sizeof profiles[0] };

const char *const *w4a16_profile_names(void) { return profile_names; }
const char *w4a16_profile_list_text(void) { return profile_text; }

const w4a16_profile *w4a16_find_profile(const char *name) {
    for (int i = 0; i < NUM_PROFILES; i++)
        if (name && strcmp(profile_names[i], name) == 0) return profiles[i];
    return NULL;
}

static int choice_smem(const w4a16_tile_choice *c) {
    const w4a16_gemm_config *cfg = w4a16_config(c->cfg);
    int a = w4a16_cfg_smem_bytes(cfg, W4A16_LAYOUT_AWQ, c->stages);
    int m = w4a16_cfg_smem_bytes(cfg, W4A16_LAYOUT_MARLIN, c->stages);
    return a > m ? a : m;
}

int w4a16_profile_smem_bytes(const w4a16_profile *p) {
    const w4a16_tile_choice *all[] = {&p->small,     &p->mid,         &p->mid2,     &p->large,
                                      &p->large_awq, &p->small_split, &p->mid_wide, &p->mid32};
    int r = 0;
    for (int i = 0; i < 8; i++) {
        if (all[i] == &p->mid32 && p->mid32_max_m == 0) continue;
        int b = choice_smem(all[i]);
        r = b > r ? b : r;
    }
    return r;
}
