/* The interface between the host library (csrc/, plain C) and the CUDA kernels (kernels/).
 * Every function here enqueues work on `stream` and returns the cudaError_t of the launch as an int;
 * arguments were fully validated by csrc/ before any of these is called. */
#ifndef W4A16_KERNEL_LAUNCH_H
#define W4A16_KERNEL_LAUNCH_H
#include <stddef.h>
#include <stdint.h>
#include "configs.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct w4a16_gemm_launch {
    const void *A, *B, *scales, *zeros, *bias;
    void *C;
    int M, N, K;
    int gshift;              /* log2(G) with G resolved (K for one group); 31 when G = K is not a power of two */
    int dtype, layout;       /* w4a16_dtype, W4A16_LAYOUT_* */
    int cfg, stages, splits; /* tile config id, pipeline depth, K splits across blocks */
    int smem_bytes;
    int marlin_channelwise;
    int reduce_dtype;        /* W4A16_FLAG_REDUCE_IN_DTYPE */
    int pdl;                 /* W4A16_FLAG_PDL on a device that has it (compute capability 9.0 and up) */
    int wgmma;               /* 1 + id of W4A16_WGMMA_CONFIGS: the sm_90a wgmma kernel (cfg, stages, smem_bytes unused) */
    void *counters, *partials; /* workspace parts; unused when splits == 1 */
    void *stream;
} w4a16_gemm_launch;

int w4a16_launch_gemm(const w4a16_gemm_launch *a);
/* cudaFuncGetAttributes on one GEMM instance: loads its image, so it tells whether this GPU can run it. */
int w4a16_probe_gemm(int dtype, int layout, int cfg, int *binary_version);
/* Loads every sm_90a wgmma GEMM image (the dense one of the staged path too): cudaSuccess only on a device that runs them (compute capability 9.0)
 * and in a build that holds them (ARCHS includes 90). */
int w4a16_probe_gemm_wgmma(void);
/* Largest shared memory per block of the wgmma GEMM tiles (0 when they are not compiled in). */
int w4a16_gemm_wgmma_smem_bytes(void);

/* The staged large-M path (sm_90a only): Wt[nc, K] (dtype) = dequant(AWQ or Marlin tensors) of channels n0 .. n0 + nc - 1
 * (K contiguous: the layout the dense GEMM reads), then C[M, nc] (row stride ldc) = A[M, K] Wt^T (+ bias[nc]) on a
 * persistent grid of at most sm_count blocks. */
int w4a16_launch_awq_dequant_t(const int32_t *qweight, const void *scales, const int32_t *qzeros, void *Wt, int K,
                               int N, int G, int n0, int nc, int dtype, void *stream);
int w4a16_launch_marlin_dequant_t(const int32_t *weight, const void *scales, const int32_t *zeros, void *Wt, int K,
                                  int N, int gshift, int channelwise, int n0, int nc, int dtype, void *stream);
int w4a16_launch_dense_gemm(const void *A, const void *Wt, const void *bias, void *C, int M, int nc, int K, int ldc,
                            int dtype, int sm_count, void *stream);

int w4a16_launch_awq_dequant(const int32_t *qweight, const void *scales, const int32_t *qzeros, void *W,
                             int K, int N, int G, int dtype, void *stream);
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
