/* Mixture-of-experts entry points: routing, the grouped GEMMs and the stacked-expert converters. Every argument is
 * checked before anything is launched; nothing is allocated and nothing synchronised. */
#include "../kernels/moe_launch.h"
#include "internal.h"
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* The routing shape: counts >= 1, E within the routing kernel's shared memory, entries and padding within int32. */
static w4a16_status check_routing_shape(int num_tokens, int top_k, int num_experts, int block_size, int *entries,
                                        int *sorted_capacity) {
    if (num_tokens < 1 || top_k < 1 || num_experts < 1)
        return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "num_tokens=%d, top_k=%d and num_experts=%d must be at least 1",
                          num_tokens, top_k, num_experts);
    if (num_experts > W4A16_MOE_MAX_EXPERTS)
        return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "num_experts=%d is more than the %d the routing supports",
                          num_experts, W4A16_MOE_MAX_EXPERTS);
    if (block_size < 1 || block_size > 1024)
        return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "block_size=%d is not in 1..1024", block_size);
    const long long n = (long long)num_tokens * top_k;
    const long long used = n < num_experts ? n : num_experts;
    /* each used expert pads its run by at most block_size - 1, and the runs add up to a multiple of block_size: so
     * rounding the bound down, not up, still holds every run (and vLLM's numel + E (block_size - 1) buffers fit) */
    long long cap = n + used * (block_size - 1);
    cap = cap / block_size * block_size;
    if (cap > 2147483647LL - 1024)
        return w4a16_fail(W4A16_ERR_SIZE_OVERFLOW,
                          "num_tokens=%d x top_k=%d with block_size=%d needs %lld routing "
                          "entries, more than int32 indexes",
                          num_tokens, top_k, block_size, cap);
    *entries = (int)n;
    *sorted_capacity = (int)cap;
    return W4A16_OK;
}

w4a16_status w4a16_moe_align_sizes(int num_tokens, int top_k, int num_experts, int block_size, int *sorted_capacity,
                                   int *blocks_capacity) {
    w4a16_clear_error();
    if (!sorted_capacity || !blocks_capacity)
        return w4a16_fail(W4A16_ERR_NULL_POINTER, "%s is NULL",
                          sorted_capacity ? "blocks_capacity" : "sorted_capacity");
    int n, cap;
    w4a16_status s = check_routing_shape(num_tokens, top_k, num_experts, block_size, &n, &cap);
    if (s != W4A16_OK) return s;
    *sorted_capacity = cap;
    *blocks_capacity = cap / block_size;
    return W4A16_OK;
}

w4a16_status w4a16_moe_align_block_size(const int32_t *topk_ids, int num_tokens, int top_k, int num_experts,
                                        int block_size, int32_t *sorted_ids, int sorted_capacity, int32_t *expert_ids,
                                        int blocks_capacity, int32_t *num_tokens_post_padded, w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int n, cap, device;
    const w4a16_device_state *st;
    if ((s = w4a16_check_ptr(topk_ids, "topk_ids", 4, 1)) || (s = w4a16_check_ptr(sorted_ids, "sorted_ids", 4, 1)) ||
        (s = w4a16_check_ptr(expert_ids, "expert_ids", 4, 1)) ||
        (s = w4a16_check_ptr(num_tokens_post_padded, "num_tokens_post_padded", 4, 1)) ||
        (s = check_routing_shape(num_tokens, top_k, num_experts, block_size, &n, &cap)))
        return s;
    /* the routing kernel's loops step through the buffers 1024 entries at a time in int */
    if (sorted_capacity > 2147483647 - 1024 || blocks_capacity > 2147483647 - 1024)
        return w4a16_fail(W4A16_ERR_SIZE_OVERFLOW, "sorted_capacity=%d / blocks_capacity=%d: at most %d entries",
                          sorted_capacity, blocks_capacity, 2147483647 - 1024);
    if (sorted_capacity < cap)
        return w4a16_fail(W4A16_ERR_INVALID_SHAPE,
                          "sorted_capacity=%d is less than the %d entries "
                          "w4a16_moe_align_sizes() asks for",
                          sorted_capacity, cap);
    if (blocks_capacity < cap / block_size)
        return w4a16_fail(W4A16_ERR_INVALID_SHAPE,
                          "blocks_capacity=%d is less than the %d blocks "
                          "w4a16_moe_align_sizes() asks for",
                          blocks_capacity, cap / block_size);
    if ((s = w4a16_current_device(&device, &st))) return s;
    return w4a16_launch_status(w4a16_launch_moe_align(topk_ids, n, num_experts, block_size, sorted_ids, sorted_capacity,
                                                      expert_ids, blocks_capacity, num_tokens_post_padded, stream),
                               "w4a16_moe_align_block_size");
}

/* Split-K workspace of the MoE GEMMs: a counter per tile, then the fp32 sums of every split of every tile, for at most
 * W4A16_MOE_SPLIT_SLOTS_PER_SM blocks per SM (splits are only chosen while tiles x splits stay within that). */
static size_t moe_counters_bytes(int sm_count) {
    return ((size_t)sm_count * W4A16_MOE_SPLIT_SLOTS_PER_SM * sizeof(int) + 255) & ~(size_t)255;
}
static size_t moe_workspace_bytes(int sm_count) {
    return moe_counters_bytes(sm_count) + (size_t)sm_count * W4A16_MOE_SPLIT_SLOTS_PER_SM * W4A16_MOE_SPLIT_TILE_BYTES;
}

w4a16_status w4a16_moe_workspace_size(size_t *bytes) { return w4a16_workspace_query(bytes, moe_workspace_bytes); }

/* K splits of the 16 x 64 tile: only when the tiles (routing blocks x channel tiles, counted from the routing
 * buffers' capacity, which at decode sizes is close to the blocks that run) fill at most half the GPU's block slots
 * (at most W4A16_MOE_SPLIT_SLOTS_PER_SM per SM, what the workspace holds); then as many splits as fill the slots once
 * (two waves' worth was slower on every split row of the H100 benchmark), at most 16, each with at least 640 k: a split
 * costs a round trip through the workspace and the last block's additions, which 384 k per split did not repay
 * (Qwen3-30B-A3B w2 at T = 1: 1.25x slower). */
static int moe_splits(int sm_count, int per_sm, long long tiles, int K) {
    if (per_sm > W4A16_MOE_SPLIT_SLOTS_PER_SM) per_sm = W4A16_MOE_SPLIT_SLOTS_PER_SM;
    if (tiles > (long long)sm_count * per_sm) return 1; /* also keeps tiles within int below */
    return w4a16_choose_splits(per_sm, (int)tiles, (K + W4A16_MOE_SPLIT_BK - 1) / W4A16_MOE_SPLIT_BK, sm_count,
                               (640 + W4A16_MOE_SPLIT_BK - 1) / W4A16_MOE_SPLIT_BK);
}

/* The kernels prepared on each device (shared-memory and carveout attributes set, w4a16_moe_prepare): per device and
 * kernel (dtype, layout, tile, split), the shared memory and carveout it was prepared with and the resident blocks per
 * SM the device then allows. A call prepares its kernel only when that differs (first use, another pipeline depth or
 * carveout after a profile change), not on every call. */
enum { MOE_MAX_DEVICES = 64, MOE_KERNELS = 2 * 2 * W4A16_MOE_TILES * 3 };
typedef struct moe_prepared {
    int smem; /* 0: not prepared */
    int carveout;
    int occupancy;
} moe_prepared;
static moe_prepared moe_kernels[MOE_MAX_DEVICES][MOE_KERNELS];
static pthread_mutex_t moe_kernels_lock = PTHREAD_MUTEX_INITIALIZER;

/* Prepares the kernel of launch `a` (split: 1 the K-splitting one, 2 the stream-K one) on `device`, the current device,
 * once; *occupancy: its resident blocks per SM. Returns the cudaError_t. */
static int moe_prepare(int device, const w4a16_moe_launch *a, int split, int *occupancy) {
    const int tile = a->tile;
    /* (the warp-specialised tiles run stream-K and whole tiles in one kernel: one entry) */
    if ((split == 1 && !w4a16_moe_tile_can_split(tile)) || (split == 2 && !w4a16_moe_tile_can_stream_k(tile)) ||
        w4a16_moe_tile_ws(tile))
        split = 0;
    const int smem = w4a16_moe_smem_bytes(tile, a->layout, a->stages);
    int err = cudaSuccess;
    *occupancy = 0;
    if (device < 0 || device >= MOE_MAX_DEVICES) return w4a16_moe_prepare(a, split, occupancy);
    pthread_mutex_lock(&moe_kernels_lock);
    moe_prepared *k = &moe_kernels[device][((a->dtype * 2 + a->layout) * W4A16_MOE_TILES + tile) * 3 + split];
    if (k->smem != smem || k->carveout != a->carveout) {
        int occ = 0;
        err = w4a16_moe_prepare(a, split, &occ);
        k->smem = err == cudaSuccess ? smem : 0;
        k->carveout = a->carveout;
        k->occupancy = occ;
    }
    if (err == cudaSuccess) *occupancy = k->occupancy;
    pthread_mutex_unlock(&moe_kernels_lock);
    return err;
}

/* Resident blocks per SM a MoE kernel is counted with: those the device gives it (its shared memory and the
 * carveout of an emulated SM set, as the launch sets them), at most what the profile's SM holds by shared memory, as
 * the dense plans count them (csrc/plan.c); 0 when the occupancy query fails (then K is not split). */
static int moe_blocks_per_sm(const w4a16_device_state *st, int device, const w4a16_moe_launch *a, int split,
                             int *occupancy) {
    int occ = 0;
    if (moe_prepare(device, a, split, &occ) != cudaSuccess) occ = 0;
    const int by_smem = st->smem_per_sm / (w4a16_moe_smem_bytes(a->tile, a->layout, a->stages) + st->smem_reserved);
    *occupancy = occ;
    return occ < by_smem ? occ : by_smem;
}

/* The MoE launch of a dense GEMM plan that runs a MoE launch tile (W4A16_KERNEL_TILES) on the identity routing
 * (no routing buffers: row i of A and C is pair i of routing block i / rows, all of expert 0), channel tiles fastest.
 */
static void moe_dense_of(const w4a16_gemm_launch *g, w4a16_moe_launch *a) {
    const w4a16_gemm_args *x = &g->args;
    const int rows = W4A16_KERNEL_ROWS(g->plan.kind);
    *a = (w4a16_moe_launch){
        .A = x->A,
        .B = x->B,
        .scales = x->scales,
        .zeros = x->zeros,
        .bias = x->bias,
        .C = x->C,
        .sorted_capacity = g->plan.grid[0] * rows,
        .grid_blocks = g->plan.grid[0],
        .block_size = rows,
        .M = x->M,
        .top_k = 1,
        .num_experts = 1,
        .N = x->N,
        .K = x->K,
        .gshift = x->gshift,
        .marlin_channelwise = x->marlin_channelwise,
        .dtype = g->dtype,
        .layout = g->layout,
        .stages = g->plan.stages,
        .carveout = g->plan.carveout,
        .tile = w4a16_kernel_moe_tile(g->plan.kind),
        .splits = g->plan.splits,
        .sk_blocks = g->plan.sk_blocks,
        .sk_fixup = g->plan.sk_fixup,
        .n_fast = g->plan.grid[0] <= 65535,
        /* only rows-16, the kind that replaced the decode kernel's PDL launches and that test_selfref_pdl_chain runs;
         * rows-16w with the flag had llama3-8b.gate_up at M = 9 / 16 (224 whole 16 x 128 tiles on 528 slots) at
         * 1.10-1.16x its plain time in make bench (v38); the other MoE-tile plans launch plainly as before */
        .pdl = x->pdl && g->plan.kind == W4A16_KERNEL_ROWS16,
        .counters = x->counters, /* the dense workspace's counters and partial sums (K splits) */
        .partials = x->partials,
        .stream = g->stream,
    };
}

/* The MoE launch of a dense plan in *a, its kernel prepared on the current device (once); cudaError_t. */
static int moe_dense_prepare(const w4a16_gemm_launch *g, w4a16_moe_launch *a, int *blocks_per_sm) {
    int device;
    const w4a16_device_state *st;
    *blocks_per_sm = 0;
    if (w4a16_current_device(&device, &st) != W4A16_OK) return cudaErrorInvalidDevice;
    moe_dense_of(g, a);
    return moe_prepare(device, a, w4a16_moe_launch_split(a), blocks_per_sm);
}

int w4a16_moe_dense_occupancy(const w4a16_gemm_launch *g, int *blocks_per_sm) {
    w4a16_moe_launch a;
    return moe_dense_prepare(g, &a, blocks_per_sm);
}

int w4a16_moe_dense_launch(const w4a16_gemm_launch *g) {
    w4a16_moe_launch a;
    int occupancy;
    const int err = moe_dense_prepare(g, &a, &occupancy);
    return err != cudaSuccess ? err : w4a16_launch_moe_gemm(&a);
}

/* A tile for launch `a` with the pipeline depth the profile gives that tile (w4a16_moe_stages): the two go together,
 * since the depth decides the shared memory and so the resident blocks the plan counts. */
static void moe_use_tile(const w4a16_device_state *st, w4a16_moe_launch *a, int tile) {
    a->tile = tile;
    a->stages = w4a16_moe_stages(st, tile, a->layout);
}

/* The tile of a 16-row routing block (the routing blocks counted from the buffers' capacity, as for the K split), from
 * one A/B run of the three tiles on the H100, native and sm120 profiles (docs/PERFORMANCE.md "MoE m4"):
 * - 16 x 64 where its blocks fit in about one wave of the GPU's block slots (at most 1.1: decode sizes), or where the
 *   16 x 128 tile's would fill less than 60% of its slots (Mixtral's long-K w2 at T = 4-16): the most blocks, the 4
 *   warps splitting each stage's k, and K split across blocks where they fill at most half the slots;
 * - else 16 x 256 where its blocks fill at least 60% of its slots and it is as resident as the 16 x 128 tile (each
 *   warp dequantises its 64 channels over whole stages: 0.62-0.85x the 16 x 64 tile's time there; on the 100 KB
 *   profiles with 3 stages it held half the blocks per SM and measured slower than 16 x 128 on every row; with 2 it
 *   holds as many, Marlin layout: "MoE m14");
 * - else 16 x 128 (0.77-0.95x the 16 x 64 tile's time where the 16 x 256 tile would leave SMs idle). */
static void moe_tile16(const w4a16_device_state *st, int device, w4a16_moe_launch *a) {
    const long long sms = st->sm_count, rb = a->grid_blocks;
    int occ;
    moe_use_tile(st, a, W4A16_MOE_TILE_16x64);
    const long long per_c = moe_blocks_per_sm(st, device, a, 0, &occ);
    if (per_c < 1 || rb * ((a->N + 63) / 64) * 10 <= sms * per_c * 11) return;
    moe_use_tile(st, a, W4A16_MOE_TILE_16x128);
    const long long per_a = moe_blocks_per_sm(st, device, a, 0, &occ);
    if (per_a < 1 || rb * ((a->N + 127) / 128) * 10 < sms * per_a * 6) {
        moe_use_tile(st, a, W4A16_MOE_TILE_16x64);
        return;
    }
    moe_use_tile(st, a, W4A16_MOE_TILE_16x256); /* 2 stages on a 100 KB SM: four blocks */
    const long long per_b = (size_t)w4a16_moe_smem_bytes(a->tile, a->layout, a->stages) <= st->smem_optin
                                ? moe_blocks_per_sm(st, device, a, 0, &occ)
                                : 0;
    if (per_b < 1 || per_b < per_a || rb * ((a->N + 255) / 256) * 10 < sms * per_b * 6)
        moe_use_tile(st, a, W4A16_MOE_TILE_16x128);
}

int w4a16_moe_stages(const w4a16_device_state *st, int tile, int layout) {
    /* ws-64 70656 bytes, ws-32 54272: one block per 100 KB SM, as the 128-row tile's 3 stages (ws-32 with 6 stages,
     * 81408 bytes, measured no faster: docs/PERFORMANCE.md v36) */
    if (tile == W4A16_MOE_TILE_WS64 || tile == W4A16_MOE_TILE_WS32) return 4;
    /* the wgmma form (228 KB Hopper SMs, one block): 6 stages of 26-27 KB (128 rows) took 0.97-0.99x the time of 4 at
     * M 128-512 (docs/PERFORMANCE.md v45) */
    if (w4a16_moe_tile_wgmma(tile)) return 6;
    const int base = st->profile && st->profile->arch >= 90 && st->profile->arch < 120 ? 4 : 3;
    /* Two stages where the tile's register budget allows more resident blocks than shared memory gives it with `base`
     * and two stages fit them. The 64-row tile (4 warps, 2 blocks by registers) with 3 stages of 64 k takes 53-56 KB:
     * one block per 100 KB SM, so 4 warps to hide every latency; with 2 stages (35-37 KB) two blocks fit: 0.67-0.75x
     * the time at T >= 1024 under the sm120 profile (docs/PERFORMANCE.md "MoE m5"). The 32 x 64 tile (3 by
     * registers) takes 38.8 / 44.9 KB (Marlin / AWQ) with 3 stages of 128 k, two blocks per 100 KB SM; with 2 its
     * warps' reduction buffer (32 KB) sizes it and three fit: 0.91-0.96x the 3-stage time on three of the four layers
     * rows-32n won most on, 1.05x on the fourth ("v41"). The 16 x 256 tile (4 by registers) takes 34.5 KB with 3
     * stages, two blocks per 100 KB SM, so moe_tile16 never took it there; with 2 (23 KB) four fit, and where the
     * plan then takes it in place of 16 x 128 the sm120 profile ran 0.82-0.95x the time on 11 of 17 MoE rows at T =
     * 4-64, within 4% on 2, 1.05-1.13x on 4 ("MoE m14"). The 16 x 64 tile keeps its depth: its 4th block only paid
     * where it made the blocks fit one wave, and 2 stages lost 7-8% where they did not (dense rows-16 and MoE decode
     * rows). */
    const int want = tile == W4A16_MOE_TILE_64       ? 2
                     : tile == W4A16_MOE_TILE_32x64  ? 3
                     : tile == W4A16_MOE_TILE_16x256 ? 4
                                                     : 0;
    if (want && st->smem_per_sm / (w4a16_moe_smem_bytes(tile, layout, base) + st->smem_reserved) < want &&
        st->smem_per_sm / (w4a16_moe_smem_bytes(tile, layout, 2) + st->smem_reserved) >= want)
        return 2;
    return base;
}

/* The launch sizes of a MoE GEMM (no tensors): tile, stages, carveout, K splits. blocks_per_sm: the resident blocks
 * the kernel that runs is counted with (the K split is sized with the splitting kernel's); occupancy: those the
 * device gives it. */
static w4a16_status moe_plan(const w4a16_device_state *st, int device, int layout, int dtype, int block_size,
                             int sorted_capacity, int N, int K, int G, size_t workspace_bytes, const char *op,
                             w4a16_moe_launch *a, int *blocks_per_sm, int *occupancy) {
    if (workspace_bytes > 0 && workspace_bytes < moe_workspace_bytes(st->sm_count))
        return w4a16_fail(W4A16_ERR_WORKSPACE_TOO_SMALL,
                          "%s: workspace_bytes=%zu is less than the %zu bytes "
                          "w4a16_moe_workspace_size() asks for on device %d",
                          op, workspace_bytes, moe_workspace_bytes(st->sm_count), device);
    a->sorted_capacity = sorted_capacity;
    a->grid_blocks = (sorted_capacity + block_size - 1) / block_size;
    a->block_size = block_size;
    a->N = N;
    a->K = K;
    a->gshift = w4a16_group_shift(G);
    a->marlin_channelwise = layout == W4A16_LAYOUT_MARLIN && G == K;
    a->dtype = dtype;
    a->layout = layout;
    a->carveout = st->carveout; /* a forced profile's smaller SM, emulated as the dense kernels emulate it */
    moe_use_tile(st, a,
                 block_size <= 16   ? W4A16_MOE_TILE_16x64
                 : block_size <= 32 ? W4A16_MOE_TILE_32
                                    : W4A16_MOE_TILE_64);
    if ((size_t)w4a16_moe_smem_bytes(a->tile, layout, a->stages) > st->smem_optin)
        return w4a16_fail(W4A16_ERR_PROFILE_UNAVAILABLE,
                          "%s: block_size=%d needs %d bytes of shared memory; device %d "
                          "allows %zu",
                          op, block_size, w4a16_moe_smem_bytes(a->tile, layout, a->stages), device, st->smem_optin);
    if (block_size <= 16) moe_tile16(st, device, a);
    /* Channel tiles run fastest (gridDim.y holds the routing blocks, at most 65535), so the blocks launch routing block
     * by routing block. The grid counts the routing blocks the buffers can hold, and the blocks past the padded count
     * exit at once: in this order they all come after the live ones, which spread evenly over the SMs. Routing
     * blocks fastest interleave them with the live ones, in a pattern that can leave SMs with no live block beside
     * SMs with several (Mixtral-8x7B w2, 8 experts, 14336 k: 0.81x the routing-fast order's time at T = 4, 0.76x at
     * T = 64; over 120 rows of bench_moe at T <= 256, both layouts, native and sm120: 0.986x, at worst 1.02x,
     * docs/PERFORMANCE.md "MoE m6"). It also serves AWQ's 16-row tiles: their weight rows are 32- to 128-byte pieces,
     * which a 128-byte fetch serves to the neighbouring channel tiles only while they run together. */
    a->n_fast = a->grid_blocks <= 65535;
    a->splits = 1;
    *blocks_per_sm = *occupancy = 0;
    if (workspace_bytes > 0 && a->tile == W4A16_MOE_TILE_16x64) { /* only the 16 x 64 tile splits K */
        const long long tiles = (long long)a->grid_blocks * ((N + 63) / 64);
        *blocks_per_sm = moe_blocks_per_sm(st, device, a, 1, occupancy);
        a->splits = moe_splits(st->sm_count, *blocks_per_sm, tiles, K);
    }
    return W4A16_OK;
}

/* "16x64 tile (3 stages), 4 K splits, grid 9x12x4, 26496 bytes shared, 3 blocks/SM, carveout 43% (emulated SM)" */
static void moe_plan_text(const w4a16_moe_launch *a, int blocks_per_sm, char *buf, size_t size) {
    const int bn = w4a16_moe_tile_bn(a->tile);
    const int ntiles = (a->N + bn - 1) / bn;
    int n = snprintf(buf, size, "%dx%d tile (%d stages), %d K split%s, grid %dx%dx%d, %d bytes shared",
                     w4a16_moe_tile_rows(a->tile), bn, a->stages, a->splits, a->splits > 1 ? "s" : "",
                     a->n_fast ? ntiles : a->grid_blocks, a->n_fast ? a->grid_blocks : ntiles, a->splits,
                     w4a16_moe_smem_bytes(a->tile, a->layout, a->stages));
    if (blocks_per_sm > 0 && n > 0 && (size_t)n < size)
        n += snprintf(buf + n, size - n, ", %d block%s/SM", blocks_per_sm, blocks_per_sm > 1 ? "s" : "");
    if (a->carveout >= 0 && n > 0 && (size_t)n < size)
        snprintf(buf + n, size - n, ", carveout %d%% (emulated SM)", a->carveout);
}

static w4a16_status moe_gemm(int layout, const void *A, const int32_t *W, const void *scales, const int32_t *zeros,
                             const void *bias, const float *topk_weights, void *C, const int32_t *sorted_ids,
                             const int32_t *expert_ids, const int32_t *num_post_padded, int sorted_capacity,
                             int blocks_capacity, int block_size, int M, int top_k, int E, int N, int K, int group_size,
                             w4a16_dtype dtype, void *workspace, size_t workspace_bytes, w4a16_stream_t stream,
                             const char *op) {
    w4a16_status s;
    int G, device;
    const w4a16_device_state *st;
    const char *wname = layout == W4A16_LAYOUT_AWQ ? "qweight" : "weight";
    const char *zname = layout == W4A16_LAYOUT_AWQ ? "qzeros" : "zeros";
    if ((s = w4a16_check_dtype(dtype)) || (s = w4a16_check_ptr(A, "A", 16, 1)) ||
        (s = w4a16_check_ptr(W, wname, 16, 1)) || (s = w4a16_check_ptr(scales, "scales", 16, 1)) ||
        (s = w4a16_check_ptr(zeros, zname, 16, layout == W4A16_LAYOUT_AWQ)) ||
        (s = w4a16_check_ptr(bias, "bias", 4, 0)) || (s = w4a16_check_ptr(topk_weights, "topk_weights", 4, 0)) ||
        (s = w4a16_check_ptr(C, "C", 16, 1)) || (s = w4a16_check_ptr(sorted_ids, "sorted_ids", 4, 1)) ||
        (s = w4a16_check_ptr(expert_ids, "expert_ids", 4, 1)) ||
        (s = w4a16_check_ptr(num_post_padded, "num_tokens_post_padded", 4, 1)) ||
        (s = w4a16_check_ptr(workspace, "workspace", 16, workspace_bytes > 0)))
        return s;
    if (M < 1 || top_k < 1 || E < 1)
        return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "M=%d, top_k=%d and num_experts=%d must be at least 1", M, top_k, E);
    if ((long long)M * top_k > 2147483647LL - 1024)
        return w4a16_fail(W4A16_ERR_SIZE_OVERFLOW, "M=%d x top_k=%d rows of C do not fit int32 indexes", M, top_k);
    if (block_size < 8 || block_size > 64 || block_size % 8)
        return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "block_size=%d is not a multiple of 8 in 8..64", block_size);
    /* the grid is counted in int from sorted_capacity, as the routing kernel's loops are */
    if (sorted_capacity > 2147483647 - 1024 || blocks_capacity > 2147483647 - 1024)
        return w4a16_fail(W4A16_ERR_SIZE_OVERFLOW, "sorted_capacity=%d / blocks_capacity=%d: at most %d entries",
                          sorted_capacity, blocks_capacity, 2147483647 - 1024);
    if (sorted_capacity < block_size || blocks_capacity < 1)
        return w4a16_fail(W4A16_ERR_INVALID_SHAPE,
                          "sorted_capacity=%d must hold a block of %d and blocks_capacity=%d "
                          "at least 1",
                          sorted_capacity, block_size, blocks_capacity);
    if ((long long)blocks_capacity * block_size < sorted_capacity)
        return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "blocks_capacity=%d x block_size=%d is less than sorted_capacity=%d",
                          blocks_capacity, block_size, sorted_capacity);
    if ((s = w4a16_check_gemm_shape(M, N, K, group_size, 64, &G)) ||
        (s = w4a16_check_size("C[M*top_k,N]", (long long)M * top_k, N)) ||
        (s = w4a16_check_size("W[E,K,N]", (long long)E * K, N)))
        return s;
    if ((s = w4a16_current_device(&device, &st))) return s;
    w4a16_moe_launch a = {0};
    int blocks_per_sm, occupancy;
    if ((s = moe_plan(st, device, layout, dtype, block_size, sorted_capacity, N, K, G, workspace_bytes, op, &a,
                      &blocks_per_sm, &occupancy)))
        return s;
    a.A = A;
    a.B = W;
    a.scales = scales;
    a.zeros = zeros;
    a.bias = bias;
    a.topk_weights = topk_weights;
    a.C = C;
    a.sorted_ids = sorted_ids;
    a.expert_ids = expert_ids;
    a.num_post_padded = num_post_padded;
    a.M = M;
    a.top_k = top_k;
    a.num_experts = E;
    if (workspace_bytes > 0) {
        a.counters = (int *)workspace;
        a.partials = (char *)workspace + moe_counters_bytes(st->sm_count);
    }
    a.stream = stream;
    if (st->log_level >= 2) {
        char text[256];
        moe_plan_text(&a, blocks_per_sm, text, sizeof text);
        fprintf(stderr, "w4a16: %s M=%d top_k=%d E=%d N=%d K=%d G=%d %s: %s\n", op, M, top_k, E, N, K, G,
                dtype ? "bf16" : "fp16", text);
    }
    int occ, err = moe_prepare(device, &a, w4a16_moe_launch_split(&a), &occ);
    if (err == cudaSuccess) err = w4a16_launch_moe_gemm(&a);
    return w4a16_launch_status(err, op);
}

w4a16_status w4a16_moe_marlin_gemm(const void *A, const int32_t *weight, const void *scales, const int32_t *zeros,
                                   const void *bias, const float *topk_weights, void *C, const int32_t *sorted_ids,
                                   const int32_t *expert_ids, const int32_t *num_tokens_post_padded,
                                   int sorted_capacity, int blocks_capacity, int block_size, int M, int top_k,
                                   int num_experts, int N, int K, int group_size, w4a16_dtype dtype, void *workspace,
                                   size_t workspace_bytes, w4a16_stream_t stream) {
    w4a16_clear_error();
    return moe_gemm(W4A16_LAYOUT_MARLIN, A, weight, scales, zeros, bias, topk_weights, C, sorted_ids, expert_ids,
                    num_tokens_post_padded, sorted_capacity, blocks_capacity, block_size, M, top_k, num_experts, N, K,
                    group_size, dtype, workspace, workspace_bytes, stream, "w4a16_moe_marlin_gemm");
}

w4a16_status w4a16_moe_awq_gemm(const void *A, const int32_t *qweight, const void *scales, const int32_t *qzeros,
                                const void *bias, const float *topk_weights, void *C, const int32_t *sorted_ids,
                                const int32_t *expert_ids, const int32_t *num_tokens_post_padded, int sorted_capacity,
                                int blocks_capacity, int block_size, int M, int top_k, int num_experts, int N, int K,
                                int group_size, w4a16_dtype dtype, void *workspace, size_t workspace_bytes,
                                w4a16_stream_t stream) {
    w4a16_clear_error();
    return moe_gemm(W4A16_LAYOUT_AWQ, A, qweight, scales, qzeros, bias, topk_weights, C, sorted_ids, expert_ids,
                    num_tokens_post_padded, sorted_capacity, blocks_capacity, block_size, M, top_k, num_experts, N, K,
                    group_size, dtype, workspace, workspace_bytes, stream, "w4a16_moe_awq_gemm");
}

w4a16_status w4a16_moe_gemm_plan(int marlin, int sorted_capacity, int block_size, int N, int K, int group_size,
                                 w4a16_dtype dtype, size_t workspace_bytes, w4a16_gemm_plan_info *info) {
    w4a16_clear_error();
    w4a16_status s;
    int G, device;
    const w4a16_device_state *st;
    if (!info) return w4a16_fail(W4A16_ERR_NULL_POINTER, "info is NULL");
    if (marlin != 0 && marlin != 1) return w4a16_fail(W4A16_ERR_INVALID_VALUE, "marlin=%d is neither 0 nor 1", marlin);
    if ((s = w4a16_check_dtype(dtype))) return s;
    if (block_size < 8 || block_size > 64 || block_size % 8)
        return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "block_size=%d is not a multiple of 8 in 8..64", block_size);
    if (sorted_capacity < block_size)
        return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "sorted_capacity=%d must hold a block of %d", sorted_capacity,
                          block_size);
    if ((s = w4a16_check_gemm_shape(1, N, K, group_size, 64, &G)) || (s = w4a16_current_device(&device, &st))) return s;
    const int layout = marlin ? W4A16_LAYOUT_MARLIN : W4A16_LAYOUT_AWQ;
    w4a16_moe_launch a = {0};
    int blocks_per_sm, occupancy;
    if ((s = moe_plan(st, device, layout, dtype, block_size, sorted_capacity, N, K, G, workspace_bytes,
                      "w4a16_moe_gemm_plan", &a, &blocks_per_sm, &occupancy)))
        return s;
    if (a.splits == 1) blocks_per_sm = moe_blocks_per_sm(st, device, &a, 0, &occupancy); /* the kernel that runs */
    const int rows = w4a16_moe_tile_rows(a.tile), bn = w4a16_moe_tile_bn(a.tile);
    memset(info, 0, sizeof *info);
    snprintf(info->kernel, sizeof info->kernel, "moe-%d", rows);
    info->config = rows;
    info->stages = a.stages;
    info->splits = a.splits;
    info->grid[a.n_fast] = a.grid_blocks; /* the launch's order: channel tiles in x where n_fast */
    info->grid[!a.n_fast] = (N + bn - 1) / bn;
    info->grid[2] = a.splits;
    info->threads = W4A16_MOE_THREADS;
    info->smem_bytes = w4a16_moe_smem_bytes(a.tile, layout, a.stages);
    info->blocks_per_sm = blocks_per_sm;
    info->smem_blocks_per_sm = st->smem_per_sm / (info->smem_bytes + st->smem_reserved);
    info->occupancy = occupancy;
    info->carveout = a.carveout;
    moe_plan_text(&a, blocks_per_sm, info->text, sizeof info->text);
    return W4A16_OK;
}

/* ---------------------------------------------------------------- stacked converters: the per-expert launches with
 * offsets, after the per-expert checks (each slice is 16-byte aligned when the stack is: its size in bytes is a
 * multiple of 16 under the shape rules) */
static w4a16_status check_stack(const void *in, const void *out, int E, int K, int N, int k_multiple) {
    w4a16_status s;
    if ((s = w4a16_check_convert(in, out, K, N, k_multiple))) return s;
    if (E < 1) return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "num_experts=%d must be at least 1", E);
    return w4a16_check_size("W[E,K,N]", (long long)E * K, N);
}

w4a16_status w4a16_moe_marlin_repack_awq(const int32_t *awq_qweight, int32_t *marlin_weight, int num_experts, int K,
                                         int N, w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int device;
    const w4a16_device_state *st;
    if ((s = check_stack(awq_qweight, marlin_weight, num_experts, K, N, 16)) ||
        (s = w4a16_current_device(&device, &st)))
        return s;
    const size_t words = (size_t)K * N / 8;
    for (int e = 0; e < num_experts; e++) {
        int err = w4a16_launch_repack_awq(awq_qweight + e * words, marlin_weight + e * words, K, N, stream);
        if (err) return w4a16_launch_status(err, "w4a16_moe_marlin_repack_awq");
    }
    return W4A16_OK;
}

w4a16_status w4a16_moe_marlin_repack_gptq(const int32_t *gptq_qweight, const int32_t *perm, int32_t *marlin_weight,
                                          int num_experts, int K, int N, w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int device;
    const w4a16_device_state *st;
    if ((s = check_stack(gptq_qweight, marlin_weight, num_experts, K, N, 16)) ||
        (s = w4a16_check_ptr(perm, "perm", 4, 0)) || (s = w4a16_current_device(&device, &st)))
        return s;
    const size_t words = (size_t)K * N / 8;
    for (int e = 0; e < num_experts; e++) {
        int err = w4a16_launch_repack_gptq(gptq_qweight + e * words, perm ? perm + (size_t)e * K : NULL,
                                           marlin_weight + e * words, K, N, stream);
        if (err) return w4a16_launch_status(err, "w4a16_moe_marlin_repack_gptq");
    }
    return W4A16_OK;
}

w4a16_status w4a16_moe_marlin_permute_scales(const void *scales, void *marlin_scales, int num_experts, int K, int N,
                                             int group_size, w4a16_dtype dtype, w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int G, device;
    const w4a16_device_state *st;
    if ((s = w4a16_check_dtype(dtype)) || (s = check_stack(scales, marlin_scales, num_experts, K, N, 16)) ||
        (s = w4a16_check_group(K, group_size, &G)) || (s = w4a16_current_device(&device, &st)))
        return s;
    const size_t bytes = (size_t)(K / G) * N * 2;
    for (int e = 0; e < num_experts; e++) {
        int err = w4a16_launch_permute_scales((const char *)scales + e * bytes, (char *)marlin_scales + e * bytes,
                                              K / G, N, G == K, stream);
        if (err) return w4a16_launch_status(err, "w4a16_moe_marlin_permute_scales");
    }
    return W4A16_OK;
}

w4a16_status w4a16_moe_marlin_awq_zero_points(const int32_t *awq_qzeros, int32_t *marlin_zeros, int num_experts, int K,
                                              int N, int group_size, w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int G, device;
    const w4a16_device_state *st;
    if ((s = check_stack(awq_qzeros, marlin_zeros, num_experts, K, N, 16)) ||
        (s = w4a16_check_group(K, group_size, &G)) || (s = w4a16_current_device(&device, &st)))
        return s;
    const size_t words = (size_t)(K / G) * N / 8;
    for (int e = 0; e < num_experts; e++) {
        int err = w4a16_launch_awq_zero_points(awq_qzeros + e * words, marlin_zeros + e * words, K / G, N, stream);
        if (err) return w4a16_launch_status(err, "w4a16_moe_marlin_awq_zero_points");
    }
    return W4A16_OK;
}
