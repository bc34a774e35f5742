/* Launch plans (csrc/plan.c), on the CPU with the kernels stubbed out:
 *  - regression: for every call of tests/plan_grid.h on every device there, the plan gives exactly the kernel, config,
 *    stages, K splits, grid and shared memory the library launched before the plan existed (tests/plan_recorded.txt);
 *  - emulation: a forced profile of an architecture with a smaller SM (sm120 or sm80 on an H100) plans exactly what a
 *    GPU of that architecture with the H100's SM count would, and says which carveout holds the SM to it;
 *  - invariants over the benchmark's shapes on the H100, an RTX 5090, an RTX PRO 6000, a GB10, an A100 and the
 *    emulated sm120 on an H100: the grid covers M and N, the splits cover K, never more blocks than the workspace
 *    has slots, the config's shared memory fits the device;
 *  - a few plans checked by hand, and the MoE tiles' shared memory and pipeline depth per device;
 *  - a profile forced on one thread while another plans: every plan is wholly one profile's (csrc/device.c's views). */
#include "../csrc/internal.h"
#include "../kernels/moe_launch.h"
#include "plan_grid.h"
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* after setjmp.h, stdarg.h and stddef.h, which cmocka.h needs but does not include */
#include <cmocka.h>

#ifndef PLAN_RECORDED
#define PLAN_RECORDED "tests/plan_recorded.txt"
#endif

static w4a16_device_state device_state(const plan_device *d) {
    w4a16_device_state st;
    memset(&st, 0, sizeof st);
    st.sm_count = d->sms;
    st.smem_optin = (size_t)d->smem_block;
    st.device_smem_per_sm = d->smem_block + 1024;
    st.smem_reserved = 1024;
    st.wgmma = d->wgmma;
    st.ws = d->ws;
    st.pdl = 1;
    st.smem_per_sm = st.device_smem_per_sm;
    st.carveout = -1;
    st.profile = w4a16_find_profile(d->profile);
    return st;
}

static const plan_device *find_device(const char *name) {
    for (int i = 0; i < PLAN_NUM_DEVICES; i++)
        if (strcmp(plan_devices[i].name, name) == 0) return &plan_devices[i];
    return NULL;
}

static const char *const ws_names[4] = {"none", "small", "part", "big"};

static size_t ws_bytes(int which, int sms, int N, int K) {
    const size_t off = w4a16_workspace_slab_offset(sms);
    const size_t all[4] = {0, w4a16_workspace_bytes_for(sms), off + ((size_t)N * K * 2) / 3, off + (size_t)N * K * 2};
    return all[which];
}

/* One line of the recorded format for a call planned on `st`. */
static void plan_line(const w4a16_device_state *st, const char *dev, int layout, int dt, int G, int ws, int M, int N,
                      int K, char *out, size_t size) {
    w4a16_plan pl;
    char what[160];
    w4a16_status s = w4a16_plan_gemm(st, layout, dt, M, N, K, ws_bytes(ws, st->sm_count, N, K), "test_plan", &pl);
    static const char *const kinds[] = {"decode8", "decode16", "mma",     "wgmma",   "staged",
                                        "rows64",  "rows32",   "rows128", "ws64",    "ws32",
                                        "rows16",  "rows16w",  "rows32n", "wgws128", "wgws64"};
    _Static_assert(sizeof kinds / sizeof kinds[0] == W4A16_KERNEL_WGWS64 + 1, "a name for every kernel kind");
    if (s != W4A16_OK)
        snprintf(what, sizeof what, "%s", w4a16_status_string(s));
    else if (pl.kind == W4A16_KERNEL_STAGED)
        snprintf(what, sizeof what, "staged nc=%d slabs=%d grid=%d", pl.slab_channels,
                 (N + pl.slab_channels - 1) / pl.slab_channels, pl.grid[0]);
    else if (pl.kind == W4A16_KERNEL_WGMMA)
        snprintf(what, sizeof what, "wgmma cfg=%d splits=%d sk=%d/%d grid=%d,%d,%d", pl.cfg, pl.splits, pl.sk_blocks,
                 pl.sk_tiles, pl.grid[0], pl.grid[1], pl.grid[2]);
    else if (W4A16_KERNEL_ROWS(pl.kind))
        snprintf(what, sizeof what, "%s st=%d splits=%d sk=%d/%d%s grid=%d,%d,%d smem=%d", kinds[pl.kind], pl.stages,
                 pl.splits, pl.sk_blocks, pl.sk_tiles, pl.sk_fixup ? "+fx" : "", pl.grid[0], pl.grid[1], pl.grid[2],
                 pl.smem_bytes);
    else if (pl.kind == W4A16_KERNEL_MMA)
        snprintf(what, sizeof what, "%s cfg=%d st=%d sk=%d/%d grid=%d smem=%d", kinds[pl.kind], pl.cfg, pl.stages,
                 pl.sk_blocks, pl.sk_tiles, pl.grid[0], pl.smem_bytes);
    else
        snprintf(what, sizeof what, "%s cfg=%d st=%d splits=%d grid=%d,%d,%d smem=%d", kinds[pl.kind], pl.cfg,
                 pl.stages, pl.splits, pl.grid[0], pl.grid[1], pl.grid[2], pl.smem_bytes);
    snprintf(out, size, "%s %s %s G=%d ws=%s M=%d N=%d K=%d: %s", dev, layout ? "marlin" : "awq", dt ? "bf16" : "fp16",
             G, ws_names[ws], M, N, K, what);
}

static uint64_t fnv(uint64_t h, const char *s) {
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* FNV-1a 64 of every line of the grid for one device, layout and dtype, in the recorder's order. */
static uint64_t grid_hash(const w4a16_device_state *st, const char *dev, int layout, int dt) {
    uint64_t h = 0xcbf29ce484222325ULL;
    char line[256];
    for (int l = 0; l < W4A16_NUM_LAYERS + PLAN_NUM_EXTRA; l++) {
        const int K = l < W4A16_NUM_LAYERS ? w4a16_layers[l].K : plan_extra[l - W4A16_NUM_LAYERS].K;
        const int N = l < W4A16_NUM_LAYERS ? w4a16_layers[l].N : plan_extra[l - W4A16_NUM_LAYERS].N;
        if (layout == W4A16_LAYOUT_MARLIN && K % 128) continue;
        for (int gi = 0; gi < PLAN_NUM_G; gi++) {
            const int G = plan_g[gi];
            if (G > 0 && K % G) continue;
            for (int ws = 0; ws < 4; ws++)
                for (int mi = 0; mi < PLAN_NUM_M; mi++) {
                    plan_line(st, dev, layout, dt, G, ws, plan_m[mi], N, K, line, sizeof line);
                    h = fnv(fnv(h, line), "\n");
                }
        }
    }
    return h;
}

/* One line of the recorded file as today's plans would write it: a hash line with the current grid hash, a plan line
 * with the current plan, anything else (comments) as it is. Returns 1 for a hash line, 2 for a plan line, 0 else. */
static int current_line(const char *buf, char *out, size_t size) {
    char dev[32], lay[16], dt[16], wsn[16], line[256];
    unsigned long long want;
    int G, M, N, K;
    if (sscanf(buf, "hash %31s %15s %15s %llx", dev, lay, dt, &want) == 4) {
        const plan_device *d = find_device(dev);
        assert_non_null(d);
        w4a16_device_state st = device_state(d);
        snprintf(out, size, "hash %s %s %s %016llx", dev, lay, dt,
                 (unsigned long long)grid_hash(&st, dev, strcmp(lay, "marlin") == 0, strcmp(dt, "bf16") == 0));
        return 1;
    }
    if (sscanf(buf, "line %31s %15s %15s G=%d ws=%15s M=%d N=%d K=%d:", dev, lay, dt, &G, wsn, &M, &N, &K) == 8) {
        int ws = 0;
        while (ws < 4 && strcmp(ws_names[ws], wsn) != 0) ws++;
        assert_true(ws < 4);
        w4a16_device_state st = device_state(find_device(dev));
        plan_line(&st, dev, strcmp(lay, "marlin") == 0, strcmp(dt, "bf16") == 0, G, ws, M, N, K, line, sizeof line);
        snprintf(out, size, "line %s", line);
        return 2;
    }
    snprintf(out, size, "%s", buf);
    return 0;
}

/* Every line of tests/plan_recorded.txt against today's plans. W4A16_PLAN_RECORD=<file> also writes today's lines
 * there (after a deliberate change of the launch decisions; the commit that changes them says why). */
static void test_recorded_decisions(void **state) {
    (void)state;
    FILE *f = fopen(PLAN_RECORDED, "r");
    if (!f) fail_msg("cannot open %s (run from the repository root)", PLAN_RECORDED);
    const char *record = getenv("W4A16_PLAN_RECORD");
    FILE *out = record ? fopen(record, "w") : NULL;
    if (record && !out) fail_msg("cannot open %s", record);
    char buf[512], now[512];
    int hashes = 0, lines = 0, bad = 0;
    while (fgets(buf, sizeof buf, f)) {
        buf[strcspn(buf, "\n")] = 0;
        const int kind = current_line(buf, now, sizeof now);
        if (out) fprintf(out, "%s\n", now);
        hashes += kind == 1;
        lines += kind == 2;
        if (strcmp(now, buf) == 0) continue;
        if (kind == 1)
            print_message("  plans differ from the recorded ones: %s\n", buf + 5);
        else
            print_message("  recorded: %s\n  planned:  %s\n", buf + 5, now + 5);
        bad++;
    }
    fclose(f);
    if (out) fclose(out);
    print_message("  %d hashed groups and %d lines compared\n", hashes, lines);
    assert_int_equal(hashes, PLAN_NUM_DEVICES * 4);
    assert_true(lines > 1000);
    assert_int_equal(bad, 0);
}

/* An H100 with a forced profile of a smaller SM plans what that architecture would with 132 SMs. */
static void test_forced_profile_emulates_its_sm(void **state) {
    (void)state;
    const struct {
        const char *profile, *as;
        int smem_per_sm, carveout;
    } cases[] = {
        {"sm120", "sm120-132", 102400, 43}, /* 43% of 228 KB = 98 KB: the hardware's next configuration is 100 KB */
        {"sm121", "sm120-132", 102400, 43},
        {"sm80", "sm80-132", 167936, 71}, /* 71% = 162 KB: next 164 KB */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        w4a16_device_state h100 = device_state(find_device("h100")), as = device_state(find_device(cases[i].as));
        w4a16_use_profile(&h100, w4a16_find_profile(cases[i].profile), 1);
        assert_int_equal(h100.smem_per_sm, cases[i].smem_per_sm);
        assert_int_equal(h100.carveout, cases[i].carveout);
        as.profile = h100.profile;
        for (int layout = 0; layout < 2; layout++)
            for (int dt = 0; dt < 2; dt++)
                assert_true(grid_hash(&h100, "x", layout, dt) == grid_hash(&as, "x", layout, dt));
    }
    /* the native profile, or a forced one with an SM as large as the device's, runs on the device's own SM */
    w4a16_device_state h100 = device_state(find_device("h100"));
    w4a16_use_profile(&h100, w4a16_find_profile("sm90"), 1);
    assert_int_equal(h100.carveout, -1);
    w4a16_use_profile(&h100, w4a16_find_profile("sm100"), 1);
    assert_int_equal(h100.carveout, -1);
    w4a16_use_profile(&h100, w4a16_find_profile("sm120"), 0); /* reached by the fallback chain: not emulated */
    assert_int_equal(h100.carveout, -1);
    assert_int_equal(h100.smem_per_sm, 233472);
}

/* The GPUs the library targets, as the plan sees them (ws: the warp-specialised tiles' image loads there). */
static const struct {
    const char *name, *profile;
    int sms, smem_block, wgmma, ws;
    const char *forced;
} targets[] = {
    {"H100", "sm90", 132, 232448, 1, 1, NULL},          {"RTX 5090", "sm120", 170, 101376, 0, 1, NULL},
    {"RTX PRO 6000", "sm120", 188, 101376, 0, 1, NULL}, {"GB10", "sm121", 48, 101376, 0, 1, NULL},
    {"A100", "sm80", 108, 166912, 0, 0, NULL},          {"H100 as sm120", "sm90", 132, 232448, 1, 1, "sm120"},
};

/* The mma.sync tile kernel's stream-K (csrc/plan.c, kernels/gemm.cuh): the blocks cover every tile and k-tile once;
 * the shared tiles' blocks never outnumber the slots, keep at least 2 k-tiles each, share a tile among at most 16,
 * and the workspace holds their counters and two partial tiles per block. The block ranges are rebuilt as the kernel
 * computes them. */
static void check_stream_k(const w4a16_device_state *st, const w4a16_plan *pl, int M, int N, int K, int bm, int bn,
                           int bk, int ws, size_t counters, size_t partial_bytes) {
    const long long tiles = (long long)((M + bm - 1) / bm) * ((N + bn - 1) / bn);
    const int num_kt = (K + bk - 1) / bk, G = pl->sk_blocks;
    assert_int_equal(pl->splits, 1);
    assert_int_equal(pl->grid[1], 1);
    assert_int_equal(pl->grid[2], 1);
    assert_true(pl->grid[0] == G + tiles - pl->sk_tiles);
    if (ws == 0 || G == 0) {
        assert_int_equal(G, 0);
        assert_int_equal(pl->sk_tiles, 0);
        return;
    }
    assert_in_range(pl->sk_tiles, 1, tiles);
    assert_true(G <= st->sm_count * pl->blocks_per_sm);
    assert_true((size_t)pl->sk_tiles <= counters);
    assert_true(2 * (size_t)G * bm * bn * sizeof(float) <= partial_bytes);
    const long long total = (long long)pl->sk_tiles * num_kt;
    assert_true(total < 2147483647LL);
    const int q = (int)(total / G), rem = (int)(total % G);
    int covered = 0;
    for (int b = 0; b < G; b++) {
        const int start = b * q + b * rem / G, stop = (b + 1) * q + (b + 1) * rem / G;
        assert_true(start == covered); /* contiguous ranges, in block order */
        assert_true(stop - start >= 2);
        covered = stop;
    }
    assert_true(covered == total);
    for (int t = 0; t < pl->sk_tiles; t++) { /* blocks per tile */
        const long long x0 = (long long)t * num_kt, x1 = x0 + num_kt - 1;
        const long long b0 = ((x0 + 1) * G - 1) / total, b1 = ((x1 + 1) * G - 1) / total;
        assert_true(b1 - b0 + 1 <= 16);
    }
}

/* A plan on the MoE kernel's 16-row tiles (rows-16 / rows-16w) at M rows16_min_m .. small_max_m: 16 x 128 whole
 * tiles where they fill the profile's share of one wave of their slots (the AWQ layout's larger share), else in the
 * Marlin layout only 16 x 64 with the decode tiles' K split (the slots once, at least 512 k a split, the workspace
 * holding the splits' sums and a counter per tile). */
static void check_rows16_plan(const w4a16_device_state *st, const w4a16_plan *pl, int layout, int M, int N, int K,
                              int ws) {
    const w4a16_profile *p = st->profile;
    const int tile = w4a16_kernel_moe_tile(pl->kind);
    assert_true(p->rows16_min_m > 0 && M >= p->rows16_min_m && M <= p->mid32_max_m && K % 64 == 0);
    /* past the decode regime only where the decode tiles ran M 17-32 (narrow layers): 16 x 64, two row tiles */
    if (M > p->small_max_m) assert_int_equal(pl->kind, W4A16_KERNEL_ROWS16);
    assert_int_equal(pl->cfg, 16);
    assert_int_equal(pl->threads, W4A16_MOE_THREADS);
    assert_int_equal(pl->smem_bytes, w4a16_moe_smem_bytes(tile, layout, pl->stages));
    assert_true(pl->blocks_per_sm >= 1 && pl->blocks_per_sm <= 4);
    assert_true(pl->blocks_per_sm * (pl->smem_bytes + st->smem_reserved) <= st->smem_per_sm);
    assert_int_equal(pl->sk_blocks, 0);
    assert_int_equal(pl->grid[0], (M + 15) / 16);
    assert_int_equal(pl->grid[1], (N + w4a16_moe_tile_bn(tile) - 1) / w4a16_moe_tile_bn(tile));
    assert_int_equal(pl->grid[2], pl->splits);
    const int fill = layout == W4A16_LAYOUT_AWQ ? p->rows16_awq_wide_fill : p->rows16_wide_fill;
    const long long wide_tiles = (N + 127) / 128;
    if (pl->kind == W4A16_KERNEL_ROWS16W) {
        assert_int_equal(tile, W4A16_MOE_TILE_16x128);
        assert_int_equal(pl->splits, 1);
        assert_true(wide_tiles * 100 >= (long long)st->sm_count * pl->blocks_per_sm * fill);
        return;
    }
    assert_int_equal(pl->kind, W4A16_KERNEL_ROWS16);
    assert_int_equal(tile, W4A16_MOE_TILE_16x64);
    assert_int_equal(layout, W4A16_LAYOUT_MARLIN);
    const long long tiles = (long long)pl->grid[0] * pl->grid[1], slots = (long long)st->sm_count * pl->blocks_per_sm;
    /* the 16 x 128 tile fell short of its fill (or fits no block): its slots by shared memory, four at most */
    const int smem128 = w4a16_moe_smem_bytes(W4A16_MOE_TILE_16x128, layout, pl->stages);
    int per128 = st->smem_per_sm / (smem128 + st->smem_reserved);
    if (per128 > 4) per128 = 4;
    if ((size_t)smem128 <= st->smem_optin && per128 > 0)
        assert_true(pl->grid[0] * wide_tiles * 100 < (long long)st->sm_count * per128 * fill);
    assert_in_range(pl->splits, 1, 16);
    if (ws == 0) assert_int_equal(pl->splits, 1);
    if (pl->splits > 1) {
        assert_true(tiles * pl->splits <= slots && tiles * 2 <= slots);
        assert_true((K + W4A16_MOE_SPLIT_BK - 1) / W4A16_MOE_SPLIT_BK >= pl->splits * (512 / W4A16_MOE_SPLIT_BK));
        assert_true(w4a16_workspace_counters_bytes(st->sm_count) +
                        (size_t)tiles * pl->splits * W4A16_MOE_SPLIT_TILE_BYTES <=
                    ws_bytes(ws, st->sm_count, N, K));
        assert_true(tiles <= (long long)(w4a16_workspace_counters_bytes(st->sm_count) / sizeof(int)));
    }
}

/* Whether a call meets rows-32n's rule (M 17-64 below the wgmma tiles, a workspace, at M 17-32 not a narrow layer:
 * mid32_narrow's count, at most mid32_min_tiles_per_8sm tiles of the mid32 config per 8 SMs; the 32 x 64 tile's K
 * split across blocks at least 2 splits of at most rows32n_max_split_k k; its blocks per SM: three by registers, fewer
 * where shared memory runs out): every rows-32n plan meets it, and no other plan may take such a call. */
static int rows32n_rule(const w4a16_device_state *st, int layout, int M, int N, int K, int ws) {
    const w4a16_profile *p = st->profile;
    if (p->rows32n_max_split_k <= 0 || ws == 0 || K % 64 || M <= p->small_max_m || M > p->mid_max_m) return 0;
    if (st->wgmma && p->wgmma_min_m > 0 && M >= p->wgmma_min_m) return 0;
    const w4a16_gemm_config *m32 = w4a16_config(p->mid32.cfg);
    if (M <= p->mid32_max_m && (long long)((M + w4a16_cfg_bm(m32) - 1) / w4a16_cfg_bm(m32)) *
                                       ((N + w4a16_cfg_bn(m32) - 1) / w4a16_cfg_bn(m32)) * 8 <=
                                   (long long)p->mid32_min_tiles_per_8sm * st->sm_count)
        return 0;
    const int smem =
        w4a16_moe_smem_bytes(W4A16_MOE_TILE_32x64, layout, w4a16_moe_stages(st, W4A16_MOE_TILE_32x64, layout));
    if ((size_t)smem > st->smem_optin) return 0;
    int per_sm = st->smem_per_sm / (smem + st->smem_reserved);
    per_sm = per_sm > 3 ? 3 : per_sm < 1 ? 1 : per_sm;
    const int tiles = (M + 31) / 32 * (N / 64), kt = (K + W4A16_MOE_SPLIT_BK - 1) / W4A16_MOE_SPLIT_BK;
    const int splits = w4a16_choose_splits(per_sm, tiles, kt, st->sm_count, 512 / W4A16_MOE_SPLIT_BK);
    return splits >= 2 && (K + splits - 1) / splits <= p->rows32n_max_split_k;
}

/* A rows-32n plan (the MoE kernel's 32 x 64 tile): a call that meets the rule, either layout, three blocks per SM at
 * most (its register budget) within the profile's SM, K split across blocks as rows-16 splits it (the slots once, at
 * least 512 k a split) into 2 or more splits of at most rows32n_max_split_k k. */
static int rows32n_plans;
static void check_rows32n_plan(const w4a16_device_state *st, const w4a16_plan *pl, int layout, int M, int N, int K,
                               int ws) {
    const w4a16_profile *p = st->profile;
    assert_true(rows32n_rule(st, layout, M, N, K, ws));
    assert_int_equal(pl->cfg, 32);
    assert_int_equal(pl->threads, W4A16_MOE_THREADS);
    assert_int_equal(pl->stages, w4a16_moe_stages(st, W4A16_MOE_TILE_32x64, layout));
    assert_int_equal(pl->smem_bytes, w4a16_moe_smem_bytes(W4A16_MOE_TILE_32x64, layout, pl->stages));
    assert_in_range(pl->blocks_per_sm, 1, 3);
    assert_true(pl->blocks_per_sm * (pl->smem_bytes + st->smem_reserved) <= st->smem_per_sm);
    assert_int_equal(pl->sk_blocks, 0);
    assert_int_equal(pl->grid[0], (M + 31) / 32);
    assert_int_equal(pl->grid[1], N / 64);
    const long long tiles = (long long)pl->grid[0] * (N / 64), slots = (long long)st->sm_count * pl->blocks_per_sm;
    assert_in_range(pl->splits, 2, 16);
    assert_true(tiles * pl->splits <= slots && tiles * 2 <= slots);
    assert_true((K + W4A16_MOE_SPLIT_BK - 1) / W4A16_MOE_SPLIT_BK >= pl->splits * (512 / W4A16_MOE_SPLIT_BK));
    assert_true((K + pl->splits - 1) / pl->splits <= p->rows32n_max_split_k);
    rows32n_plans++;
}

/* A stream-K plan of a MoE launch tile (rows x bn) over its t tiles, K deep, on `slots` block slots: no K split, every
 * tile shared, at least one block per SM and at most one per slot, each block at least min_kt k-tiles of 64, the
 * workspace (class ws) holding two partial tiles per block and a counter per tile. */
static void check_sk_plan(const w4a16_device_state *st, const w4a16_plan *pl, long long t, long long slots, int rows,
                          int bn, int min_kt, int N, int K, int ws) {
    assert_true(ws > 0 && min_kt > 0);
    assert_int_equal(pl->splits, 1);
    assert_int_equal(pl->sk_tiles, t);
    assert_in_range(pl->sk_blocks, st->sm_count, slots);
    assert_true(t * (K / 64) >= (long long)pl->sk_blocks * min_kt);
    assert_true(w4a16_workspace_counters_bytes(st->sm_count) + 2 * (size_t)pl->sk_blocks * rows * bn * sizeof(float) <=
                ws_bytes(ws, st->sm_count, N, K));
    assert_true(t <= (long long)(w4a16_workspace_counters_bytes(st->sm_count) / sizeof(int)));
}

/* A warp-specialised tile's plan (csrc/plan.c): only on a device with its image, in its profile's M regime, one
 * 384-thread block per SM within the shared memory its formula gives; whole tiles where they fill most of a wave and
 * of all the waves they take, else stream-K over one block per SM, each block enough k-tiles, the workspace holding
 * two partial tiles per block and a counter per tile. */
static int ws_plans_checked[3];  /* by warp rows 32, 64, 128 */
static int ws_fixups_checked[2]; /* parts added by the tile's last block (or whole tiles), by a second grid */
static void check_ws_plan(const w4a16_device_state *st, const w4a16_plan *pl, int layout, int M, int N, int K, int ws) {
    const w4a16_profile *p = st->profile;
    const int tile = w4a16_kernel_moe_tile(pl->kind), rows = w4a16_moe_tile_rows(tile);
    assert_true(st->ws && p->rows128_min_m > 0 && K % 64 == 0);
    if (w4a16_moe_tile_wgmma(tile)) /* the wgmma form: Hopper from wgws_min_m, N in whole 16-byte zero-point rows */
        assert_true(st->wgmma && p->wgws_min_m > 0 && M >= p->wgws_min_m && N % 32 == 0);
    else
        assert_false(st->wgmma && p->wgmma_min_m > 0 && M >= p->wgmma_min_m);
    if (rows == 32) assert_true(p->ws32_min_kt > 0 && M > p->small_max_m && M <= p->mid32_max_m);
    if (rows == 64) assert_true(p->ws64_sk_min_kt > 0 && M > p->mid32_max_m);
    if (rows == 128) assert_true(M >= p->rows128_min_m);
    ws_plans_checked[rows == 32 ? 0 : rows == 64 ? 1 : 2]++;
    assert_int_equal(pl->cfg, rows);
    assert_int_equal(pl->threads, W4A16_MOE_WS_THREADS);
    assert_int_equal(pl->blocks_per_sm, 1);
    assert_int_equal(pl->splits, 1);
    assert_int_equal(pl->stages, w4a16_moe_stages(st, tile, layout));
    assert_int_equal(pl->smem_bytes, w4a16_moe_smem_bytes(tile, layout, pl->stages));
    assert_true((size_t)pl->smem_bytes <= st->smem_optin);
    const long long t = (long long)pl->grid[0] * pl->grid[1], slots = st->sm_count;
    const int fx = p->ws_fixup_min_blocks_per_tile;
    assert_int_equal(pl->sk_fixup, pl->sk_blocks > 0 && fx > 0 && pl->sk_blocks >= (long long)fx * pl->sk_tiles);
    ws_fixups_checked[pl->sk_fixup]++;
    if (pl->sk_blocks == 0) {
        assert_true(t * 100 >= slots * p->rows64_min_fill);
        assert_true(t * 100 >= (t + slots - 1) / slots * slots * p->rows128_min_wave_fill);
        return;
    }
    const int min_kt = w4a16_moe_tile_wgmma(tile) ? p->wgws_sk_min_kt
                       : rows == 128              ? p->rows64_sk_min_kt
                       : rows == 64               ? p->ws64_sk_min_kt
                                                  : p->ws32_min_kt;
    check_sk_plan(st, pl, t, slots, rows, 256, min_kt, N, K, ws);
}

/* Every plan of the grid (each target, both with and without the warp-specialised tiles' image where it has them). */
static void test_plan_invariants(void **state) {
    (void)state;
    int checked = 0;
    for (size_t tw = 0; tw < 2 * sizeof targets / sizeof targets[0]; tw++) {
        const size_t t = tw / 2;
        if (tw % 2 && !targets[t].ws) continue;
        plan_device d = {targets[t].name,       targets[t].profile, targets[t].sms,
                         targets[t].smem_block, targets[t].wgmma,   (int)(tw % 2)};
        w4a16_device_state st = device_state(&d);
        if (targets[t].forced) w4a16_use_profile(&st, w4a16_find_profile(targets[t].forced), 1);
        const size_t partial_bytes =
            w4a16_workspace_bytes_for(st.sm_count) - w4a16_workspace_counters_bytes(st.sm_count);
        const size_t counters = w4a16_workspace_counters_bytes(st.sm_count) / sizeof(int);
        for (int l = 0; l < W4A16_NUM_LAYERS; l++)
            for (int mi = 0; mi < PLAN_NUM_M; mi++)
                for (int layout = 0; layout < 2; layout++)
                    for (int dt = 0; dt < 2; dt++)
                        for (int ws = 0; ws < 4; ws++) {
                            const int M = plan_m[mi], N = w4a16_layers[l].N, K = w4a16_layers[l].K;
                            w4a16_plan pl;
                            assert_int_equal(
                                w4a16_plan_gemm(&st, layout, dt, M, N, K, ws_bytes(ws, st.sm_count, N, K), "test", &pl),
                                W4A16_OK);
                            assert_int_equal(pl.carveout, st.carveout);
                            if (rows32n_rule(&st, layout, M, N, K, ws)) assert_int_equal(pl.kind, W4A16_KERNEL_ROWS32N);
                            if (pl.kind == W4A16_KERNEL_STAGED) {
                                assert_true(st.wgmma && ws >= 2 && M >= st.profile->staged_min_m);
                                assert_true(pl.slab_channels % W4A16_DENSE_BN == 0 || pl.slab_channels == N);
                                assert_in_range(pl.grid[0], 1, st.sm_count);
                                continue;
                            }
                            int bm, bn, bk, minb;
                            const int ws_tile =
                                W4A16_KERNEL_ROWS(pl.kind) && w4a16_moe_tile_ws(w4a16_kernel_moe_tile(pl.kind));
                            if (!ws_tile) assert_int_equal(pl.sk_fixup, 0); /* only those tiles have the fixup grid */
                            if (ws_tile) {
                                check_ws_plan(&st, &pl, layout, M, N, K, ws);
                                bm = W4A16_KERNEL_ROWS(pl.kind), bn = 256, bk = 64, minb = 1;
                            } else if (pl.kind == W4A16_KERNEL_ROWS32N) {
                                check_rows32n_plan(&st, &pl, layout, M, N, K, ws);
                                bm = 32, bn = 64, bk = W4A16_MOE_SPLIT_BK, minb = 3;
                            } else if (W4A16_KERNEL_ROWS(pl.kind) == 16) {
                                check_rows16_plan(&st, &pl, layout, M, N, K, ws);
                                bn = w4a16_moe_tile_bn(w4a16_kernel_moe_tile(pl.kind));
                                bm = 16, bk = bn == 64 ? W4A16_MOE_SPLIT_BK : 64, minb = 4;
                            } else if (W4A16_KERNEL_ROWS(pl.kind)) {
                                /* the MoE kernel's tiles: never where a wgmma tile runs, K whole */
                                const int rows = W4A16_KERNEL_ROWS(pl.kind), r64 = rows == 64;
                                const int tile = w4a16_kernel_moe_tile(pl.kind);
                                assert_false(st.wgmma && st.profile->wgmma_min_m > 0 && M >= st.profile->wgmma_min_m);
                                assert_true(K % 64 == 0 && M > st.profile->small_max_m);
                                bm = rows, bn = w4a16_moe_tile_bn(tile), bk = 64, minb = r64 ? 2 : 3;
                                assert_int_equal(pl.cfg, rows);
                                assert_int_equal(pl.threads, W4A16_MOE_THREADS);
                                assert_int_equal(pl.smem_bytes, w4a16_moe_smem_bytes(tile, layout, pl.stages));
                                assert_true(pl.blocks_per_sm * (pl.smem_bytes + st.smem_reserved) <= st.smem_per_sm);
                                const long long t = (long long)pl.grid[0] * pl.grid[1],
                                                slots = (long long)st.sm_count * pl.blocks_per_sm;
                                const int mid32 = M <= st.profile->mid32_max_m;
                                if (r64 && pl.sk_blocks > 0) {
                                    /* stream-K where whole tiles would leave the slots partly idle: with a
                                     * workspace, at least one block per SM, at most one per slot, each at least
                                     * rows64_sk_min_kt k-tiles; the workspace holds two partial tiles per block and a
                                     * counter per tile; the launch's grid still counts the tiles */
                                    assert_true(!mid32);
                                    check_sk_plan(&st, &pl, t, slots, 64, 256, st.profile->rows64_sk_min_kt, N, K, ws);
                                    assert_false(t * 100 >= slots * st.profile->rows64_min_fill &&
                                                 t * 100 >= (t + slots - 1) / slots * slots *
                                                                st.profile->rows64_min_wave_fill);
                                } else if (r64) {
                                    /* past the 32-row regime; its tiles fill most of a wave and of all they take */
                                    assert_true(st.profile->rows64_min_fill > 0 && !mid32);
                                    assert_true(t * 100 >= slots * st.profile->rows64_min_fill);
                                    assert_true(t * 100 >=
                                                (t + slots - 1) / slots * slots * st.profile->rows64_min_wave_fill);
                                } else if (pl.sk_blocks > 0) {
                                    /* rows-32 in the mid32 regime with more than one wave of whole tiles filling
                                     * under rows32_sk_wave_fill percent of them: stream-K over its slots, at least
                                     * one block per SM, each at least rows32_sk_min_kt k-tiles, the workspace holding
                                     * two partial 32 x 128 tiles per block and a counter per tile */
                                    assert_true(mid32 && K <= st.profile->rows32_max_k && t > slots);
                                    assert_true(t * 100 <
                                                (t + slots - 1) / slots * slots * st.profile->rows32_sk_wave_fill);
                                    check_sk_plan(&st, &pl, t, slots, 32, 128, st.profile->rows32_sk_min_kt, N, K, ws);
                                } else {
                                    /* short K; mid2 M in one wave at most, mid32 M filling half a wave at least, and
                                     * the AWQ layout from the mid32 regime on in one wave */
                                    const int mid2 = M > st.profile->mid_max_m && M <= st.profile->mid2_max_m;
                                    const int awq = layout == W4A16_LAYOUT_AWQ && M <= st.profile->mid2_max_m;
                                    assert_true(mid2 || mid32 || awq);
                                    assert_true(K <= st.profile->rows32_max_k);
                                    assert_true(mid32 ? t * 2 >= slots || (awq && t <= slots) : t <= slots);
                                }
                            } else if (pl.kind == W4A16_KERNEL_WGMMA) {
                                assert_true(st.wgmma && st.profile->wgmma_min_m > 0 && M >= st.profile->wgmma_min_m);
                                bm = w4a16_wgmma_tm(pl.cfg), bn = w4a16_wgmma_bn(pl.cfg), bk = 64;
                                minb = w4a16_wgmma_minb(pl.cfg);
                                assert_int_equal(pl.threads, w4a16_wgmma_threads(pl.cfg));
                            } else {
                                const w4a16_gemm_config *c = w4a16_config(pl.cfg);
                                assert_non_null(c);
                                bm = w4a16_cfg_bm(c), bn = w4a16_cfg_bn(c), bk = w4a16_cfg_bk(c), minb = c->minb;
                                assert_int_equal(pl.threads, w4a16_cfg_threads(c));
                                assert_int_equal(pl.kind == W4A16_KERNEL_MMA, !w4a16_cfg_is_decode(c));
                                if (pl.kind == W4A16_KERNEL_DECODE8) assert_true(M <= 8);
                                if (pl.kind == W4A16_KERNEL_DECODE16) assert_true(M > 8);
                                /* the tile fits a block, and its resident blocks fit the (emulated) SM */
                                assert_true((size_t)pl.smem_bytes <= st.smem_optin);
                                assert_true(pl.blocks_per_sm * (pl.smem_bytes + st.smem_reserved) <= st.smem_per_sm);
                            }
                            assert_in_range(pl.blocks_per_sm, 1, minb);
                            if (pl.kind == W4A16_KERNEL_WGMMA && pl.sk_blocks > 0) {
                                /* wgmma stream-K: only where the tiles take no K split and the profile allows it */
                                assert_true(st.profile->wgmma_sk_overhead_kt > 0);
                                check_stream_k(&st, &pl, M, N, K, bm, bn, bk, ws, counters, partial_bytes);
                                checked++;
                                continue;
                            }
                            if (pl.kind == W4A16_KERNEL_MMA) {
                                check_stream_k(&st, &pl, M, N, K, bm, bn, bk, ws, counters, partial_bytes);
                                checked++;
                                continue;
                            }
                            /* the grid covers M and N exactly, the splits cover K */
                            assert_true(pl.grid[0] * bm >= M && (pl.grid[0] - 1) * bm < M);
                            assert_true(pl.grid[1] * bn >= N && (pl.grid[1] - 1) * bn < N);
                            assert_int_equal(pl.grid[2], pl.splits);
                            const int num_kt = (K + bk - 1) / bk;
                            assert_in_range(pl.splits, 1, num_kt < 16 ? num_kt : 16);
                            if (ws == 0) assert_int_equal(pl.splits, 1);
                            if (pl.splits > 1) {
                                const long long tiles = (long long)pl.grid[0] * pl.grid[1];
                                /* never more blocks than slots; the workspace holds their counters and partials */
                                assert_true(tiles * pl.splits <= (long long)st.sm_count * pl.blocks_per_sm);
                                assert_true((size_t)tiles <= counters);
                                assert_true((size_t)tiles * pl.splits * bm * bn * sizeof(float) <= partial_bytes);
                                assert_true(num_kt / pl.splits >= 2);
                            }
                            checked++;
                        }
    }
    print_message("  %d plans checked; warp-specialised tiles of 32 / 64 / 128 rows: %d / %d / %d\n", checked,
                  ws_plans_checked[0], ws_plans_checked[1], ws_plans_checked[2]);
    for (int i = 0; i < 3; i++) assert_true(ws_plans_checked[i] > 0);
    print_message("  of them whole or added by the last block / by a fixup grid: %d / %d\n", ws_fixups_checked[0],
                  ws_fixups_checked[1]);
    assert_true(ws_fixups_checked[0] > 0 && ws_fixups_checked[1] > 0);
    print_message("  rows-32n plans: %d\n", rows32n_plans);
    assert_true(rows32n_plans > 0);
}

/* A fp16 call planned on a described device (under `forced`, if given) with the small workspace, printed;
 * dense_only: with the profile's MoE-tile plans (rows-64 / rows-32 / rows-32n) switched off, to check the dense
 * kernels' plans. */
static w4a16_plan plan_on(const plan_device *d, const char *forced, int layout, int M, int N, int K, int dense_only) {
    w4a16_device_state st = device_state(d);
    if (forced) w4a16_use_profile(&st, w4a16_find_profile(forced), 1);
    w4a16_profile dense;
    if (dense_only) {
        dense = *st.profile;
        dense.rows64_min_fill = dense.rows32_max_k = dense.rows32n_max_split_k = 0;
        st.profile = &dense;
    }
    w4a16_plan pl;
    assert_int_equal(w4a16_plan_gemm(&st, layout, 0, M, N, K, w4a16_workspace_bytes_for(st.sm_count), "test", &pl),
                     W4A16_OK);
    char text[256];
    w4a16_plan_text(&pl, text, sizeof text);
    print_message("  %-13s %s M=%d N=%d K=%d: %s\n", d->name, layout ? "marlin" : "awq", M, N, K, text);
    return pl;
}

/* By hand (configs.h, profiles.c): llama3-8b.qkv (K = 4096, N = 6144) at M = 1 (and 16), AWQ fp16, small workspace.
 * The 128-k decode tile (64 x 2 channels, 4 warps) makes 48 tiles; 3 stages of 15616 bytes = 46848 bytes, so two
 * blocks fit a 100 KB SM (2 x 47872 <= 102400) and four fit the H100's 228 KB (the config allows 4). Splits: slots /
 * tiles, at most 16 and at least 2 of the 32 k-tiles each. At M = 16 the 16-token decode kernel (built for 3 blocks
 * per SM) runs the same tile, not the mma.sync tile kernel. */
static void test_hand_checked(void **state) {
    (void)state;
    const struct {
        plan_device d;
        const char *forced;
        int M, kind, cfg, splits, bps;
    } c[] = {
        /* slots / tiles: 340 / 48, 376 / 48, 96 / 48, 264 / 48 */
        {{"RTX 5090", "sm120", 170, 101376, 0, 0}, NULL, 1, W4A16_KERNEL_DECODE8, W4A16_CFG_DECODE, 7, 2},
        {{"RTX PRO 6000", "sm120", 188, 101376, 0, 0}, NULL, 1, W4A16_KERNEL_DECODE8, W4A16_CFG_DECODE, 7, 2},
        {{"GB10", "sm121", 48, 101376, 0, 0}, NULL, 1, W4A16_KERNEL_DECODE8, W4A16_CFG_DECODE, 2, 2},
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0}, "sm120", 1, W4A16_KERNEL_DECODE8, W4A16_CFG_DECODE, 5, 2},
        {{"RTX 5090", "sm120", 170, 101376, 0, 0}, NULL, 16, W4A16_KERNEL_DECODE16, W4A16_CFG_DECODE, 7, 2},
        {{"GB10", "sm121", 48, 101376, 0, 0}, NULL, 16, W4A16_KERNEL_DECODE16, W4A16_CFG_DECODE, 2, 2},
        /* A100: the deep decode tile (2 stages of 31232 bytes: 2 blocks per 164 KB SM; 256 k: 16 k-tiles, at least 4
         * each): 216 slots / 48 = 4 */
        {{"A100", "sm80", 108, 166912, 0, 0}, NULL, 1, W4A16_KERNEL_DECODE8, W4A16_CFG_DECODE_DEEP, 4, 2},
        /* H100: the deep decode tile with 3 stages (93696 bytes: 2 per SM), 264 slots / 48 = 5, 16 k-tiles / 4 = 4 */
        {{"H100", "sm90", 132, 232448, 1, 0}, NULL, 1, W4A16_KERNEL_DECODE8, W4A16_CFG_DECODE_DEEP, 4, 2},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const w4a16_plan pl = plan_on(&c[i].d, c[i].forced, W4A16_LAYOUT_AWQ, c[i].M, 6144, 4096, 0);
        assert_int_equal(pl.kind, c[i].kind);
        assert_int_equal(pl.cfg, c[i].cfg);
        assert_int_equal(pl.splits, c[i].splits);
        assert_int_equal(pl.blocks_per_sm, c[i].bps);
        assert_int_equal(pl.grid[0], 1);
        assert_int_equal(pl.grid[1], 48);
    }
}

/* A device whose profile one thread flips between its own (sm90) and a forced sm120 (an emulated smaller SM), as
 * w4a16_force_profile does, while this thread plans llama3-8b.qkv at M = 1 on the view it loads, as every GEMM call
 * does: each plan must be exactly that view's profile's, which differ in config, carveout, resident blocks and splits.
 * The writer flips only after the planner made two more plans, so each profile is planned with many times over. */
typedef struct flip_run {
    w4a16_device_views views;
    atomic_int done, planned;
    int flips;
} flip_run;

static void *flip_profiles(void *arg) {
    flip_run *r = arg;
    const w4a16_profile *sm90 = w4a16_find_profile("sm90"), *sm120 = w4a16_find_profile("sm120");
    for (int i = 1; i <= r->flips; i++) {
        const int seen = atomic_load(&r->planned);
        while (atomic_load(&r->planned) < seen + 2) continue;
        w4a16_publish_view(&r->views, w4a16_device_view(&r->views, i & 1 ? sm120 : sm90, i & 1));
    }
    atomic_store(&r->done, 1);
    return NULL;
}

static void test_forced_profile_while_planning(void **state) {
    (void)state;
    static flip_run r; /* zero: nothing published */
    r.flips = 100000;
    r.views.desc = device_state(find_device("h100"));
    const w4a16_profile *profiles[2] = {w4a16_find_profile("sm90"), w4a16_find_profile("sm120")};
    const size_t ws = w4a16_workspace_bytes_for(132);
    w4a16_plan want[2];
    for (int f = 0; f < 2; f++) {
        const w4a16_device_state *v = w4a16_device_view(&r.views, profiles[f], f);
        assert_int_equal(w4a16_plan_gemm(v, W4A16_LAYOUT_AWQ, 0, 1, 6144, 4096, ws, "test", &want[f]), W4A16_OK);
    }
    assert_true(want[0].cfg != want[1].cfg && want[0].carveout == -1 && want[1].carveout == 43);
    assert_true(want[0].splits != want[1].splits);
    w4a16_publish_view(&r.views, w4a16_device_view(&r.views, profiles[0], 0));
    pthread_t writer;
    assert_int_equal(pthread_create(&writer, NULL, flip_profiles, &r), 0);
    long plans[2] = {0, 0}, mixed = 0;
    while (!atomic_load(&r.done)) {
        const w4a16_device_state *v = w4a16_current_view(&r.views);
        const int f = v->profile == profiles[1];
        w4a16_plan pl;
        assert_int_equal(w4a16_plan_gemm(v, W4A16_LAYOUT_AWQ, 0, 1, 6144, 4096, ws, "test", &pl), W4A16_OK);
        if (memcmp(&pl, &want[f], sizeof pl) == 0)
            plans[f]++;
        else if (mixed++ < 3)
            print_message("  plan of a mixed view: config %d, carveout %d, %d blocks/SM, %d splits\n", pl.cfg,
                          pl.carveout, pl.blocks_per_sm, pl.splits);
        atomic_fetch_add(&r.planned, 1);
    }
    assert_int_equal(pthread_join(writer, NULL), 0);
    print_message("  %d flips: %ld plans with sm90, %ld with sm120 forced, %ld mixed\n", r.flips, plans[0], plans[1],
                  mixed);
    assert_int_equal(mixed, 0);
    assert_true(plans[0] > 0 && plans[1] > 0);
}

/* By hand: stream-K plans of the mma.sync tile kernel (configs.h, profiles.c, plan.c), Marlin fp16, small workspace,
 * the MoE-tile plans off (most of these shapes run rows-64 with stream-K now: test_hand_checked_rows).
 * Stage bytes: A BM x BK x 2 + weights (BK / 16) x 2 BN x 4 + scales (BK / 32) x BN x 2 + zeros (BK / 32) x BN / 2. */
static void test_hand_checked_stream_k(void **state) {
    (void)state;
    const struct {
        plan_device d;
        const char *forced;
        int M, N, K, cfg, stages, smem, sk_blocks, sk_tiles, grid;
    } c[] = {
        /* M 65-256 on sm120: the 128 x 256 tile (3 x 25856 bytes: one per 100 KB SM) since its 1 x 112 tiles x 64
         * k-tiles = 7168 >= 40 k-tiles x 170 slots; 112 tiles fill 66% of the 170 slots: all share them */
        {{"RTX 5090", "sm120", 170, 101376, 0, 0},
         NULL,
         128,
         28672,
         4096,
         W4A16_CFG_LARGE_MARLIN,
         3,
         77568,
         170,
         112,
         170},
        /* M 17-32 on sm120: the 32 x 256 tile (3 x 13568 bytes, one block per SM by its register budget); 24 tiles are
         * under half of 132 slots: each split 5 ways (132 / 24), no block straddles two */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0},
         "sm120",
         32,
         6144,
         4096,
         W4A16_CFG_WIDE32,
         3,
         40704,
         120,
         24,
         120},
        /* M 33-64 on sm120: the 64 x 128 tile (3 x 25856 bytes) splits K among its warps, so its tiles never share
         * K among blocks; 48 tiles are under half of 132 slots: each split 2 ways (132 / 48) */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0}, "sm120", 64, 6144, 4096, W4A16_CFG_MID, 3, 77568, 96, 48, 96},
        /* ... but 80 of them would fill 61% of the slots with no split: the 64 x 256 tile (4 x 17664 bytes), whose 40
         * tiles split 3 ways (132 / 40) */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0},
         "sm120",
         64,
         10240,
         8192,
         W4A16_CFG_WIDE64,
         4,
         70656,
         120,
         40,
         120},
        /* M > 256 on sm80: the 128 x 256 tile with 4 stages (103424 bytes: one per 164 KB SM); 4 x 8 = 32 tiles are
         * under half of the 108 slots (and too few for the 64-row tile: 8 x 8 = 64 < 85% of 2 x 108): each split 3
         * ways (108 / 32) */
        {{"A100", "sm80", 108, 166912, 0, 0}, NULL, 512, 2048, 8192, W4A16_CFG_LARGE_MARLIN, 4, 103424, 96, 32, 96},
        /* the 164 KB profiles take the 100 KB parts' tiles from M = 17 (v27): M 17-32 the 32 x 256 tile (not two
         * 16-row decode tiles), 16 tiles split 6 ways (108 / 16) ... */
        {{"A100", "sm80", 108, 166912, 0, 0}, NULL, 32, 4096, 4096, W4A16_CFG_WIDE32, 3, 40704, 96, 16, 96},
        /* ... M 65-256 the 64 x 256 tile with stream-K (not the 64 x 128 one, which splits K in the block: 64 tiles
         * on 108 SMs, none shared), 2 x 16 tiles split 3 ways (108 / 32) */
        {{"A100", "sm80", 108, 166912, 0, 0}, NULL, 128, 4096, 14336, W4A16_CFG_WIDE64, 4, 70656, 96, 32, 96},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const w4a16_plan pl = plan_on(&c[i].d, c[i].forced, W4A16_LAYOUT_MARLIN, c[i].M, c[i].N, c[i].K, 1);
        assert_int_equal(pl.kind, W4A16_KERNEL_MMA);
        assert_int_equal(pl.cfg, c[i].cfg);
        assert_int_equal(pl.stages, c[i].stages);
        assert_int_equal(pl.smem_bytes, c[i].smem);
        assert_int_equal(pl.blocks_per_sm, 1);
        assert_int_equal(pl.sk_blocks, c[i].sk_blocks);
        assert_int_equal(pl.sk_tiles, c[i].sk_tiles);
        assert_int_equal(pl.grid[0], c[i].grid);
    }
}

/* By hand: the H100's wgmma tile up to 256 tokens (csrc/plan.c plan_wgmma, v31). The 256-token tile runs M 129-256
 * except on a layer with few 128-channel tiles where its K split would leave each block at most 24 k-tiles of 64
 * (1536 k): there the 64-token tile takes over: Qwen2.5-7B qkv (N = 4608: 36 tiles, K = 3584 = 56 k-tiles, split 3
 * ways: 19 each) at M = 129, 192 and 256, not at M = 257 (two 256-token row tiles: 72 tiles, no split, 56 k-tiles
 * each: stream-K over the 132 SMs, test_hand_checked_wgmma_stream_k); Qwen2.5-72B o (K = 8192: 128 k-tiles in 2 splits,
 * 64 each) and a wide layer (Llama-3-8B gate_up, one split of 64 k-tiles) keep it at M = 192, as does a wide layer of
 * short K that it does not split (K = 1536). */
static void test_hand_checked_wgmma_t64(void **state) {
    (void)state;
    const struct {
        int M, N, K, cfg, splits, grid_m;
    } c[] = {
        {129, 4608, 3584, W4A16_WGMMA_T64, 2, 3},   {192, 4608, 3584, W4A16_WGMMA_T64, 2, 3},
        {256, 4608, 3584, W4A16_WGMMA_T64, 1, 4},   {257, 4608, 3584, W4A16_WGMMA_T256, 1, 132},
        {192, 8192, 8192, W4A16_WGMMA_T256, 2, 1},  {192, 28672, 4096, W4A16_WGMMA_T256, 1, 1},
        {192, 28672, 1536, W4A16_WGMMA_T256, 1, 1}, {128, 4608, 3584, W4A16_WGMMA_T64, 3, 2},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const plan_device h100 = {"H100", "sm90", 132, 232448, 1, 0};
        const w4a16_plan pl = plan_on(&h100, NULL, W4A16_LAYOUT_MARLIN, c[i].M, c[i].N, c[i].K, 0);
        assert_int_equal(pl.kind, W4A16_KERNEL_WGMMA);
        assert_int_equal(pl.cfg, c[i].cfg);
        assert_int_equal(pl.splits, c[i].splits);
        assert_int_equal(pl.grid[0], c[i].grid_m);
    }
}

/* By hand: the H100's wgmma stream-K (csrc/plan.c wgmma_plan). A one-block-per-SM plan without K split takes it where
 * (shared k-tiles per block + whole tiles' k-tiles after them + 22) <= 95% of (waves x k-tiles):
 * - Qwen2.5-72B qkv (N = 10240, K = 8192: 128 k-tiles) at M = 256: 80 tiles of 256 x 128 on 132 SMs, 77.6 + 22 against
 *   128: every tile shared (grid 132); at M = 512 160 tiles, 155.2 + 22 against 256: the same; at M = 1024 (17 MB of
 *   activations) 320 tiles, 2.42 waves: 56 + 132 shared (182.3 k-tiles a block) + 1 wave whole (128) + 22 against 384
 *   (87%): 132 blocks over 188 tiles, then 132 whole, grid 264;
 * - Qwen2.5-72B gate_up (N = 59136) at M = 256: 462 tiles, 3.5 waves: 66 + 132 shared (192 k-tiles a block) + 2 waves
 *   whole (256) + 22 = 470 against 4 x 128 = 512 (92%): 132 blocks over 198 tiles, then 264 whole, grid 396;
 * - Llama-3-8B gate_up (N = 28672, K = 4096: 64 k-tiles) at M = 128: 112 tiles of 128 x 256, 54.3 + 22 against 64:
 *   whole tiles (measured 1.20x with stream-K); Llama-3-8B qkv at M = 512: 96 tiles, 46.5 + 22 against 64: whole;
 * - an H100 PCIe (114 SMs), Qwen2.5-72B qkv at M = 256: 89.8 + 22 against 128: 114 blocks over 80 tiles;
 * - activations past 25 MiB (half the L2) need a prediction of at most 80%: Qwen3-32B down (N = 5120, K = 25600: 400
 *   k-tiles) at M = 1024 (52 MB): 160 tiles, 1.21 waves, 484.8 + 22 against 800 (63%): 132 blocks over 160 tiles; at
 *   M = 2048 (105 MB) 320 tiles, 2.42 waves, 969.7 + 22 against 1200 (83%): whole tiles; Qwen2.5-7B down (N = 3584,
 *   K = 18944: 296 k-tiles) at M = 1024 (39 MB): 112 tiles, 251 + 22 against 296 (92%): whole;
 * - no workspace: whole tiles. */
static void test_hand_checked_wgmma_stream_k(void **state) {
    (void)state;
    const plan_device h100 = {"H100", "sm90", 132, 232448, 1, 0}, pcie = {"H100 PCIe", "sm90", 114, 232448, 1, 0};
    const struct {
        const plan_device *d;
        int M, N, K, cfg, sk_blocks, sk_tiles, grid;
    } c[] = {
        {&h100, 256, 10240, 8192, W4A16_WGMMA_T256, 132, 80, 132},
        {&h100, 512, 10240, 8192, W4A16_WGMMA_T256, 132, 160, 132},
        {&h100, 1024, 10240, 8192, W4A16_WGMMA_T256, 132, 188, 264},
        {&h100, 256, 59136, 8192, W4A16_WGMMA_T256, 132, 198, 396},
        {&h100, 128, 28672, 4096, W4A16_WGMMA_T128, 0, 0, 1},
        {&h100, 512, 6144, 4096, W4A16_WGMMA_T256, 0, 0, 2},
        {&pcie, 256, 10240, 8192, W4A16_WGMMA_T256, 114, 80, 114},
        {&h100, 1024, 5120, 25600, W4A16_WGMMA_T256, 132, 160, 132},
        {&h100, 2048, 5120, 25600, W4A16_WGMMA_T256, 0, 0, 8},
        {&h100, 1024, 3584, 18944, W4A16_WGMMA_T256, 0, 0, 4},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const w4a16_plan pl = plan_on(c[i].d, NULL, W4A16_LAYOUT_MARLIN, c[i].M, c[i].N, c[i].K, 0);
        assert_int_equal(pl.kind, W4A16_KERNEL_WGMMA);
        assert_int_equal(pl.cfg, c[i].cfg);
        assert_int_equal(pl.splits, 1);
        assert_int_equal(pl.sk_blocks, c[i].sk_blocks);
        assert_int_equal(pl.sk_tiles, c[i].sk_tiles);
        assert_int_equal(pl.grid[0], c[i].grid);
    }
    w4a16_device_state st = device_state(&h100);
    w4a16_plan pl;
    assert_int_equal(w4a16_plan_gemm(&st, W4A16_LAYOUT_MARLIN, 0, 256, 10240, 8192, 0, "test", &pl), W4A16_OK);
    assert_int_equal(pl.sk_blocks, 0);
    assert_int_equal(pl.grid[1], 80);
}

/* By hand (kernels/moe.cu's tiles; the sizes are what the GPU tests' plans print): the MoE tiles' shared memory, and
 * the pipeline depth each device's profile gives them. The 64-row tile (64 x 256, 64 k per stage: 8192 bytes of
 * activations, 8192 of Marlin weights or 9216 of AWQ ones, 1024 + 256 of scale / zero rows) takes 52992 / 56064 bytes
 * with 3 stages: one block per 100 KB SM (102400 / (56064 + 1024) = 1), two with 2 stages (35328 / 37376 bytes), so
 * the 100 KB profiles run it with 2; the 164 KB A100 holds three at 3 stages, the H100 three at 4. The 16- and 32-row
 * tiles keep the profile's depth. */
static void test_moe_stages(void **state) {
    (void)state;
    assert_int_equal(w4a16_moe_smem_bytes(W4A16_MOE_TILE_64, W4A16_LAYOUT_MARLIN, 3), 52992);
    assert_int_equal(w4a16_moe_smem_bytes(W4A16_MOE_TILE_64, W4A16_LAYOUT_AWQ, 3), 56064);
    assert_int_equal(w4a16_moe_smem_bytes(W4A16_MOE_TILE_64, W4A16_LAYOUT_MARLIN, 2), 35328);
    assert_int_equal(w4a16_moe_smem_bytes(W4A16_MOE_TILE_64, W4A16_LAYOUT_AWQ, 2), 37376);
    assert_int_equal(w4a16_moe_smem_bytes(W4A16_MOE_TILE_16x64, W4A16_LAYOUT_MARLIN, 3), 26496);
    assert_int_equal(w4a16_moe_smem_bytes(W4A16_MOE_TILE_32, W4A16_LAYOUT_MARLIN, 3), 32768); /* the warps' reduction */
    /* 32 x 64: 3 stages of 12928 bytes; with 2 the warps' reduction (4 warps x 2 m16 tiles x 8 n8 blocks x 512) */
    assert_int_equal(w4a16_moe_smem_bytes(W4A16_MOE_TILE_32x64, W4A16_LAYOUT_MARLIN, 3), 38784);
    assert_int_equal(w4a16_moe_smem_bytes(W4A16_MOE_TILE_32x64, W4A16_LAYOUT_MARLIN, 2), 32768);
    const struct {
        plan_device d;
        const char *forced;
        int s64, s32n, s_other; /* stages of the 64-row tile, of the 32 x 64 one, of the others but 16 x 256 */
        int s16w[2]; /* of the 16 x 256 one (AWQ, Marlin): 4 x 2 AWQ stages (26112 bytes with the reserve) do not fit a
                        100 KB SM, so AWQ keeps 3 there (two blocks per SM: moe_tile16 takes 16 x 128 instead) */
    } c[] = {
        {{"RTX 5090", "sm120", 170, 101376, 0, 0}, NULL, 2, 2, 3, {3, 2}},
        {{"RTX PRO 6000", "sm120", 188, 101376, 0, 0}, NULL, 2, 2, 3, {3, 2}},
        {{"GB10", "sm121", 48, 101376, 0, 0}, NULL, 2, 2, 3, {3, 2}},
        {{"RTX 4090", "sm89", 128, 101376, 0, 0}, NULL, 2, 2, 3, {3, 2}},
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0}, "sm120", 2, 2, 3, {3, 2}},
        {{"A100", "sm80", 108, 166912, 0, 0}, NULL, 3, 3, 3, {3, 3}},
        {{"H100", "sm90", 132, 232448, 1, 0}, NULL, 4, 4, 4, {4, 4}},
        {{"B200", "sm100", 148, 232448, 0, 0}, NULL, 4, 4, 4, {4, 4}},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        w4a16_device_state st = device_state(&c[i].d);
        if (c[i].forced) w4a16_use_profile(&st, w4a16_find_profile(c[i].forced), 1);
        for (int layout = 0; layout < 2; layout++) {
            for (int tile = 0; tile < W4A16_MOE_TILES; tile++) {
                const int stages = w4a16_moe_stages(&st, tile, layout);
                const int smem = w4a16_moe_smem_bytes(tile, layout, stages);
                if (w4a16_moe_tile_wgmma(tile) && !st.wgmma) continue; /* never planned there */
                if (w4a16_moe_tile_ws(tile)) { /* the warp-specialised tiles: one block per SM, within its memory */
                    assert_true((size_t)smem <= st.smem_optin);
                    continue;
                }
                assert_int_equal(stages, tile == W4A16_MOE_TILE_64       ? c[i].s64
                                         : tile == W4A16_MOE_TILE_32x64  ? c[i].s32n
                                         : tile == W4A16_MOE_TILE_16x256 ? c[i].s16w[layout]
                                                                         : c[i].s_other);
                assert_true((size_t)smem <= st.smem_optin);
                /* the 4-warp 64-row tile keeps two blocks per SM wherever its depth allows, the 32 x 64 one three */
                if (tile == W4A16_MOE_TILE_64) assert_true(st.smem_per_sm / (smem + st.smem_reserved) >= 2);
                if (tile == W4A16_MOE_TILE_32x64) assert_true(st.smem_per_sm / (smem + st.smem_reserved) >= 3);
                /* and the 16 x 256 one, with 2 stages, four (its register budget, as the 16 x 128 tile holds them) */
                if (tile == W4A16_MOE_TILE_16x256 && stages == 2)
                    assert_true(st.smem_per_sm / (smem + st.smem_reserved) >= 4);
            }
        }
        print_message("  %-13s MoE stages: 64-row tile %d, 32 x 64 %d, 16 x 256 %d (AWQ %d), others %d\n", c[i].d.name,
                      c[i].s64, c[i].s32n, c[i].s16w[1], c[i].s16w[0], c[i].s_other);
    }
}

/* By hand: the MoE kernel's tiles for dense GEMMs, Marlin fp16, small workspace. The 64 x 256 tile
 * (W4A16_KERNEL_ROWS64; shared memory from test_moe_stages: 52992 bytes with 3 stages, 35328 with 2; on a 100 KB SM two
 * blocks fit only with 2 stages, on a 164 KB SM three fit with 3, counted as 2, its register budget) runs where its
 * tiles fill at least 85% of SMs x 2 slots (the same layer takes it on the H100's 132 SMs but not on an RTX 5090's 170)
 * and 70% of the waves they take. Else, for K <= 8192, the 32 x 128 tile (W4A16_KERNEL_ROWS32: 32768 bytes, the warps'
 * reduction buffer, at 3 stages; 3 blocks per SM): at M 65-256 where its tiles fit SMs x 3 slots, at M 17-32 (100 KB
 * profiles) where they fill at least half of them. */
static void test_hand_checked_rows(void **state) {
    (void)state;
    const struct {
        plan_device d;
        const char *forced;
        int M, N, K, rows, stages, smem, per_sm, splits, sk; /* sk: stream-K blocks (0: whole tiles) */
    } c[] = {
        /* 8 x 40 = 320 tiles >= 0.85 x 216: whole tiles */
        {{"A100", "sm80", 108, 166912, 0, 0}, NULL, 512, 10240, 8192, 64, 3, 52992, 2, 1, 0},
        /* 16 x 16 = 256 tiles >= 0.85 x 264 on 132 SMs ... */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0}, "sm120", 1024, 4096, 14336, 64, 2, 35328, 2, 1, 0},
        /* ... < 0.85 x 340 on 170: stream-K, one block per slot (256 x 224 k-tiles: 168 a block) */
        {{"RTX 5090", "sm120", 170, 101376, 0, 0}, NULL, 1024, 4096, 14336, 64, 2, 35328, 2, 1, 340},
        /* 64 x 16 = 1024 tiles: 4 waves of 340, 75% used */
        {{"RTX 5090", "sm120", 170, 101376, 0, 0}, NULL, 4096, 4096, 14336, 64, 2, 35328, 2, 1, 0},
        /* 2 x 112 = 224 < 0.85 x 340, and 4 x 224 = 896 32-row tiles > 3 x 170: stream-K */
        {{"RTX 5090", "sm120", 170, 101376, 0, 0}, NULL, 128, 28672, 4096, 64, 2, 35328, 2, 1, 340},
        /* 8 x 40 = 320 tiles on 264 slots: two waves, 61% of them used: stream-K */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0}, "sm120", 512, 10240, 8192, 64, 2, 35328, 2, 1, 264},
        /* 16 x 40 = 640: three waves, 81% */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0}, "sm120", 1024, 10240, 8192, 64, 2, 35328, 2, 1, 0},
        /* 4 x 32 = 128 32-row tiles <= 3 x 132, under half of them: K split 3 ways (396 / 128; 64 k-tiles), which keeps
         * the 32-row tile */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0}, "sm120", 128, 4096, 4096, 32, 3, 32768, 3, 3, 0},
        /* the same tiles, K past 8192: no 32-row plan; 2 x 16 = 32 64-row tiles x 224 k-tiles, stream-K */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0}, "sm120", 128, 4096, 14336, 64, 2, 35328, 2, 1, 264},
        /* 8 x 48 = 384 32-row tiles <= 3 x 170 would not split: 4 x 24 = 96 64-row tiles x 64 k-tiles, stream-K over
         * 340 blocks (18 k-tiles each) */
        {{"RTX 5090", "sm120", 170, 101376, 0, 0}, NULL, 256, 6144, 4096, 64, 2, 35328, 2, 1, 340},
        /* 8 x 80 = 640 > 3 x 132: 4 x 40 = 160 64-row tiles, stream-K */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0}, "sm120", 256, 10240, 8192, 64, 2, 35328, 2, 1, 264},
        /* M 17-32: 1 x 224 = 224 >= 3 x 132 / 2 ... */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0}, "sm120", 32, 28672, 4096, 32, 3, 32768, 3, 1, 0},
        /* ... 1 x 80 = 80 are not (nor does rows-32n take its 2 splits of 4096 k: test_hand_checked_rows32n) */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0}, "sm120", 32, 10240, 8192, 0, 0, 0, 0, 1, 0},
        /* 1 x 112 tiles x 64 k-tiles: stream-K over 264 slots (27 k-tiles each) ... */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0}, "sm120", 64, 28672, 4096, 64, 2, 35328, 2, 1, 264},
        /* ... or 340 (21 each) */
        {{"RTX 5090", "sm120", 170, 101376, 0, 0}, NULL, 64, 28672, 4096, 64, 2, 35328, 2, 1, 340},
        /* 1 x 24 tiles x 64 k-tiles make 96 blocks of 16, fewer than the SMs: no rows-64 */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0}, "sm120", 64, 6144, 4096, 0, 0, 0, 0, 1, 0},
        /* the H100's own profile runs wgmma there */
        {{"H100", "sm90", 132, 232448, 1, 0}, NULL, 4096, 4096, 14336, 0, 0, 0, 0, 1, 0},
        {{"H100", "sm90", 132, 232448, 1, 0}, NULL, 128, 4096, 4096, 0, 0, 0, 0, 1, 0},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const w4a16_plan pl = plan_on(&c[i].d, c[i].forced, W4A16_LAYOUT_MARLIN, c[i].M, c[i].N, c[i].K, 0);
        assert_int_equal(W4A16_KERNEL_ROWS(pl.kind), c[i].rows);
        if (!c[i].rows) continue;
        assert_int_equal(pl.stages, c[i].stages);
        assert_int_equal(pl.smem_bytes, c[i].smem);
        assert_int_equal(pl.blocks_per_sm, c[i].per_sm);
        assert_int_equal(pl.grid[0], c[i].M / c[i].rows);
        assert_int_equal(pl.grid[1], c[i].N / (c[i].rows == 64 ? 256 : 128));
        assert_int_equal(pl.splits, c[i].splits);
        assert_int_equal(pl.grid[2], c[i].splits);
        assert_int_equal(pl.sk_blocks, c[i].sk);
    }
    /* The AWQ layout takes the 32 x 128 tile at M 17-64 wherever its tiles fit a wave (at M 17-32 unless rows-32n
     * runs: test_hand_checked_rows32n): llama3-8b.qkv at M = 64 keeps the dense tile in the Marlin layout (above), and
     * in AWQ runs 2 x 48 tiles with K split 4 ways (396 / 96 slots; 64 k-tiles of at least 10 would allow 6) */
    plan_device d = {"H100 as sm120", "sm90", 132, 232448, 1, 0};
    w4a16_device_state st = device_state(&d);
    w4a16_use_profile(&st, w4a16_find_profile("sm120"), 1);
    w4a16_plan pl;
    assert_int_equal(
        w4a16_plan_gemm(&st, W4A16_LAYOUT_AWQ, 0, 64, 6144, 4096, w4a16_workspace_bytes_for(132), "test", &pl),
        W4A16_OK);
    assert_int_equal(pl.kind, W4A16_KERNEL_ROWS32);
    assert_int_equal(pl.grid[0] * pl.grid[1], 96);
    assert_int_equal(pl.splits, 4);
    /* ... and where a 32-row plan would split K fewer than 3 ways the 64 x 256 tile with stream-K: llama3-8b.o at
     * M = 512 is 8 x 16 = 128 tiles x 64 k-tiles over 264 blocks, in both layouts; without a workspace neither */
    for (int layout = 0; layout < 2; layout++) {
        assert_int_equal(w4a16_plan_gemm(&st, layout, 0, 512, 4096, 4096, w4a16_workspace_bytes_for(132), "test", &pl),
                         W4A16_OK);
        assert_int_equal(pl.kind, W4A16_KERNEL_ROWS64);
        assert_int_equal(pl.sk_blocks, 264);
        assert_int_equal(pl.sk_tiles, 128);
        assert_int_equal(w4a16_plan_gemm(&st, layout, 0, 512, 4096, 4096, 0, "test", &pl), W4A16_OK);
        assert_int_equal(pl.kind == W4A16_KERNEL_ROWS64, 0);
    }
}

/* By hand: the warp-specialised tiles on devices that load their image (sm90 / sm120 / sm121 profiles, both layouts).
 * The 128 x 256 one (W4A16_KERNEL_ROWS128: 3 stages of 128 x 64 x 2 + 4 x 2 x 256 x 4 + 2 x 256 x 2 + 2 x 32 x 4 =
 * 25856 bytes, 77568 bytes, one 384-thread block per SM) in the rows-64 plans from M = 65, whole tiles where they fill
 * 90% of the waves they take, else stream-K over one block per SM; below M = 65 the 64-row one (W4A16_KERNEL_WS64: 4
 * stages of 17664 bytes) where rows-64 would not run whole tiles, its stream-K blocks at least 4 k-tiles. At M 17-32,
 * where no rows-32 plan runs, the 32-row one (W4A16_KERNEL_WS32: 4 stages of 32 x 64 x 2 + 8192 + 1024 + 256 = 13568
 * bytes; AWQ 14592), whole tiles or stream-K blocks of at least 8 k-tiles. */
static void test_hand_checked_rows128(void **state) {
    (void)state;
    enum {
        R128 = W4A16_KERNEL_ROWS128,
        R64 = W4A16_KERNEL_ROWS64,
        WS64 = W4A16_KERNEL_WS64,
        WS32 = W4A16_KERNEL_WS32,
        R32 = W4A16_KERNEL_ROWS32,
        MMA = W4A16_KERNEL_MMA,
        DEC8 = W4A16_KERNEL_DECODE8,
        DEC16 = W4A16_KERNEL_DECODE16
    };
    const struct {
        plan_device d;
        const char *forced;
        int layout, M, N, K, kind, grid0, grid1, sk; /* sk: stream-K blocks (0: whole tiles) */
    } c[] = {
        /* 32 x 112 = 3584 tiles on 132 SMs: 28 waves, 97% used: whole tiles */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1},
         "sm120",
         W4A16_LAYOUT_MARLIN,
         4096,
         28672,
         4096,
         R128,
         32,
         112,
         0},
        /* 8 x 24 = 192 tiles: two waves, 73% used (rows-64's 70% would keep whole tiles): stream-K over 132 blocks */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1},
         "sm120",
         W4A16_LAYOUT_MARLIN,
         1024,
         6144,
         4096,
         R128,
         8,
         24,
         132},
        /* 4 x 16 = 64 tiles under 85% of 170: stream-K over 170 */
        {{"RTX 5090", "sm120", 170, 101376, 0, 1}, NULL, W4A16_LAYOUT_MARLIN, 512, 4096, 14336, R128, 4, 16, 170},
        /* 1 x 16 tiles of 128 rows at M = 65 (30 k-tiles of 64 each on 48 SMs: stream-K) */
        {{"GB10", "sm121", 48, 101376, 0, 1}, NULL, W4A16_LAYOUT_MARLIN, 65, 4096, 8192, R128, 1, 16, 48},
        /* M = 64: rows-64 would share 112 tiles x 64 k-tiles among 264 slots; ws-64 shares them among 132 */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1},
         "sm120",
         W4A16_LAYOUT_MARLIN,
         64,
         28672,
         4096,
         WS64,
         1,
         112,
         132},
        /* 16 tiles x 128 k-tiles: 2048 / 16 = 128 rows-64 blocks are fewer than the SMs; ws-64 blocks of 15-16 k-tiles
         * (at K = 4096 rows-32n: test_hand_checked_rows32n) */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_MARLIN, 48, 4096, 8192, WS64, 1, 16, 132},
        /* M = 128 on a narrow layer: 16 rows-128 tiles x 64 k-tiles make 64 blocks of 16, fewer than the SMs (and the
         * 32-row plan splits K 3 ways); 32 ws-64 tiles shared among 132 blocks of 15-16 k-tiles */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_MARLIN, 128, 4096, 4096, WS64, 2, 16, 132},
        /* 231 rows-64 tiles would fill 87% of 264 slots whole; ws-64 shares them among 132 blocks (v48) */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1},
         "sm120",
         W4A16_LAYOUT_MARLIN,
         64,
         59136,
         8192,
         WS64,
         1,
         231,
         132},
        /* the AWQ layout too (4 x 16 tiles: stream-K); the device without the image and the sm80 profile on the H100
         * (no image on an sm_80): 64 x 256 */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_AWQ, 512, 4096, 4096, R128, 4, 16, 132},
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0}, "sm120", W4A16_LAYOUT_MARLIN, 512, 4096, 4096, R64, 8, 16, 264},
        {{"H100 as sm80", "sm90", 132, 232448, 1, 1}, "sm80", W4A16_LAYOUT_MARLIN, 4096, 28672, 4096, R64, 64, 112, 0},
        /* without the image the M = 48 layer above has no 64-row plan (the mma.sync tile kernel) */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0}, "sm120", W4A16_LAYOUT_MARLIN, 48, 4096, 8192, MMA, -1, -1, -1},
        /* M = 32, AWQ, K past rows32_max_k: 32 tiles x 462 k-tiles, stream-K over 170 blocks */
        {{"RTX 5090", "sm120", 170, 101376, 0, 1}, NULL, W4A16_LAYOUT_AWQ, 32, 8192, 29568, WS32, 1, 32, 170},
        /* M = 24: 48 tiles on 48 SMs, whole */
        {{"GB10", "sm121", 48, 101376, 0, 1}, NULL, W4A16_LAYOUT_MARLIN, 24, 12288, 14336, WS32, 1, 48, 0},
        /* the native Hopper profile too, below its wgmma tiles (M = 24: 24 tiles x 224 k-tiles, 40-41 a block; at
         * K = 4096 rows-32n runs there, test_hand_checked_rows32n) */
        {{"H100", "sm90", 132, 232448, 1, 1}, NULL, W4A16_LAYOUT_MARLIN, 24, 6144, 14336, WS32, 1, 24, 132},
        /* 16 tiles x 64 k-tiles would give 132 blocks under 8 each: the decode tiles of narrow layers (AWQ; the
         * Marlin layout's run the 16-row MoE tile there, test_hand_checked_rows16) */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_AWQ, 32, 4096, 4096, DEC16, -1, -1, -1},
        /* a wide layer keeps its rows-32 plan (with stream-K here: test_hand_checked_rows32_sk) */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_MARLIN, 32, 59136, 8192, R32, -1, -1, -1},
        /* M = 16 in the AWQ layout where 16 x 128 tiles fill under 60% of their slots stays on the decode kernel
         * (test_hand_checked_rows16), and M 17-32 without the image */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_AWQ, 16, 28672, 4096, DEC16, -1, -1, -1},
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0}, "sm120", W4A16_LAYOUT_MARLIN, 24, 10240, 8192, MMA, -1, -1, -1},
        /* M = 8 stays on the decode kernel; without the image AWQ's M = 16 too */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_MARLIN, 8, 4096, 4096, DEC8, -1, -1, -1},
        {{"H100 as sm120", "sm90", 132, 232448, 1, 0}, "sm120", W4A16_LAYOUT_AWQ, 16, 4096, 4096, DEC16, -1, -1, -1},
    };
    /* without a workspace, where the warp-specialised tiles would need stream-K (200 128-row tiles under 90% of two
     * waves, 400 64-row ones under 90% of four), rows-64's 400 whole tiles (76% of two waves of 264 slots) */
    {
        plan_device d = {"H100 as sm120", "sm90", 132, 232448, 1, 1};
        w4a16_device_state st = device_state(&d);
        w4a16_use_profile(&st, w4a16_find_profile("sm120"), 1);
        w4a16_plan pl;
        assert_int_equal(w4a16_plan_gemm(&st, W4A16_LAYOUT_MARLIN, 0, 1280, 5120, 4096, 0, "test", &pl), W4A16_OK);
        assert_int_equal(pl.kind, W4A16_KERNEL_ROWS64);
        assert_int_equal(pl.grid[0] * pl.grid[1], 400);
        assert_int_equal(pl.sk_blocks, 0);
    }
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const w4a16_plan pl = plan_on(&c[i].d, c[i].forced, c[i].layout, c[i].M, c[i].N, c[i].K, 0);
        assert_int_equal(pl.kind, c[i].kind);
        if (c[i].kind == MMA || c[i].kind == DEC8 || c[i].kind == DEC16 || c[i].kind == R32) continue;
        assert_int_equal(pl.grid[0], c[i].grid0);
        assert_int_equal(pl.grid[1], c[i].grid1);
        assert_int_equal(pl.sk_blocks, c[i].sk);
        if (c[i].kind != R64) { /* both layouts' stages: 26 / 18 / 14 KB on 1024-byte atoms, + 1 KB to align */
            const int k = c[i].kind;
            assert_int_equal(pl.stages, k == R128 ? 3 : 4);
            assert_int_equal(pl.smem_bytes, k == R128 ? 80896 : k == WS64 ? 74752 : 58368);
            assert_int_equal(pl.threads, 384);
            assert_int_equal(pl.blocks_per_sm, 1);
            assert_int_equal(pl.splits, 1);
        }
    }
}

/* By hand: the warp-specialised tiles' stream-K parts are added by a second grid where the blocks number two or more
 * per tile (ws_fixup_min_blocks_per_tile), else by each tile's last block; the text says which. */
static void test_hand_checked_ws_fixup(void **state) {
    (void)state;
    const plan_device h100 = {"H100", "sm90", 132, 232448, 1, 1}, r5090 = {"RTX 5090", "sm120", 170, 101376, 0, 1};
    const struct {
        const plan_device *d;
        const char *forced;
        int M, N, K, kind, tiles, fixup;
    } c[] = {
        /* llama3-8b.down at M = 128: 16 rows-128 tiles on 132 blocks, 8.25 a tile; llama3-8b.o: 32 ws-64 tiles (the
         * 128-row ones would give their blocks under 16 k-tiles), 4.1 a tile */
        {&h100, "sm120", 128, 4096, 14336, W4A16_KERNEL_ROWS128, 16, 1},
        {&h100, "sm120", 128, 4096, 4096, W4A16_KERNEL_WS64, 32, 1},
        /* llama3-8b.gate_up at M = 128: 112 rows-128 tiles on 132 blocks, 1.2 a tile: the last block adds */
        {&h100, "sm120", 128, 28672, 4096, W4A16_KERNEL_ROWS128, 112, 0},
        /* test_selfref_ws_tiles' fixup shape: a partial row tile and a half channel tile, 18 tiles on 132 blocks */
        {&h100, "sm120", 120, 256 * 17 + 128, 8192, W4A16_KERNEL_ROWS128, 18, 1},
        /* the boundary: 66 tiles on 132 blocks, then 67 */
        {&h100, "sm120", 128, 66 * 256, 8192, W4A16_KERNEL_ROWS128, 66, 1},
        {&h100, "sm120", 128, 67 * 256, 8192, W4A16_KERNEL_ROWS128, 67, 0},
        /* the wgmma form natively, and an RTX 5090 (4 x 16 tiles on 170 blocks) */
        {&h100, NULL, 128, 4096, 14336, W4A16_KERNEL_WGWS128, 16, 1},
        {&r5090, NULL, 512, 4096, 14336, W4A16_KERNEL_ROWS128, 64, 1},
        /* ws-32 at M = 24: 24 tiles x 224 k-tiles on 132 blocks */
        {&h100, NULL, 24, 6144, 14336, W4A16_KERNEL_WS32, 24, 1},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const w4a16_plan pl = plan_on(c[i].d, c[i].forced, W4A16_LAYOUT_MARLIN, c[i].M, c[i].N, c[i].K, 0);
        assert_int_equal(pl.kind, c[i].kind);
        assert_int_equal(pl.sk_tiles, c[i].tiles);
        assert_true(pl.sk_blocks > 0);
        assert_int_equal(pl.sk_fixup, c[i].fixup);
        char text[256];
        w4a16_plan_text(&pl, text, sizeof text);
        assert_int_equal(strstr(text, "+ fixup grid") != NULL, c[i].fixup);
    }
}

/* By hand: M 9-16 on the MoE kernel's 16-row tiles. 16 x 128 (W4A16_KERNEL_ROWS16W: 3 stages of 16 x 64 x 2 + 4 x 2 x
 * 128 x 4 + 2 x 128 x 2 + 2 x 16 x 4 = 6784 bytes (Marlin), four blocks per 100 KB SM) where its tiles fill 40% of a
 * wave of its slots (AWQ: 60%), whole; else in the Marlin layout 16 x 64 (W4A16_KERNEL_ROWS16: 3 stages of 16 x 128 x 2
 * + 8 x 2 x 64 x 4 + 4 x 64 x 2 + 4 x 8 x 4 = 8832 bytes, three per SM) with the decode tiles' K split, also at M
 * 17-32 where narrow layers run the decode tiles; the AWQ layout's narrow layers keep the decode kernel. */
static void test_hand_checked_rows16(void **state) {
    (void)state;
    enum {
        R16 = W4A16_KERNEL_ROWS16,
        R16W = W4A16_KERNEL_ROWS16W,
        DEC8 = W4A16_KERNEL_DECODE8,
        DEC16 = W4A16_KERNEL_DECODE16
    };
    const struct {
        plan_device d;
        const char *forced;
        int layout, M, N, K, kind, grid1, splits, per_sm;
    } c[] = {
        /* 224 tiles of 16 x 128 on 4 x 132 slots: 42% */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_MARLIN, 16, 28672, 4096, R16W, 224, 1, 4},
        /* the AWQ layout there: under 60%, the decode kernel; 462 tiles (88%): 16 x 128 */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_AWQ, 16, 28672, 4096, DEC16, 0, 0, 0},
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_AWQ, 16, 59136, 8192, R16W, 462, 1, 4},
        /* 32 tiles of 16 x 128 (6%): 64 tiles of 16 x 64 on 3 x 132 slots, 6 K splits of 5-6 k-tiles of 128 */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_MARLIN, 16, 4096, 4096, R16, 64, 6, 3},
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_MARLIN, 9, 4096, 4096, R16, 64, 6, 3},
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_AWQ, 16, 4096, 4096, DEC16, 0, 0, 0},
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_MARLIN, 8, 4096, 4096, DEC8, 0, 0, 0},
        /* M = 32 on that narrow layer (the decode tiles' regime there): two row tiles of 16 x 64, 128 tiles, 3 splits
         */
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_MARLIN, 32, 4096, 4096, R16, 64, 3, 3},
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_AWQ, 32, 4096, 4096, DEC16, 0, 0, 0},
        /* the native Hopper profile: 4 stages, four 16 x 64 blocks per SM, 8 splits of 4 k-tiles (528 slots / 64
         * tiles, at least 4 k-tiles each) */
        {{"H100", "sm90", 132, 232448, 1, 1}, NULL, W4A16_LAYOUT_MARLIN, 12, 4096, 4096, R16, 64, 8, 4},
        /* an RTX 5090, Qwen2.5-7B's gate_up (N = 37888, K = 3584): 296 tiles of 16 x 128 on 680 slots (44%) */
        {{"RTX 5090", "sm120", 170, 101376, 0, 1}, NULL, W4A16_LAYOUT_MARLIN, 16, 37888, 3584, R16W, 296, 1, 4},
        /* GB10, 48 SMs, N = 4096, K = 14336: 64 tiles of 16 x 64 on 144 slots, 2 splits */
        {{"GB10", "sm121", 48, 101376, 0, 1}, NULL, W4A16_LAYOUT_MARLIN, 16, 4096, 14336, R16, 64, 2, 3},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const w4a16_plan pl = plan_on(&c[i].d, c[i].forced, c[i].layout, c[i].M, c[i].N, c[i].K, 0);
        assert_int_equal(pl.kind, c[i].kind);
        if (c[i].kind == DEC8 || c[i].kind == DEC16) continue;
        assert_int_equal(pl.grid[0], (c[i].M + 15) / 16);
        assert_int_equal(pl.grid[1], c[i].grid1);
        assert_int_equal(pl.splits, c[i].splits);
        assert_int_equal(pl.grid[2], c[i].splits);
        assert_int_equal(pl.blocks_per_sm, c[i].per_sm);
        assert_int_equal(pl.threads, 128);
        const int stages = c[i].d.wgmma && !c[i].forced ? 4 : 3;
        assert_int_equal(pl.stages, stages);
        assert_int_equal(pl.smem_bytes, stages * (c[i].kind == R16W ? (c[i].layout ? 6784 : 7808) : 8832));
    }
}

/* By hand: rows-32 at M 17-32 (32 x 128, three blocks per SM): whole tiles in one wave or less (llama3-8b.gate_up:
 * 224 tiles on 396 slots under sm120), stream-K over the slots where they take more than one wave filled under 90%
 * (qwen2.5-72b.gate_up: 462 tiles, 58% of two waves; qwen3-32b.gate_up: 400, 51%), both layouts, each block at least
 * 8 k-tiles; the native Hopper profile too (4 stages, still three blocks per SM by registers); an RTX 5090's 510 slots
 * hold the 462 tiles in one wave. */
static void test_hand_checked_rows32_sk(void **state) {
    (void)state;
    const struct {
        plan_device d;
        const char *forced;
        int layout, M, N, K, tiles, sk;
    } c[] = {
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_MARLIN, 32, 28672, 4096, 224, 0},
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_MARLIN, 32, 59136, 8192, 462, 396},
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_AWQ, 24, 59136, 8192, 462, 396},
        {{"H100 as sm120", "sm90", 132, 232448, 1, 1}, "sm120", W4A16_LAYOUT_MARLIN, 32, 51200, 5120, 400, 396},
        {{"RTX 5090", "sm120", 170, 101376, 0, 1}, NULL, W4A16_LAYOUT_MARLIN, 32, 59136, 8192, 462, 0},
        {{"H100", "sm90", 132, 232448, 1, 1}, NULL, W4A16_LAYOUT_MARLIN, 32, 59136, 8192, 462, 396},
        {{"H100", "sm90", 132, 232448, 1, 1}, NULL, W4A16_LAYOUT_MARLIN, 32, 102400, 5120, 800, 396},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const w4a16_plan pl = plan_on(&c[i].d, c[i].forced, c[i].layout, c[i].M, c[i].N, c[i].K, 0);
        assert_int_equal(pl.kind, W4A16_KERNEL_ROWS32);
        assert_int_equal(pl.grid[0] * pl.grid[1], c[i].tiles);
        assert_int_equal(pl.sk_blocks, c[i].sk);
        assert_int_equal(pl.sk_tiles, c[i].sk ? c[i].tiles : 0);
        assert_int_equal(pl.splits, 1);
    }
}

/* By hand: rows-32n (32 x 64, K split across blocks: slots / tiles, at most 16, at least 4 k-tiles of 128 each) at
 * M 17-64 below the wgmma tiles, both layouts, where that takes 2 or more splits of at most 1792 k, off the narrow
 * layers (whose 32 x 256 tiles make at most one per 8 SMs); 2 stages (32768 bytes, three blocks per 100 KB SM), 4 on
 * Hopper-class SMs. */
static void test_hand_checked_rows32n(void **state) {
    (void)state;
    enum {
        R32N = W4A16_KERNEL_ROWS32N,
        WS32 = W4A16_KERNEL_WS32,
        R16 = W4A16_KERNEL_ROWS16,
        R32 = W4A16_KERNEL_ROWS32,
        WG = W4A16_KERNEL_WGMMA
    };
    const plan_device h100 = {"H100", "sm90", 132, 232448, 1, 1};
    const struct {
        plan_device d;
        const char *forced;
        int layout, M, N, K, kind, splits, stages;
    } c[] = {
        /* llama3-8b.qkv: 96 tiles on 396 slots, 4 splits of 1024 k */
        {h100, "sm120", W4A16_LAYOUT_MARLIN, 32, 6144, 4096, R32N, 4, 2},
        {h100, "sm120", W4A16_LAYOUT_MARLIN, 17, 6144, 4096, R32N, 4, 2},
        {h100, NULL, W4A16_LAYOUT_MARLIN, 24, 6144, 4096, R32N, 4, 4},
        {h100, "sm120", W4A16_LAYOUT_AWQ, 32, 6144, 4096, R32N, 4, 2}, /* AWQ too (rows-32 otherwise) */
        /* qwen3-32b.o: 80 tiles, 4 splits of 2048 k: too long a split; AWQ keeps rows-32 */
        {h100, "sm120", W4A16_LAYOUT_MARLIN, 32, 5120, 8192, WS32, 0, 0},
        {h100, "sm120", W4A16_LAYOUT_AWQ, 32, 5120, 8192, R32, 0, 0},
        /* qwen2.5-72b.qkv: 160 tiles, 2 splits of 4096 k: too long a split */
        {h100, "sm120", W4A16_LAYOUT_MARLIN, 24, 10240, 8192, WS32, 0, 0},
        /* llama3-8b.o: narrow (16 tiles of 32 x 256 on 132 SMs), rows-16 */
        {h100, "sm120", W4A16_LAYOUT_MARLIN, 32, 4096, 4096, R16, 0, 0},
        /* phi4.qkv on an RTX 5090: 120 tiles on 510 slots, 4 splits of 1280 k (3 on the H100's 396) */
        {{"RTX 5090", "sm120", 170, 101376, 0, 1}, NULL, W4A16_LAYOUT_MARLIN, 32, 7680, 5120, R32N, 4, 2},
        {h100, "sm120", W4A16_LAYOUT_MARLIN, 32, 7680, 5120, R32N, 3, 2},
        /* 224 tiles: 2 splits of 1792 k on an RTX PRO 6000's 564 slots; more than half of the H100's 396 */
        {{"RTX PRO 6000", "sm120", 188, 101376, 0, 1}, NULL, W4A16_LAYOUT_MARLIN, 32, 14336, 3584, R32N, 2, 2},
        {h100, "sm120", W4A16_LAYOUT_MARLIN, 32, 14336, 3584, WS32, 0, 0},
        /* M 33-64 (no wgmma tile under sm120): two row tiles; llama3-8b.o 128 tiles, 3 splits of 1365 k; at M = 64
         * the native profile runs wgmma */
        {h100, "sm120", W4A16_LAYOUT_MARLIN, 48, 4096, 4096, R32N, 3, 2},
        {h100, "sm120", W4A16_LAYOUT_AWQ, 64, 4096, 4096, R32N, 3, 2},
        {h100, NULL, W4A16_LAYOUT_MARLIN, 64, 4096, 4096, WG, 0, 0},
        /* GB10: N = 4096 is not narrow on 48 SMs (16 tiles of 32 x 256); 64 tiles on 144 slots, 2 splits of 1792 k
         * (on the H100 a narrow layer: rows-16) */
        {{"GB10", "sm121", 48, 101376, 0, 1}, NULL, W4A16_LAYOUT_MARLIN, 32, 4096, 3584, R32N, 2, 2},
        {h100, "sm120", W4A16_LAYOUT_MARLIN, 32, 4096, 3584, R16, 0, 0},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const w4a16_plan pl = plan_on(&c[i].d, c[i].forced, c[i].layout, c[i].M, c[i].N, c[i].K, 0);
        assert_int_equal(pl.kind, c[i].kind);
        if (c[i].kind != R32N) continue;
        assert_int_equal(pl.grid[0], (c[i].M + 31) / 32);
        assert_int_equal(pl.grid[1], c[i].N / 64);
        assert_int_equal(pl.splits, c[i].splits);
        assert_int_equal(pl.grid[2], c[i].splits);
        assert_int_equal(pl.blocks_per_sm, 3);
        assert_int_equal(pl.stages, c[i].stages);
        assert_int_equal(pl.smem_bytes, c[i].stages == 2 ? 32768 : 4 * 12928);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recorded_decisions),
        cmocka_unit_test(test_hand_checked_rows128),
        cmocka_unit_test(test_hand_checked_ws_fixup),
        cmocka_unit_test(test_hand_checked_rows16),
        cmocka_unit_test(test_hand_checked_rows32_sk),
        cmocka_unit_test(test_hand_checked_rows32n),
        cmocka_unit_test(test_forced_profile_emulates_its_sm),
        cmocka_unit_test(test_plan_invariants),
        cmocka_unit_test(test_hand_checked),
        cmocka_unit_test(test_hand_checked_stream_k),
        cmocka_unit_test(test_hand_checked_wgmma_t64),
        cmocka_unit_test(test_hand_checked_wgmma_stream_k),
        cmocka_unit_test(test_hand_checked_rows),
        cmocka_unit_test(test_forced_profile_while_planning),
        cmocka_unit_test(test_moe_stages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
