/* Private declarations shared by the host-side C files of libw4a16. */
#ifndef W4A16_INTERNAL_H
#define W4A16_INTERNAL_H
#include "../include/w4a16.h"
#include "../kernels/configs.h"
#include "../kernels/launch.h"
#include <stdarg.h>
#include <stdatomic.h>

#define W4A16_HIDDEN __attribute__((visibility("hidden")))

/* Record `status` with a printf-style message on this thread and return it. */
W4A16_HIDDEN w4a16_status w4a16_fail(w4a16_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
W4A16_HIDDEN void w4a16_clear_error(void);

/* One tile choice of a profile: a compiled config (W4A16_CFG_*) and its pipeline depth. */
typedef struct w4a16_tile_choice {
    int cfg;
    int stages;
} w4a16_tile_choice;

/* An architecture profile (csrc/profiles.c): which compiled tile runs in each M regime, and the thresholds that pick
 * between tiles, as data; csrc/plan.c reads it. */
typedef struct w4a16_profile {
    const char *name;     /* "sm90": its entry of W4A16_PROFILE_LIST */
    int arch;             /* compute capability x 10 it was tuned for */
    const char *fallback; /* next profile in the chain, or NULL */
    int smem_per_sm;      /* shared memory of one SM of that architecture (bytes): a forced profile holds a larger SM
                             to it (carveout), so that the resident blocks are those of its architecture */
    /* mma.sync tiles: M <= small_max_m `small`, M <= mid_max_m `mid`, M <= mid2_max_m `mid2`, else `large` (Marlin
     * layout) or `large_awq` (AWQ layout) */
    int small_max_m, mid_max_m, mid2_max_m;
    w4a16_tile_choice small, mid, mid2, large, large_awq;
    w4a16_tile_choice small_split; /* small M when `small`'s tiles are fewer than small_split_tiles_per_sm per SM
                                      (K will be split across blocks) */
    w4a16_tile_choice mid_wide;    /* mid M when `mid`'s tiles are at least mid_wide_tiles_per_sm per SM */
    int small_split_tiles_per_sm, mid_wide_tiles_per_sm;
    int mid32_max_m; /* > 0: M from small_max_m + 1 to this runs `mid32` (before the mid regime) */
    w4a16_tile_choice mid32;
    int deep_decode_min_kt;     /* k-tiles per K split at least, for decode tiles of 256 k per stage (others 2) */
    int mid2_large_kt_per_slot; /* > 0: mid2 M takes the `large` tile when its tiles hold at least this many k-tiles per
                                   resident block slot (the long-K or wide layers; short ones keep mid2's finer tile) */
    /* compute capability 9.0 with the sm_90a images loaded: wgmma tiles (W4A16_WGMMA_*) from wgmma_min_m (0: never):
     * T64 below wgmma_t128_min_m, T128 below wgmma_large_min_m, T256 from it; T128 falls back to T64 when it makes
     * fewer than wgmma_t128_min_tiles tiles, and T64 widens to T64_WIDE when that makes at least
     * wgmma_wide_min_half_tiles_per_sm / 2 tiles per SM; up to 256 tokens T256 gives way to T64 where it splits K
     * and its blocks would take at most wgmma_t64_max_kt k-tiles of 64 each (> 0) */
    int wgmma_min_m, wgmma_t128_min_m, wgmma_large_min_m;
    int wgmma_t128_min_tiles, wgmma_wide_min_half_tiles_per_sm, wgmma_t64_max_kt;
    /* > 0: where a one-block-per-SM wgmma plan takes no K split, stream-K over the SMs (csrc/plan.c wgmma_plan) where
     * it is predicted to take at most 95% of the whole tiles' time (80% where the activations take more than
     * wgmma_sk_act_l2_bytes), counting a stream-K block's fixed cost as wgmma_sk_overhead_kt k-tiles of 64 */
    int wgmma_sk_overhead_kt;
    size_t wgmma_sk_act_l2_bytes;
    int staged_min_m;   /* M >= this (> 0) on a wgmma device: staged GEMMs when the workspace holds a slab of
                           dequantised weights (w4a16_workspace_size_staged) */
    int wgws_min_m;     /* > 0: M >= this on a wgmma device with the warp-specialised image, where no staged plan runs:
                           the wgmma form of the warp-specialised tiles (W4A16_KERNEL_WGWS128 / WGWS64; plan_wgws) ... */
    int wgws_sk_min_kt; /* ... with stream-K blocks of at least this many k-tiles */
    int mid32_min_tiles_per_8sm; /* M 17-32 (mid32) keeps the decode tiles where the mid32 tile makes at most this many
                                    tiles per 8 SMs */
    int rows64_min_fill; /* > 0: where no wgmma tile runs, the MoE kernel's 64 x 256 tile (W4A16_KERNEL_ROWS64) when
                            its tiles fill at least this percent of one wave of its block slots ... */
    int rows64_min_wave_fill; /* ... and this percent of all the waves they take */
    int rows64_sk_min_kt; /* > 0: ... or else, with a workspace, stream-K over its slots, each block at least this many
                             k-tiles (and one block per SM) ... */
    int rows32_keep_min_splits; /* ... except where a rows-32 plan would split K this many ways or more */
    int rows128_min_m; /* > 0: on a device with its image (w4a16_device_state.ws), the rows-64 plans of the Marlin
                          layout take the warp-specialised 128 x 256 tile (W4A16_KERNEL_ROWS128) from this M, in whole
                          tiles where they fill at least rows128_min_wave_fill percent of the waves they take */
    int rows128_min_wave_fill;
    int ws_fixup_min_blocks_per_tile; /* > 0: the warp-specialised tiles' stream-K parts are added by a second grid
                                         (fixup_kernel) where the blocks number at least this many per shared tile;
                                         else by each tile's last block */
    int ws64_sk_min_kt;   /* > 0: on such a device, the warp-specialised 64 x 256 tile (W4A16_KERNEL_WS64) below
                             rows128_min_m in place of rows-64, and from it where the 128-row tile has no plan, with
                             stream-K blocks of at least this many k-tiles (one block per SM) */
    int ws32_min_kt;      /* > 0: on such a device, M 17-32 (above small_max_m, up to mid32_max_m) where the 32-row plan
                             (rows32_max_k) does not run: the warp-specialised 32 x 256 tile (W4A16_KERNEL_WS32), in whole
                             tiles where they fill rows64_min_fill percent of one wave and rows128_min_wave_fill percent
                             of their waves, else stream-K over one block per SM where each gets at least this many
                             k-tiles (else the mma.sync / decode tiles) */
    int rows32_max_k;     /* > 0: else, for K at most this, the MoE kernel's 32 x 128 tile (W4A16_KERNEL_ROWS32): in the
                             mid2 regime when its tiles fit one wave of its block slots, in the mid32 regime when they fill
                             at least half of one; in the AWQ layout from M above small_max_m when they fit one wave */
    int rows32_sk_min_kt; /* > 0: in the mid32 regime, where its whole tiles take more than one wave and fill under
                             rows32_sk_wave_fill percent of their waves, stream-K over its slots, each block at least
                             this many k-tiles */
    int rows32_sk_wave_fill;
    int rows16_min_m; /* > 0: M from this to small_max_m (and M 17-32 where the decode tiles run there, narrow layers),
                         the MoE kernel's 16-row tiles in place of the decode tiles:
                         16 x 128 (W4A16_KERNEL_ROWS16W) where its tiles fill at least rows16_wide_fill percent of one
                         wave of its block slots (AWQ layout: rows16_awq_wide_fill), else in the Marlin layout 16 x 64
                         (W4A16_KERNEL_ROWS16) with K split across blocks */
    int rows16_wide_fill, rows16_awq_wide_fill;
    int rows32n_max_split_k; /* > 0: M 17-64 (off the layers narrow at M 17-32, below the wgmma tiles): the MoE
                                kernel's 32 x 64 tile (W4A16_KERNEL_ROWS32N) when its K split across blocks takes at
                                least two splits of at most this many k */
} w4a16_profile;

W4A16_HIDDEN const w4a16_profile *w4a16_find_profile(const char *name);
W4A16_HIDDEN const w4a16_gemm_config *w4a16_config(int id);
W4A16_HIDDEN int w4a16_profile_smem_bytes(const w4a16_profile *p);
/* "sm80 sm86 ... sm121": the names of W4A16_PROFILE_LIST, for messages. */
W4A16_HIDDEN const char *w4a16_profile_list_text(void);

/* What the planners read of a device: its description and the profile in use. Immutable once published
 * (csrc/device.c): a call loads its device's view once and reads only that one, so a profile forced meanwhile on
 * another thread never mixes with the one the call started with. */
typedef struct w4a16_device_state {
    w4a16_status status; /* why the device cannot be used, or W4A16_OK */
    const char *reason;  /* the text of `status`, or the device's line of W4A16_LOG=1 */
    int sm_count;
    size_t smem_optin;      /* shared memory per block (opt-in limit) */
    int device_smem_per_sm; /* the device's shared memory per SM */
    int smem_per_sm;        /* shared memory per SM the plans count resident blocks with: the device's, or the smaller
                               one of a forced profile's architecture (then held to it by `carveout`) */
    int smem_reserved;      /* shared memory the system reserves per block */
    int carveout;           /* -1, or the shared-memory carveout (percent) that holds an SM to smem_per_sm */
    const w4a16_profile *profile;
    int wgmma;     /* the device runs the sm_90a wgmma kernels (compute capability 9.0, images loaded) */
    int ws;        /* the device runs the warp-specialised rows-128 tile (sm_90a / sm_120a / sm_121a image loaded) */
    int pdl;       /* programmatic dependent launch exists (compute capability 9.0 and up): W4A16_FLAG_PDL */
    int log_level; /* W4A16_LOG at first use: 1 device choices, 2 also every GEMM's plan */
} w4a16_device_state;

/* Fill the profile fields of a view not yet published: profile `p`; `forced` (by W4A16_PROFILE /
 * w4a16_force_profile): a smaller SM of the profile's architecture is emulated (smem_per_sm, carveout). */
W4A16_HIDDEN void w4a16_use_profile(w4a16_device_state *st, const w4a16_profile *p, int forced);

#define W4A16_COUNT_ONE_(n) +1
enum { W4A16_NUM_PROFILES = 0 W4A16_PROFILE_LIST(W4A16_COUNT_ONE_) };
#undef W4A16_COUNT_ONE_

/* The views of one device (csrc/device.c). `desc` (no profile) is filled once before anything is published; a view
 * per (profile, forced) is built from it on first use and never changed after, so one published earlier stays whole
 * for a call still reading it; `current` points to the view published last (release store, acquire load). Publishers
 * are serialised by the caller; readers take no lock. Zero-initialised: nothing published. */
typedef struct w4a16_device_views {
    w4a16_device_state desc;
    char reason[256]; /* desc.reason and every view's */
    w4a16_device_state built[W4A16_NUM_PROFILES][2];
    const w4a16_device_state *_Atomic current;
} w4a16_device_views;

/* The view of profile `p` (one of the table's), `forced` or not, built on first use; not published. */
W4A16_HIDDEN const w4a16_device_state *w4a16_device_view(w4a16_device_views *v, const w4a16_profile *p, int forced);
/* Publish `view` (desc or a view of w4a16_device_view) as the one later calls read. */
W4A16_HIDDEN void w4a16_publish_view(w4a16_device_views *v, const w4a16_device_state *view);
/* The view published last, or NULL before the first. */
W4A16_HIDDEN const w4a16_device_state *w4a16_current_view(w4a16_device_views *v);

/* The state of the current device; on error the status is recorded with its message and returned. */
W4A16_HIDDEN w4a16_status w4a16_current_device(int *device, const w4a16_device_state **state);

/* A workspace-size query on the current device: `bytes` checked, then bytes_for(its SM count) stored there. */
W4A16_HIDDEN w4a16_status w4a16_workspace_query(size_t *bytes, size_t (*bytes_for)(int sm_count));

/* Workspace layout for a device: counters then partials. */
W4A16_HIDDEN size_t w4a16_workspace_counters_bytes(int sm_count);
W4A16_HIDDEN size_t w4a16_workspace_bytes_for(int sm_count);
W4A16_HIDDEN size_t w4a16_workspace_slab_offset(int sm_count); /* then the staged path's weight slab */

/* Launch plans (csrc/plan.c). */
/* The launch of one GEMM call on device `st` (its profile, SMs, shared memory, kernels): kernel kind, config,
 * stages, K splits and grid; W4A16_ERR_SIZE_OVERFLOW (recorded, naming `op`) when the tiles overflow. */
W4A16_HIDDEN w4a16_status w4a16_plan_gemm(const w4a16_device_state *st, int layout, int dtype, int M, int N, int K,
                                          size_t workspace_bytes, const char *op, w4a16_plan *plan);
/* The plan in one line (W4A16_LOG=2, w4a16_gemm_plan). */
W4A16_HIDDEN void w4a16_plan_text(const w4a16_plan *plan, char *buf, size_t size);
W4A16_HIDDEN const char *w4a16_kernel_kind_name(int kind);
/* Channels per slab of the staged path for a workspace of `workspace_bytes`: N when the whole weight fits, else a
 * multiple of the dense tile's width; 0 when the slab would not give every SM a tile (or not fit). */
W4A16_HIDDEN int w4a16_staged_slab_channels(int M, int N, int K, size_t workspace_bytes, int sm_count);
/* Blocks of the staged path's dense GEMM for a slab of nc channels: one per tile, at most one per SM. */
W4A16_HIDDEN int w4a16_staged_grid(int M, int nc, int sm_count);
/* K splits across blocks for `tiles` tiles of `num_kt` k-tiles on sm_count SMs holding blocks_per_sm
 * blocks each: 1 when the tiles alone fill half the block slots; else at most the slots (tiles x splits <= slots:
 * the workspace is sized for that), at most 16, and at least min_kt k-tiles per split. */
W4A16_HIDDEN int w4a16_choose_splits(int blocks_per_sm, int tiles, int num_kt, int sm_count, int min_kt);
/* Stream-K of the mma.sync tile kernel (csrc/plan.c): how many blocks share the k-tiles of how many tiles (both 0:
 * every block computes one whole tile). */
W4A16_HIDDEN void w4a16_plan_stream_k(long long tiles, int num_kt, int slots, int min_kt, int straddle, int *sk_blocks,
                                      int *sk_tiles);
/* Pipeline depth of a MoE GEMM tile (W4A16_MOE_TILE_*) on a device's profile (csrc/moe.c): 4 stages on Hopper-class
 * shared memory, 3 elsewhere, 2 for the 64-row tile where 3 leave one block per SM and 2 fit two, for the 32 x 64
 * tile where 3 leave fewer than three and 2 fit three, and for the 16 x 256 tile where 3 leave fewer than four and 2
 * fit four (the 100 KB SMs; the AWQ layout's 2 stages do not fit four). */
W4A16_HIDDEN int w4a16_moe_stages(const w4a16_device_state *st, int tile, int layout);
/* A dense GEMM on a MoE launch tile (the W4A16_KERNEL_TILES plans: rows-64 / 32 / 32n / 16 / 16w, rows-128, ws-64 / 32;
 * csrc/moe.c): the resident blocks per SM the device gives it (its shared memory and carveout set as the launch sets
 * them), and the launch; cudaError_t. */
W4A16_HIDDEN int w4a16_moe_dense_occupancy(const w4a16_gemm_launch *a, int *blocks_per_sm);
W4A16_HIDDEN int w4a16_moe_dense_launch(const w4a16_gemm_launch *a);

/* Validation helpers (csrc/validate.c): each records its message and returns the status, or W4A16_OK. */
W4A16_HIDDEN w4a16_status w4a16_check_ptr(const void *p, const char *name, unsigned align, int required);
W4A16_HIDDEN w4a16_status w4a16_check_dtype(int dtype);
/* M >= 1, N % 64, K % k_multiple, sizes within 2^40 elements, and the group size; *resolved_group (may be NULL)
 * gets G with -1 resolved to K. */
W4A16_HIDDEN w4a16_status w4a16_check_gemm_shape(int M, int N, int K, int group_size, int k_multiple,
                                                 int *resolved_group);
/* a x b elements within the supported 2^40. */
W4A16_HIDDEN w4a16_status w4a16_check_size(const char *what, long long a, long long b);
W4A16_HIDDEN w4a16_status w4a16_check_group(int K, int group_size, int *resolved);
/* Shapes of the converters: N % 64, K % k_multiple, in != out. */
W4A16_HIDDEN w4a16_status w4a16_check_convert(const void *in, const void *out, int K, int N, int k_multiple);
/* log2(G) for a power of two; 31 otherwise (then G = K: every k is in group 0). */
W4A16_HIDDEN int w4a16_group_shift(int G);
/* W4A16_OK for cudaSuccess; else W4A16_ERR_LAUNCH_FAILED, recorded with `op` and the CUDA error of a launch. */
W4A16_HIDDEN w4a16_status w4a16_launch_status(int err, const char *op);

#endif
