/* The interface between the host library (csrc/, plain C) and the CUDA kernels (kernels/).
 * Every function here enqueues work on `stream` and returns the cudaError_t of the launch as an int;
 * arguments were fully validated by csrc/ before any of these is called. */
#ifndef W4A16_KERNEL_LAUNCH_H
#define W4A16_KERNEL_LAUNCH_H
#include "configs.h"
#include "moe_launch.h"
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The GEMM kernels' argument, passed by value to every GEMM kernel exactly as the host fills it. */
typedef struct w4a16_gemm_args {
    const void *A;         /* [M, K] */
    const uint32_t *B;     /* AWQ [K, N/8] or Marlin [K/16, 2N] */
    const void *scales;    /* [K/G, N] (Marlin: permuted) */
    const uint32_t *zeros; /* [K/G, N/8], or NULL (symmetric: zero point 8) */
    const void *bias;      /* [N] or NULL */
    void *C;               /* [M, N] */
    int M, N, K;
    int gshift;    /* group of row k = k >> gshift: log2(G), or 31 when G = K is not a power of two */
    int stages;    /* pipeline stages of the mma.sync kernels */
    int *counters; /* workspace: per-tile arrival counters (zero between calls) */
#ifdef __CUDACC__
    float4 *partials; /* workspace: split-K partial sums */
#else
    void *partials;
#endif
    int marlin_channelwise;  /* Marlin scales permuted in chunks of 32 (G == K) */
    int reduce_dtype;        /* split-K partials rounded to the dtype (W4A16_FLAG_REDUCE_IN_DTYPE), not kept in fp32 */
    int pdl;                 /* programmatic dependent launch (W4A16_FLAG_PDL): weights are read before the wait */
    int sk_blocks, sk_tiles; /* mma.sync tile kernel: blocks sharing the first sk_tiles tiles' k-tiles (stream-K) */
} w4a16_gemm_args;

/* Which GEMM kernel runs: the decode kernel (kernels/gemm_decode.cuh) with 8 or 16 tokens per MMA, the mma.sync tile
 * kernel (gemm.cuh), the sm_90a wgmma kernel (gemm_sm90.cuh), the staged path (dequantise, then dense wgmma), or one
 * of the MoE launch's tiles on the identity routing (csrc/moe.c launches them): the MoE kernel's 64 x 256, 32 x 128,
 * 16 x 64, 16 x 128 or 32 x 64 tile (kernels/moe.cu), the warp-specialised tiles of 128, 64 or 32 rows
 * (kernels/tile_ws.cu), and their wgmma form of 128 or 64 rows (sm_90a). */
#define W4A16_KERNEL_KINDS(X)                                                                                          \
    X(DECODE8, "decode-8")                                                                                             \
    X(DECODE16, "decode-16")                                                                                           \
    X(MMA, "mma.sync")                                                                                                 \
    X(WGMMA, "wgmma")                                                                                                  \
    X(STAGED, "staged")                                                                                                \
    X(ROWS64, "rows-64")                                                                                               \
    X(ROWS32, "rows-32")                                                                                               \
    X(ROWS128, "rows-128")                                                                                             \
    X(WS64, "ws-64")                                                                                                   \
    X(WS32, "ws-32")                                                                                                   \
    X(ROWS16, "rows-16")                                                                                               \
    X(ROWS16W, "rows-16w")                                                                                             \
    X(ROWS32N, "rows-32n")                                                                                             \
    X(WGWS128, "wgmma-ws-128")                                                                                         \
    X(WGWS64, "wgmma-ws-64")
/* The kinds that run a MoE launch tile, and that tile: one table for both directions. */
#define W4A16_KERNEL_TILES(X)                                                                                          \
    X(ROWS64, W4A16_MOE_TILE_64)                                                                                       \
    X(ROWS32, W4A16_MOE_TILE_32)                                                                                       \
    X(ROWS128, W4A16_MOE_TILE_128)                                                                                     \
    X(WS64, W4A16_MOE_TILE_WS64)                                                                                       \
    X(WS32, W4A16_MOE_TILE_WS32)                                                                                       \
    X(ROWS16, W4A16_MOE_TILE_16x64)                                                                                    \
    X(ROWS16W, W4A16_MOE_TILE_16x128)                                                                                  \
    X(ROWS32N, W4A16_MOE_TILE_32x64)                                                                                   \
    X(WGWS128, W4A16_MOE_TILE_WG128)                                                                                   \
    X(WGWS64, W4A16_MOE_TILE_WG64)
typedef enum w4a16_kernel_kind {
#define W4A16_KIND_ENUM_(sym, text) W4A16_KERNEL_##sym,
    W4A16_KERNEL_KINDS(W4A16_KIND_ENUM_)
#undef W4A16_KIND_ENUM_
} w4a16_kernel_kind;

/* The MoE launch tile of a plan kind, -1 for the kinds that run none; and the kind of a tile, -1 for the MoE-only
 * tiles. */
static inline int w4a16_kernel_moe_tile(int kind) {
    switch (kind) {
#define W4A16_KIND_TILE_(sym, tile)                                                                                    \
    case W4A16_KERNEL_##sym:                                                                                           \
        return tile;
        W4A16_KERNEL_TILES(W4A16_KIND_TILE_)
#undef W4A16_KIND_TILE_
    default:
        return -1;
    }
}
static inline int w4a16_moe_tile_kernel(int tile) {
    switch (tile) {
#define W4A16_TILE_KIND_(sym, tile)                                                                                    \
    case tile:                                                                                                         \
        return W4A16_KERNEL_##sym;
        W4A16_KERNEL_TILES(W4A16_TILE_KIND_)
#undef W4A16_TILE_KIND_
    default:
        return -1;
    }
}
/* The MoE tile rows of a plan that runs one (W4A16_KERNEL_TILES), 0 for the other kinds. */
#define W4A16_KERNEL_ROWS(kind) (w4a16_kernel_moe_tile(kind) < 0 ? 0 : w4a16_moe_tile_rows(w4a16_kernel_moe_tile(kind)))

/* One GEMM call's launch, decided once on the host (csrc/plan.c); the kernels follow it without deciding again. */
typedef struct w4a16_plan {
    int kind;       /* w4a16_kernel_kind */
    int cfg;        /* W4A16_GEMM_CONFIGS id (decode / mma.sync kinds), W4A16_WGMMA_CONFIGS id (wgmma), rows (rows-*) */
    int stages;     /* pipeline stages (mma.sync kinds; a wgmma config has its own) */
    int splits;     /* K splits across blocks (grid z) */
    int grid[3];    /* blocks along M, N, K splits; staged: the dense GEMM's blocks for a full slab */
    int threads;    /* threads per block */
    int smem_bytes; /* dynamic shared memory per block (mma.sync kinds; 0: the wgmma config's own) */
    int blocks_per_sm; /* resident blocks per SM the K split was sized for */
    int slab_channels; /* staged: channels dequantised per slab */
    int carveout;      /* shared-memory carveout (percent) that emulates a smaller SM, or -1 (the device's own) */
    int sk_blocks;     /* mma.sync kind: stream-K blocks (the first grid[0] blocks) and the tiles they share; the */
    int sk_tiles;      /* other grid[0] - sk_blocks blocks compute one whole tile each */
    int sk_fixup;      /* warp-specialised tiles with stream-K: a second grid adds the parts (else each tile's last
                          block) */
} w4a16_plan;

typedef struct w4a16_gemm_launch {
    w4a16_gemm_args args;
    int dtype, layout; /* w4a16_dtype, W4A16_LAYOUT_* */
    w4a16_plan plan;
    void *stream;
} w4a16_gemm_launch;

int w4a16_launch_gemm(const w4a16_gemm_launch *a);
/* Sets a kernel's dynamic shared memory and its shared-memory carveout (percent; -1: the device's default), as every
 * GEMM and MoE launch and occupancy query does: a kernel never keeps an earlier emulated profile's carveout. */
int w4a16_set_kernel_smem(const void *fn, int smem_bytes, int carveout);
/* Resident blocks per SM the device gives the plan's kernel (cudaOccupancyMaxActiveBlocksPerMultiprocessor, with the
 * plan's shared memory and carveout set on the kernel as a launch sets them). */
int w4a16_gemm_occupancy(const w4a16_gemm_launch *a, int *blocks_per_sm);
/* cudaFuncGetAttributes on one GEMM instance: loads its image, so it tells whether this GPU can run it. */
int w4a16_probe_gemm(int dtype, int layout, int cfg, int *binary_version);
/* Loads every sm_90a wgmma GEMM image (the dense one of the staged path too): cudaSuccess only on a device that runs
 * them (compute capability 9.0) and in a build that holds them (ARCHS includes 90). */
int w4a16_probe_gemm_wgmma(void);
/* Largest shared memory per block of the wgmma GEMM tiles (0 when they are not compiled in). */
int w4a16_gemm_wgmma_smem_bytes(void);

/* The staged large-M path (sm_90a only): Wt[nc, K] (dtype) = dequant(AWQ or Marlin tensors) of channels n0 .. n0 + nc -
 * 1 (K contiguous: the layout the dense GEMM reads), then C[M, nc] (row stride ldc) = A[M, K] Wt^T (+ bias[nc]) on a
 * persistent grid of `grid` blocks. */
int w4a16_launch_awq_dequant_t(const int32_t *qweight, const void *scales, const int32_t *qzeros, void *Wt, int K,
                               int N, int G, int n0, int nc, int dtype, void *stream);
int w4a16_launch_marlin_dequant_t(const int32_t *weight, const void *scales, const int32_t *zeros, void *Wt, int K,
                                  int N, int gshift, int channelwise, int n0, int nc, int dtype, void *stream);
int w4a16_launch_dense_gemm(const void *A, const void *Wt, const void *bias, void *C, int M, int nc, int K, int ldc,
                            int dtype, int grid, void *stream);

int w4a16_launch_awq_dequant(const int32_t *qweight, const void *scales, const int32_t *qzeros, void *W, int K, int N,
                             int G, int dtype, void *stream);
int w4a16_launch_repack_awq(const int32_t *in, int32_t *out, int K, int N, void *stream);
int w4a16_launch_repack_gptq(const int32_t *in, const int32_t *perm, int32_t *out, int K, int N, void *stream);
int w4a16_launch_permute_scales(const void *in, void *out, int rows, int N, int channelwise, void *stream);
int w4a16_launch_permute_cols(const void *A, const int32_t *perm, void *out, int M, int K_in, int K_out, void *stream);
int w4a16_launch_gather_rows(const void *in, int rows_in, const int32_t *idx, void *out, int rows_out, int cols,
                             void *stream);
int w4a16_launch_awq_zero_points(const int32_t *in, int32_t *out, int rows, int N, void *stream);

#ifdef __cplusplus
}
#endif
#endif
