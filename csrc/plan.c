/* Launch plans: one function turns (device, profile, layout, dtype, M, N, K, workspace) into the launch of a GEMM
 * call: which kernel, which compiled tile config and pipeline depth, how many K splits, which grid. Nothing
 * downstream decides again: kernels/dispatch.cu launches exactly this. Pure C over data, so the CPU tests
 * (tests/test_plan.c) check the plans of GPUs this machine does not have. */
#include "../kernels/moe_launch.h"
#include "internal.h"
#include <stdio.h>

enum { MAX_SPLITS = 16 };

/* K splits across blocks: only when the tiles alone leave resident block slots (SMs x the config's blocks per
 * SM) idle; never more blocks than those slots (the workspace is sized for that), at most MAX_SPLITS, and every
 * split keeps at least min_kt k-tiles. */
int w4a16_choose_splits(int blocks_per_sm, int tiles, int num_kt, int sm_count, int min_kt) {
    int slots = sm_count * blocks_per_sm;
    if (tiles * 2 > slots) return 1;
    int s = slots / tiles;
    if (s > num_kt / min_kt) s = num_kt / min_kt;
    if (s > MAX_SPLITS) s = MAX_SPLITS;
    return s < 1 ? 1 : s;
}

int w4a16_staged_slab_channels(int M, int N, int K, size_t workspace_bytes, int sm_count) {
    const size_t off = w4a16_workspace_slab_offset(sm_count);
    long long nc = workspace_bytes > off ? (long long)((workspace_bytes - off) / ((size_t)K * 2)) : 0;
    nc = nc >= N ? N : nc / W4A16_DENSE_BN * W4A16_DENSE_BN;
    const long long tiles_m = (M + W4A16_DENSE_TM - 1) / W4A16_DENSE_TM;
    return nc > 0 && tiles_m * ((nc + W4A16_DENSE_BN - 1) / W4A16_DENSE_BN) >= sm_count ? (int)nc : 0;
}

int w4a16_staged_grid(int M, int nc, int sm_count) {
    const long long tiles =
        (long long)((M + W4A16_DENSE_TM - 1) / W4A16_DENSE_TM) * ((nc + W4A16_DENSE_BN - 1) / W4A16_DENSE_BN);
    return tiles < sm_count ? (int)tiles : sm_count;
}

static int cdiv(int a, int b) { return (a + b - 1) / b; }

/* Whether a workspace of workspace_bytes holds a stream-K plan of `blocks` blocks sharing `tiles` tiles of tile_bytes
 * fp32 sums each: a counter per tile, and two partial tiles per block after the counters. */
static int sk_workspace_fits(const w4a16_device_state *st, long long blocks, long long tiles, size_t tile_bytes,
                             size_t workspace_bytes) {
    const size_t counters = w4a16_workspace_counters_bytes(st->sm_count);
    return tiles <= (long long)(counters / sizeof(int)) &&
           counters + 2 * (size_t)blocks * tile_bytes <= workspace_bytes;
}

/* Resident blocks per SM of a tile using smem_bytes of shared memory: the register budget its instance was built for
 * (minb), or fewer where shared memory runs out first (each block also takes the system's reserved shared memory). */
static int tile_blocks_per_sm(const w4a16_device_state *st, int smem_bytes, int minb) {
    int per_sm = st->smem_per_sm / (smem_bytes + st->smem_reserved);
    if (per_sm > minb) per_sm = minb;
    return per_sm < 1 ? 1 : per_sm;
}

/* Stream-K for the mma.sync tile kernel (kernels/gemm.cuh): `tiles` tiles of num_kt k-tiles on `slots` resident
 * block slots.
 *  - Whole tiles while they fill the slots in full waves, or nearly (a last wave at least W4A16_SK_MIN_WAVE_FILL
 *    percent full).
 *  - At most half a wave of tiles: each tile's k-tiles split evenly among as many blocks as fill the slots (at most
 *    16 a tile, at least min_kt k-tiles each): no block straddles two tiles.
 *  - Otherwise the slots share the k-tiles of the last partial wave's tiles plus one full wave if there is one (up to
 *    two tiles' worth per block, so the partial wave costs a fraction of a tile, not a whole one); the other tiles
 *    run whole.
 * The blocks never outnumber the slots (the workspace holds two partial tiles per slot and a counter per two).
 * `straddle` 0: never the last case (a block then computes parts of one tile only). */
enum { W4A16_SK_MIN_WAVE_FILL = 90 };
void w4a16_plan_stream_k(long long tiles, int num_kt, int slots, int min_kt, int straddle, int *sk_blocks,
                         int *sk_tiles) {
    *sk_blocks = *sk_tiles = 0;
    const long long waves = tiles / slots, rest = tiles % slots;
    if (rest == 0 || rest * 100 >= (long long)slots * W4A16_SK_MIN_WAVE_FILL) return;
    if (waves == 0 && tiles * 2 <= slots) { /* the uniform K split of the other kernels */
        const int s = w4a16_choose_splits(1, (int)tiles, num_kt, slots, min_kt);
        if (s > 1) {
            *sk_blocks = (int)(tiles * s);
            *sk_tiles = (int)tiles;
        }
        return;
    }
    if (!straddle) return;
    const long long shared = waves > 0 ? rest + slots : tiles;
    if (shared * num_kt >= 2147483647LL || shared * num_kt / min_kt < slots) return;
    *sk_blocks = slots;
    *sk_tiles = (int)shared;
}

/* The plan of wgmma tile `id` over M x N x K: its K splits, or stream-K, and grid. */
static void wgmma_plan(const w4a16_device_state *st, int id, int M, int N, int K, size_t workspace_bytes,
                       w4a16_plan *pl) {
    const int tiles_m = cdiv(M, w4a16_wgmma_tm(id)), tiles_n = cdiv(N, w4a16_wgmma_bn(id));
    pl->kind = W4A16_KERNEL_WGMMA;
    pl->cfg = id;
    pl->stages = w4a16_wgmma_stages(id);
    pl->threads = w4a16_wgmma_threads(id);
    pl->blocks_per_sm = w4a16_wgmma_minb(id);
    pl->splits = 1;
    pl->sk_blocks = pl->sk_tiles = 0;
    if (workspace_bytes > 0)
        pl->splits = w4a16_choose_splits(pl->blocks_per_sm, tiles_m * tiles_n, cdiv(K, 64), st->sm_count, 2);
    pl->grid[0] = tiles_m;
    pl->grid[1] = tiles_n;
    pl->grid[2] = pl->splits;
    /* Whole tiles whose last wave is part empty: stream-K over the SMs (the mma.sync tile kernel's division: every
     * block an equal run of (tile, k-tile) units, at least 4 k-tiles) where it is predicted to take at most 95% of
     * the whole tiles' time, each block costing wgmma_sk_overhead_kt k-tiles more (its second pipeline fill, the
     * partial tiles' stores and the last block's additions). On the H100 that count predicted the measured ratio within
     * 0.07 on 29 of 34 layer shapes at M 128-2048 (0.66-1.20x). The others were down projections with 22-105 MB of
     * activations: the blocks then read A at k offsets spread over all of K at once, past what the L2 keeps (whole
     * tiles of a wave read the same k range), and gained less than predicted or lost (qwen3-32b.down at M = 2048: 0.83
     * predicted, 1.11 measured), so past half the L2 the prediction must be at most 80% (docs/PERFORMANCE.md v44).
     * Needs the workspace to hold two partial tiles per block and a counter per shared tile; the two-block tiles have
     * no stream-K instance (its loop state would spill under their register budget). */
    const w4a16_profile *p = st->profile;
    const int ovh = p->wgmma_sk_overhead_kt;
    if (pl->splits > 1 || ovh <= 0 || !workspace_bytes || pl->blocks_per_sm > 1) return;
    const long long tiles = (long long)tiles_m * tiles_n, slots = st->sm_count;
    const int num_kt = cdiv(K, 64);
    int skb, skt;
    w4a16_plan_stream_k(tiles, num_kt, (int)slots, 4, 1, &skb, &skt);
    if (skb == 0) return;
    if (!sk_workspace_fits(st, skb, skt, (size_t)w4a16_wgmma_tm(id) * w4a16_wgmma_bn(id) * sizeof(float),
                           workspace_bytes))
        return;
    /* k-tiles on the busiest SM: whole tiles in full waves, or the shared run plus the whole tiles after it */
    const double whole = (double)((tiles + slots - 1) / slots) * num_kt;
    const double shared = (double)skt * num_kt / skb + (double)(tiles - skt) / slots * num_kt + ovh;
    const int max_pct = (double)M * K * 2 > (double)p->wgmma_sk_act_l2_bytes ? 80 : 95;
    if (shared * 100 > whole * max_pct) return;
    pl->sk_blocks = skb;
    pl->sk_tiles = skt;
    pl->grid[0] = (int)(skb + tiles - skt);
    pl->grid[1] = 1;
}

/* The sm_90a wgmma tile for M on this device (profile thresholds), its K splits and grid. */
static void plan_wgmma(const w4a16_device_state *st, int M, int N, int K, size_t workspace_bytes, w4a16_plan *pl) {
    const w4a16_profile *p = st->profile;
    int id = M >= p->wgmma_large_min_m  ? W4A16_WGMMA_T256
             : M >= p->wgmma_t128_min_m ? W4A16_WGMMA_T128
                                        : W4A16_WGMMA_T64;
    /* few 128-token tiles leave the SMs to split-K: the 64-token tile runs two blocks per SM */
    if (id == W4A16_WGMMA_T128 &&
        (long long)cdiv(M, w4a16_wgmma_tm(id)) * cdiv(N, w4a16_wgmma_bn(id)) < p->wgmma_t128_min_tiles)
        id = W4A16_WGMMA_T64;
    /* very wide layers: the 256-channel tile halves the per-stage work per weight and still fills the SMs */
    if (id == W4A16_WGMMA_T64 && (long long)cdiv(N, w4a16_wgmma_bn(W4A16_WGMMA_T64_WIDE)) * 2 >=
                                     (long long)p->wgmma_wide_min_half_tiles_per_sm * st->sm_count)
        id = W4A16_WGMMA_T64_WIDE;
    wgmma_plan(st, id, M, N, K, workspace_bytes, pl);
    /* Up to 256 tokens, on layers with few channel tiles (those it splits K for), the 256-token tile's K split leaves
     * each block a short k range, over which its 5-stage pipeline (320 k) fills and drains with one block per SM;
     * below 256 tokens it also computes padding rows (M = 160: 37% of its MMAs). There the 64-token tile (at most 63
     * padding rows, two blocks per SM) runs instead: under the native profile on the H100 0.58-0.89x the time at M =
     * 129-192 where the 256-token blocks took 896-1365 k (Qwen2.5-7B qkv / o, Gemma-3-27B o, Llama-3-8B o), 0.87-0.89x
     * at M = 224-256 on two of them and 1.04-1.09x on Gemma-3-27B o; 1.08-1.6x where the blocks took 2560 k or more
     * (Phi-4 qkv, Qwen2.5-72B o, the down projections; docs/PERFORMANCE.md "v31"). */
    if (id == W4A16_WGMMA_T256 && M <= 256 && p->wgmma_t64_max_kt > 0 && pl->splits > 1 &&
        cdiv(K, 64) <= (long long)p->wgmma_t64_max_kt * pl->splits)
        wgmma_plan(st, W4A16_WGMMA_T64, M, N, K, workspace_bytes, pl);
}

/* Whether M is in the mid32 regime (M 17-32 where the profile has one) on a layer so narrow that the mid32 tile makes
 * at most mid32_min_tiles_per_8sm tiles per 8 SMs: the 16-row decode tiles then run M 17-32 where the warp-specialised
 * 32-row tile has no plan (plan_ws32): two row tiles, four times the tiles of 32 x 256, K split across blocks. Under
 * sm120 on the H100 they took 0.83-0.90x the 32 x 256 tile's time on llama3-8b.o (16 tiles on 132 SMs) and about 1.0x
 * on .down (also 16, K = 14336), but 1.04-1.9x on every layer with 24 tiles or more (docs/PERFORMANCE.md v28). */
static int mid32_narrow(const w4a16_device_state *st, int M, int N) {
    const w4a16_profile *p = st->profile;
    if (M <= p->small_max_m || M > p->mid32_max_m) return 0;
    const w4a16_gemm_config *c = w4a16_config(p->mid32.cfg);
    const long long tiles = (long long)cdiv(M, w4a16_cfg_bm(c)) * cdiv(N, w4a16_cfg_bn(c));
    return tiles * 8 <= (long long)p->mid32_min_tiles_per_8sm * st->sm_count;
}

/* The plan of MoE launch tile `tile` (W4A16_MOE_TILE_64, _32, _32x64, _16x64, _16x128 or a warp-specialised one) over
 * M x N, its register budget allowing minb blocks per SM; returns its blocks per SM, 0 when its shared memory does not
 * fit a block. */
static int rows_plan(const w4a16_device_state *st, int layout, int tile, int minb, int M, int N, w4a16_plan *pl) {
    const int rows = w4a16_moe_tile_rows(tile), stages = w4a16_moe_stages(st, tile, layout);
    const int smem = w4a16_moe_smem_bytes(tile, layout, stages);
    if ((size_t)smem > st->smem_optin) return 0;
    pl->kind = w4a16_moe_tile_kernel(tile);
    pl->cfg = rows;
    pl->stages = stages;
    pl->threads = w4a16_moe_tile_threads(tile);
    pl->smem_bytes = smem;
    pl->blocks_per_sm = tile_blocks_per_sm(st, smem, minb);
    pl->grid[0] = cdiv(M, rows);
    pl->grid[1] = cdiv(N, w4a16_moe_tile_bn(tile));
    return pl->blocks_per_sm;
}

/* Given *pl, the plan of tile `tile` over M x N with per_sm blocks per SM (rows_plan): whole tiles where they fill
 * rows64_min_fill percent of one wave of its block slots and wave_fill percent of the waves they take, else (*whole =
 * 0) with a workspace stream-K over the slots, each block at least min_kt k-tiles, at least one block per SM, the
 * workspace holding two partial tiles per block and a counter per tile. Returns 0 where neither fits. */
static int tile_sk(const w4a16_device_state *st, int tile, int per_sm, int wave_fill, int min_kt, int K,
                   size_t workspace_bytes, w4a16_plan *pl, int *whole) {
    const w4a16_profile *p = st->profile;
    const long long tiles = (long long)pl->grid[0] * pl->grid[1], slots = (long long)st->sm_count * per_sm;
    /* whole tiles: a last wave nearly empty would cost a whole tile's time */
    const long long waves = (tiles + slots - 1) / slots;
    *whole = tiles * 100 >= slots * p->rows64_min_fill && tiles * 100 >= waves * slots * wave_fill;
    if (*whole) return 1;
    if (!workspace_bytes || min_kt <= 0) return 0;
    const long long units = tiles * cdiv(K, 64);
    const long long blocks = slots < units / min_kt ? slots : units / min_kt;
    const size_t tile_bytes = (size_t)w4a16_moe_tile_rows(tile) * w4a16_moe_tile_bn(tile) * sizeof(float);
    if (blocks < st->sm_count || !sk_workspace_fits(st, blocks, tiles, tile_bytes, workspace_bytes)) return 0;
    pl->sk_blocks = (int)blocks;
    pl->sk_tiles = (int)tiles;
    return 1;
}

/* The same from the start: tile `tile` planned over M x N (its register budget allowing minb blocks per SM). */
static int plan_tile_sk(const w4a16_device_state *st, int layout, int tile, int minb, int wave_fill, int min_kt, int M,
                        int N, int K, size_t workspace_bytes, w4a16_plan *pl, int *whole) {
    const int per_sm = rows_plan(st, layout, tile, minb, M, N, pl);
    return per_sm && tile_sk(st, tile, per_sm, wave_fill, min_kt, K, workspace_bytes, pl, whole);
}

/* A warp-specialised tile (one block per SM) into *pl: whole where its tiles fill rows128_min_wave_fill percent of
 * their waves, else stream-K blocks of at least min_kt k-tiles (none where min_kt is 0), their parts added by a second
 * grid from ws_fixup_min_blocks_per_tile blocks per tile; *pl unchanged where it has no plan. K % 64 and N % 32
 * (Marlin: 64) are what its copies need (whole k-tiles; whole 16-byte zero-point rows; the Marlin layout's 64-channel
 * permutation blocks); the API already holds N to multiples of 64, so the latter only guards direct callers of the
 * plan. */
static int plan_ws(const w4a16_device_state *st, int layout, int tile, int min_kt, int M, int N, int K,
                   size_t workspace_bytes, w4a16_plan *pl) {
    w4a16_plan c = *pl;
    int whole;
    if (K % 64 || N % (layout == W4A16_LAYOUT_MARLIN ? 64 : 32) ||
        !plan_tile_sk(st, layout, tile, 1, st->profile->rows128_min_wave_fill, min_kt, M, N, K, workspace_bytes, &c,
                      &whole))
        return 0;
    const int fx = st->profile->ws_fixup_min_blocks_per_tile;
    c.sk_fixup = c.sk_blocks > 0 && fx > 0 && c.sk_blocks >= (long long)fx * c.sk_tiles;
    *pl = c;
    return 1;
}

/* M 17-32 where no 32-row plan runs, on a device with the warp-specialised tiles' image: their 32-row form, whole
 * tiles where they fill rows64_min_fill percent of one wave and rows128_min_wave_fill percent of the waves they take,
 * else stream-K over one block per SM if each gets ws32_min_kt k-tiles. 0 where the profile has none or it has no plan
 * (then the mma.sync 32 x 256 tile, or the decode tiles on narrow layers). */
static int plan_ws32(const w4a16_device_state *st, int layout, int M, int N, int K, size_t workspace_bytes,
                     w4a16_plan *pl) {
    const w4a16_profile *p = st->profile;
    if (!st->ws || p->ws32_min_kt <= 0 || K % 64 || M <= p->small_max_m || M > p->mid32_max_m) return 0;
    return plan_ws(st, layout, W4A16_MOE_TILE_WS32, p->ws32_min_kt, M, N, K, workspace_bytes, pl);
}

/* From wgws_min_m on Hopper (the sm_90a images of the wgmma and warp-specialised kernels): above M = 64 the wgmma form
 * of the warp-specialised 128 x 256 tile (kernels/tile_ws.cu: two wgmma math warpgroups, one producer thread copying by
 * TMA), else or where it has no plan its 64-row form; whole tiles where they fill rows128_min_wave_fill percent of
 * their waves, else stream-K blocks of at least wgws_sk_min_kt k-tiles (where blocks would get fewer, on narrow
 * layers of short K, the wgmma kernel's two blocks per SM with K splits stay). Under the native profile on the H100:
 * 0.78-0.85x the wgmma kernel's time at M 128-4096 over the benchmark's layers, 0.69-0.97x at M 40-64 on the six layers
 * it takes there (docs/PERFORMANCE.md v45). Blocks of 8-15 k-tiles lost to the wgmma kernel (1.05-1.27x on
 * llama3-8b.qkv / .o at M 40-64, v45) until the fixup grid added their parts: then 0.92-0.94x on llama3-8b.qkv at M
 * 48-64 and .o at M = 128; 4-7 k-tiles still lost (llama3-8b.o at M 48-128: 1.09-1.10x; v48). */
static int plan_wgws(const w4a16_device_state *st, int layout, int M, int N, int K, size_t workspace_bytes,
                     w4a16_plan *pl) {
    const w4a16_profile *p = st->profile;
    if (!st->wgmma || !st->ws || p->wgws_min_m <= 0 || M < p->wgws_min_m || K % 64) return 0;
    return (M > 64 && plan_ws(st, layout, W4A16_MOE_TILE_WG128, p->wgws_sk_min_kt, M, N, K, workspace_bytes, pl)) ||
           plan_ws(st, layout, W4A16_MOE_TILE_WG64, p->wgws_sk_min_kt, M, N, K, workspace_bytes, pl);
}

/* The MoE grouped GEMM's 64 x 256 tile (kernels/moe.cu: 4 warps of 64 x 64, each B fragment feeding four m16 tiles, no
 * K split among them) on the identity routing, where no wgmma tile runs and M is past the decode and 32-row regimes:
 * - whole tiles where they fill at least rows64_min_fill percent of one wave of its block slots and
 *   rows64_min_wave_fill percent of the waves they take. Under the sm120 profile on the H100 it took 0.76-0.99x the
 *   time of the mma.sync tiles (stream-K) on such layers of the peer harness (docs/PERFORMANCE.md "v24");
 * - else, with a workspace, stream-K: one block per slot (fewer where a block would get under rows64_sk_min_kt
 *   k-tiles; at least one per SM), each taking an equal range of the tiles' k-tiles ("v29"). Over M 48-512 of the
 *   harness under sm120 it took 0.96x (Marlin) / 0.91x (AWQ) the time of the plans before (0.63-0.93x on 45 of 128
 *   rows, 1.05-1.15x on 14), except where the rows-32 plan splits K rows32_keep_min_splits ways or more
 *   (rows32_splits: its K splits, 0 where it has none; few tiles of short K: the 32-row tile's split measured 1.1-1.2x
 *   faster there).
 * On devices with the warp-specialised tiles' image (kernels/tile_ws.cu), both layouts run them instead (v34): from
 * rows128_min_m the 128 x 256 one (whole tiles from rows128_min_wave_fill percent of their waves, else stream-K; v32),
 * below it the 64 x 256 one with stream-K blocks of at least ws64_sk_min_kt k-tiles (v33; since v48 also where rows-64
 * would run whole tiles: 0.93-0.98x on qwen2.5-72b.gate_up at M 48-64, 231 tiles filling 87% of rows-64's slots), and
 * from rows128_min_m also where the 128-row one has no plan (v35). */
static int plan_rows64(const w4a16_device_state *st, int layout, int M, int N, int K, size_t workspace_bytes,
                       int rows32_splits, w4a16_plan *pl) {
    const w4a16_profile *p = st->profile;
    /* only in the M regimes of tiles with 64 rows or more (decode and 32-row tiles below) */
    if (p->rows64_min_fill <= 0 || K % 64 || M <= p->small_max_m || M <= p->mid32_max_m) return 0;
    /* stream-K not where a 32-row plan splits K 3 ways or more (few tiles of short K) */
    const int sk_kt = rows32_splits >= p->rows32_keep_min_splits ? 0 : p->rows64_sk_min_kt;
    const int ws = st->ws && p->rows128_min_m > 0;
    w4a16_plan c = *pl;
    int whole;
    /* the warp-specialised 128-row tile from rows128_min_m, one block per SM; on narrow layers (few 128-row tiles of
     * short K: too few stream-K blocks, or a 32-row plan splitting K 3 ways) its 64-row form with stream-K blocks of
     * ws64_sk_min_kt k-tiles (v35); where neither has a plan (no workspace, and whole tiles under 90% of their waves),
     * rows-64 below */
    if (ws && M >= p->rows128_min_m &&
        (plan_ws(st, layout, W4A16_MOE_TILE_128, sk_kt, M, N, K, workspace_bytes, pl) ||
         (p->ws64_sk_min_kt > 0 &&
          plan_ws(st, layout, W4A16_MOE_TILE_WS64, p->ws64_sk_min_kt, M, N, K, workspace_bytes, pl))))
        return 1;
    /* below rows128_min_m the warp-specialised 64-row tile (ws64_sk_min_kt > 0), at most one block per SM, wherever
     * it has a plan; else 64 x 256 (its register budget: moe.cu's tests hold it at 2 per SM) */
    if (ws && M < p->rows128_min_m && sk_kt > 0 && p->ws64_sk_min_kt > 0 &&
        plan_ws(st, layout, W4A16_MOE_TILE_WS64, p->ws64_sk_min_kt, M, N, K, workspace_bytes, pl))
        return 1;
    if (!plan_tile_sk(st, layout, W4A16_MOE_TILE_64, 2, p->rows64_min_wave_fill, sk_kt, M, N, K, workspace_bytes, &c,
                      &whole))
        return 0;
    *pl = c;
    return 1;
}

/* Else the MoE kernel's 32 x 128 tile (4 warps: 2 channel groups x a 2-way K split, each B fragment feeding two m16
 * tiles, three blocks per SM), for K at most rows32_max_k:
 * - in the mid2 regime (M 65-256) where its tiles fit one wave of its block slots: there the dense plans run few
 *   64 x 256 or 128 x 256 tiles and share their k-tiles among the idle slots (stream-K), which measured slower than
 *   8x as many whole 32 x 128 tiles (0.71-0.96x the time under sm120 on the H100); past that K the stream-K split pays
 *   (llama3-8b.down, K = 14336: 1.22x);
 * - in the mid32 regime (M 17-32, the 32 x 256 tile with one block per SM) where its tiles fill at least half of its
 *   slots (wide layers: 0.70 / 0.82x there, 1.25-2.7x on layers with 80 tiles or fewer);
 * - in the AWQ layout also at M 17-64 wherever its tiles fit one wave (unless rows-32n takes the layer, plan_rows32n):
 *   the dense AWQ tiles are the slower layout there
 *   (1.08-1.11x the Marlin path's time), and the MoE kernel's AWQ path took 0.80-0.95x their time on the narrow layers,
 *   where in the Marlin layout it lost 13-24% (docs/PERFORMANCE.md "v25"). */
static int plan_rows32(const w4a16_device_state *st, int layout, int M, int N, int K, size_t workspace_bytes,
                       w4a16_plan *pl) {
    const w4a16_profile *p = st->profile;
    const int mid2 = M > p->mid_max_m && M <= p->mid2_max_m, mid32 = M > p->small_max_m && M <= p->mid32_max_m;
    const int awq = layout == W4A16_LAYOUT_AWQ && M > p->small_max_m && M <= p->mid2_max_m;
    if (p->rows32_max_k <= 0 || K % 64 || K > p->rows32_max_k || !(mid2 || mid32 || awq) || mid32_narrow(st, M, N))
        return 0;
    w4a16_plan c = *pl;
    const int per_sm = rows_plan(st, layout, W4A16_MOE_TILE_32, 3, M, N, &c); /* its register budget: three per SM */
    if (!per_sm) return 0;
    const long long tiles = (long long)c.grid[0] * c.grid[1], slots = (long long)st->sm_count * per_sm;
    const int fits = tiles <= slots, half = tiles * 2 >= slots;
    if (!(mid32 ? half || (awq && fits) : fits)) return 0;
    /* more than one wave of whole tiles whose last is part empty (the wide gate_up layers at M 17-32: 400 and 462
     * tiles on 396 slots of the 100 KB profiles): stream-K over the slots instead, each block at least rows32_sk_min_kt
     * k-tiles; 0.80-0.96x the whole tiles' time there, both layouts, both profiles (one wave or less: 1.06-1.24x,
     * docs/PERFORMANCE.md v39) */
    if (mid32 && tiles > slots && workspace_bytes > 0 && p->rows32_sk_min_kt > 0) {
        w4a16_plan d = c; /* the tile as planned above */
        int whole;
        if (tile_sk(st, W4A16_MOE_TILE_32, per_sm, p->rows32_sk_wave_fill, p->rows32_sk_min_kt, K, workspace_bytes, &d,
                    &whole) &&
            !whole) {
            *pl = d;
            return 1;
        }
    }
    /* K split across blocks (the MoE kernel's, through the dense workspace) where the tiles leave half the slots idle,
     * each split at least 640 k, as the MoE plans split their 16 x 64 tile */
    if (workspace_bytes > 0) c.splits = w4a16_choose_splits(per_sm, (int)tiles, cdiv(K, 64), st->sm_count, 10);
    c.grid[2] = c.splits;
    *pl = c;
    return 1;
}

/* K splits across blocks of a MoE-tile plan whose 4 warps split each 128-k stage (16 x 64, 32 x 64), as the decode
 * tiles split K: the slots once, at least 512 k a split. */
static int split_128k(const w4a16_device_state *st, int per_sm, const w4a16_plan *pl, int K) {
    return w4a16_choose_splits(per_sm, pl->grid[0] * pl->grid[1], cdiv(K, W4A16_MOE_SPLIT_BK), st->sm_count,
                               512 / W4A16_MOE_SPLIT_BK);
}

/* M from rows16_min_m to small_max_m (16), and M 17-32 on the narrow layers that run the decode tiles there
 * (mid32_narrow): the MoE kernel's 16-row tiles (kernels/moe.cu: the activations the MMAs' 16-row operand, each weight
 * dequantised once in registers with its scale) in place of the decode kernel's 16-token form (two 8-token MMA
 * operands, deferred scales), which under sm120 on the H100 took 1.2x its own M = 1 time and 1.14x vLLM Marlin's
 * (docs/PERFORMANCE.md v38):
 * - 16 x 128 (4 warps: 2 channel groups x a 2-way K split, up to four blocks per SM) where its tiles fill at least
 *   rows16_wide_fill percent of one wave of its block slots (wide layers; AWQ layout from rows16_awq_wide_fill), whole
 *   tiles: 0.81-0.97x the decode tile's time at M = 16 on the harness's wide layers, Marlin layout, both profiles;
 * - else, in the Marlin layout, 16 x 64 (the 4 warps splitting each 128-k stage) with K split across blocks as the
 *   decode tiles split it (the slots once, each split at least 512 k): 0.86-0.97x on 5 of the 6 narrow layers at M =
 *   16, 1.09x on llama3-8b.o natively; at M 17-32 (two row tiles) 0.86-0.93x natively and 0.92-0.99x under sm120 on
 *   the narrow layers measured (llama3-8b.o, qwen2.5-7b.o). The AWQ layout's 16 x 64 tile was 1.04-1.40x slower on most
 *   of them (its 32-byte row pieces), so it keeps the decode tile there. */
static int plan_rows16(const w4a16_device_state *st, int layout, int M, int N, int K, size_t workspace_bytes,
                       w4a16_plan *pl) {
    const w4a16_profile *p = st->profile;
    if (p->rows16_min_m <= 0 || M < p->rows16_min_m || K % 64 || (M > p->small_max_m && !mid32_narrow(st, M, N)))
        return 0;
    w4a16_plan c = *pl;
    const int per_sm = rows_plan(st, layout, W4A16_MOE_TILE_16x128, 4, M, N, &c); /* its register budget: four */
    const int fill = layout == W4A16_LAYOUT_AWQ ? p->rows16_awq_wide_fill : p->rows16_wide_fill;
    if (per_sm && (long long)c.grid[0] * c.grid[1] * 100 >= (long long)st->sm_count * per_sm * fill) {
        *pl = c;
        return 1;
    }
    if (layout == W4A16_LAYOUT_AWQ) return 0;
    c = *pl;
    const int per_sm64 = rows_plan(st, layout, W4A16_MOE_TILE_16x64, 4, M, N, &c);
    if (!per_sm64) return 0;
    if (workspace_bytes > 0) c.splits = split_128k(st, per_sm64, &c, K);
    c.grid[2] = c.splits;
    *pl = c;
    return 1;
}

/* M 17-64 where no wgmma tile runs, off the layers narrow at M 17-32 (those run rows-16 or the decode tiles there):
 * the MoE kernel's 32 x 64 tile (kernels/moe.cu: 4 warps splitting each 128-k stage, each weight fragment feeding two
 * m16 tiles, three blocks per SM; two row tiles from M = 33) with K split across blocks as rows-16 splits it (the slots
 * once, at least 512 k a split), where that takes at least two splits of at most rows32n_max_split_k k. Under sm120 on
 * the H100, in the Marlin layout, it took 0.81-0.96x the time of the warp-specialised 32 x 256 tile's stream-K (and of
 * the mma.sync 32 x 256 one) at M = 24 / 32 on layers of 72-120 such tiles and K 3584-5120 (splits of 717-1707 k),
 * about 1.0x with splits of 2048-2731 k, and 1.15-1.3x with splits of 4096 k or more; in the AWQ layout 0.79-0.93x
 * rows-32's time with splits of 717-1707 k, 1.07x at 2048 k; at M = 48 / 64 0.78-0.87x ws-64's stream-K on the narrow
 * layers (llama3-8b.o, qwen2.5-7b.o: 3 splits of 1195-1365 k), 0.96-1.04x on qwen2.5-7b.qkv (2 of 1792); on the layers
 * narrow at M 17-32 0.96-1.04x rows-16's time under sm120, 1.04-1.08x natively (docs/PERFORMANCE.md v41, v42). */
static int plan_rows32n(const w4a16_device_state *st, int layout, int M, int N, int K, size_t workspace_bytes,
                        w4a16_plan *pl) {
    const w4a16_profile *p = st->profile;
    if (p->rows32n_max_split_k <= 0 || !workspace_bytes || K % 64 || M <= p->small_max_m || M > p->mid_max_m ||
        mid32_narrow(st, M, N))
        return 0;
    w4a16_plan c = *pl;
    const int per_sm = rows_plan(st, layout, W4A16_MOE_TILE_32x64, 3, M, N, &c); /* its register budget: three */
    if (!per_sm) return 0;
    c.splits = split_128k(st, per_sm, &c, K);
    if (c.splits < 2 || cdiv(K, c.splits) > p->rows32n_max_split_k) return 0;
    c.grid[2] = c.splits;
    *pl = c;
    return 1;
}

/* Whether `tiles` tiles of config c, K deep, run unshared where stream-K would share them if c's tiles could straddle
 * blocks: tiles that split K among their warps (WK > 1) never do (see w4a16_plan_gemm), so with more than half a wave
 * and a last wave under the fill threshold they keep SMs idle. Only asked where the alternative config `other`
 * computes a tile in one warp's K range (WK = 1), which stream-K can balance. */
static int unsplittable(const w4a16_device_state *st, const w4a16_gemm_config *c, int layout, int stages,
                        long long tiles, int K, int other) {
    if (c->wk == 1 || w4a16_config(other)->wk != 1) return 0;
    const int slots = st->sm_count * tile_blocks_per_sm(st, w4a16_cfg_smem_bytes(c, layout, stages), c->minb);
    const int num_kt = cdiv(K, w4a16_cfg_bk(c));
    int as_planned, shared, tiles_unused;
    w4a16_plan_stream_k(tiles, num_kt, slots, 2, 0, &as_planned, &tiles_unused);
    w4a16_plan_stream_k(tiles, num_kt, slots, 2, 1, &shared, &tiles_unused);
    return as_planned == 0 && shared > 0;
}

/* The mma.sync tile of the profile's M regime, adjusted by how many tiles the layer makes on this device. */
static const w4a16_tile_choice *mma_choice(const w4a16_device_state *st, int layout, int M, int N, int K) {
    const w4a16_profile *p = st->profile;
    const w4a16_tile_choice *tc = M <= p->small_max_m             ? &p->small
                                  : M <= p->mid32_max_m           ? &p->mid32
                                  : M <= p->mid_max_m             ? &p->mid
                                  : M <= p->mid2_max_m            ? &p->mid2
                                  : layout == W4A16_LAYOUT_MARLIN ? &p->large
                                                                  : &p->large_awq;
    if (tc == &p->mid32 && mid32_narrow(st, M, N)) tc = &p->small;
    const w4a16_gemm_config *c = w4a16_config(tc->cfg);
    long long tiles = (long long)cdiv(M, w4a16_cfg_bm(c)) * cdiv(N, w4a16_cfg_bn(c));
    if (tc == &p->mid && (tiles >= (long long)p->mid_wide_tiles_per_sm * st->sm_count ||
                          unsplittable(st, c, layout, tc->stages, tiles, K, p->mid_wide.cfg))) {
        /* wide layer: enough blocks without the 8-warp tile (the 4-warp one runs two per SM); or tiles that would
         * leave SMs idle and only a tile in one warp's K range can share among blocks */
        tc = &p->mid_wide;
        c = w4a16_config(tc->cfg);
        tiles = (long long)cdiv(M, w4a16_cfg_bm(c)) * cdiv(N, w4a16_cfg_bn(c));
    }
    if (tc == &p->mid2 && p->mid2_large_kt_per_slot > 0) {
        /* long-K or wide layers: the larger tile reads each weight once for 128 rows and still keeps every slot busy
         * for that many k-tiles (its blocks per SM by shared memory) */
        const w4a16_tile_choice *lc = layout == W4A16_LAYOUT_MARLIN ? &p->large : &p->large_awq;
        const w4a16_gemm_config *l = w4a16_config(lc->cfg);
        const int per_sm = tile_blocks_per_sm(st, w4a16_cfg_smem_bytes(l, layout, lc->stages), l->minb);
        const long long kt = (long long)cdiv(M, w4a16_cfg_bm(l)) * cdiv(N, w4a16_cfg_bn(l)) * cdiv(K, w4a16_cfg_bk(l));
        if (kt >= (long long)p->mid2_large_kt_per_slot * st->sm_count * per_sm) return lc;
    }
    if (tc == &p->small && tiles < (long long)p->small_split_tiles_per_sm * st->sm_count)
        tc = &p->small_split; /* K will be split across blocks: the deeper stage amortises its fixed costs better */
    return tc;
}

w4a16_status w4a16_plan_gemm(const w4a16_device_state *st, int layout, int dtype, int M, int N, int K,
                             size_t workspace_bytes, const char *op, w4a16_plan *pl) {
    const w4a16_profile *p = st->profile;
    *pl = (w4a16_plan){.splits = 1, .grid = {1, 1, 1}, .carveout = st->carveout};
    const int nc = st->wgmma && p->staged_min_m > 0 && M >= p->staged_min_m
                       ? w4a16_staged_slab_channels(M, N, K, workspace_bytes, st->sm_count)
                       : 0;
    if (nc > 0) {
        pl->kind = W4A16_KERNEL_STAGED;
        pl->slab_channels = nc;
        pl->grid[0] = w4a16_staged_grid(M, nc, st->sm_count);
        return W4A16_OK;
    }
    if (plan_wgws(st, layout, M, N, K, workspace_bytes, pl)) return W4A16_OK;
    if (st->wgmma && p->wgmma_min_m > 0 && M >= p->wgmma_min_m) {
        plan_wgmma(st, M, N, K, workspace_bytes, pl);
        return W4A16_OK;
    }
    /* M 17-64: the 32 x 64 tile's short K splits first (in the AWQ layout rows-32 would take these layers) */
    if (plan_rows32n(st, layout, M, N, K, workspace_bytes, pl)) return W4A16_OK;
    /* the 32-row plan first: the 64-row one's stream-K yields to it where it splits K several ways */
    w4a16_plan r32 = *pl;
    const int rows32 = plan_rows32(st, layout, M, N, K, workspace_bytes, &r32);
    if (plan_rows64(st, layout, M, N, K, workspace_bytes, rows32 ? r32.splits : 0, pl)) return W4A16_OK;
    if (rows32) {
        *pl = r32;
        return W4A16_OK;
    }
    if (plan_ws32(st, layout, M, N, K, workspace_bytes, pl)) return W4A16_OK;
    if (plan_rows16(st, layout, M, N, K, workspace_bytes, pl)) return W4A16_OK;
    const w4a16_tile_choice *tc = mma_choice(st, layout, M, N, K);
    const w4a16_gemm_config *c = w4a16_config(tc->cfg);
    const int bm = w4a16_cfg_bm(c), bn = w4a16_cfg_bn(c), bk = w4a16_cfg_bk(c);
    const int tiles_m = cdiv(M, bm), tiles_n = cdiv(N, bn);
    if (tiles_m > 2147483647 / tiles_n)
        return w4a16_fail(W4A16_ERR_SIZE_OVERFLOW, "%s: M=%d, N=%d make too many tiles", op, M, N);
    const int decode = w4a16_cfg_is_decode(c);
    /* decode tiles: 8 tokens per MMA up to M = 8, 16 tokens (one or more row tiles) above */
    pl->kind = decode && M <= 8 ? W4A16_KERNEL_DECODE8 : decode ? W4A16_KERNEL_DECODE16 : W4A16_KERNEL_MMA;
    pl->cfg = tc->cfg;
    pl->stages = tc->stages;
    pl->threads = w4a16_cfg_threads(c);
    pl->smem_bytes = w4a16_cfg_smem_bytes(c, layout, tc->stages);
    /* the register budget the kernel instance was built for */
    const int minb = pl->kind == W4A16_KERNEL_DECODE16 ? W4A16_DECODE16_MINB(c->minb, layout, dtype) : c->minb;
    pl->blocks_per_sm = tile_blocks_per_sm(st, pl->smem_bytes, minb);
    if (pl->kind == W4A16_KERNEL_MMA) {
        /* one-dimensional grid: the stream-K blocks, then one block per remaining tile */
        if (workspace_bytes > 0)
            /* tiles that split K among their warps (WK > 1) keep one tile per block: compute-sanitizer's racecheck
             * reports shared-memory hazards between their warps' K reduction and the next tile's fragment reads in
             * a block that computes two (docs/PERFORMANCE.md v20) */
            w4a16_plan_stream_k((long long)tiles_m * tiles_n, cdiv(K, bk), st->sm_count * pl->blocks_per_sm, 2,
                                c->wk == 1, &pl->sk_blocks, &pl->sk_tiles);
        pl->grid[0] = pl->sk_blocks + tiles_m * tiles_n - pl->sk_tiles;
        return W4A16_OK;
    }
    if (workspace_bytes > 0) {
        /* the deep decode tile (256 k per stage) keeps more k-tiles per split: its fixed cost per split is larger */
        const int min_kt = decode && bk >= 256 ? p->deep_decode_min_kt : 2;
        pl->splits = w4a16_choose_splits(pl->blocks_per_sm, tiles_m * tiles_n, cdiv(K, bk), st->sm_count, min_kt);
    }
    pl->grid[0] = tiles_m;
    pl->grid[1] = tiles_n;
    pl->grid[2] = pl->splits;
    return W4A16_OK;
}

const char *w4a16_kernel_kind_name(int kind) {
    switch (kind) {
#define W4A16_KIND_NAME_(sym, text)                                                                                    \
    case W4A16_KERNEL_##sym:                                                                                           \
        return text;
        W4A16_KERNEL_KINDS(W4A16_KIND_NAME_)
#undef W4A16_KIND_NAME_
    }
    return "?";
}

void w4a16_plan_text(const w4a16_plan *pl, char *buf, size_t size) {
    int n;
    if (pl->kind == W4A16_KERNEL_STAGED)
        n = snprintf(buf, size, "staged: slabs of %d channels, dense GEMM on %d blocks", pl->slab_channels,
                     pl->grid[0]);
    else if (pl->kind == W4A16_KERNEL_WGMMA) {
        char split[64];
        if (pl->sk_blocks > 0)
            snprintf(split, sizeof split, "stream-K %d blocks over %d tiles, grid %d", pl->sk_blocks, pl->sk_tiles,
                     pl->grid[0]);
        else
            snprintf(split, sizeof split, "%d K split%s, grid %dx%dx%d", pl->splits, pl->splits > 1 ? "s" : "",
                     pl->grid[0], pl->grid[1], pl->grid[2]);
        n = snprintf(buf, size, "wgmma config %d (%d tokens x %d channels, %d stages), %s, %d threads, %d block%s/SM",
                     pl->cfg, w4a16_wgmma_tm(pl->cfg), w4a16_wgmma_bn(pl->cfg), pl->stages, split, pl->threads,
                     pl->blocks_per_sm, pl->blocks_per_sm > 1 ? "s" : "");
    } else if (W4A16_KERNEL_ROWS(pl->kind)) {
        const int tile = w4a16_kernel_moe_tile(pl->kind);
        char split[80];
        if (pl->sk_blocks > 0)
            snprintf(split, sizeof split, "stream-K %d blocks over %d tiles%s", pl->sk_blocks, pl->sk_tiles,
                     pl->sk_fixup ? " + fixup grid" : "");
        else
            snprintf(split, sizeof split, "%d K split%s, grid %dx%dx%d", pl->splits, pl->splits > 1 ? "s" : "",
                     pl->grid[0], pl->grid[1], pl->grid[2]);
        n = snprintf(buf, size,
                     "%s (the %s %d x %d tile, %d stages, the MoE launch's identity routing), %s, %d threads, %d "
                     "bytes shared, %d block%s/SM",
                     w4a16_kernel_kind_name(pl->kind), w4a16_moe_tile_ws(tile) ? "warp-specialised" : "MoE kernel's",
                     w4a16_moe_tile_rows(tile), w4a16_moe_tile_bn(tile), pl->stages, split, pl->threads, pl->smem_bytes,
                     pl->blocks_per_sm, pl->blocks_per_sm > 1 ? "s" : "");
    } else if (pl->kind == W4A16_KERNEL_MMA)
        n = snprintf(buf, size,
                     "%s config %d (%s, %d stages), stream-K %d blocks over %d tiles, grid %d, %d threads, "
                     "%d bytes shared, %d block%s/SM",
                     w4a16_kernel_kind_name(pl->kind), pl->cfg, w4a16_config(pl->cfg)->name, pl->stages, pl->sk_blocks,
                     pl->sk_tiles, pl->grid[0], pl->threads, pl->smem_bytes, pl->blocks_per_sm,
                     pl->blocks_per_sm > 1 ? "s" : "");
    else
        n = snprintf(buf, size,
                     "%s config %d (%s, %d stages), %d K split%s, grid %dx%dx%d, %d threads, "
                     "%d bytes shared, %d block%s/SM",
                     w4a16_kernel_kind_name(pl->kind), pl->cfg, w4a16_config(pl->cfg)->name, pl->stages, pl->splits,
                     pl->splits > 1 ? "s" : "", pl->grid[0], pl->grid[1], pl->grid[2], pl->threads, pl->smem_bytes,
                     pl->blocks_per_sm, pl->blocks_per_sm > 1 ? "s" : "");
    if (pl->carveout >= 0 && n > 0 && (size_t)n < size)
        snprintf(buf + n, size - n, ", carveout %d%% (emulated SM)", pl->carveout);
}
