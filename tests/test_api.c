/* CPU tests of the C ABI: version, status strings, last-error messages, and every argument check.
 * Rejected calls must return their status with a message and write nothing: the "device" buffers here are
 * host arrays filled with a pattern, and must still hold it afterwards. No call in this file ever passes
 * validation, so nothing can be launched on the host arrays even where a GPU exists. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* after setjmp.h, stdarg.h and stddef.h, which cmocka.h needs but does not include */
#include <cmocka.h>

#include "w4a16.h"

enum { BUF = 4096 };
static _Alignas(256) unsigned char bufA[BUF], bufW[BUF], bufS[BUF], bufZ[BUF], bufC[BUF], bufWS[BUF];
static const unsigned char POISON = 0xA5;

static void poison_all(void) {
    memset(bufA, POISON, BUF);
    memset(bufW, POISON, BUF);
    memset(bufS, POISON, BUF);
    memset(bufZ, POISON, BUF);
    memset(bufC, POISON, BUF);
    memset(bufWS, POISON, BUF);
}
static void assert_untouched(void) {
    unsigned char *bufs[] = {bufA, bufW, bufS, bufZ, bufC, bufWS};
    for (int b = 0; b < 6; b++)
        for (int i = 0; i < BUF; i++) assert_int_equal(bufs[b][i], POISON);
}

#define EXPECT(call, status, fragment)                                                                                 \
    do {                                                                                                               \
        poison_all();                                                                                                  \
        w4a16_status s_ = (call);                                                                                      \
        if (s_ != (status) || !strstr(w4a16_last_error_message(), (fragment)))                                         \
            fail_msg("%s\n  returned %d (%s) '%s', expected %d with '%s'", #call, s_, w4a16_status_string(s_),         \
                     w4a16_last_error_message(), (int)(status), (fragment));                                           \
        assert_untouched();                                                                                            \
    } while (0)

static const int32_t *W = (const int32_t *)bufW, *Z = (const int32_t *)bufZ;
#define AWQ(A_, qw_, s_, qz_, b_, C_, M_, N_, K_, G_, dt_, ws_, wsb_)                                                  \
    w4a16_awq_gemm(A_, qw_, s_, qz_, b_, C_, M_, N_, K_, G_, dt_, ws_, wsb_, NULL)

static void test_version(void **state) {
    (void)state;
    assert_int_equal(w4a16_version_number(), W4A16_VERSION_NUMBER);
    char expect[32];
    snprintf(expect, sizeof expect, "%d.%d.%d", W4A16_VERSION_MAJOR, W4A16_VERSION_MINOR, W4A16_VERSION_PATCH);
    assert_string_equal(w4a16_version_string(), expect);
}

static void test_status_strings(void **state) {
    (void)state;
    const char *seen[64] = {0};
    int n = 0;
#define CHECK_STATUS_(name, value, text)                                                                               \
    assert_string_equal(w4a16_status_string(name), text);                                                              \
    assert_true(strlen(text) > 5);                                                                                     \
    for (int i = 0; i < n; i++) assert_string_not_equal(seen[i], text);                                                \
    seen[n++] = text;
    W4A16_STATUS_LIST(CHECK_STATUS_)
#undef CHECK_STATUS_
    assert_string_equal(w4a16_status_string((w4a16_status)999), "unknown w4a16 status");
    assert_int_equal(W4A16_OK, 0);
    assert_int_equal(W4A16_ERR_ARCH_UNSUPPORTED, 22); /* values never change meaning */
}

static void test_compiled_archs(void **state) {
    (void)state;
    const char *a = w4a16_compiled_archs();
    assert_non_null(a);
    assert_non_null(strstr(a, "ptx:"));
    assert_true(strlen(a) > 5);
    const char *const *names = w4a16_profile_names();
    int n = 0;
    while (names[n]) n++;
    assert_int_equal(n, 7);
    assert_string_equal(names[5], "sm120");
}

static void test_awq_gemm_validation(void **state) {
    (void)state;
    const w4a16_dtype H = W4A16_FP16;
    EXPECT(AWQ(NULL, W, bufS, Z, NULL, bufC, 1, 64, 128, 128, H, NULL, 0), W4A16_ERR_NULL_POINTER, "A is NULL");
    EXPECT(AWQ(bufA, NULL, bufS, Z, NULL, bufC, 1, 64, 128, 128, H, NULL, 0), W4A16_ERR_NULL_POINTER,
           "qweight is NULL");
    EXPECT(AWQ(bufA, W, NULL, Z, NULL, bufC, 1, 64, 128, 128, H, NULL, 0), W4A16_ERR_NULL_POINTER, "scales is NULL");
    EXPECT(AWQ(bufA, W, bufS, NULL, NULL, bufC, 1, 64, 128, 128, H, NULL, 0), W4A16_ERR_NULL_POINTER, "qzeros is NULL");
    EXPECT(AWQ(bufA, W, bufS, Z, NULL, NULL, 1, 64, 128, 128, H, NULL, 0), W4A16_ERR_NULL_POINTER, "C is NULL");
    EXPECT(AWQ(bufA + 2, W, bufS, Z, NULL, bufC, 1, 64, 128, 128, H, NULL, 0), W4A16_ERR_MISALIGNED, "16-byte aligned");
    EXPECT(AWQ(bufA, (const int32_t *)(bufW + 4), bufS, Z, NULL, bufC, 1, 64, 128, 128, H, NULL, 0),
           W4A16_ERR_MISALIGNED, "qweight=");
    EXPECT(AWQ(bufA, W, bufS, Z, bufWS + 2, bufC, 1, 64, 128, 128, H, NULL, 0), W4A16_ERR_MISALIGNED, "bias=");
    EXPECT(AWQ(bufA, W, bufS, Z, NULL, bufC + 8, 1, 64, 128, 128, H, NULL, 0), W4A16_ERR_MISALIGNED, "C=");
    EXPECT(AWQ(bufA, W, bufS, Z, NULL, bufC, 0, 64, 128, 128, H, NULL, 0), W4A16_ERR_INVALID_SHAPE,
           "M=0 must be at least 1");
    EXPECT(AWQ(bufA, W, bufS, Z, NULL, bufC, -3, 64, 128, 128, H, NULL, 0), W4A16_ERR_INVALID_SHAPE, "M=-3");
    EXPECT(AWQ(bufA, W, bufS, Z, NULL, bufC, 1, 100, 128, 128, H, NULL, 0), W4A16_ERR_INVALID_SHAPE,
           "N=100 must be a positive multiple of 64");
    EXPECT(AWQ(bufA, W, bufS, Z, NULL, bufC, 1, 0, 128, 128, H, NULL, 0), W4A16_ERR_INVALID_SHAPE, "N=0");
    EXPECT(AWQ(bufA, W, bufS, Z, NULL, bufC, 1, 64, 4000, 128, H, NULL, 0), W4A16_ERR_INVALID_SHAPE,
           "K=4000 is not a multiple of group_size=128");
    EXPECT(AWQ(bufA, W, bufS, Z, NULL, bufC, 1, 64, 100, -1, H, NULL, 0), W4A16_ERR_INVALID_SHAPE,
           "K=100 must be a positive multiple of 32");
    EXPECT(AWQ(bufA, W, bufS, Z, NULL, bufC, 1, 64, 128, 48, H, NULL, 0), W4A16_ERR_UNSUPPORTED_GROUP_SIZE,
           "group_size=48 is not one of 32, 64, 128, -1");
    EXPECT(AWQ(bufA, W, bufS, Z, NULL, bufC, 1, 64, 128, 0, H, NULL, 0), W4A16_ERR_UNSUPPORTED_GROUP_SIZE,
           "group_size=0");
    EXPECT(AWQ(bufA, W, bufS, Z, NULL, bufC, 1, 64, 128, 128, (w4a16_dtype)7, NULL, 0), W4A16_ERR_UNSUPPORTED_DTYPE,
           "dtype=7");
    /* products that overflow 32 bits are computed in 64 bits and rejected past the documented limit */
    EXPECT(AWQ(bufA, W, bufS, Z, NULL, bufC, 1 << 30, 64, 1 << 20, 128, H, NULL, 0), W4A16_ERR_SIZE_OVERFLOW,
           "A[M,K] has 1073741824 x 1048576 elements");
    EXPECT(AWQ(bufA, W, bufS, Z, NULL, bufC, 1, 64 * 70000, 128, 128, H, NULL, 0), W4A16_ERR_SIZE_OVERFLOW,
           "N=4480000");
    EXPECT(AWQ(bufA, W, bufS, Z, NULL, bufC, 1, 64, 128, 128, H, NULL, 1024), W4A16_ERR_NULL_POINTER,
           "workspace is NULL");
    EXPECT(AWQ(bufA, W, bufS, Z, NULL, bufC, 1, 64, 128, 128, H, bufWS + 4, 1024), W4A16_ERR_MISALIGNED, "workspace=");
    EXPECT(w4a16_awq_gemm_ex(bufA, W, bufS, Z, NULL, bufC, 1, 64, 128, 128, H, NULL, 0, 6u, NULL),
           W4A16_ERR_INVALID_VALUE, "flags=0x6 has unknown bits");
    EXPECT(w4a16_marlin_gemm_ex(bufA, W, bufS, NULL, NULL, bufC, 1, 64, 128, 128, H, NULL, 0, 0x80u, NULL),
           W4A16_ERR_INVALID_VALUE, "flags=0x80");
    /* both known flags pass the flag check: the next check (the group size) answers */
    EXPECT(w4a16_awq_gemm_ex(bufA, W, bufS, Z, NULL, bufC, 1, 64, 128, 48, H, NULL, 0,
                             W4A16_FLAG_PDL | W4A16_FLAG_REDUCE_IN_DTYPE, NULL),
           W4A16_ERR_UNSUPPORTED_GROUP_SIZE, "group_size=48");
}

static void test_marlin_gemm_validation(void **state) {
    (void)state;
    const w4a16_dtype B = W4A16_BF16;
    EXPECT(w4a16_marlin_gemm(bufA, W, bufS, NULL, NULL, bufC, 1, 64, 96, -1, B, NULL, 0, NULL), W4A16_ERR_INVALID_SHAPE,
           "K=96 must be a positive multiple of 128");
    EXPECT(w4a16_marlin_gemm(bufA, NULL, bufS, NULL, NULL, bufC, 1, 64, 128, 128, B, NULL, 0, NULL),
           W4A16_ERR_NULL_POINTER, "marlin_weight is NULL");
    EXPECT(w4a16_marlin_gemm(bufA, W, bufS, (const int32_t *)(bufZ + 4), NULL, bufC, 1, 64, 128, 128, B, NULL, 0, NULL),
           W4A16_ERR_MISALIGNED, "marlin_zeros=");
    EXPECT(w4a16_marlin_gemm(bufA, W, bufS, NULL, NULL, bufC, 1, 64, 384, 256, B, NULL, 0, NULL),
           W4A16_ERR_UNSUPPORTED_GROUP_SIZE, "group_size=256");
}

static void test_converter_validation(void **state) {
    (void)state;
    int32_t *out = (int32_t *)bufC;
    EXPECT(w4a16_marlin_repack_awq(W, (int32_t *)bufW, 128, 64, NULL), W4A16_ERR_INVALID_VALUE, "same buffer");
    EXPECT(w4a16_marlin_repack_awq(W, out, 120, 64, NULL), W4A16_ERR_INVALID_SHAPE,
           "K=120 must be a positive multiple of 16");
    EXPECT(w4a16_marlin_repack_awq(W, out, 128, 96, NULL), W4A16_ERR_INVALID_SHAPE, "N=96");
    EXPECT(w4a16_marlin_repack_gptq(W, (const int32_t *)(bufZ + 2), out, 128, 64, NULL), W4A16_ERR_MISALIGNED, "perm=");
    EXPECT(w4a16_marlin_permute_scales(bufS, bufC, 128, 64, 96, W4A16_FP16, NULL), W4A16_ERR_UNSUPPORTED_GROUP_SIZE,
           "group_size=96");
    EXPECT(w4a16_marlin_permute_scales(bufS, bufC, 128, 64, 64, (w4a16_dtype)2, NULL), W4A16_ERR_UNSUPPORTED_DTYPE,
           "dtype=2");
    EXPECT(w4a16_marlin_awq_zero_points(NULL, out, 128, 64, 128, NULL), W4A16_ERR_NULL_POINTER, "input is NULL");
    EXPECT(w4a16_awq_dequantize(W, bufS, Z, bufC, 192, 64, 128, W4A16_FP16, NULL), W4A16_ERR_INVALID_SHAPE,
           "K=192 is not a multiple of group_size=128");
    EXPECT(w4a16_awq_dequantize(W, bufS, Z, NULL, 128, 64, 128, W4A16_FP16, NULL), W4A16_ERR_NULL_POINTER, "W is NULL");
}

static void test_introspection_validation(void **state) {
    (void)state;
    EXPECT(w4a16_get_device_info(0, NULL), W4A16_ERR_NULL_POINTER, "info is NULL");
    EXPECT(w4a16_workspace_size(NULL), W4A16_ERR_NULL_POINTER, "bytes is NULL");
    size_t bytes = 12345;
    EXPECT(w4a16_workspace_size_staged(4096, 4096, NULL), W4A16_ERR_NULL_POINTER, "bytes is NULL");
    EXPECT(w4a16_workspace_size_staged(100, 4096, &bytes), W4A16_ERR_INVALID_SHAPE,
           "N=100 must be a positive multiple of 64");
    EXPECT(w4a16_workspace_size_staged(4096, 4010, &bytes), W4A16_ERR_INVALID_SHAPE,
           "K=4010 must be a positive multiple of 32");
    assert_int_equal(bytes, 12345); /* nothing written on failure */
    EXPECT(w4a16_force_profile("sm999"), W4A16_ERR_INVALID_VALUE, "profile 'sm999' does not exist");
    w4a16_device_info info;
    EXPECT(w4a16_get_device_info(-1, &info), W4A16_ERR_INVALID_VALUE, "device=-1");
}

static void *other_thread(void *arg) {
    (void)arg;
    w4a16_awq_gemm(NULL, W, bufS, Z, NULL, bufC, 1, 64, 128, 128, W4A16_FP16, NULL, 0, NULL);
    return (void *)(strstr(w4a16_last_error_message(), "A is NULL") != NULL ? (void *)1 : NULL);
}

static void test_last_error_is_thread_local(void **state) {
    (void)state;
    w4a16_awq_gemm(bufA, W, bufS, Z, NULL, bufC, 1, 64, 128, 48, W4A16_FP16, NULL, 0, NULL);
    assert_non_null(strstr(w4a16_last_error_message(), "group_size=48"));
    pthread_t t;
    void *ok = NULL;
    assert_int_equal(pthread_create(&t, NULL, other_thread, NULL), 0);
    pthread_join(t, &ok);
    assert_non_null(ok);
    assert_non_null(strstr(w4a16_last_error_message(), "group_size=48")); /* ours is unchanged */
}

/* Act-order: the permutation sorts rows by group, stably, and only whole groups are accepted. */
static void test_act_order_sort(void **state) {
    (void)state;
    enum { K = 512, G = 128 };
    int32_t g_idx[K], perm[K], sorted[K];
    uint64_t x = 88172645463325252ull;
    int pos[K];
    for (int k = 0; k < K; k++) pos[k] = k;
    for (int k = K - 1; k > 0; k--) { /* desc_act: group of a row = its rank in activation order / G */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int j = (int)(x % (uint64_t)(k + 1)), t = pos[k];
        pos[k] = pos[j];
        pos[j] = t;
    }
    for (int k = 0; k < K; k++) g_idx[k] = pos[k] / G;
    assert_int_equal(w4a16_act_order_sort(g_idx, K, G, perm, sorted), W4A16_OK);
    int seen[K] = {0};
    for (int k = 0; k < K; k++) {
        seen[perm[k]]++;
        assert_int_equal(g_idx[perm[k]], k / G); /* sorted by group */
        assert_int_equal(sorted[k], k / G);
        if (k % G) assert_true(perm[k] > perm[k - 1]); /* stable inside a group */
    }
    for (int k = 0; k < K; k++) assert_int_equal(seen[k], 1);
    g_idx[7] = 4; /* out of range */
    EXPECT(w4a16_act_order_sort(g_idx, K, G, perm, NULL), W4A16_ERR_INVALID_VALUE, "g_idx[7]=4 is outside [0, K/G=4)");
    for (int k = 0; k < K; k++) g_idx[k] = k / G;
    g_idx[0] = 1; /* group 0 cut short, as in a row-parallel shard */
    EXPECT(w4a16_act_order_sort(g_idx, K, G, perm, NULL), W4A16_ERR_NOT_IMPLEMENTED, "use w4a16_act_order_plan");
    EXPECT(w4a16_act_order_sort(NULL, K, G, perm, NULL), W4A16_ERR_NULL_POINTER, "g_idx is NULL");
    EXPECT(w4a16_permute_cols(bufA, (const int32_t *)bufZ, bufA, 4, 64, 64, W4A16_FP16, NULL), W4A16_ERR_INVALID_VALUE,
           "same buffer");
    EXPECT(w4a16_permute_cols(bufA, NULL, bufC, 4, 64, 64, W4A16_FP16, NULL), W4A16_ERR_NULL_POINTER, "perm is NULL");
    EXPECT(w4a16_gather_rows(bufS, 4, (const int32_t *)bufZ, bufC, 0, 64, W4A16_FP16, NULL), W4A16_ERR_INVALID_SHAPE,
           "rows_out=0");
}

/* Act-order on a K shard with cut groups: runs padded to 32, every 32-row block in one group, K_padded % 128 == 0. */
static void test_act_order_plan(void **state) {
    (void)state;
    enum { K = 300, GROUPS = 7 };
    int32_t g_idx[K], row_src[1024], block_group[32];
    int counts[GROUPS] = {0};
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int k = 0; k < K; k++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        g_idx[k] = (int32_t)(x % GROUPS);
        counts[g_idx[k]]++;
    }
    int kp = 0, want = 0;
    for (int g = 0; g < GROUPS; g++) want += (counts[g] + 31) / 32 * 32;
    want = (want + 127) / 128 * 128;
    assert_int_equal(w4a16_act_order_plan(g_idx, K, GROUPS, NULL, 0, &kp, NULL), W4A16_OK);
    assert_int_equal(kp, want);
    EXPECT(w4a16_act_order_plan(g_idx, K, GROUPS, row_src, kp - 1, &kp, block_group), W4A16_ERR_INVALID_VALUE,
           "capacity=");
    assert_int_equal(w4a16_act_order_plan(g_idx, K, GROUPS, row_src, 1024, &kp, block_group), W4A16_OK);
    int seen[K] = {0}, prev = -1;
    for (int i = 0; i < kp; i++) {
        if (row_src[i] < 0) continue;
        seen[row_src[i]]++;
        assert_int_equal(g_idx[row_src[i]], block_group[i / 32]); /* every row in a block of its own group */
        if (prev >= 0 && g_idx[prev] == g_idx[row_src[i]]) assert_true(row_src[i] > prev); /* stable */
        prev = row_src[i];
    }
    for (int k = 0; k < K; k++) assert_int_equal(seen[k], 1);
    g_idx[3] = GROUPS;
    EXPECT(w4a16_act_order_plan(g_idx, K, GROUPS, row_src, 1024, &kp, block_group), W4A16_ERR_INVALID_VALUE,
           "g_idx[3]=7");
}

/* A driver older than the build needs is reported with both versions, before anything else is tried. */
static void test_driver_too_old(void **state) {
    (void)state;
    setenv("W4A16_FAKE_DRIVER_VERSION", "12020", 1);
    size_t bytes = 0;
    EXPECT(w4a16_workspace_size(&bytes), W4A16_ERR_DRIVER_TOO_OLD,
           "supports CUDA 12.2 but this build of w4a16 needs CUDA 13.0");
    EXPECT(w4a16_awq_gemm(bufA, W, bufS, Z, NULL, bufC, 1, 64, 128, 128, W4A16_FP16, NULL, 0, NULL),
           W4A16_ERR_DRIVER_TOO_OLD, "driver >= 580");
    w4a16_device_info info;
    EXPECT(w4a16_get_device_info(0, &info), W4A16_ERR_DRIVER_TOO_OLD, "CUDA 12.2");
    assert_int_equal(info.driver_version, 12020);
    unsetenv("W4A16_FAKE_DRIVER_VERSION");
}

/* Without a GPU every valid call says so; with one, test_gpu covers the device paths. */
static void test_no_device_is_reported(void **state) {
    (void)state;
    w4a16_device_info info;
    w4a16_status s = w4a16_get_device_info(0, &info);
    if (s == W4A16_OK && info.supported) skip();
    assert_true(s == W4A16_ERR_NO_DEVICE || s == W4A16_ERR_DRIVER_TOO_OLD || s == W4A16_OK);
    assert_true(strlen(w4a16_last_error_message()) > 10 || strlen(info.reason) > 10);
    size_t bytes = 0;
    assert_int_not_equal(w4a16_workspace_size(&bytes), W4A16_OK);
    assert_int_not_equal(w4a16_workspace_size_staged(4096, 4096, &bytes), W4A16_OK);
    printf("  no usable GPU here: %s\n", w4a16_last_error_message());
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_compiled_archs),
        cmocka_unit_test(test_awq_gemm_validation),
        cmocka_unit_test(test_marlin_gemm_validation),
        cmocka_unit_test(test_converter_validation),
        cmocka_unit_test(test_introspection_validation),
        cmocka_unit_test(test_last_error_is_thread_local),
        cmocka_unit_test(test_act_order_sort),
        cmocka_unit_test(test_act_order_plan),
        cmocka_unit_test(test_driver_too_old),
        cmocka_unit_test(test_no_device_is_reported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
