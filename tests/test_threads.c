/* Concurrency: 8 host threads make their first w4a16 calls at the same moment (the per-device profile choice is
 * initialised under contention), then each runs both GEMM paths on its own stream and workspace. Every result must
 * be bit-identical to the same calls made serially afterwards. A fresh process, so nothing is initialised before. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* after setjmp.h, stdarg.h and stddef.h, which cmocka.h needs but does not include */
#include <cmocka.h>

#include "gpu_util.h"

enum { THREADS = 8, M = 6, K = 4096, N = 1024, G = 128 };

static pthread_barrier_t start;
static void *dA, *dW, *dZ, *dS;
static int32_t *mW, *mZ;
static uint16_t *mS;

typedef struct {
    uint16_t out[2][M * N];
    w4a16_status status;
} result;

static w4a16_status run_both(cudaStream_t s, void *ws, size_t wsb, void *C, uint16_t out[2][M * N]) {
    w4a16_status st = w4a16_awq_gemm(dA, dW, dS, dZ, NULL, C, M, N, K, G, W4A16_FP16, ws, wsb, s);
    if (st) return st;
    GPU_CHECK(cudaMemcpyAsync(out[0], C, sizeof out[0], cudaMemcpyDeviceToHost, s));
    st = w4a16_marlin_gemm(dA, mW, mS, mZ, NULL, C, M, N, K, G, W4A16_FP16, ws, wsb, s);
    if (st) return st;
    GPU_CHECK(cudaMemcpyAsync(out[1], C, sizeof out[1], cudaMemcpyDeviceToHost, s));
    GPU_CHECK(cudaStreamSynchronize(s));
    return W4A16_OK;
}

static void *worker(void *arg) {
    result *r = arg;
    cudaStream_t s;
    GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *C = gpu_alloc((size_t)M * N * 2);
    pthread_barrier_wait(&start);
    size_t wsb = 0;
    r->status = w4a16_workspace_size(&wsb); /* the first w4a16 call of the process, in 8 threads at once */
    if (r->status == W4A16_OK) {
        void *ws = gpu_alloc(wsb);
        GPU_CHECK(cudaMemsetAsync(ws, 0, wsb, s));
        r->status = run_both(s, ws, wsb, C, r->out);
        cudaFree(ws);
    }
    cudaFree(C);
    cudaStreamDestroy(s);
    return NULL;
}

static void test_concurrent_first_use(void **state) {
    (void)state;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        printf("  SKIPPED: no CUDA GPU visible\n");
        skip();
    }
    uint64_t seed = (uint64_t)time(NULL) ^ 0xC0FFEEull;
    uint32_t *w = malloc((size_t)K * N / 2), *z = malloc((size_t)K / G * N / 2);
    uint16_t *sc = malloc((size_t)K / G * N * 2), *a = malloc((size_t)M * K * 2);
    fill_random_words(w, (size_t)K * N / 8, &seed);
    fill_random_words(z, (size_t)K / G * N / 8, &seed);
    fill_random_half(sc, (size_t)K / G * N, 0.005f, 0.015f, W4A16_FP16, &seed);
    fill_random_half(a, (size_t)M * K, -1.f, 1.f, W4A16_FP16, &seed);
    dA = gpu_upload(a, (size_t)M * K * 2);
    dW = gpu_upload(w, (size_t)K * N / 2);
    dZ = gpu_upload(z, (size_t)K / G * N / 2);
    dS = gpu_upload(sc, (size_t)K / G * N * 2);
    /* the Marlin tensors from the CPU twins, so no w4a16 call precedes the threads */
    int32_t *hw = malloc((size_t)K * N / 2), *hz = malloc((size_t)K / G * N / 2);
    uint16_t *hs = malloc((size_t)K / G * N * 2);
    w4a16_ref_marlin_repack_awq((int32_t *)w, K, N, hw);
    w4a16_ref_marlin_awq_zero_points((int32_t *)z, K, N, G, hz);
    w4a16_ref_marlin_permute_scales(sc, K, N, G, hs);
    mW = gpu_upload(hw, (size_t)K * N / 2);
    mZ = gpu_upload(hz, (size_t)K / G * N / 2);
    mS = gpu_upload(hs, (size_t)K / G * N * 2);

    static result res[THREADS], serial;
    pthread_t t[THREADS];
    pthread_barrier_init(&start, NULL, THREADS);
    for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_create(&t[i], NULL, worker, &res[i]), 0);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&start);

    size_t wsb = 0;
    W4_CHECK(w4a16_workspace_size(&wsb));
    void *ws = gpu_alloc(wsb), *C = gpu_alloc((size_t)M * N * 2);
    GPU_CHECK(cudaMemset(ws, 0, wsb));
    assert_int_equal(run_both(0, ws, wsb, C, serial.out), W4A16_OK);
    for (int i = 0; i < THREADS; i++) {
        if (res[i].status) fail_msg("thread %d: %s", i, w4a16_status_string(res[i].status));
        assert_memory_equal(res[i].out, serial.out, sizeof serial.out);
    }
    /* and the two paths agree on the same tensors: within rounding, not bit for bit (at M <= 16 the decode kernel
     * dequantises the two layouts' nibbles with different exact scalings, see README "Numerics") */
    double num = 0, den = 0;
    for (int i = 0; i < M * N; i++) {
        double a = w4a16_ref_to_float(serial.out[0][i], W4A16_FP16),
               b = w4a16_ref_to_float(serial.out[1][i], W4A16_FP16);
        num += (a - b) * (a - b);
        den += a * a;
    }
    if (!(den > 0 && sqrt(num / den) < 5e-3)) fail_msg("AWQ vs Marlin: relative difference %.3e", sqrt(num / den));
    printf("  %d threads, first use at once: AWQ and Marlin results bit-identical to the serial run; AWQ vs Marlin "
           "relative difference %.2e\n",
           THREADS, sqrt(num / den));
    cudaFree(ws);
    cudaFree(C);
    cudaFree(dA);
    cudaFree(dW);
    cudaFree(dZ);
    cudaFree(dS);
    cudaFree(mW);
    cudaFree(mZ);
    cudaFree(mS);
    free(w);
    free(z);
    free(sc);
    free(a);
    free(hw);
    free(hz);
    free(hs);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_concurrent_first_use)};
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) { /* skipped as a whole, with the reason (exit 77: tests/run-suites) */
        printf("test_threads: skipped: no CUDA GPU visible (%s) (%zu tests)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "no device", sizeof tests / sizeof tests[0]);
        return 77;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
