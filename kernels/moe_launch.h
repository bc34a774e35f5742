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
/* Threads of a grouped-GEMM block (4 warps). */
enum { W4A16_MOE_THREADS = 128 };

int w4a16_launch_moe_align(const int32_t *topk_ids, int num_entries, int num_experts, int block_size,
                           int32_t *sorted_ids, int sorted_capacity, int32_t *expert_ids, int blocks_capacity,
                           int32_t *num_post_padded, void *stream);

typedef struct w4a16_moe_launch {
    const void *A, *B, *scales, *zeros, *bias;
    const float *topk_weights;
    void *C;
    const int32_t *sorted_ids, *expert_ids, *num_post_padded;
    int sorted_capacity, grid_blocks; /* blocks launched along x: ceil(sorted_capacity / block_size) */
    int block_size, M, top_k, num_experts, N, K;
    int gshift;             /* log2(G), 31 when G = K is not a power of two */
    int marlin_channelwise; /* Marlin scales permuted in chunks of 32 (G == K) */
    int dtype, layout, stages;
    int carveout;   /* shared-memory carveout (percent) emulating a forced profile's smaller SM, or -1 */
    int splits;     /* K split across gridDim.z blocks (block_size <= 16 only); 1: no split */
    int n_fast;     /* grid x = channel tiles, y = routing blocks (else the other way round) */
    int *counters;  /* workspace: one arrival counter per tile (grid_blocks x N / 64), zero between calls */
    void *partials; /* workspace: splits x 16 x 64 fp32 sums per tile */
    void *stream;
} w4a16_moe_launch;

/* Launches the grouped GEMM; its kernel must have been prepared on this device (w4a16_moe_prepare) for the launch's
 * tile, layout, dtype, split, stages and carveout. */
int w4a16_launch_moe_gemm(const w4a16_moe_launch *a);
/* Dynamic shared memory of the MoE GEMM for block_size rows, a layout and a pipeline depth. */
int w4a16_moe_smem_bytes(int block_size, int layout, int stages);
/* Sets the dynamic shared memory and carveout attributes of the launch's kernel (the K-splitting one where `split`,
 * block_size <= 16) on the current device, as its launch needs them, and gives the resident blocks per SM the device
 * allows it then; returns the cudaError_t. csrc/moe.c does this once per device and kernel (cached). */
int w4a16_moe_prepare(const w4a16_moe_launch *a, int split, int *blocks_per_sm);
/* Block slots per SM the split-K workspace is sized for, and the fp32 sums of one tile (16 rows x 64 channels). */
/* The k of one pipeline stage of that tile. */
enum { W4A16_MOE_SPLIT_SLOTS_PER_SM = 8, W4A16_MOE_SPLIT_TILE_BYTES = 16 * 64 * 4, W4A16_MOE_SPLIT_BK = 128 };

#ifdef __cplusplus
}
#endif
#endif
