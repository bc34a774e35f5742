/* CPU reference: 16-bit floats, AWQ/GPTQ packing, quantisers, dequantisation, GEMM, errors, random numbers. */
#include "reference.h"
#include "../../kernels/marlin_index.h"
#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- 16-bit floats */
static uint32_t f32_bits(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}
static float bits_f32(uint32_t u) {
    float v;
    memcpy(&v, &u, 4);
    return v;
}

static uint16_t to_bf16(float v) {
    uint32_t u = f32_bits(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                          /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static uint16_t to_f16(float v) {
    uint32_t u = f32_bits(v), sign = (u >> 16) & 0x8000u, au = u & 0x7fffffffu;
    if (au > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (au >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (au < 0x38800000u) {                                   /* subnormal or zero in fp16 */
        float a = bits_f32(au);
        /* a / 2^-24 rounded to nearest even, using float's own rounding */
        float scaled = a * 16777216.0f;
        float r = nearbyintf(scaled);
        return (uint16_t)(sign | (uint16_t)r);
    }
    uint32_t mant = au & 0x7fffffu, exp = (au >> 23) - 112;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

static float from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)mant / 16777216.0f;
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t w4a16_ref_from_float(float v, w4a16_dtype dtype) { return dtype == W4A16_BF16 ? to_bf16(v) : to_f16(v); }

float w4a16_ref_to_float(uint16_t v, w4a16_dtype dtype) {
    return dtype == W4A16_BF16 ? bits_f32((uint32_t)v << 16) : from_f16(v);
}

static float round_dtype(float v, w4a16_dtype dtype) {
    return w4a16_ref_to_float(w4a16_ref_from_float(v, dtype), dtype);
}

/* ---------------------------------------------------------------- packing */
void w4a16_ref_awq_pack(const uint8_t *q, int rows, int N, int32_t *packed) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < N / 8; c++) {
            uint32_t w = 0;
            for (int i = 0; i < 8; i++) w |= (uint32_t)(q[(size_t)r * N + 8 * c + w4a16_awq_order(i)] & 0xF) << (4 * i);
            packed[(size_t)r * (N / 8) + c] = (int32_t)w;
        }
}

void w4a16_ref_awq_unpack(const int32_t *packed, int rows, int N, uint8_t *q) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < N / 8; c++) {
            uint32_t w = (uint32_t)packed[(size_t)r * (N / 8) + c];
            for (int i = 0; i < 8; i++) q[(size_t)r * N + 8 * c + w4a16_awq_order(i)] = (uint8_t)((w >> (4 * i)) & 0xF);
        }
}

void w4a16_ref_gptq_pack(const uint8_t *q, int K, int N, int32_t *packed) {
    for (int r = 0; r < K / 8; r++)
        for (int n = 0; n < N; n++) {
            uint32_t w = 0;
            for (int i = 0; i < 8; i++) w |= (uint32_t)(q[(size_t)(8 * r + i) * N + n] & 0xF) << (4 * i);
            packed[(size_t)r * N + n] = (int32_t)w;
        }
}

void w4a16_ref_gptq_unpack(const int32_t *packed, int K, int N, uint8_t *q) {
    for (int r = 0; r < K / 8; r++)
        for (int n = 0; n < N; n++) {
            uint32_t w = (uint32_t)packed[(size_t)r * N + n];
            for (int i = 0; i < 8; i++) q[(size_t)(8 * r + i) * N + n] = (uint8_t)((w >> (4 * i)) & 0xF);
        }
}

/* ---------------------------------------------------------------- quantisers */
static int clamp15(float v) { return v < 0.f ? 0 : v > 15.f ? 15 : (int)v; }

void w4a16_ref_awq_quantize(const float *W, int K, int N, int G, w4a16_dtype dtype, int32_t *qweight, int32_t *qzeros,
                            uint16_t *scales) {
    if (G <= 0) G = K;
    const int groups = K / G;
    for (int g = 0; g < groups; g++) {
        for (int n = 0; n < N; n++) {
            float mn = INFINITY, mx = -INFINITY;
            for (int k = g * G; k < (g + 1) * G; k++) {
                float v = W[(size_t)k * N + n];
                mn = v < mn ? v : mn;
                mx = v > mx ? v : mx;
            }
            float s = (mx - mn) / 15.0f;
            if (s < 1e-5f) s = 1e-5f;
            uint16_t sb = w4a16_ref_from_float(s, dtype);
            s = w4a16_ref_to_float(sb, dtype);
            scales[(size_t)g * N + n] = sb;
            int z = clamp15(rintf(-mn / s));
            /* packed words are assembled nibble by nibble (read-modify-write) */
            uint32_t *zw = (uint32_t *)&qzeros[(size_t)g * (N / 8) + n / 8];
            int zsh = 4 * w4a16_awq_reverse(n % 8);
            *zw = (*zw & ~(0xFu << zsh)) | ((uint32_t)z << zsh);
            for (int k = g * G; k < (g + 1) * G; k++) {
                int qv = clamp15(rintf(W[(size_t)k * N + n] / s) + (float)z);
                uint32_t *qw = (uint32_t *)&qweight[(size_t)k * (N / 8) + n / 8];
                *qw = (*qw & ~(0xFu << zsh)) | ((uint32_t)qv << zsh);
            }
        }
    }
}

void w4a16_ref_gptq_quantize(const float *W, int K, int N, int G, w4a16_dtype dtype, int32_t *qweight,
                             uint16_t *scales) {
    if (G <= 0) G = K;
    for (int g = 0; g < K / G; g++)
        for (int n = 0; n < N; n++) {
            float mx = 0.f;
            for (int k = g * G; k < (g + 1) * G; k++) {
                float a = fabsf(W[(size_t)k * N + n]);
                mx = a > mx ? a : mx;
            }
            float s = mx / 7.5f;
            if (s < 1e-5f) s = 1e-5f;
            uint16_t sb = w4a16_ref_from_float(s, dtype);
            s = w4a16_ref_to_float(sb, dtype);
            scales[(size_t)g * N + n] = sb;
            for (int k = g * G; k < (g + 1) * G; k++) {
                int qv = clamp15(rintf(W[(size_t)k * N + n] / s) + 8.0f);
                uint32_t *qw = (uint32_t *)&qweight[(size_t)(k / 8) * N + n];
                int sh = 4 * (k % 8);
                *qw = (*qw & ~(0xFu << sh)) | ((uint32_t)qv << sh);
            }
        }
}

/* ---------------------------------------------------------------- dequantisation and GEMM */
void w4a16_ref_dequantize_q(const uint8_t *q, const uint8_t *z, const uint16_t *scales, int K, int N, int G,
                            w4a16_dtype dtype, float *W) {
    if (G <= 0) G = K;
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) {
            int g = k / G;
            int zz = z ? z[(size_t)g * N + n] : 8;
            float s = w4a16_ref_to_float(scales[(size_t)g * N + n], dtype);
            W[(size_t)k * N + n] = round_dtype((float)(q[(size_t)k * N + n] - zz) * s, dtype);
        }
}

void w4a16_ref_awq_dequantize(const int32_t *qweight, const int32_t *qzeros, const uint16_t *scales, int K, int N,
                              int G, w4a16_dtype dtype, float *W) {
    if (G <= 0) G = K;
    for (int k = 0; k < K; k++)
        for (int c = 0; c < N / 8; c++) {
            uint32_t w = (uint32_t)qweight[(size_t)k * (N / 8) + c];
            uint32_t zw = (uint32_t)qzeros[(size_t)(k / G) * (N / 8) + c];
            for (int i = 0; i < 8; i++) {
                int n = 8 * c + w4a16_awq_order(i);
                int qv = (int)((w >> (4 * i)) & 0xF), zv = (int)((zw >> (4 * i)) & 0xF);
                float s = w4a16_ref_to_float(scales[(size_t)(k / G) * N + n], dtype);
                W[(size_t)k * N + n] = round_dtype((float)(qv - zv) * s, dtype);
            }
        }
}

void w4a16_ref_gemm(const float *A, const float *W, const float *bias, int M, int N, int K, double *C) {
    for (int m = 0; m < M; m++) {
        double *c = C + (size_t)m * N;
        for (int n = 0; n < N; n++) c[n] = bias ? bias[n] : 0.0;
        for (int k = 0; k < K; k++) {
            double a = A[(size_t)m * K + k];
            const float *w = W + (size_t)k * N;
            for (int n = 0; n < N; n++) c[n] += a * w[n];
        }
    }
}

double w4a16_ref_rel_error(const float *out, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(out[i])) return INFINITY;
        double d = out[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---------------------------------------------------------------- random numbers */
uint64_t w4a16_ref_rand_u64(uint64_t *state) {
    uint64_t x = *state ? *state : 0x9E3779B97F4A7C15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

float w4a16_ref_rand_uniform(uint64_t *state, float lo, float hi) {
    return lo + (hi - lo) * (float)((w4a16_ref_rand_u64(state) >> 40) * (1.0 / 16777216.0));
}
