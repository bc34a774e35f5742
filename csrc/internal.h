/* Private declarations shared by the host-side C files of libw4a16. */
#ifndef W4A16_INTERNAL_H
#define W4A16_INTERNAL_H
#include <stdarg.h>
#include "../include/w4a16.h"
#include "../kernels/configs.h"
#include "../kernels/launch.h"

#define W4A16_HIDDEN __attribute__((visibility("hidden")))

/* Record `status` with a printf-style message on this thread and return it. */
W4A16_HIDDEN w4a16_status w4a16_fail(w4a16_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
W4A16_HIDDEN void w4a16_clear_error(void);

/* One tile choice of a profile: a compiled config and its pipeline depth. */
typedef struct w4a16_tile_choice {
    int cfg;
    int stages;
} w4a16_tile_choice;

/* An architecture profile: data, not code (BLIS style). Choices are by M regime. */
typedef struct w4a16_profile {
    const char *name;       /* "sm90" */
    int arch;               /* compute capability * 10 it was tuned for */
    const char *fallback;   /* next profile in the chain, or NULL */
    int small_max_m;        /* M <= this: `small`, or `small_split` when its tiles fill fewer than 2 blocks per SM */
    int mid_max_m;          /* M <= this: `mid` */
    int mid2_max_m;         /* M <= this: `mid2`, else `large` (Marlin layout) or `large_awq` */
    w4a16_tile_choice small, mid, mid2, large, large_awq, small_split;
    w4a16_tile_choice mid_wide; /* mid M when `mid`'s tiles alone fill every SM (wide layers) */
    int wgmma_min_m;        /* M >= this (> 0) on a compute capability 9.0 device: the sm_90a wgmma kernel, */
    int wgmma_large_min_m;  /* its 128-token tile (W4A16_WGMMA_CONFIGS 1) below this M, its 256-token tile (0) from it */
    int staged_min_m;       /* GEMMs (both layouts) with M >= this (> 0) on a wgmma device run staged when the
                               workspace holds a slab of dequantised weights (w4a16_workspace_size_staged) */
} w4a16_profile;

W4A16_HIDDEN const w4a16_profile *w4a16_find_profile(const char *name);
W4A16_HIDDEN const w4a16_gemm_config *w4a16_config(int id);
W4A16_HIDDEN int w4a16_profile_smem_bytes(const w4a16_profile *p);

/* Per-device state, filled once (thread-safe) on first use. */
typedef struct w4a16_device_state {
    int ready;
    w4a16_status status; /* why the device cannot be used, or W4A16_OK */
    char reason[256];
    int sm_count;
    size_t smem_optin;
    const w4a16_profile *profile;
    int wgmma;           /* the device runs the sm_90a wgmma kernels (compute capability 9.0, images loaded) */
    int pdl;             /* programmatic dependent launch exists (compute capability 9.0 and up): W4A16_FLAG_PDL */
} w4a16_device_state;

/* The state of the current device; on error the status is recorded with its message and returned. */
W4A16_HIDDEN w4a16_status w4a16_current_device(int *device, const w4a16_device_state **state);

/* Workspace layout for a device: counters then partials. */
W4A16_HIDDEN size_t w4a16_workspace_counters_bytes(int sm_count);
W4A16_HIDDEN size_t w4a16_workspace_bytes_for(int sm_count);
W4A16_HIDDEN size_t w4a16_workspace_slab_offset(int sm_count); /* then the staged path's weight slab */
/* Channels per slab of the staged path for a workspace of `workspace_bytes` (csrc/api.c): N when the whole weight
 * fits, else a multiple of the dense tile's width; 0 when the slab would not give every SM a tile (or not fit). */
W4A16_HIDDEN int w4a16_staged_slab_channels(int M, int N, int K, size_t workspace_bytes, int sm_count);
/* K splits across blocks (csrc/api.c) for `tiles` tiles of `num_kt` k-tiles on sm_count SMs holding blocks_per_sm
 * blocks each: 1 when the tiles alone fill half the block slots; else at most the slots (tiles x splits <= slots:
 * the workspace is sized for that), at most 16, and at least min_kt k-tiles per split. */
W4A16_HIDDEN int w4a16_choose_splits(int blocks_per_sm, int tiles, int num_kt, int sm_count, int min_kt);

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

#endif
