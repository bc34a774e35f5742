/* CPU tests of tests/ref/reference.c and tests/ref/marlin_ref.c: packing order against hand-computed words, the
 * quantiser's error bound, and the Marlin converters against the literal formats.md implementation. */
#include <math.h>
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

#include "../kernels/marlin_index.h"
#include "marlin_literal.h"
#include "ref/reference.h"

static uint64_t seed;

static void random_nibbles(uint8_t *q, size_t n) {
    for (size_t i = 0; i < n; i++) q[i] = (uint8_t)(w4a16_ref_rand_u64(&seed) & 0xF);
}

static void test_awq_pack_hand_computed(void **state) {
    (void)state;
    /* column j holds value j: nibble i holds column ORDER[i] = {0,2,4,6,1,3,5,7}[i] -> 0x75316420 */
    uint8_t q[16];
    for (int j = 0; j < 16; j++) q[j] = (uint8_t)(j % 8);
    int32_t packed[2];
    w4a16_ref_awq_pack(q, 1, 16, packed);
    assert_int_equal((uint32_t)packed[0], 0x75316420u);
    assert_int_equal((uint32_t)packed[1], 0x75316420u);
    /* one non-zero column: column 1 lives in nibble 4 */
    memset(q, 0, sizeof q);
    q[1] = 0xA;
    w4a16_ref_awq_pack(q, 1, 16, packed);
    assert_int_equal((uint32_t)packed[0], 0x000A0000u);
    uint8_t back[16];
    w4a16_ref_awq_unpack(packed, 1, 16, back);
    assert_memory_equal(back, q, 16);
}

static void test_gptq_pack_hand_computed(void **state) {
    (void)state;
    uint8_t q[8 * 2];
    for (int k = 0; k < 8; k++) {
        q[k * 2 + 0] = (uint8_t)k;        /* column 0: k */
        q[k * 2 + 1] = (uint8_t)(15 - k); /* column 1: 15 - k */
    }
    int32_t packed[2];
    w4a16_ref_gptq_pack(q, 8, 2, packed);
    assert_int_equal((uint32_t)packed[0], 0x76543210u);
    assert_int_equal((uint32_t)packed[1], 0x89ABCDEFu);
}

static void test_pack_round_trips(void **state) {
    (void)state;
    const int K = 64, N = 192;
    uint8_t *q = malloc(K * N), *back = malloc(K * N);
    int32_t *p = malloc(K * N / 2);
    random_nibbles(q, K * N);
    w4a16_ref_awq_pack(q, K, N, p);
    w4a16_ref_awq_unpack(p, K, N, back);
    assert_memory_equal(q, back, K * N);
    w4a16_ref_gptq_pack(q, K, N, p);
    w4a16_ref_gptq_unpack(p, K, N, back);
    assert_memory_equal(q, back, K * N);
    free(q);
    free(back);
    free(p);
}

static void quantize_bound(int K, int N, int G, w4a16_dtype dtype) {
    float *W = malloc(sizeof(float) * K * N), *D = malloc(sizeof(float) * K * N);
    for (int i = 0; i < K * N; i++) W[i] = w4a16_ref_rand_uniform(&seed, -1.f, 1.f);
    int groups = G > 0 ? K / G : 1;
    int32_t *qw = calloc(K * N / 8, 4), *qz = calloc(groups * N / 8, 4);
    uint16_t *s = malloc(2 * groups * N);
    w4a16_ref_awq_quantize(W, K, N, G, dtype, qw, qz, s);
    w4a16_ref_awq_dequantize(qw, qz, s, K, N, G, dtype, D);
    double worst = 0;
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) {
            int g = G > 0 ? k / G : 0;
            float sc = w4a16_ref_to_float(s[g * N + n], dtype);
            /* rounding (s/2) plus the zero point's own rounding and clamp (s/2), plus the dtype's rounding */
            double err = fabs(W[k * N + n] - D[k * N + n]) / sc;
            worst = err > worst ? err : worst;
        }
    assert_true(worst <= 1.0 + 0.02);
    /* and the error is really quantisation-sized, not zero: the test can fail both ways */
    assert_true(worst > 0.3);
    free(W);
    free(D);
    free(qw);
    free(qz);
    free(s);
}

static void test_quantize_error_bound(void **state) {
    (void)state;
    quantize_bound(256, 128, 128, W4A16_FP16);
    quantize_bound(256, 128, 32, W4A16_BF16);
    quantize_bound(384, 64, -1, W4A16_FP16);
}

static void test_half_conversions(void **state) {
    (void)state;
    assert_int_equal(w4a16_ref_from_float(1.0f, W4A16_FP16), 0x3C00);
    assert_int_equal(w4a16_ref_from_float(-2.0f, W4A16_FP16), 0xC000);
    assert_int_equal(w4a16_ref_from_float(65504.0f, W4A16_FP16), 0x7BFF);
    assert_int_equal(w4a16_ref_from_float(65520.0f, W4A16_FP16), 0x7C00);
    assert_int_equal(w4a16_ref_from_float(5.9604645e-8f, W4A16_FP16), 0x0001);
    assert_int_equal(w4a16_ref_from_float(1.0f + 1.0f / 2048, W4A16_FP16), 0x3C00); /* tie -> even */
    assert_int_equal(w4a16_ref_from_float(1.0f, W4A16_BF16), 0x3F80);
    assert_int_equal(w4a16_ref_from_float(1.0f + 1.0f / 256, W4A16_BF16), 0x3F80); /* tie -> even */
    for (int i = 0; i < 1000; i++) {
        float v = w4a16_ref_rand_uniform(&seed, -100.f, 100.f);
        float h = w4a16_ref_to_float(w4a16_ref_from_float(v, W4A16_FP16), W4A16_FP16);
        float b = w4a16_ref_to_float(w4a16_ref_from_float(v, W4A16_BF16), W4A16_BF16);
        assert_true(fabsf(h - v) <= fabsf(v) * (1.0f / 2048) + 1e-7f);
        assert_true(fabsf(b - v) <= fabsf(v) * (1.0f / 256) + 1e-7f);
    }
}

static void test_rel_error_nan_fails(void **state) {
    (void)state;
    float out[3] = {1.f, NAN, 2.f};
    double ref[3] = {1.0, 1.0, 2.0};
    assert_true(isinf(w4a16_ref_rel_error(out, ref, 3)));
    out[1] = 1.f;
    assert_true(w4a16_ref_rel_error(out, ref, 3) == 0.0);
}

static const int shapes[][2] = {{16, 64}, {128, 64}, {64, 192}, {384, 128}, {256, 512}};

static void test_marlin_repack_matches_literal(void **state) {
    (void)state;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int K = shapes[s][0], N = shapes[s][1];
        uint8_t *q = malloc(K * N), *back = malloc(K * N);
        int32_t *awq = malloc(K * N / 2), *gptq = malloc(K * N / 2), *lit = malloc(K * N / 2), *got = malloc(K * N / 2);
        random_nibbles(q, K * N);
        literal_marlin_pack(q, K, N, lit);
        w4a16_ref_awq_pack(q, K, N, awq);
        w4a16_ref_marlin_repack_awq(awq, K, N, got);
        assert_memory_equal(got, lit, K * N / 2);
        w4a16_ref_gptq_pack(q, K, N, gptq);
        w4a16_ref_marlin_repack_gptq(gptq, NULL, K, N, got);
        assert_memory_equal(got, lit, K * N / 2);
        w4a16_ref_marlin_unpack(got, K, N, back); /* round trip recovers the int4 matrix */
        assert_memory_equal(back, q, K * N);
        free(q);
        free(back);
        free(awq);
        free(gptq);
        free(lit);
        free(got);
    }
}

static void test_marlin_repack_gptq_perm(void **state) {
    (void)state;
    const int K = 256, N = 128;
    uint8_t *q = malloc(K * N), *qp = malloc(K * N);
    int32_t *gptq = malloc(K * N / 2), *lit = malloc(K * N / 2), *got = malloc(K * N / 2);
    int32_t perm[256];
    for (int k = 0; k < K; k++) perm[k] = k;
    for (int k = K - 1; k > 0; k--) { /* Fisher-Yates */
        int j = (int)(w4a16_ref_rand_u64(&seed) % (uint64_t)(k + 1)), t = perm[k];
        perm[k] = perm[j];
        perm[j] = t;
    }
    random_nibbles(q, K * N);
    for (int k = 0; k < K; k++) memcpy(qp + k * N, q + perm[k] * N, N); /* row k of the result = source row perm[k] */
    literal_marlin_pack(qp, K, N, lit);
    w4a16_ref_gptq_pack(q, K, N, gptq);
    w4a16_ref_marlin_repack_gptq(gptq, perm, K, N, got);
    assert_memory_equal(got, lit, K * N / 2);
    free(q);
    free(qp);
    free(gptq);
    free(lit);
    free(got);
}

static void test_marlin_scales_and_zeros_match_literal(void **state) {
    (void)state;
    const int K = 512, N = 256;
    const int gs[] = {32, 64, 128, -1};
    for (int i = 0; i < 4; i++) {
        int G = gs[i], rows = G > 0 ? K / G : 1;
        uint16_t *s = malloc(2 * rows * N), *lit = malloc(2 * rows * N), *got = malloc(2 * rows * N);
        for (int j = 0; j < rows * N; j++) s[j] = (uint16_t)w4a16_ref_rand_u64(&seed);
        literal_permute_scales(s, rows, N, G < 0, lit);
        w4a16_ref_marlin_permute_scales(s, K, N, G, got);
        assert_memory_equal(got, lit, 2 * rows * N);
        uint8_t *z = malloc(rows * N);
        int32_t *awqz = malloc(rows * N / 2), *zl = malloc(rows * N / 2), *zg = malloc(rows * N / 2);
        random_nibbles(z, rows * N);
        w4a16_ref_awq_pack(z, rows, N, awqz);
        literal_marlin_zeros(z, rows, N, zl);
        w4a16_ref_marlin_awq_zero_points(awqz, K, N, G, zg);
        assert_memory_equal(zg, zl, rows * N / 2);
        free(s);
        free(lit);
        free(got);
        free(z);
        free(awqz);
        free(zl);
        free(zg);
    }
}

static void test_marlin_perm_is_a_permutation(void **state) {
    (void)state;
    int perm[1024], seen[1024] = {0};
    literal_marlin_perm(perm);
    for (int i = 0; i < 1024; i++) seen[perm[i]]++;
    for (int i = 0; i < 1024; i++) assert_int_equal(seen[i], 1);
    /* lane 0's first 8 entries, from the public code's comment: 0, 128, 8, 136, 16, 144, 24, 152 */
    const int lane0[8] = {0, 128, 8, 136, 16, 144, 24, 152};
    for (int i = 0; i < 8; i++) assert_int_equal(perm[i], lane0[i]);
}

/* The staged path's Marlin dequantisation finds a column's scale and zero point through the inverse map. */
static void test_marlin_scale_pos_inverts_source(void **state) {
    (void)state;
    for (int cw = 0; cw < 2; cw++)
        for (int pos = 0; pos < 256; pos++) {
            assert_int_equal(w4a16_marlin_scale_pos(w4a16_marlin_scale_source(pos, cw), cw), pos);
            assert_int_equal(w4a16_marlin_scale_source(w4a16_marlin_scale_pos(pos, cw), cw), pos);
        }
    for (int n = 0; n < 128; n++) { /* zero point of column n: nibble reverse(p % 8) of word p / 8 */
        int p = w4a16_marlin_scale_pos(n, 0);
        assert_int_equal(w4a16_marlin_zero_source(p / 8, w4a16_awq_reverse(p % 8)), n);
    }
}

int main(void) {
    seed = (uint64_t)time(NULL) ^ 0x5DEECE66Dull; /* fresh random inputs every run */
    printf("test_reference: seed %llu\n", (unsigned long long)seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_awq_pack_hand_computed),
        cmocka_unit_test(test_gptq_pack_hand_computed),
        cmocka_unit_test(test_pack_round_trips),
        cmocka_unit_test(test_quantize_error_bound),
        cmocka_unit_test(test_half_conversions),
        cmocka_unit_test(test_rel_error_nan_fails),
        cmocka_unit_test(test_marlin_perm_is_a_permutation),
        cmocka_unit_test(test_marlin_repack_matches_literal),
        cmocka_unit_test(test_marlin_repack_gptq_perm),
        cmocka_unit_test(test_marlin_scales_and_zeros_match_literal),
        cmocka_unit_test(test_marlin_scale_pos_inverts_source),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
