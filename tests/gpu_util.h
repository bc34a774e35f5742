/* GPU helpers shared by the GPU test suites and the benchmarks (C and C++): checked CUDA calls, random AWQ / GPTQ
 * tensors on the device, the Marlin conversion of them, and the cuBLAS product used as the reference. */
#ifndef W4A16_GPU_UTIL_H
#define W4A16_GPU_UTIL_H
#include "ref/reference.h"
#include "w4a16.h"
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPU_CHECK(x)                                                                                                   \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                 \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)
#define BLAS_CHECK(x)                                                                                                  \
    do {                                                                                                               \
        cublasStatus_t e_ = (x);                                                                                       \
        if (e_ != CUBLAS_STATUS_SUCCESS) {                                                                             \
            fprintf(stderr, "%s:%d: %s failed: cublas status %d\n", __FILE__, __LINE__, #x, (int)e_);                  \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)
#define W4_CHECK(x)                                                                                                    \
    do {                                                                                                               \
        w4a16_status e_ = (x);                                                                                         \
        if (e_ != W4A16_OK) {                                                                                          \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #x, w4a16_status_string(e_),             \
                    w4a16_last_error_message());                                                                       \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

/* In a cmocka test of a GPU suite: skip, saying why, when the suite found no usable GPU. */
#define GPU_TEST_REQUIRE(have, reason)                                                                                 \
    do {                                                                                                               \
        if (!(have)) {                                                                                                 \
            printf("  SKIPPED: %s\n", (reason));                                                                       \
            skip();                                                                                                    \
        }                                                                                                              \
    } while (0)

/* A GPU suite's device 0: 1 when w4a16 can use it (then the suite's first line, with the seed, is printed); else 0
 * with the reason in `reason`, for the tests to skip with. */
static inline int gpu_suite_device(const char *suite, unsigned long long seed, w4a16_device_info *info, char *reason,
                                   size_t reason_size) {
    w4a16_status s = w4a16_get_device_info(0, info);
    if (s != W4A16_OK || !info->supported) {
        snprintf(reason, reason_size, "no usable CUDA GPU: %s",
                 s != W4A16_OK ? w4a16_last_error_message() : info->reason);
        return 0;
    }
    printf("%s: %s; seed %llu\n", suite, info->reason, seed);
    return 1;
}

/* The worst relative error over a test's cases, with the case that had it. */
typedef struct err_stats {
    double worst;
    int cases;
    char worst_case[200];
} err_stats;

static inline void err_stats_add(err_stats *st, double err, const char *label) {
    st->cases++;
    if (err >= st->worst) {
        st->worst = err;
        snprintf(st->worst_case, sizeof st->worst_case, "%s", label);
    }
}

static inline void *gpu_alloc(size_t bytes) {
    void *p = NULL;
    GPU_CHECK(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}

static inline void *gpu_upload(const void *host, size_t bytes) {
    void *p = gpu_alloc(bytes);
    GPU_CHECK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    return p;
}

/* Random bytes for packed int4 words: every nibble uniform in 0..15. */
static inline void fill_random_words(uint32_t *w, size_t n, uint64_t *seed) {
    for (size_t i = 0; i < n; i++) w[i] = (uint32_t)(w4a16_ref_rand_u64(seed) >> 16);
}

/* Random 16-bit values of dtype, uniform in [lo, hi]. */
static inline void fill_random_half(uint16_t *h, size_t n, float lo, float hi, w4a16_dtype dt, uint64_t *seed) {
    for (size_t i = 0; i < n; i++) h[i] = w4a16_ref_from_float(w4a16_ref_rand_uniform(seed, lo, hi), dt);
}

/* One quantised layer on the device: AWQ tensors, optionally GPTQ (symmetric) instead, and their Marlin forms. */
typedef struct gpu_layer {
    int K, N, G, groups, gptq;
    w4a16_dtype dt;
    int32_t *qweight, *qzeros; /* AWQ [K, N/8], [groups, N/8]; GPTQ: qweight [K/8, N], qzeros NULL */
    uint16_t *scales;          /* [groups, N] */
    int32_t *mweight, *mzeros; /* Marlin [K/16, 2N], [groups, N/8] (NULL for GPTQ) */
    uint16_t *mscales;
    uint16_t *dense; /* dequantised W [K, N] in dtype, for the reference */
} gpu_layer;

/* Scales around 0.01 keep |C| near 1 for K in the thousands with A in [-1, 1]. */
static inline void gpu_layer_make(gpu_layer *L, int K, int N, int G, w4a16_dtype dt, int gptq, int marlin,
                                  uint64_t *seed) {
    memset(L, 0, sizeof *L);
    L->K = K;
    L->N = N;
    L->G = G;
    L->dt = dt;
    L->gptq = gptq;
    L->groups = (G == -1 || G == K) ? 1 : K / G;
    size_t nw = (size_t)K * N / 8, nz = (size_t)L->groups * N / 8, ns = (size_t)L->groups * N;
    uint32_t *hw = (uint32_t *)malloc(nw * 4), *hz = (uint32_t *)malloc(nz * 4);
    uint16_t *hs = (uint16_t *)malloc(ns * 2);
    fill_random_words(hw, nw, seed);
    fill_random_words(hz, nz, seed);
    fill_random_half(hs, ns, 0.005f, 0.015f, dt, seed);
    L->qweight = (int32_t *)gpu_upload(hw, nw * 4);
    L->scales = (uint16_t *)gpu_upload(hs, ns * 2);
    L->dense = (uint16_t *)gpu_alloc((size_t)K * N * 2);
    if (!gptq) {
        L->qzeros = (int32_t *)gpu_upload(hz, nz * 4);
        W4_CHECK(w4a16_awq_dequantize(L->qweight, L->scales, L->qzeros, L->dense, K, N, G, dt, NULL));
    } else { /* no GPU dequantiser for GPTQ: build the dense reference on the CPU */
        uint8_t *q = (uint8_t *)malloc((size_t)K * N);
        float *wf = (float *)malloc((size_t)K * N * 4);
        uint16_t *wh = (uint16_t *)malloc((size_t)K * N * 2);
        w4a16_ref_gptq_unpack((const int32_t *)hw, K, N, q);
        w4a16_ref_dequantize_q(q, NULL, hs, K, N, G, dt, wf);
        for (size_t i = 0; i < (size_t)K * N; i++) wh[i] = w4a16_ref_from_float(wf[i], dt);
        GPU_CHECK(cudaMemcpy(L->dense, wh, (size_t)K * N * 2, cudaMemcpyHostToDevice));
        free(q);
        free(wf);
        free(wh);
    }
    if (marlin) {
        L->mweight = (int32_t *)gpu_alloc(nw * 4);
        L->mscales = (uint16_t *)gpu_alloc(ns * 2);
        if (gptq) {
            W4_CHECK(w4a16_marlin_repack_gptq(L->qweight, NULL, L->mweight, K, N, NULL));
        } else {
            W4_CHECK(w4a16_marlin_repack_awq(L->qweight, L->mweight, K, N, NULL));
            L->mzeros = (int32_t *)gpu_alloc(nz * 4);
            W4_CHECK(w4a16_marlin_awq_zero_points(L->qzeros, L->mzeros, K, N, G, NULL));
        }
        W4_CHECK(w4a16_marlin_permute_scales(L->scales, L->mscales, K, N, G, dt, NULL));
    }
    GPU_CHECK(cudaDeviceSynchronize());
    free(hw);
    free(hz);
    free(hs);
}

static inline void gpu_layer_free(gpu_layer *L) {
    cudaFree(L->qweight);
    cudaFree(L->qzeros);
    cudaFree(L->scales);
    cudaFree(L->mweight);
    cudaFree(L->mzeros);
    cudaFree(L->mscales);
    cudaFree(L->dense);
    memset(L, 0, sizeof *L);
}

static inline cudaDataType_t cuda_type(w4a16_dtype dt) { return dt == W4A16_BF16 ? CUDA_R_16BF : CUDA_R_16F; }

/* Row-major C[M,N] = A[M,K] * W[K,N] through cuBLAS (column-major C^T = W^T A^T), fp32 accumulation;
 * out_type CUDA_R_32F for the reference, the activation type for the fp16 baseline. */
static inline void cublas_gemm(cublasHandle_t h, const void *A, const void *W, void *C, int M, int N, int K,
                               w4a16_dtype dt, cudaDataType_t out_type) {
    const float one = 1.f, zero = 0.f;
    BLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, W, cuda_type(dt), N, A, cuda_type(dt), K, &zero,
                            C, out_type, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
#endif
