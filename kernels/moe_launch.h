/* The interface between csrc/moe.c and the MoE kernels (kernels/moe.cu): each function enqueues work on `stream`
 * and returns the cudaError_t of the launch as an int; csrc/moe.c validated every argument before. */
#ifndef W4A16_MOE_LAUNCH_H
#define W4A16_MOE_LAUNCH_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest expert count the routing kernel holds in shared memory (3 counters per expert). */
enum { W4A16_MOE_MAX_EXPERTS = 2048 };
/* Threads of a grouped-GEMM block (4 warps), and of the warp-specialised dense tile (two math warpgroups and a
 * producer warpgroup). */
enum { W4A16_MOE_THREADS = 128, W4A16_MOE_WS_THREADS = 384 };

int w4a16_launch_moe_align(const int32_t *topk_ids, int num_entries, int num_experts, int block_size,
                           int32_t *sorted_ids, int sorted_capacity, int32_t *expert_ids, int blocks_capacity,
                           int32_t *num_post_padded, void *stream);

typedef struct w4a16_moe_launch {
    const void *A, *B, *scales, *zeros, *bias;
    const float *topk_weights;
    void *C;
    const int32_t *sorted_ids, *expert_ids, *num_post_padded; /* all NULL: a dense GEMM (pair i = row i, expert 0) */
    int sorted_capacity, grid_blocks; /* blocks launched along x: ceil(sorted_capacity / block_size) */
    int block_size, M, top_k, num_experts, N, K;
    int gshift;             /* log2(G), 31 when G = K is not a power of two */
    int marlin_channelwise; /* Marlin scales permuted in chunks of 32 (G == K) */
    int dtype, layout, stages;
    int carveout;  /* shared-memory carveout (percent) emulating a forced profile's smaller SM, or -1 */
    int tile;      /* W4A16_MOE_TILE_*, holding block_size rows */
    int splits;    /* K split across gridDim.z blocks (w4a16_moe_tile_can_split; MoE plans split only 16x64); 1: none */
    int n_fast;    /* grid x = channel tiles, y = routing blocks (else the other way round) */
    int sk_blocks; /* > 0: a dense call's stream-K over this many blocks (w4a16_moe_tile_can_stream_k); splits 1 */
    int sk_fixup;  /* with sk_blocks, warp-specialised tiles: a second grid adds the parts (kernels/tile_ws.cu) */
    int pdl;       /* programmatic dependent launch (a dense rows-16 call with W4A16_FLAG_PDL, csrc/moe.c): the first
                      weight stages are copied before the wait for the previous grid */
    int *counters; /* workspace: one arrival counter per tile (grid_blocks x N / BN), zero between calls */
    void *partials; /* workspace: splits x BM x BN fp32 sums per tile; stream-K: 2 x BM x BN per block */
    void *stream;
} w4a16_moe_launch;

/* Launches the grouped GEMM; its kernel must have been prepared on this device (w4a16_moe_prepare) for the launch's
 * tile, layout, dtype, split, stages and carveout. */
int w4a16_launch_moe_gemm(const w4a16_moe_launch *a);
/* Sets the dynamic shared memory and carveout attributes of the launch's kernel (split: 0 the plain one, 1 the
 * K-splitting one, 2 the stream-K one; w4a16_moe_launch_split) on the current device, as its launch needs them, and
 * gives the resident blocks per SM the device allows it then; returns the cudaError_t. csrc/moe.c does this once per
 * device and kernel (cached). */
int w4a16_moe_prepare(const w4a16_moe_launch *a, int split, int *blocks_per_sm);
/* The warp-specialised dense tiles (W4A16_MOE_TILE_128 / _WS64 / _WS32, and _WG128 / _WG64; kernels/tile_ws.cu): their
 * launch and their preparation as above, and whether this device can load it (its kernels exist only as sm_90a /
 * sm_120a / sm_121a machine code: they set their warps' register budgets with setmaxnreg); cudaError_t. */
int w4a16_launch_ws(const w4a16_moe_launch *a);
int w4a16_prepare_ws(const w4a16_moe_launch *a, int *blocks_per_sm);
int w4a16_probe_ws(void);
/* The GEMM tiles (rows x channels per block, k per pipeline stage); csrc/moe.c picks one per call. */
enum {
    W4A16_MOE_TILE_16x64 = 0,  /* 16 x 64, 128 k: the 4 warps split each stage's k; the one MoE plans split K for */
    W4A16_MOE_TILE_16x128 = 1, /* 16 x 128, 64 k: 2 channel groups x 2-way K split */
    W4A16_MOE_TILE_16x256 = 2, /* 16 x 256, 64 k: each warp its 64 channels over whole stages */
    W4A16_MOE_TILE_32 = 3,     /* 32 x 128, 64 k */
    W4A16_MOE_TILE_64 = 4,     /* 64 x 256, 64 k */
    W4A16_MOE_TILE_128 = 5,    /* 128 x 256, 64 k: the warp-specialised dense tile (kernels/tile_ws.cu; dense only) */
    W4A16_MOE_TILE_WS64 = 6,   /* 64 x 256, 64 k: the same kernel with 64-row warp tiles */
    W4A16_MOE_TILE_WS32 = 7,   /* 32 x 256, 64 k: ... 32-row warp tiles (M 17-32) */
    W4A16_MOE_TILE_32x64 = 8,  /* 32 x 64, 128 k: the 16 x 64 tile's 4-way K split, each weight fragment feeding two m16
                                  tiles (dense rows-32n: M 17-64 below the wgmma tiles, K split across blocks) */
    W4A16_MOE_TILE_WG128 = 9,  /* 128 x 256, 64 k: the warp-specialised tile with wgmma math warpgroups and TMA copies
                                  (sm_90a only; dense only) */
    W4A16_MOE_TILE_WG64 = 10,  /* 64 x 256, 64 k: the same with 64 rows */
    W4A16_MOE_TILES = 11
};

#ifdef __cplusplus
#define W4A16_MOE_CONSTEXPR_ constexpr
#else
#define W4A16_MOE_CONSTEXPR_
#endif
static inline W4A16_MOE_CONSTEXPR_ int w4a16_moe_tile_rows(int tile) {
    return tile <= W4A16_MOE_TILE_16x256                                                              ? 16
           : tile == W4A16_MOE_TILE_32 || tile == W4A16_MOE_TILE_WS32 || tile == W4A16_MOE_TILE_32x64 ? 32
           : tile == W4A16_MOE_TILE_128 || tile == W4A16_MOE_TILE_WG128                               ? 128
                                                                                                      : 64;
}
/* The warp-specialised tiles' wgmma form (kernels/tile_ws.cu; sm_90a). */
static inline W4A16_MOE_CONSTEXPR_ int w4a16_moe_tile_wgmma(int tile) {
    return tile == W4A16_MOE_TILE_WG128 || tile == W4A16_MOE_TILE_WG64;
}
/* The warp-specialised tiles (kernels/tile_ws.cu). */
static inline W4A16_MOE_CONSTEXPR_ int w4a16_moe_tile_ws(int tile) {
    return tile == W4A16_MOE_TILE_128 || tile == W4A16_MOE_TILE_WS64 || tile == W4A16_MOE_TILE_WS32 ||
           w4a16_moe_tile_wgmma(tile);
}
/* The tiles with a K-splitting kernel instance: 16 x 64 (MoE plans, dense rows-16), 32 x 128 and 32 x 64 (dense
 * rows-32, rows-32n). */
static inline W4A16_MOE_CONSTEXPR_ int w4a16_moe_tile_can_split(int tile) {
    return tile == W4A16_MOE_TILE_16x64 || tile == W4A16_MOE_TILE_32 || tile == W4A16_MOE_TILE_32x64;
}
/* The tiles with a stream-K instance (dense calls): 64 x 256, 32 x 128 and the warp-specialised ones. */
static inline W4A16_MOE_CONSTEXPR_ int w4a16_moe_tile_can_stream_k(int tile) {
    return tile == W4A16_MOE_TILE_64 || tile == W4A16_MOE_TILE_32 || w4a16_moe_tile_ws(tile);
}
/* Threads of a tile's block. */
static inline W4A16_MOE_CONSTEXPR_ int w4a16_moe_tile_threads(int tile) {
    return w4a16_moe_tile_ws(tile) ? W4A16_MOE_WS_THREADS : W4A16_MOE_THREADS;
}
/* The kernel instance a launch runs: 0 plain, 1 K split across blocks, 2 stream-K. */
static inline int w4a16_moe_launch_split(const w4a16_moe_launch *a) {
    return a->splits > 1 ? 1 : a->sk_blocks > 0 ? 2 : 0;
}
static inline W4A16_MOE_CONSTEXPR_ int w4a16_moe_tile_bn(int tile) {
    return tile == W4A16_MOE_TILE_16x64 || tile == W4A16_MOE_TILE_32x64 ? 64
           : tile == W4A16_MOE_TILE_16x128 || tile == W4A16_MOE_TILE_32 ? 128
                                                                        : 256;
}
/* Dynamic shared memory of the MoE GEMM for a tile, a layout (W4A16_LAYOUT_AWQ = 0, Marlin = 1) and a pipeline depth,
 * in plain C so that the host's plans (and the CPU tests) size it; kernels/moe.cu checks it against its Tile at compile
 * time. A tile is <MT, WN, KS> (moe.cu's Cfg) with 4 warps: WK = 4 / WN, BM = 16 MT, BN = 64 WN, BK = 16 WK KS; a stage
 * holds the gathered activations, the packed weights (AWQ rows padded by 4 words), and BK / 32 scale and zero-point
 * rows; the K-split warps reduce through the buffers (WK > 1), the unsplit tiles stage their output tile (rows padded
 * by 8). */
static inline W4A16_MOE_CONSTEXPR_ int w4a16_moe_smem_bytes(int tile, int layout, int stages) {
    if (w4a16_moe_tile_ws(tile)) { /* tile_ws.cu: A, weights, 2 scale and zero-point rows; output staged */
        const int rows = w4a16_moe_tile_rows(tile);
        const int b = layout == 0 ? 64 * 256 / 2 : 4 * 2 * 256 * 4;
        const int raw = rows * 64 * 2 + b + 2 * 256 * 2 + 2 * 32 * 4, out = rows * (256 + 8) * 2;
        /* stages on 1024-byte swizzle atoms, + the slack that aligns the first */
        const int st = (raw + 1023) / 1024 * 1024;
        return (stages * st > out ? stages * st : out) + 1024;
    }
    const int bm = w4a16_moe_tile_rows(tile), bn = w4a16_moe_tile_bn(tile), mt = bm / 16, wn = bn / 64;
    const int ks = tile == W4A16_MOE_TILE_16x256 || tile == W4A16_MOE_TILE_64 ? 4 : 2;
    const int wk = 4 / wn, bk = 16 * wk * ks, slots = bk / 32;
    const int b = layout == 0 ? bk * (bn / 8 + 4) * 4 : (bk / 16) * 2 * bn * 4;
    const int stage = bm * bk * 2 + b + slots * bn * 2 + slots * (bn / 8) * 4;
    const int red = wk > 1 ? 4 * mt * 8 * 32 * 16 : 0, out = wk == 1 ? bm * (bn + 8) * 2 : 0;
    const int m = stages * stage > red ? stages * stage : red;
    return m > out ? m : out;
}
/* Block slots per SM the split-K workspace is sized for, the fp32 sums of one 16 x 64 tile, the k of its stage. */
enum { W4A16_MOE_SPLIT_SLOTS_PER_SM = 8, W4A16_MOE_SPLIT_TILE_BYTES = 16 * 64 * 4, W4A16_MOE_SPLIT_BK = 128 };

#ifdef __cplusplus
}
#endif
#endif
