/* w4a16 from C: one AWQ GEMM on checkpoint-layout tensors, checked against a CPU reference.
 *
 * Against an installed w4a16 (README "Using it from C"):
 *   cc app.c -o app $(pkg-config --cflags --libs w4a16-static)                   # libw4a16.a
 *   cc app.c -o app $(pkg-config --cflags --libs w4a16) \
 *      -L$(pkg-config --variable=cudalibdir w4a16) -lcudart_static -ldl -lpthread -lrt   # libw4a16.so
 * or with CMake: find_package(w4a16) and the targets w4a16::w4a16 / w4a16::w4a16_static (CMakeLists.txt here).
 *
 * Exit status: 0 the GEMM matched the reference; 1 an error or a mismatch; 2 no GPU that w4a16 can use (the reason
 * is printed; nothing was launched). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <w4a16.h>

enum { M = 16, N = 256, K = 512, G = 128 };

static const char *status_name(w4a16_status s) {
    switch (s) {
#define W4A16_NAME_(name, value, text)                                                                                 \
    case name:                                                                                                         \
        return #name;
        W4A16_STATUS_LIST(W4A16_NAME_)
#undef W4A16_NAME_
    }
    return "unknown status";
}

#define CUDA_CHECK(call)                                                                                               \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "app: %s failed: %s\n", #call, cudaGetErrorString(e_));                                    \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

/* IEEE half <-> float on the host (round to nearest even; the values here are normal and finite) */
static uint16_t to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, mant = x & 0x7FFFFFu;
    int exp = (int)((x >> 23) & 0xFF) - 127 + 15;
    if (exp <= 0) return (uint16_t)sign; /* below the smallest normal half: zero is close enough here */
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13), rest = mant & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)h;
}

static float from_half(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FFu, x;
    if (exp == 0x1F)
        x = sign | 0x7F800000u | (mant << 13); /* inf / NaN */
    else if (exp == 0)
        return (sign ? -1.f : 1.f) * ldexpf((float)mant, -24); /* zero / subnormal */
    else
        x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint64_t rng = 0x853C49E6748FEA9Bull;
static uint32_t next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(next_u32() >> 8) / 16777216.f; }

/* AutoAWQ packing: nibble i of word c holds column 8c + order[i] */
static const int awq_order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
static void awq_pack(const uint8_t *q, int rows, int32_t *out) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < N / 8; c++) {
            uint32_t w = 0;
            for (int i = 0; i < 8; i++) w |= (uint32_t)q[(size_t)r * N + 8 * c + awq_order[i]] << (4 * i);
            out[(size_t)r * (N / 8) + c] = (int32_t)w;
        }
}

int main(void) {
    /* a GPU w4a16 can run on? (no driver, no GPU, too old a driver or an architecture this build lacks) */
    w4a16_device_info info;
    w4a16_status s = w4a16_get_device_info(0, &info);
    if (s != W4A16_OK) {
        fprintf(stderr, "app: no GPU for w4a16: %s: %s\n", status_name(s), w4a16_last_error_message());
        return 2;
    }
    if (!info.supported) {
        fprintf(stderr, "app: %s: %s: %s\n", info.name, status_name(info.status), info.reason);
        return 2;
    }
    printf("app: w4a16 %s on %s (profile %s)\n", w4a16_version_string(), info.name, info.profile);

    /* a random layer in AutoAWQ checkpoint layout: 4-bit weights and zero points, fp16 scales; fp16 activations */
    static uint8_t q[K * N], z[K / G * N];
    static int32_t qweight[K * N / 8], qzeros[K / G * N / 8];
    static uint16_t scales[K / G * N], a[M * K], c[M * N];
    for (int i = 0; i < K * N; i++) q[i] = (uint8_t)(next_u32() & 15);
    for (int i = 0; i < K / G * N; i++) z[i] = (uint8_t)(next_u32() & 15);
    for (int i = 0; i < K / G * N; i++) scales[i] = to_half(uniform(0.005f, 0.02f));
    for (int i = 0; i < M * K; i++) a[i] = to_half(uniform(-1.f, 1.f));
    awq_pack(q, K, qweight);
    awq_pack(z, K / G, qzeros);

    /* once per device: the workspace, zeroed once (every call leaves it zeroed again) */
    size_t ws_bytes;
    if ((s = w4a16_workspace_size(&ws_bytes)) != W4A16_OK) {
        fprintf(stderr, "app: w4a16_workspace_size: %s: %s\n", status_name(s), w4a16_last_error_message());
        return 1;
    }
    void *ws, *dA, *dW, *dZ, *dS, *dC;
    CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    CUDA_CHECK(cudaMemset(ws, 0, ws_bytes));
    CUDA_CHECK(cudaMalloc(&dA, sizeof a));
    CUDA_CHECK(cudaMalloc(&dW, sizeof qweight));
    CUDA_CHECK(cudaMalloc(&dZ, sizeof qzeros));
    CUDA_CHECK(cudaMalloc(&dS, sizeof scales));
    CUDA_CHECK(cudaMalloc(&dC, sizeof c));
    CUDA_CHECK(cudaMemcpy(dA, a, sizeof a, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dW, qweight, sizeof qweight, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dZ, qzeros, sizeof qzeros, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dS, scales, sizeof scales, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dC, 0xFF, sizeof c)); /* NaN everywhere: an element the GEMM does not write shows */

    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    /* C[M,N] = A[M,K] * dequant(qweight, qzeros, scales): the checkpoint tensors as stored, no bias */
    s = w4a16_awq_gemm(dA, dW, dS, dZ, NULL, dC, M, N, K, G, W4A16_FP16, ws, ws_bytes, stream);
    if (s != W4A16_OK) { /* nothing was launched, nothing written */
        fprintf(stderr, "app: w4a16_awq_gemm: %s: %s\n", status_name(s), w4a16_last_error_message());
        return 1;
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy(c, dC, sizeof c, cudaMemcpyDeviceToHost));

    /* reference in double: W[k,n] = (q - z) * s */
    double err2 = 0, ref2 = 0;
    int unwritten = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double ref = 0;
            for (int k = 0; k < K; k++) {
                int g = k / G;
                double w = ((int)q[k * N + n] - (int)z[g * N + n]) * (double)from_half(scales[g * N + n]);
                ref += (double)from_half(a[m * K + k]) * w;
            }
            float got = from_half(c[m * N + n]);
            if (isnan(got)) unwritten++;
            err2 += (got - ref) * (got - ref);
            ref2 += ref * ref;
        }
    double rel = sqrt(err2 / ref2);
    printf("app: C[%d,%d] = A[%d,%d] x W[%d,%d] (group size %d): relative error %.2e against the CPU reference\n", M, N,
           M, K, K, N, G, rel);

    cudaStreamDestroy(stream);
    cudaFree(ws), cudaFree(dA), cudaFree(dW), cudaFree(dZ), cudaFree(dS), cudaFree(dC);
    if (unwritten || !(rel < 1e-2)) {
        fprintf(stderr, "app: MISMATCH (%d elements not written)\n", unwritten);
        return 1;
    }
    return 0;
}
