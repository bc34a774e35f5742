// What the benchmarks share: the timing of a batch of launches, and the device ceilings their floors are made of.
#ifndef W4A16_BENCH_UTIL_H
#define W4A16_BENCH_UTIL_H
#include <algorithm>
#include <cstdint>
#include <vector>

#include "../tests/gpu_util.h"

// A result row for a case: `seen` is that case's row from an earlier sweep of the list (--sweeps), or null; the case
// keeps the lower of its times.
template <class Row> void keep_lowest(std::vector<Row> &rows, Row *seen, const Row &r) {
    if (!seen)
        rows.push_back(r);
    else if (r.us < seen->us)
        *seen = r;
}

// Microseconds per launch: 9 samples of `reps` launches each, timed with CUDA events; the median sample, the lower
// of two passes. launch() enqueues one launch.
template <class Launch> double time_launches(Launch &&launch, int reps, cudaEvent_t e0, cudaEvent_t e1) {
    const int samples = 9;
    double best = 0;
    float ms;
    for (int pass = 0; pass < 2; pass++) {
        std::vector<double> t;
        for (int s = 0; s < samples; s++) {
            GPU_CHECK(cudaEventRecord(e0));
            for (int r = 0; r < reps; r++) launch();
            GPU_CHECK(cudaEventRecord(e1));
            GPU_CHECK(cudaEventSynchronize(e1));
            GPU_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            t.push_back(ms * 1000.0 / reps);
        }
        std::sort(t.begin(), t.end());
        if (pass == 0 || t[samples / 2] < best) best = t[samples / 2];
    }
    return best;
}

// Device ceilings measured once: the bandwidth of a large device-to-device copy and the throughput of a large cuBLAS
// fp16 product (the fastest of 5 runs after a warm-up each).
struct Ceilings {
    double copy_tbps = 0, cublas_tflops = 0;
};

inline Ceilings measure_ceilings(cublasHandle_t blas) {
    Ceilings c;
    size_t bytes = (size_t)1 << 30;
    void *a = gpu_alloc(bytes), *b = gpu_alloc(bytes);
    GPU_CHECK(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    GPU_CHECK(cudaEventCreate(&e0));
    GPU_CHECK(cudaEventCreate(&e1));
    float best = 1e30f, ms;
    for (int i = 0; i < 6; i++) {
        GPU_CHECK(cudaEventRecord(e0));
        GPU_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
        GPU_CHECK(cudaEventRecord(e1));
        GPU_CHECK(cudaEventSynchronize(e1));
        GPU_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (i) best = std::min(best, ms);
    }
    c.copy_tbps = 2.0 * bytes / (best * 1e-3) / 1e12;
    cudaFree(a);
    cudaFree(b);
    const int n = 8192;
    std::vector<uint16_t> h((size_t)n * n);
    uint64_t seed = 99;
    fill_random_half(h.data(), h.size(), -1.f, 1.f, W4A16_FP16, &seed);
    void *x = gpu_upload(h.data(), h.size() * 2), *y = gpu_upload(h.data(), h.size() * 2), *z = gpu_alloc(h.size() * 2);
    best = 1e30f;
    for (int i = 0; i < 6; i++) {
        GPU_CHECK(cudaEventRecord(e0));
        cublas_gemm(blas, x, y, z, n, n, n, W4A16_FP16, CUDA_R_16F);
        GPU_CHECK(cudaEventRecord(e1));
        GPU_CHECK(cudaEventSynchronize(e1));
        GPU_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (i) best = std::min(best, ms);
    }
    c.cublas_tflops = 2.0 * n * n * (double)n / (best * 1e-3) / 1e12;
    cudaFree(x);
    cudaFree(y);
    cudaFree(z);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return c;
}
#endif
