/* Devices, drivers and architecture profiles.
 *
 * A profile is a small table (which compiled tile config, how many pipeline stages, per M regime) named after
 * the architecture it was tuned for, with a fallback chain. Each device gets one profile on first use
 * (thread-safe): its own, else the nearest of its family, walking the chain until the tiles fit the device's
 * sharedMemPerBlockOptin; W4A16_PROFILE forces one, W4A16_LOG=1 prints the choice. Before any profile is
 * accepted, one kernel image is loaded (cudaFuncGetAttributes) so a GPU this build cannot run is reported
 * here, naming its compute capability and the compiled architectures, and never reached by a launch. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"

#ifndef W4A16_SASS_ARCHS
#define W4A16_SASS_ARCHS ""
#endif
#ifndef W4A16_PTX_ARCHS
#define W4A16_PTX_ARCHS ""
#endif

/* ---------------------------------------------------------------- tables */
static const w4a16_gemm_config configs[W4A16_NUM_GEMM_CONFIGS] = {
#define W4A16_CFG_ROW_(id, name, MT, WM, NH, WN, WK, KS, MINB) {id, name, MT, WM, NH, WN, WK, KS, MINB},
    W4A16_GEMM_CONFIGS(W4A16_CFG_ROW_)
#undef W4A16_CFG_ROW_
};

/* name, arch, fallback, small/mid/mid2 max M, {cfg, stages} for small / mid / mid2 / large M (Marlin, AWQ layout),
 * and for small M when the tiles leave the GPU under-filled so K is split across blocks (measured on the H100:
 * 8 k16 steps per warp-stage win 5-20% there and lose 8-21% on large-N layers; the 100 KB parts keep cfg0).
 * Shared memory per stage (AWQ layout, the larger): cfg0 15.3 KB, cfg1 27.3 KB, cfg2/3 26.3 KB, cfg4 13.6 KB, cfg5 30.5 KB.
 * The decode config takes 3 stages everywhere (4 blocks/SM fit 227 KB, 2 fit the 100 KB of sm_86/89/120/121); the 99 KB parts
 * take one stage less for the larger tiles. The sm90 profile's unsplit decode tile is cfg5 with 3 stages (2 blocks/SM):
 * with the decode kernel of gemm_decode.cuh, whose per-stage work is the larger share, it measured 7% faster than cfg0
 * on qwen2.5-72b.gate_up at M = 1 (108 -> 101 us) and level elsewhere; 4 stages were not better. Its split tile
 * (cfg5 x 3 as well, 2 blocks/SM, so fewer K splits) was level without programmatic dependent launch and measured
 * 6-17% faster on the o / down layers with it (qwen2.5-72b.o 21.6 -> 17.9 us, docs/PERFORMANCE.md v18).
 * Decode tiles serve M <= 32 (two 16-row tiles beat one 64-row tile there).
 * Mid M on wide layers (the mid tile's blocks alone fill every SM) takes the 4-warp 64x128 tile (`mid_wide`):
 * measured on the H100 at M = 64, 20-25% faster on the gate_up layers and 20-40% slower on the narrower ones. The sm90 profile also names the M from which a compute capability 9.0
 * device runs the sm_90a wgmma kernel (64-token tile up to M = 64, 128-token tile up to M = 128, 256 above). */
#ifndef W4A16_SM90_STAGED_MIN_M /* experiments: -DW4A16_SM90_STAGED_MIN_M=... */
#define W4A16_SM90_STAGED_MIN_M 1024
#endif
static const w4a16_profile profiles[] = {
    {"sm80", 80, NULL, 32, 64, 256, {0, 3}, {1, 4}, {4, 5}, {2, 4}, {3, 4}, {5, 2}, {4, 5}, 0, 0, 0},
    {"sm86", 86, "sm80", 32, 64, 256, {0, 3}, {1, 3}, {4, 4}, {2, 3}, {3, 3}, {0, 3}, {4, 4}, 0, 0, 0},
    {"sm89", 89, "sm86", 32, 64, 256, {0, 3}, {1, 3}, {4, 4}, {2, 3}, {3, 3}, {0, 3}, {4, 4}, 0, 0, 0},
    {"sm90", 90, "sm80", 32, 64, 256, {5, 3}, {1, 4}, {4, 5}, {2, 4}, {3, 4}, {5, 3}, {4, 5}, 17, 129, W4A16_SM90_STAGED_MIN_M},
    {"sm100", 100, "sm90", 32, 64, 256, {0, 3}, {1, 4}, {4, 5}, {2, 4}, {3, 4}, {5, 2}, {4, 5}, 0, 0, 0},
    {"sm120", 120, "sm89", 32, 64, 256, {0, 3}, {1, 3}, {4, 4}, {2, 3}, {3, 3}, {0, 3}, {4, 4}, 0, 0, 0},
    {"sm121", 121, "sm120", 32, 64, 256, {0, 3}, {1, 3}, {4, 4}, {2, 3}, {3, 3}, {0, 3}, {4, 4}, 0, 0, 0},
};
enum { NUM_PROFILES = sizeof profiles / sizeof profiles[0] };

static const char *const profile_names[NUM_PROFILES + 1] = {"sm80",  "sm86",  "sm89", "sm90",
                                                            "sm100", "sm120", "sm121", NULL};

const char *const *w4a16_profile_names(void) { return profile_names; }

const w4a16_gemm_config *w4a16_config(int id) {
    return id >= 0 && id < W4A16_NUM_GEMM_CONFIGS ? &configs[id] : NULL;
}

const w4a16_profile *w4a16_find_profile(const char *name) {
    for (int i = 0; i < NUM_PROFILES; i++)
        if (name && strcmp(profiles[i].name, name) == 0) return &profiles[i];
    return NULL;
}

static int choice_smem(const w4a16_tile_choice *c) {
    const w4a16_gemm_config *cfg = w4a16_config(c->cfg);
    int a = w4a16_cfg_smem_bytes(cfg, W4A16_LAYOUT_AWQ, c->stages);
    int m = w4a16_cfg_smem_bytes(cfg, W4A16_LAYOUT_MARLIN, c->stages);
    return a > m ? a : m;
}

int w4a16_profile_smem_bytes(const w4a16_profile *p) {
    const w4a16_tile_choice *all[] = {&p->small, &p->mid, &p->mid2, &p->large, &p->large_awq, &p->small_split,
                                      &p->mid_wide};
    int r = 0;
    for (int i = 0; i < 7; i++) {
        int b = choice_smem(all[i]);
        r = b > r ? b : r;
    }
    return r;
}

/* The device's own profile, else the nearest lower one of the same major version, else NULL. */
static const w4a16_profile *native_profile(int arch) {
    const w4a16_profile *best = NULL;
    for (int i = 0; i < NUM_PROFILES; i++) {
        const w4a16_profile *p = &profiles[i];
        if (p->arch / 10 == arch / 10 && p->arch <= arch && (!best || p->arch > best->arch)) best = p;
    }
    if (!best && arch >= 130) best = w4a16_find_profile("sm120"); /* newer part: mma.sync, small smem assumed */
    return best;
}

/* ---------------------------------------------------------------- compiled architectures */
const char *w4a16_compiled_archs(void) {
    static const char text[] = W4A16_SASS_ARCHS " ptx:" W4A16_PTX_ARCHS;
    return text;
}

/* 1 when the fat binary holds SASS that runs on compute capability `arch` (same major, not newer). */
static int has_native_sass(int arch) {
    const char *s = W4A16_SASS_ARCHS;
    while (*s) {
        int a = atoi(s);
        if (a / 10 == arch / 10 && a <= arch) return 1;
        s = strchr(s, ',');
        if (!s) break;
        s++;
    }
    return 0;
}

/* ---------------------------------------------------------------- driver */
/* W4A16_FAKE_DRIVER_VERSION (e.g. 12020) replaces the driver's answer: a documented testing override, so the
 * driver-too-old path can be exercised on any machine. */
static int driver_version(void) {
    const char *fake = getenv("W4A16_FAKE_DRIVER_VERSION");
    if (fake && *fake) return atoi(fake);
    int drv = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
    return drv;
}

static w4a16_status check_driver(void) {
    int drv = driver_version();
    if (drv == 0)
        return w4a16_fail(W4A16_ERR_NO_DEVICE, "no NVIDIA driver found (libcuda.so.1 could not be loaded)");
    if (drv < CUDART_VERSION)
        return w4a16_fail(W4A16_ERR_DRIVER_TOO_OLD,
                          "the NVIDIA driver supports CUDA %d.%d but this build of w4a16 needs CUDA %d.%d "
                          "(driver >= 580 for CUDA 13): update the driver",
                          drv / 1000, (drv % 1000) / 10, CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10);
    return W4A16_OK;
}

/* ---------------------------------------------------------------- per-device state */
enum { MAX_DEVICES = 64 };
static w4a16_device_state states[MAX_DEVICES];
static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;

static int log_enabled(void) {
    const char *v = getenv("W4A16_LOG");
    return v && *v && strcmp(v, "0") != 0;
}

/* Accept `p` for the device if it fits; else walk its fallback chain. */
static const w4a16_profile *fit_profile(const w4a16_profile *p, size_t smem_optin) {
    while (p && (size_t)w4a16_profile_smem_bytes(p) > smem_optin) p = w4a16_find_profile(p->fallback);
    return p;
}

/* Fill `st` for `device`, which must be the current device. Called with state_lock held. */
static void init_state(int device, w4a16_device_state *st) {
    memset(st, 0, sizeof *st);
    st->ready = 1;
    struct cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) {
        st->status = W4A16_ERR_CUDA;
        snprintf(st->reason, sizeof st->reason, "cudaGetDeviceProperties(%d) failed: %s", device,
                 cudaGetErrorString(e));
        return;
    }
    int arch = prop.major * 10 + prop.minor;
    st->sm_count = prop.multiProcessorCount;
    st->smem_optin = prop.sharedMemPerBlockOptin;
    st->pdl = prop.major >= 9;
    if (arch < 80) {
        st->status = W4A16_ERR_ARCH_UNSUPPORTED;
        snprintf(st->reason, sizeof st->reason,
                 "%s has compute capability %d.%d; w4a16 needs 8.0 or newer (compiled for %s)", prop.name,
                 prop.major, prop.minor, w4a16_compiled_archs());
        return;
    }
    int bin = 0;
    e = (cudaError_t)w4a16_probe_gemm(0, W4A16_LAYOUT_AWQ, 0, &bin);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* the probe's error is not sticky; do not leave it for the caller */
        st->status = W4A16_ERR_ARCH_UNSUPPORTED;
        snprintf(st->reason, sizeof st->reason,
                 "%s (compute capability %d.%d) cannot load w4a16's kernels: %s; this build holds SASS for "
                 "%s",
                 prop.name, prop.major, prop.minor, cudaGetErrorString(e), w4a16_compiled_archs());
        return;
    }
    if (arch == 90) { /* exactly 9.0: sm_90a images do not run on other Hopper-family parts */
        st->wgmma = w4a16_probe_gemm_wgmma() == cudaSuccess && (size_t)w4a16_gemm_wgmma_smem_bytes() <= st->smem_optin;
        cudaGetLastError();
    }
    const char *forced = getenv("W4A16_PROFILE");
    const w4a16_profile *p = NULL;
    if (forced && *forced && strcmp(forced, "auto") != 0) {
        p = w4a16_find_profile(forced);
        if (!p || (size_t)w4a16_profile_smem_bytes(p) > st->smem_optin) {
            if (p) {
                st->status = W4A16_ERR_PROFILE_UNAVAILABLE;
                snprintf(st->reason, sizeof st->reason,
                         "W4A16_PROFILE=%s needs %d bytes of shared memory per block; %s allows %zu", forced,
                         w4a16_profile_smem_bytes(p), prop.name, st->smem_optin);
            } else {
                st->status = W4A16_ERR_INVALID_VALUE;
                snprintf(st->reason, sizeof st->reason,
                         "W4A16_PROFILE=%s is not a profile name (sm80 sm86 sm89 sm90 sm100 sm120 sm121 auto)",
                         forced);
            }
            return;
        }
    } else {
        p = fit_profile(native_profile(arch), st->smem_optin);
    }
    if (!p) {
        st->status = W4A16_ERR_ARCH_UNSUPPORTED;
        snprintf(st->reason, sizeof st->reason, "no w4a16 profile fits %s (compute capability %d.%d, %zu bytes of "
                 "shared memory per block)", prop.name, prop.major, prop.minor, st->smem_optin);
        return;
    }
    st->profile = p;
    st->status = W4A16_OK;
    char wg[128] = "", staged[48] = "";
    if (p->staged_min_m > 0) snprintf(staged, sizeof staged, ", staged GEMMs from M = %d", p->staged_min_m);
    if (st->wgmma && p->wgmma_min_m > 0)
        snprintf(wg, sizeof wg, ", wgmma kernels from M = %d (256-token tile from M = %d)%s", p->wgmma_min_m,
                 p->wgmma_large_min_m, staged);
    snprintf(st->reason, sizeof st->reason, "profile %s%s on %s (sm_%d, %d SMs, %zu KB shared memory per block), %s%s",
             p->name, forced && *forced && strcmp(forced, "auto") != 0 ? " (forced by W4A16_PROFILE)" : "",
             prop.name, arch, st->sm_count, st->smem_optin / 1024,
             has_native_sass(arch) ? "native SASS" : "PTX JIT (no SASS for this GPU in this build)", wg);
    if (log_enabled()) fprintf(stderr, "w4a16: device %d: %s\n", device, st->reason);
}

/* State of `device`, initialising it once; switches the current device temporarily when needed. */
static const w4a16_device_state *device_state(int device) {
    pthread_mutex_lock(&state_lock);
    w4a16_device_state *st = &states[device];
    if (!st->ready) {
        int cur = -1;
        cudaGetDevice(&cur);
        if (cur != device) cudaSetDevice(device);
        init_state(device, st);
        if (cur != device && cur >= 0) cudaSetDevice(cur);
    }
    pthread_mutex_unlock(&state_lock);
    return st;
}

static w4a16_status resolve_device(int *device) {
    w4a16_status s = check_driver();
    if (s != W4A16_OK) return s;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorInsufficientDriver)
        return w4a16_fail(W4A16_ERR_DRIVER_TOO_OLD, "the NVIDIA driver is too old for this build (CUDA %d.%d)",
                          CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        return w4a16_fail(W4A16_ERR_NO_DEVICE, "no CUDA device is visible (%s)",
                          e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount returned 0");
    }
    if (*device < 0) {
        e = cudaGetDevice(device);
        if (e != cudaSuccess) return w4a16_fail(W4A16_ERR_CUDA, "cudaGetDevice failed: %s", cudaGetErrorString(e));
    }
    if (*device >= count || *device >= MAX_DEVICES)
        return w4a16_fail(W4A16_ERR_INVALID_VALUE, "device=%d does not exist (%d visible)", *device, count);
    return W4A16_OK;
}

w4a16_status w4a16_current_device(int *device, const w4a16_device_state **state) {
    *device = -1;
    w4a16_status s = resolve_device(device);
    if (s != W4A16_OK) return s;
    const w4a16_device_state *st = device_state(*device);
    if (st->status != W4A16_OK) return w4a16_fail(st->status, "%s", st->reason);
    *state = st;
    return W4A16_OK;
}

w4a16_status w4a16_get_device_info(int device, w4a16_device_info *info) {
    w4a16_clear_error();
    if (!info) return w4a16_fail(W4A16_ERR_NULL_POINTER, "info is NULL");
    memset(info, 0, sizeof *info);
    info->device = device;
    info->runtime_version = CUDART_VERSION;
    info->driver_version = driver_version();
    if (device < 0) return w4a16_fail(W4A16_ERR_INVALID_VALUE, "device=%d is negative", device);
    w4a16_status s = resolve_device(&device);
    if (s != W4A16_OK) {
        info->status = s;
        snprintf(info->reason, sizeof info->reason, "%s", w4a16_last_error_message());
        return s;
    }
    struct cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) return w4a16_fail(W4A16_ERR_CUDA, "cudaGetDeviceProperties: %s", cudaGetErrorString(e));
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    info->cc_major = prop.major;
    info->cc_minor = prop.minor;
    info->sm_count = prop.multiProcessorCount;
    info->smem_per_block_optin = prop.sharedMemPerBlockOptin;
    info->l2_bytes = (size_t)prop.l2CacheSize;
    info->native_sass = has_native_sass(prop.major * 10 + prop.minor);
    const w4a16_device_state *st = device_state(device);
    info->status = st->status;
    info->supported = st->status == W4A16_OK;
    snprintf(info->reason, sizeof info->reason, "%s", st->reason);
    if (st->profile) snprintf(info->profile, sizeof info->profile, "%s", st->profile->name);
    return W4A16_OK;
}

w4a16_status w4a16_force_profile(const char *name) {
    w4a16_clear_error();
    int automatic = !name || !*name || strcmp(name, "auto") == 0;
    const w4a16_profile *p = automatic ? NULL : w4a16_find_profile(name);
    if (!automatic && !p)
        return w4a16_fail(W4A16_ERR_INVALID_VALUE,
                          "profile '%s' does not exist (sm80 sm86 sm89 sm90 sm100 sm120 sm121 auto)", name);
    int device = -1;
    const w4a16_device_state *st;
    w4a16_status s = w4a16_current_device(&device, &st);
    if (s != W4A16_OK) return s;
    pthread_mutex_lock(&state_lock);
    w4a16_device_state *w = &states[device];
    if (automatic) {
        struct cudaDeviceProp prop;
        cudaGetDeviceProperties(&prop, device);
        p = fit_profile(native_profile(prop.major * 10 + prop.minor), w->smem_optin);
    } else if ((size_t)w4a16_profile_smem_bytes(p) > w->smem_optin) {
        pthread_mutex_unlock(&state_lock);
        return w4a16_fail(W4A16_ERR_PROFILE_UNAVAILABLE,
                          "profile %s needs %d bytes of shared memory per block; device %d allows %zu", name,
                          w4a16_profile_smem_bytes(p), device, w->smem_optin);
    }
    if (p) w->profile = p;
    if (log_enabled()) fprintf(stderr, "w4a16: device %d: profile %s%s\n", device, p ? p->name : "?",
                               automatic ? " (automatic)" : " (forced)");
    pthread_mutex_unlock(&state_lock);
    return W4A16_OK;
}

/* ---------------------------------------------------------------- workspace
 * A call splits K only while splits x tiles <= SMs x (its config's blocks per SM), so the counters need that
 * many ints and the partials that many tiles of fp32, for the largest such product over the configs. */
static size_t max_split_blocks(int sm_count) {
    int best = 0;
    for (int i = 0; i < W4A16_NUM_GEMM_CONFIGS; i++)
        if (configs[i].minb > best) best = configs[i].minb;
    return (size_t)sm_count * best;
}

static size_t max_split_partial_bytes(int sm_count) {
    size_t best = 0;
    for (int i = 0; i < W4A16_NUM_WGMMA_CONFIGS; i++) {
        size_t b = (size_t)sm_count * w4a16_wgmma_minb(i) * w4a16_wgmma_tm(i) * w4a16_wgmma_bn(i) * sizeof(float);
        if (b > best) best = b;
    }
    for (int i = 0; i < W4A16_NUM_GEMM_CONFIGS; i++) {
        const w4a16_gemm_config *c = &configs[i];
        size_t b = (size_t)sm_count * c->minb * w4a16_cfg_bm(c) * w4a16_cfg_bn(c) * sizeof(float);
        if (b > best) best = b;
    }
    return best;
}

size_t w4a16_workspace_counters_bytes(int sm_count) {
    size_t b = max_split_blocks(sm_count) * sizeof(int);
    return (b + 255) & ~(size_t)255;
}

size_t w4a16_workspace_bytes_for(int sm_count) {
    return w4a16_workspace_counters_bytes(sm_count) + max_split_partial_bytes(sm_count);
}

/* The staged path's slab starts 256-byte aligned after the split-K part. */
size_t w4a16_workspace_slab_offset(int sm_count) { return (w4a16_workspace_bytes_for(sm_count) + 255) & ~(size_t)255; }

w4a16_status w4a16_workspace_size_staged(int N, int K, size_t *bytes) {
    w4a16_clear_error();
    if (!bytes) return w4a16_fail(W4A16_ERR_NULL_POINTER, "bytes is NULL");
    w4a16_status s = w4a16_check_gemm_shape(1, N, K, -1, 32, NULL);
    if (s != W4A16_OK) return s;
    int device;
    const w4a16_device_state *st;
    if ((s = w4a16_current_device(&device, &st)) != W4A16_OK) return s;
    *bytes = w4a16_workspace_slab_offset(st->sm_count) + (size_t)N * (size_t)K * 2;
    return W4A16_OK;
}

w4a16_status w4a16_workspace_size(size_t *bytes) {
    w4a16_clear_error();
    if (!bytes) return w4a16_fail(W4A16_ERR_NULL_POINTER, "bytes is NULL");
    int device;
    const w4a16_device_state *st;
    w4a16_status s = w4a16_current_device(&device, &st);
    if (s != W4A16_OK) return s;
    *bytes = w4a16_workspace_bytes_for(st->sm_count);
    return W4A16_OK;
}
