/* Devices, drivers and the choice of profile (csrc/profiles.c).
 *
 * Each device gets one profile on first use (thread-safe): its own, else the nearest of its family, walking the
 * fallback chain until the tiles fit the device's sharedMemPerBlockOptin; W4A16_PROFILE forces one, W4A16_LOG=1
 * prints the choice. A forced profile of an architecture with less shared memory per SM than the device holds each
 * SM to that architecture's (a carveout on every GEMM kernel), so that the resident blocks, and therefore the
 * timings, are those its GPUs would see; K splits and grids still use the device's own SM count. Before any profile is
 * accepted, one kernel image is loaded (cudaFuncGetAttributes) so a GPU this build cannot run is reported
 * here, naming its compute capability and the compiled architectures, and never reached by a launch. */
#include "../kernels/moe_launch.h"
#include "internal.h"
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef W4A16_SASS_ARCHS
#define W4A16_SASS_ARCHS ""
#endif
#ifndef W4A16_PTX_ARCHS
#define W4A16_PTX_ARCHS ""
#endif

/* The device's own profile, else the nearest lower one of the same major version, else NULL. */
static const w4a16_profile *native_profile(int arch) {
    const w4a16_profile *best = NULL;
    for (const char *const *name = w4a16_profile_names(); *name; name++) {
        const w4a16_profile *p = w4a16_find_profile(*name);
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
    if (drv == 0) return w4a16_fail(W4A16_ERR_NO_DEVICE, "no NVIDIA driver found (libcuda.so.1 could not be loaded)");
    if (drv < CUDART_VERSION)
        return w4a16_fail(W4A16_ERR_DRIVER_TOO_OLD,
                          "the NVIDIA driver supports CUDA %d.%d but this build of w4a16 needs CUDA %d.%d "
                          "(driver >= 580 for CUDA 13): update the driver",
                          drv / 1000, (drv % 1000) / 10, CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10);
    return W4A16_OK;
}

/* ---------------------------------------------------------------- per-device views
 * The planners read a device through one immutable view, swapped whole by w4a16_force_profile: views are never freed
 * or rewritten (one per profile, forced or not), so a call that loaded the previous one still reads a whole one. */
enum { MAX_DEVICES = 64 };
static w4a16_device_views devices[MAX_DEVICES];
static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER; /* serialises first use and w4a16_force_profile */

const w4a16_device_state *w4a16_device_view(w4a16_device_views *v, const w4a16_profile *p, int forced) {
    int i = 0;
    for (const char *const *name = w4a16_profile_names(); *name && w4a16_find_profile(*name) != p; name++) i++;
    w4a16_device_state *view = &v->built[i][forced != 0];
    if (!view->profile) { /* never published yet: no reader can hold it */
        *view = v->desc;
        w4a16_use_profile(view, p, forced);
    }
    return view;
}

void w4a16_publish_view(w4a16_device_views *v, const w4a16_device_state *view) {
    atomic_store_explicit(&v->current, view, memory_order_release);
}

const w4a16_device_state *w4a16_current_view(w4a16_device_views *v) {
    return atomic_load_explicit(&v->current, memory_order_acquire);
}

/* W4A16_LOG: 0 or unset quiet, 1 the device's profile, 2 also every GEMM call's plan. */
static int log_level(void) {
    const char *v = getenv("W4A16_LOG");
    if (!v || !*v) return 0;
    int n = atoi(v);
    return n > 0 ? n : strcmp(v, "0") != 0;
}

/* Profile `p` in the view `st`, before it is published. A forced profile of an architecture with less shared memory per
 * SM than the device is emulated: the plans count resident blocks with its shared memory, and the kernels run with the
 * carveout (percent of the device's, rounded down: the hardware rounds a carveout up to its next configuration)
 * that leaves that much. */
void w4a16_use_profile(w4a16_device_state *st, const w4a16_profile *p, int forced) {
    st->profile = p;
    st->smem_per_sm = st->device_smem_per_sm;
    st->carveout = -1;
    if (forced && p->smem_per_sm < st->device_smem_per_sm) {
        st->smem_per_sm = p->smem_per_sm;
        st->carveout = (int)(100LL * p->smem_per_sm / st->device_smem_per_sm);
    }
}

/* ", each SM held to 100 KB of shared memory (carveout 43%)" when a profile is emulated, else "". */
static void emulation_text(const w4a16_device_state *st, char *buf, size_t size) {
    buf[0] = 0;
    if (st->carveout >= 0)
        snprintf(buf, size, ", each SM held to the %d KB of shared memory of %s (carveout %d%% of %d KB)",
                 st->smem_per_sm / 1024, st->profile->name, st->carveout, st->device_smem_per_sm / 1024);
}

/* ", warp-specialised tiles from M = ..." where the view's profile plans them (csrc/plan.c: the 32-row form in the
 * mid32 regime, the 64-row one past it, the 128-row one from rows128_min_m; ", at M = 17-32" where a wgmma kernel takes
 * the M above). Short: the device description (reason[256]) also holds the forced profile and the emulation. */
static void ws_text(const w4a16_device_state *st, char *buf, size_t size) {
    const w4a16_profile *p = st->profile;
    buf[0] = 0;
    if (!st->ws || p->rows128_min_m <= 0) return;
    const int from = p->ws32_min_kt > 0      ? p->small_max_m + 1
                     : p->ws64_sk_min_kt > 0 ? p->mid32_max_m + 1
                                             : p->rows128_min_m;
    if (!(st->wgmma && p->wgmma_min_m > 0))
        snprintf(buf, size, ", warp-specialised tiles from M = %d", from);
    else if (from < p->wgmma_min_m)
        snprintf(buf, size, ", warp-specialised tiles at M = %d-%d", from, p->wgmma_min_m - 1);
}

/* Accept `p` for the device if it fits; else walk its fallback chain. */
static const w4a16_profile *fit_profile(const w4a16_profile *p, size_t smem_optin) {
    while (p && (size_t)w4a16_profile_smem_bytes(p) > smem_optin) p = w4a16_find_profile(p->fallback);
    return p;
}

/* Describe `device`, which must be the current device, in v->desc and return the view to publish first: the one
 * of its profile, or desc itself when the device cannot be used. Called with state_lock held, before any view of
 * `device` is published. */
static const w4a16_device_state *init_state(int device, w4a16_device_views *v) {
    w4a16_device_state *st = &v->desc;
    memset(st, 0, sizeof *st);
    st->reason = v->reason;
    struct cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) {
        st->status = W4A16_ERR_CUDA;
        snprintf(v->reason, sizeof v->reason, "cudaGetDeviceProperties(%d) failed: %s", device, cudaGetErrorString(e));
        return st;
    }
    int arch = prop.major * 10 + prop.minor;
    st->sm_count = prop.multiProcessorCount;
    st->smem_optin = prop.sharedMemPerBlockOptin;
    st->device_smem_per_sm = (int)prop.sharedMemPerMultiprocessor;
    st->smem_reserved = (int)prop.reservedSharedMemPerBlock;
    st->carveout = -1;
    st->pdl = prop.major >= 9;
    st->log_level = log_level();
    if (arch < 80) {
        st->status = W4A16_ERR_ARCH_UNSUPPORTED;
        snprintf(v->reason, sizeof v->reason,
                 "%s has compute capability %d.%d; w4a16 needs 8.0 or newer (compiled for %s)", prop.name, prop.major,
                 prop.minor, w4a16_compiled_archs());
        return st;
    }
    int bin = 0;
    e = (cudaError_t)w4a16_probe_gemm(0, W4A16_LAYOUT_AWQ, 0, &bin);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* the probe's error is not sticky; do not leave it for the caller */
        st->status = W4A16_ERR_ARCH_UNSUPPORTED;
        snprintf(v->reason, sizeof v->reason,
                 "%s (compute capability %d.%d) cannot load w4a16's kernels: %s; this build holds SASS for "
                 "%s",
                 prop.name, prop.major, prop.minor, cudaGetErrorString(e), w4a16_compiled_archs());
        return st;
    }
    /* the architecture-specific images of the warp-specialised tile run on exactly these compute capabilities */
    if (arch == 90 || arch == 120 || arch == 121) {
        st->ws = w4a16_probe_ws() == cudaSuccess &&
                 (size_t)w4a16_moe_smem_bytes(W4A16_MOE_TILE_128, W4A16_LAYOUT_AWQ, 3) <= st->smem_optin;
        cudaGetLastError();
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
                snprintf(v->reason, sizeof v->reason,
                         "W4A16_PROFILE=%s needs %d bytes of shared memory per block; %s allows %zu", forced,
                         w4a16_profile_smem_bytes(p), prop.name, st->smem_optin);
            } else {
                st->status = W4A16_ERR_INVALID_VALUE;
                snprintf(v->reason, sizeof v->reason, "W4A16_PROFILE=%s is not a profile name (%s)", forced,
                         w4a16_profile_list_text());
            }
            return st;
        }
    } else {
        p = fit_profile(native_profile(arch), st->smem_optin);
    }
    if (!p) {
        st->status = W4A16_ERR_ARCH_UNSUPPORTED;
        snprintf(v->reason, sizeof v->reason,
                 "no w4a16 profile fits %s (compute capability %d.%d, %zu bytes of "
                 "shared memory per block)",
                 prop.name, prop.major, prop.minor, st->smem_optin);
        return st;
    }
    const int is_forced = forced && *forced && strcmp(forced, "auto") != 0;
    st->status = W4A16_OK;
    const w4a16_device_state *view = w4a16_device_view(v, p, is_forced);
    char wg[160] = "", staged[48] = "", wgws[48] = "", emu[128], wst[64];
    emulation_text(view, emu, sizeof emu);
    ws_text(view, wst, sizeof wst);
    if (p->staged_min_m > 0) snprintf(staged, sizeof staged, ", staged GEMMs from M = %d", p->staged_min_m);
    if (p->wgws_min_m > 0 && st->ws) snprintf(wgws, sizeof wgws, ", wgmma-ws tiles from M = %d", p->wgws_min_m);
    if (st->wgmma && p->wgmma_min_m > 0)
        snprintf(wg, sizeof wg, ", wgmma kernels from M = %d (256-token tile from M = %d)%s%s", p->wgmma_min_m,
                 p->wgmma_large_min_m, wgws, staged);
    snprintf(v->reason, sizeof v->reason,
             "profile %s%s on %s (sm_%d, %d SMs, %zu KB shared memory per block), %s%s%s%s", p->name,
             is_forced ? " (forced by W4A16_PROFILE)" : "", prop.name, arch, st->sm_count, st->smem_optin / 1024,
             has_native_sass(arch) ? "native SASS" : "PTX JIT (no SASS for this GPU in this build)", wg, wst, emu);
    if (st->log_level) fprintf(stderr, "w4a16: device %d: %s\n", device, v->reason);
    return view;
}

/* The current view of `device`, describing the device on first use (switching the current device temporarily when
 * needed). */
static const w4a16_device_state *device_state(int device) {
    w4a16_device_views *v = &devices[device];
    const w4a16_device_state *st = w4a16_current_view(v);
    if (st) return st;
    pthread_mutex_lock(&state_lock);
    st = w4a16_current_view(v);
    if (!st) {
        int cur = -1;
        cudaGetDevice(&cur);
        if (cur != device) cudaSetDevice(device);
        st = init_state(device, v);
        w4a16_publish_view(v, st);
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
        return w4a16_fail(W4A16_ERR_INVALID_VALUE, "profile '%s' does not exist (%s)", name, w4a16_profile_list_text());
    int device = -1;
    const w4a16_device_state *st;
    w4a16_status s = w4a16_current_device(&device, &st);
    if (s != W4A16_OK) return s;
    pthread_mutex_lock(&state_lock);
    w4a16_device_views *v = &devices[device];
    if (automatic) {
        struct cudaDeviceProp prop;
        cudaGetDeviceProperties(&prop, device);
        p = fit_profile(native_profile(prop.major * 10 + prop.minor), st->smem_optin);
    } else if ((size_t)w4a16_profile_smem_bytes(p) > st->smem_optin) {
        pthread_mutex_unlock(&state_lock);
        return w4a16_fail(W4A16_ERR_PROFILE_UNAVAILABLE,
                          "profile %s needs %d bytes of shared memory per block; device %d allows %zu", name,
                          w4a16_profile_smem_bytes(p), device, st->smem_optin);
    }
    if (p) {
        st = w4a16_device_view(v, p, !automatic);
        w4a16_publish_view(v, st);
    }
    char emu[128], wst[64];
    emulation_text(st, emu, sizeof emu);
    ws_text(st, wst, sizeof wst);
    if (st->log_level)
        fprintf(stderr, "w4a16: device %d: profile %s%s%s%s\n", device, p ? p->name : "?",
                automatic ? " (automatic)" : " (forced)", wst, emu);
    pthread_mutex_unlock(&state_lock);
    return W4A16_OK;
}

/* ---------------------------------------------------------------- workspace
 * The decode and wgmma kernels split K only while splits x tiles <= SMs x (their config's blocks per SM): a counter
 * and a tile of fp32 partial sums per block. The mma.sync tile kernel's stream-K (csrc/plan.c) runs at most that
 * many blocks too, over at most twice as many tiles, and each block keeps at most two partial tiles. */
static size_t max_split_blocks(int sm_count) {
    int best = 0;
    for (int i = 0; i < W4A16_NUM_GEMM_CONFIGS; i++)
        if (w4a16_config(i)->minb > best) best = w4a16_config(i)->minb;
    return (size_t)sm_count * best;
}

static size_t max_split_partial_bytes(int sm_count) {
    size_t best = 0;
    for (int i = 0; i < W4A16_NUM_WGMMA_CONFIGS; i++) {
        size_t b = (size_t)sm_count * w4a16_wgmma_minb(i) * w4a16_wgmma_tm(i) * w4a16_wgmma_bn(i) * sizeof(float);
        if (b > best) best = b;
    }
    for (int i = 0; i < W4A16_NUM_GEMM_CONFIGS; i++) {
        const w4a16_gemm_config *c = w4a16_config(i);
        size_t b = 2 * (size_t)sm_count * c->minb * w4a16_cfg_bm(c) * w4a16_cfg_bn(c) * sizeof(float);
        if (b > best) best = b;
    }
    return best;
}

size_t w4a16_workspace_counters_bytes(int sm_count) {
    size_t b = 2 * max_split_blocks(sm_count) * sizeof(int);
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

w4a16_status w4a16_workspace_query(size_t *bytes, size_t (*bytes_for)(int sm_count)) {
    w4a16_clear_error();
    if (!bytes) return w4a16_fail(W4A16_ERR_NULL_POINTER, "bytes is NULL");
    int device;
    const w4a16_device_state *st;
    w4a16_status s = w4a16_current_device(&device, &st);
    if (s != W4A16_OK) return s;
    *bytes = bytes_for(st->sm_count);
    return W4A16_OK;
}

w4a16_status w4a16_workspace_size(size_t *bytes) { return w4a16_workspace_query(bytes, w4a16_workspace_bytes_for); }
