/* CPU reference implementations: packing, quantisation, dequantisation, GEMM and the Marlin converters.
 * Not part of the public ABI: built into libw4a16_ref.a for the tests, the benchmark and the Python tests.
 * Matrices are row-major; 16-bit values (fp16 or bf16 bit patterns) are uint16_t with a w4a16_dtype. */
#ifndef W4A16_REFERENCE_H
#define W4A16_REFERENCE_H
#include "../../include/w4a16.h"
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 16-bit float conversions, round to nearest even (NaN kept, overflow to inf). */
uint16_t w4a16_ref_from_float(float v, w4a16_dtype dtype);
float w4a16_ref_to_float(uint16_t v, w4a16_dtype dtype);

/* AWQ packing along N: q[rows, N] (values 0..15) <-> packed[rows, N/8], nibble i = column 8c + ORDER[i]. */
void w4a16_ref_awq_pack(const uint8_t *q, int rows, int N, int32_t *packed);
void w4a16_ref_awq_unpack(const int32_t *packed, int rows, int N, uint8_t *q);

/* GPTQ packing along K: q[K, N] <-> packed[K/8, N], nibble i of row r = k 8r + i. */
void w4a16_ref_gptq_pack(const uint8_t *q, int K, int N, int32_t *packed);
void w4a16_ref_gptq_unpack(const int32_t *packed, int K, int N, uint8_t *q);

/* AutoAWQ's asymmetric quantiser, per group of G rows (G = K for -1) and column:
 * s = (max - min) / 15 (rounded to dtype), z = clamp(-round(min / s), 0, 15), q = clamp(round(w / s) + z, 0, 15).
 * Outputs AWQ tensors: qweight[K, N/8], qzeros[K/G, N/8], scales[K/G, N] (dtype bits). */
void w4a16_ref_awq_quantize(const float *W, int K, int N, int G, w4a16_dtype dtype, int32_t *qweight, int32_t *qzeros,
                            uint16_t *scales);
/* Symmetric GPTQ quantiser (uint4b8): s = max|w| / 7.5 (rounded to dtype), q = clamp(round(w / s) + 8, 0, 15).
 * Outputs qweight[K/8, N] and scales[K/G, N]. */
void w4a16_ref_gptq_quantize(const float *W, int K, int N, int G, w4a16_dtype dtype, int32_t *qweight,
                             uint16_t *scales);

/* W[k,n] = dtype_round((q - z) * s) as float: exactly what the GPU dequantises. qzeros NULL: z = 8. */
void w4a16_ref_dequantize_q(const uint8_t *q, const uint8_t *z, const uint16_t *scales, int K, int N, int G,
                            w4a16_dtype dtype, float *W);
void w4a16_ref_awq_dequantize(const int32_t *qweight, const int32_t *qzeros, const uint16_t *scales, int K, int N,
                              int G, w4a16_dtype dtype, float *W);

/* C[M,N] = A[M,K] * W[K,N] (+ bias) accumulated in double. bias may be NULL. */
void w4a16_ref_gemm(const float *A, const float *W, const float *bias, int M, int N, int K, double *C);

/* Relative Frobenius error ||out - ref|| / ||ref||; a NaN or inf in out gives +inf. */
double w4a16_ref_rel_error(const float *out, const double *ref, size_t n);

/* Marlin converters (CPU twins of the GPU ones; same output bit for bit). perm may be NULL. */
void w4a16_ref_marlin_repack_awq(const int32_t *awq_qweight, int K, int N, int32_t *out);
void w4a16_ref_marlin_repack_gptq(const int32_t *gptq_qweight, const int32_t *perm, int K, int N, int32_t *out);
void w4a16_ref_marlin_permute_scales(const uint16_t *scales, int K, int N, int G, uint16_t *out);
void w4a16_ref_marlin_awq_zero_points(const int32_t *awq_qzeros, int K, int N, int G, int32_t *out);
/* Inverse of the weight repack: Marlin [K/16, 2N] -> q[K, N]. */
void w4a16_ref_marlin_unpack(const int32_t *marlin, int K, int N, uint8_t *q);

/* Deterministic random numbers for tests and the benchmark (xorshift64*). */
uint64_t w4a16_ref_rand_u64(uint64_t *state);
float w4a16_ref_rand_uniform(uint64_t *state, float lo, float hi);

#ifdef __cplusplus
}
#endif
#endif
