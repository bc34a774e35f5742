/* w4a16-doctor: says in one command whether this machine's GPUs and driver can run w4a16, and proves it with a
 * small self-test of both GEMM paths against the CPU reference. Exit status: 0 all GPUs usable, 1 none or a
 * failed self-test, 2 bad usage. Never crashes without a GPU or driver. */
#include "../tests/ref/reference.h"
#include "w4a16.h"
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One small AWQ problem through both paths on the current device; returns 0 when both match the CPU. */
static int self_test(char *out, size_t outlen) {
    enum { M = 3, K = 512, N = 256, G = 128 };
    uint64_t seed = 12345;
    float *Wf = malloc(sizeof(float) * K * N), *Af = malloc(sizeof(float) * M * K), *Cf = malloc(sizeof(float) * M * N);
    double *ref = malloc(sizeof(double) * M * N);
    int32_t *qw = calloc(K * N / 8, 4), *qz = calloc(K / G * N / 8, 4);
    uint16_t *s = malloc(2 * K / G * N), *hA = malloc(2 * M * K), *hC = malloc(2 * M * N);
    for (int i = 0; i < K * N; i++) Wf[i] = w4a16_ref_rand_uniform(&seed, -1.f, 1.f);
    w4a16_ref_awq_quantize(Wf, K, N, G, W4A16_FP16, qw, qz, s);
    w4a16_ref_awq_dequantize(qw, qz, s, K, N, G, W4A16_FP16, Wf);
    for (int i = 0; i < M * K; i++) {
        hA[i] = w4a16_ref_from_float(w4a16_ref_rand_uniform(&seed, -1.f, 1.f), W4A16_FP16);
        Af[i] = w4a16_ref_to_float(hA[i], W4A16_FP16);
    }
    w4a16_ref_gemm(Af, Wf, NULL, M, N, K, ref);

    int rc = 1;
    size_t wsb = 0;
    void *dA = NULL, *dW = NULL, *dZ = NULL, *dS = NULL, *dC = NULL, *mW = NULL, *mZ = NULL, *mS = NULL, *ws = NULL;
    double err_awq = INFINITY, err_marlin = INFINITY;
    w4a16_status st;
#define TRY_CUDA(x)                                                                                                    \
    if ((x) != cudaSuccess) {                                                                                          \
        snprintf(out, outlen, "CUDA error in %s", #x);                                                                 \
        goto done;                                                                                                     \
    }
#define TRY_W4(x)                                                                                                      \
    if ((st = (x)) != W4A16_OK) {                                                                                      \
        snprintf(out, outlen, "%s: %s", #x, w4a16_last_error_message());                                               \
        goto done;                                                                                                     \
    }
    TRY_W4(w4a16_workspace_size(&wsb));
    TRY_CUDA(cudaMalloc(&dA, 2 * M * K));
    TRY_CUDA(cudaMalloc(&dW, K * N / 2));
    TRY_CUDA(cudaMalloc(&dZ, K / G * N / 2));
    TRY_CUDA(cudaMalloc(&dS, 2 * K / G * N));
    TRY_CUDA(cudaMalloc(&dC, 2 * M * N));
    TRY_CUDA(cudaMalloc(&mW, K * N / 2));
    TRY_CUDA(cudaMalloc(&mZ, K / G * N / 2));
    TRY_CUDA(cudaMalloc(&mS, 2 * K / G * N));
    TRY_CUDA(cudaMalloc(&ws, wsb));
    TRY_CUDA(cudaMemset(ws, 0, wsb));
    TRY_CUDA(cudaMemcpy(dA, hA, 2 * M * K, cudaMemcpyHostToDevice));
    TRY_CUDA(cudaMemcpy(dW, qw, K * N / 2, cudaMemcpyHostToDevice));
    TRY_CUDA(cudaMemcpy(dZ, qz, K / G * N / 2, cudaMemcpyHostToDevice));
    TRY_CUDA(cudaMemcpy(dS, s, 2 * K / G * N, cudaMemcpyHostToDevice));
    for (int path = 0; path < 2; path++) {
        TRY_CUDA(cudaMemset(dC, 0xFF, 2 * M * N));
        if (path == 0) {
            TRY_W4(w4a16_awq_gemm(dA, dW, dS, dZ, NULL, dC, M, N, K, G, W4A16_FP16, ws, wsb, NULL));
        } else {
            TRY_W4(w4a16_marlin_repack_awq(dW, mW, K, N, NULL));
            TRY_W4(w4a16_marlin_awq_zero_points(dZ, mZ, K, N, G, NULL));
            TRY_W4(w4a16_marlin_permute_scales(dS, mS, K, N, G, W4A16_FP16, NULL));
            TRY_W4(w4a16_marlin_gemm(dA, mW, mS, mZ, NULL, dC, M, N, K, G, W4A16_FP16, ws, wsb, NULL));
        }
        TRY_CUDA(cudaDeviceSynchronize());
        TRY_CUDA(cudaMemcpy(hC, dC, 2 * M * N, cudaMemcpyDeviceToHost));
        for (int i = 0; i < M * N; i++) Cf[i] = w4a16_ref_to_float(hC[i], W4A16_FP16);
        *(path ? &err_marlin : &err_awq) = w4a16_ref_rel_error(Cf, ref, M * N);
    }
    rc = !(err_awq < 1e-2 && err_marlin < 1e-2);
    snprintf(out, outlen, "self-test %s: awq rel err %.1e, marlin rel err %.1e (limit 1e-2)", rc ? "FAILED" : "passed",
             err_awq, err_marlin);
done:
    cudaFree(dA);
    cudaFree(dW);
    cudaFree(dZ);
    cudaFree(dS);
    cudaFree(dC);
    cudaFree(mW);
    cudaFree(mZ);
    cudaFree(mS);
    cudaFree(ws);
    free(Wf);
    free(Af);
    free(Cf);
    free(ref);
    free(qw);
    free(qz);
    free(s);
    free(hA);
    free(hC);
    return rc;
}

int main(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        printf("usage: w4a16-doctor\n  Checks the driver and every visible GPU, and self-tests w4a16 on each.\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "w4a16-doctor: unknown argument '%s' (try --help)\n", argv[1]);
        return 2;
    }
    printf("w4a16 %s (header %d.%d.%d)\n", w4a16_version_string(), W4A16_VERSION_MAJOR, W4A16_VERSION_MINOR,
           W4A16_VERSION_PATCH);
    printf("compiled architectures (SASS, then PTX): %s\n", w4a16_compiled_archs());
    int drv = 0, count = 0;
    cudaDriverGetVersion(&drv);
    printf("CUDA runtime (built with): %d.%d\n", CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10);
    if (drv)
        printf("CUDA driver: supports CUDA %d.%d\n", drv / 1000, (drv % 1000) / 10);
    else
        printf("CUDA driver: not found\n");
    w4a16_device_info info;
    w4a16_status s = w4a16_get_device_info(0, &info);
    if (s != W4A16_OK) {
        printf("verdict: NOT USABLE - %s\n", w4a16_last_error_message());
        return 1;
    }
    cudaGetDeviceCount(&count);
    int usable = 0, failed = 0;
    for (int d = 0; d < count; d++) {
        if (w4a16_get_device_info(d, &info) != W4A16_OK) continue;
        printf("GPU %d: %s, compute capability %d.%d, %d SMs, %zu KB shared memory per block, %s\n", d, info.name,
               info.cc_major, info.cc_minor, info.sm_count, info.smem_per_block_optin / 1024,
               info.native_sass ? "native SASS" : "no native SASS (PTX JIT or nothing)");
        printf("  %s\n", info.reason);
        if (!info.supported) continue;
        char msg[512];
        cudaSetDevice(d);
        int bad = self_test(msg, sizeof msg);
        printf("  %s\n", msg);
        usable += !bad;
        failed += bad;
    }
    if (usable && !failed)
        printf("verdict: OK - w4a16 runs on %d of %d GPU(s)\n", usable, count);
    else
        printf("verdict: NOT USABLE - %d of %d GPU(s) passed\n", usable, count);
    return usable && !failed ? 0 : 1;
}
