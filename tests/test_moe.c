/* Mixture-of-experts tests: argument checks of every MoE entry point (CPU, always run), then on a GPU the routing
 * against its CPU checker and both grouped GEMMs (AWQ layout; Marlin layout from AWQ and from symmetric GPTQ) against
 * a per-expert dense reference in double, over token counts, expert counts, top-k, group sizes, block sizes, both
 * dtypes, skewed routings (one expert for all, empty experts, duplicated choices, dropped pairs) and the forced sm120
 * profile; K split across blocks through the workspace at decode sizes (left zeroed, deterministic, small workspaces
 * refused); the stacked converters bit for bit against the per-expert ones; graph capture. Fresh random inputs every
 * run (the seed is printed); outputs are poisoned with NaN before each launch, every routed row must be written and
 * every dropped row left alone. Without a usable GPU the GPU tests are skipped, saying why. */
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

#include "gpu_util.h"
#include "ref/moe_ref.h"

static uint64_t seed;
static char skip_reason[512];
static int have_gpu;
static int quick; /* W4A16_TEST_QUICK=1 (make sanitize): small token counts only */

#define REQUIRE_GPU() GPU_TEST_REQUIRE(have_gpu, skip_reason)

/* ---------------------------------------------------------------- argument checks (no GPU needed)
 * The "device" buffers are host arrays with a pattern that must survive: no call here passes validation. */
enum { BUF = 4096 };
static _Alignas(256) unsigned char bA[BUF], bW[BUF], bS[BUF], bZ[BUF], bC[BUF], bR[BUF], bE[BUF], bP[BUF];
static unsigned char *const bufs[] = {bA, bW, bS, bZ, bC, bR, bE, bP};

static void poison_bufs(void) {
    for (int i = 0; i < 8; i++) memset(bufs[i], 0xA5, BUF);
}
static void assert_bufs_untouched(void) {
    for (int b = 0; b < 8; b++)
        for (int i = 0; i < BUF; i++) assert_int_equal(bufs[b][i], 0xA5);
}

#define EXPECT(call, status, fragment)                                                                                 \
    do {                                                                                                               \
        poison_bufs();                                                                                                 \
        w4a16_status s_ = (call);                                                                                      \
        if (s_ != (status) || !strstr(w4a16_last_error_message(), (fragment)))                                         \
            fail_msg("%s\n  returned %d (%s) '%s', expected %d with '%s'", #call, s_, w4a16_status_string(s_),         \
                     w4a16_last_error_message(), (int)(status), (fragment));                                           \
        assert_bufs_untouched();                                                                                       \
    } while (0)

#define I32(b) ((int32_t *)(b))
/* a valid call's arguments, with one changed at a time */
#define MGEMM(A_, W_, S_, Z_, B_, TW_, C_, SI_, EI_, NP_, SC_, BC_, BS_, M_, TK_, E_, N_, K_, G_, DT_)                 \
    w4a16_moe_marlin_gemm(A_, W_, S_, Z_, B_, TW_, C_, SI_, EI_, NP_, SC_, BC_, BS_, M_, TK_, E_, N_, K_, G_, DT_,     \
                          NULL, 0, NULL)
#define OK_M(...) MGEMM(__VA_ARGS__)

static void test_cpu_align_sizes(void **state) {
    (void)state;
    int sc = -1, bc = -1;
    assert_int_equal(w4a16_moe_align_sizes(1, 8, 128, 16, &sc, &bc), W4A16_OK);
    assert_int_equal(sc, 8 + 8 * 15); /* 8 pairs on at most 8 experts, each padded to 16 */
    assert_int_equal(bc, sc / 16);
    assert_int_equal(w4a16_moe_align_sizes(100, 2, 8, 64, &sc, &bc), W4A16_OK);
    assert_int_equal(sc, (200 + 8 * 63) / 64 * 64);
    assert_int_equal(bc, sc / 64);
    /* vLLM's buffers (numel + E (block_size - 1) entries, cdiv of that blocks) are always large enough */
    for (int T = 1; T <= 300; T += 13)
        for (int b = 8; b <= 64; b += 8) {
            assert_int_equal(w4a16_moe_align_sizes(T, 2, 4, b, &sc, &bc), W4A16_OK);
            assert_true(sc <= 2 * T + 4 * (b - 1));
            assert_true(bc <= (2 * T + 4 * (b - 1) + b - 1) / b);
        }
    int sc0 = 7;
    EXPECT(w4a16_moe_align_sizes(1, 8, 128, 16, NULL, &bc), W4A16_ERR_NULL_POINTER, "sorted_capacity");
    EXPECT(w4a16_moe_align_sizes(1, 8, 128, 16, &sc0, NULL), W4A16_ERR_NULL_POINTER, "blocks_capacity");
    EXPECT(w4a16_moe_align_sizes(0, 8, 128, 16, &sc0, &bc), W4A16_ERR_INVALID_SHAPE, "num_tokens=0");
    EXPECT(w4a16_moe_align_sizes(1, 0, 128, 16, &sc0, &bc), W4A16_ERR_INVALID_SHAPE, "top_k=0");
    EXPECT(w4a16_moe_align_sizes(1, 8, 0, 16, &sc0, &bc), W4A16_ERR_INVALID_SHAPE, "num_experts=0");
    EXPECT(w4a16_moe_align_sizes(1, 8, 4096, 16, &sc0, &bc), W4A16_ERR_INVALID_SHAPE, "num_experts=4096");
    EXPECT(w4a16_moe_align_sizes(1, 8, 128, 0, &sc0, &bc), W4A16_ERR_INVALID_SHAPE, "block_size=0");
    EXPECT(w4a16_moe_align_sizes(1, 8, 128, 2048, &sc0, &bc), W4A16_ERR_INVALID_SHAPE, "block_size=2048");
    EXPECT(w4a16_moe_align_sizes(1 << 28, 10, 128, 16, &sc0, &bc), W4A16_ERR_SIZE_OVERFLOW, "int32");
    assert_int_equal(sc0, 7); /* nothing written on failure */
}

static void test_cpu_align_checks(void **state) {
    (void)state;
    int sc, bc;
    assert_int_equal(w4a16_moe_align_sizes(4, 2, 8, 16, &sc, &bc), W4A16_OK);
    EXPECT(w4a16_moe_align_block_size(NULL, 4, 2, 8, 16, I32(bR), sc, I32(bE), bc, I32(bP), NULL),
           W4A16_ERR_NULL_POINTER, "topk_ids");
    EXPECT(w4a16_moe_align_block_size(I32(bA), 4, 2, 8, 16, NULL, sc, I32(bE), bc, I32(bP), NULL),
           W4A16_ERR_NULL_POINTER, "sorted_ids");
    EXPECT(w4a16_moe_align_block_size(I32(bA), 4, 2, 8, 16, I32(bR), sc, NULL, bc, I32(bP), NULL),
           W4A16_ERR_NULL_POINTER, "expert_ids");
    EXPECT(w4a16_moe_align_block_size(I32(bA), 4, 2, 8, 16, I32(bR), sc, I32(bE), bc, NULL, NULL),
           W4A16_ERR_NULL_POINTER, "num_tokens_post_padded");
    EXPECT(w4a16_moe_align_block_size((const int32_t *)(bA + 2), 4, 2, 8, 16, I32(bR), sc, I32(bE), bc, I32(bP), NULL),
           W4A16_ERR_MISALIGNED, "topk_ids");
    EXPECT(w4a16_moe_align_block_size(I32(bA), 4, 2, 8, 16, I32(bR + 1), sc, I32(bE), bc, I32(bP), NULL),
           W4A16_ERR_MISALIGNED, "sorted_ids");
    EXPECT(w4a16_moe_align_block_size(I32(bA), 0, 2, 8, 16, I32(bR), sc, I32(bE), bc, I32(bP), NULL),
           W4A16_ERR_INVALID_SHAPE, "num_tokens=0");
    EXPECT(w4a16_moe_align_block_size(I32(bA), 4, 2, 5000, 16, I32(bR), sc, I32(bE), bc, I32(bP), NULL),
           W4A16_ERR_INVALID_SHAPE, "num_experts=5000");
    EXPECT(w4a16_moe_align_block_size(I32(bA), 4, 2, 8, 16, I32(bR), sc - 1, I32(bE), bc, I32(bP), NULL),
           W4A16_ERR_INVALID_SHAPE, "sorted_capacity");
    EXPECT(w4a16_moe_align_block_size(I32(bA), 4, 2, 8, 16, I32(bR), sc, I32(bE), bc - 1, I32(bP), NULL),
           W4A16_ERR_INVALID_SHAPE, "blocks_capacity");
    EXPECT(w4a16_moe_align_block_size(I32(bA), 4, 2, 8, 16, I32(bR), 2147483647, I32(bE), bc, I32(bP), NULL),
           W4A16_ERR_SIZE_OVERFLOW, "sorted_capacity=2147483647");
}

static void test_cpu_gemm_checks(void **state) {
    (void)state;
    const void *A = bA, *S = bS, *B = bC;
    const int32_t *W = I32(bW), *Z = I32(bZ), *SI = I32(bR), *EI = I32(bE), *NP = I32(bP);
    const float *TW = (const float *)bP;
    void *C = bC;
    /* (M, top_k, E, N, K, G) = (4, 2, 8, 64, 128, 64), block 16, capacities 128 / 8 */
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 4, 2, 8, 64, 128, 64, 7),
           W4A16_ERR_UNSUPPORTED_DTYPE, "dtype=7");
    EXPECT(MGEMM(NULL, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 4, 2, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_NULL_POINTER, "A is NULL");
    EXPECT(MGEMM(A, NULL, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 4, 2, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_NULL_POINTER, "weight is NULL");
    EXPECT(MGEMM(A, W, NULL, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 4, 2, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_NULL_POINTER, "scales is NULL");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, NULL, SI, EI, NP, 128, 8, 16, 4, 2, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_NULL_POINTER, "C is NULL");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, NULL, EI, NP, 128, 8, 16, 4, 2, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_NULL_POINTER, "sorted_ids is NULL");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, SI, NULL, NP, 128, 8, 16, 4, 2, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_NULL_POINTER, "expert_ids is NULL");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, SI, EI, NULL, 128, 8, 16, 4, 2, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_NULL_POINTER, "num_tokens_post_padded is NULL");
    EXPECT(MGEMM((const char *)A + 8, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 4, 2, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_MISALIGNED, "A=");
    EXPECT(MGEMM(A, W, S, Z + 1, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 4, 2, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_MISALIGNED, "zeros=");
    EXPECT(MGEMM(A, W, S, Z, (const char *)B + 2, NULL, C, SI, EI, NP, 128, 8, 16, 4, 2, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_MISALIGNED, "bias=");
    EXPECT(MGEMM(A, W, S, Z, NULL, (const float *)((const char *)TW + 2), C, SI, EI, NP, 128, 8, 16, 4, 2, 8, 64, 128,
                 64, W4A16_FP16),
           W4A16_ERR_MISALIGNED, "topk_weights=");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, (char *)C + 4, SI, EI, NP, 128, 8, 16, 4, 2, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_MISALIGNED, "C=");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 0, 2, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_INVALID_SHAPE, "M=0");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 4, 0, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_INVALID_SHAPE, "top_k=0");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 4, 2, 0, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_INVALID_SHAPE, "num_experts=0");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 12, 4, 2, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_INVALID_SHAPE, "block_size=12");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 128, 4, 2, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_INVALID_SHAPE, "block_size=128");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 7, 16, 4, 2, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_INVALID_SHAPE, "blocks_capacity=7");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 8, 8, 16, 4, 2, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_INVALID_SHAPE, "sorted_capacity=8");
    /* a grid counted in int from these capacities would overflow */
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 2147483647, 134217728, 16, 4, 2, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_SIZE_OVERFLOW, "sorted_capacity=2147483647");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 4, 2, 8, 96, 128, 64, W4A16_FP16),
           W4A16_ERR_INVALID_SHAPE, "N=96");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 4, 2, 8, 64, 96, 32, W4A16_FP16),
           W4A16_ERR_INVALID_SHAPE, "K=96");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 4, 2, 8, 64, 128, 48, W4A16_FP16),
           W4A16_ERR_UNSUPPORTED_GROUP_SIZE, "group_size=48");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 4, 2, 8, 64, 192, 128, W4A16_FP16),
           W4A16_ERR_INVALID_SHAPE, "not a multiple of group_size=128");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 1 << 30, 8, 8, 64, 128, 64, W4A16_FP16),
           W4A16_ERR_SIZE_OVERFLOW, "int32");
    EXPECT(MGEMM(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 4, 2, 1 << 20, 65536, 65536, 64, W4A16_FP16),
           W4A16_ERR_SIZE_OVERFLOW, "W[E,K,N]");
    /* the AWQ-layout GEMM needs its zero points */
    EXPECT(w4a16_moe_awq_gemm(A, W, S, NULL, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 4, 2, 8, 64, 128, 64, W4A16_FP16,
                              NULL, 0, NULL),
           W4A16_ERR_NULL_POINTER, "qzeros is NULL");
    EXPECT(
        w4a16_moe_awq_gemm(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 4, 2, 8, 64, 128, 64, 3, NULL, 0, NULL),
        W4A16_ERR_UNSUPPORTED_DTYPE, "dtype=3");
    /* the split-K workspace: NULL only with 0 bytes, 16-byte aligned (the size is checked against the device's) */
    EXPECT(w4a16_moe_marlin_gemm(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 4, 2, 8, 64, 128, 64, W4A16_FP16,
                                 NULL, 4096, NULL),
           W4A16_ERR_NULL_POINTER, "workspace is NULL");
    EXPECT(w4a16_moe_awq_gemm(A, W, S, Z, NULL, NULL, C, SI, EI, NP, 128, 8, 16, 4, 2, 8, 64, 128, 64, W4A16_FP16,
                              bR + 8, 4096, NULL),
           W4A16_ERR_MISALIGNED, "workspace=");
    size_t wsz = 1;
    EXPECT(w4a16_moe_workspace_size(NULL), W4A16_ERR_NULL_POINTER, "bytes is NULL");
    w4a16_status ws_s = w4a16_moe_workspace_size(&wsz); /* OK on a GPU machine, a device status without one */
    if (ws_s == W4A16_OK)
        assert_true(wsz > 0);
    else
        assert_int_equal(wsz, 1);
}

static void test_cpu_converter_checks(void **state) {
    (void)state;
    const int32_t *in = I32(bW);
    int32_t *out = I32(bC);
    EXPECT(w4a16_moe_marlin_repack_awq(NULL, out, 2, 128, 64, NULL), W4A16_ERR_NULL_POINTER, "input is NULL");
    EXPECT(w4a16_moe_marlin_repack_awq(in, NULL, 2, 128, 64, NULL), W4A16_ERR_NULL_POINTER, "output is NULL");
    EXPECT(w4a16_moe_marlin_repack_awq(in, (int32_t *)in, 2, 128, 64, NULL), W4A16_ERR_INVALID_VALUE, "same buffer");
    EXPECT(w4a16_moe_marlin_repack_awq(in, out, 0, 128, 64, NULL), W4A16_ERR_INVALID_SHAPE, "num_experts=0");
    EXPECT(w4a16_moe_marlin_repack_awq(in, out, 2, 120, 64, NULL), W4A16_ERR_INVALID_SHAPE, "K=120");
    EXPECT(w4a16_moe_marlin_repack_awq(in, out, 2, 128, 100, NULL), W4A16_ERR_INVALID_SHAPE, "N=100");
    EXPECT(w4a16_moe_marlin_repack_awq(in, out, 1 << 20, 1 << 14, 1 << 14, NULL), W4A16_ERR_SIZE_OVERFLOW, "W[E,K,N]");
    EXPECT(w4a16_moe_marlin_repack_gptq(in, (const int32_t *)(bS + 2), out, 2, 128, 64, NULL), W4A16_ERR_MISALIGNED,
           "perm=");
    EXPECT(w4a16_moe_marlin_repack_gptq((const int32_t *)(bW + 4), NULL, out, 2, 128, 64, NULL), W4A16_ERR_MISALIGNED,
           "input=");
    EXPECT(w4a16_moe_marlin_permute_scales(bS, bC, 2, 128, 64, 64, 2, NULL), W4A16_ERR_UNSUPPORTED_DTYPE, "dtype=2");
    EXPECT(w4a16_moe_marlin_permute_scales(bS, bC, 2, 128, 64, 96, W4A16_FP16, NULL), W4A16_ERR_UNSUPPORTED_GROUP_SIZE,
           "group_size=96");
    EXPECT(w4a16_moe_marlin_permute_scales(bS, bC, -1, 128, 64, 64, W4A16_FP16, NULL), W4A16_ERR_INVALID_SHAPE,
           "num_experts=-1");
    EXPECT(w4a16_moe_marlin_awq_zero_points(in, out, 2, 192, 64, 128, NULL), W4A16_ERR_INVALID_SHAPE,
           "not a multiple of group_size=128");
    EXPECT(w4a16_moe_marlin_awq_zero_points(in, out, 2, 128, 64, 256, NULL), W4A16_ERR_UNSUPPORTED_GROUP_SIZE,
           "group_size=256");
    EXPECT(w4a16_moe_marlin_awq_zero_points(in, NULL, 2, 128, 64, 64, NULL), W4A16_ERR_NULL_POINTER, "output");
}

/* The routing checker itself must fail on a wrong routing: a hand-made correct one passes, each corruption fails. */
static void test_cpu_routing_checker(void **state) {
    (void)state;
    /* 3 tokens x top-2 over 4 experts, block 4: expert 0 <- pairs 0, 3; expert 2 <- 1, 4, 5; expert 3 <- 2 */
    const int32_t ids[6] = {0, 2, 3, 0, 2, 2};
    int32_t sorted[16] = {3, 0, 6, 6, 5, 1, 4, 6, 2, 6, 6, 6, 6, 6, 6, 6};
    int32_t eids[4] = {0, 2, 3, -1};
    char msg[256];
    assert_int_equal(w4a16_ref_moe_check_routing(ids, 6, 4, 4, sorted, 16, eids, 4, 12, msg, sizeof msg), 0);
    sorted[4] = 3; /* pair 3 twice, pair 5 missing */
    assert_int_equal(w4a16_ref_moe_check_routing(ids, 6, 4, 4, sorted, 16, eids, 4, 12, msg, sizeof msg), -1);
    sorted[4] = 5;
    sorted[13] = 0; /* junk past the runs */
    assert_int_equal(w4a16_ref_moe_check_routing(ids, 6, 4, 4, sorted, 16, eids, 4, 12, msg, sizeof msg), -1);
    sorted[13] = 6;
    eids[1] = 1;
    assert_int_equal(w4a16_ref_moe_check_routing(ids, 6, 4, 4, sorted, 16, eids, 4, 12, msg, sizeof msg), -1);
    eids[1] = 2;
    assert_int_equal(w4a16_ref_moe_check_routing(ids, 6, 4, 4, sorted, 16, eids, 4, 16, msg, sizeof msg), -1);
    /* the per-expert reference: pair i reads A row i / top_k and its expert's weights */
    const float A[2] = {1.f, 2.f}, W[2] = {3.f, 5.f}, tw[4] = {1.f, 0.5f, 2.f, 1.f};
    const int32_t ids2[4] = {1, 0, -1, 1};
    double C[4] = {-7, -7, -7, -7};
    w4a16_ref_moe_gemm(A, W, NULL, tw, ids2, 2, 2, 2, 1, 1, C); /* E = 2, N = K = 1 */
    assert_true(C[0] == 5.0 && C[1] == 1.5 && C[2] == -7 && C[3] == 10.0);
}

/* ---------------------------------------------------------------- GPU: stacked experts */
enum { KIND_AWQ = 0, KIND_MARLIN_AWQ = 1, KIND_MARLIN_GPTQ = 2 };
static const char *kind_name[] = {"awq", "marlin(awq)", "marlin(gptq)"};

typedef struct experts {
    int E, K, N, G, groups, kind;
    w4a16_dtype dt;
    int32_t *qweight, *qzeros; /* device, as the GEMM reads them: AWQ layout, or Marlin */
    uint16_t *scales;
    float *dense; /* host [E, K, N]: the dequantised weights, rounded to dtype as the GPU does */
} experts;

/* Random stacked experts (scales around 0.01 keep |C| near 1), converted to the kind's layout with the stacked
 * converters. */
static void experts_make(experts *X, int E, int K, int N, int G, w4a16_dtype dt, int kind) {
    memset(X, 0, sizeof *X);
    X->E = E;
    X->K = K;
    X->N = N;
    X->G = G;
    X->dt = dt;
    X->kind = kind;
    X->groups = G == -1 ? 1 : K / G;
    const size_t nw = (size_t)E * K * N / 8, nz = (size_t)E * X->groups * N / 8, ns = (size_t)E * X->groups * N;
    uint32_t *hw = malloc(nw * 4), *hz = malloc(nz * 4);
    uint16_t *hs = malloc(ns * 2);
    fill_random_words(hw, nw, &seed);
    fill_random_words(hz, nz, &seed);
    fill_random_half(hs, ns, 0.005f, 0.015f, dt, &seed);
    X->dense = malloc((size_t)E * K * N * sizeof(float));
    uint8_t *q = malloc((size_t)K * N);
    const size_t ew = (size_t)K * N / 8, ez = (size_t)X->groups * N / 8, es = (size_t)X->groups * N;
    for (int e = 0; e < E; e++) {
        if (kind == KIND_MARLIN_GPTQ) {
            w4a16_ref_gptq_unpack((const int32_t *)hw + e * ew, K, N, q);
            w4a16_ref_dequantize_q(q, NULL, hs + e * es, K, N, G, dt, X->dense + (size_t)e * K * N);
        } else {
            w4a16_ref_awq_dequantize((const int32_t *)hw + e * ew, (const int32_t *)hz + e * ez, hs + e * es, K, N, G,
                                     dt, X->dense + (size_t)e * K * N);
        }
    }
    int32_t *dw = gpu_upload(hw, nw * 4), *dz = gpu_upload(hz, nz * 4);
    uint16_t *ds = gpu_upload(hs, ns * 2);
    if (kind == KIND_AWQ) {
        X->qweight = dw;
        X->qzeros = dz;
        X->scales = ds;
    } else {
        X->qweight = gpu_alloc(nw * 4);
        X->scales = gpu_alloc(ns * 2);
        if (kind == KIND_MARLIN_GPTQ) {
            W4_CHECK(w4a16_moe_marlin_repack_gptq(dw, NULL, X->qweight, E, K, N, NULL));
        } else {
            W4_CHECK(w4a16_moe_marlin_repack_awq(dw, X->qweight, E, K, N, NULL));
            X->qzeros = gpu_alloc(nz * 4);
            W4_CHECK(w4a16_moe_marlin_awq_zero_points(dz, X->qzeros, E, K, N, G, NULL));
        }
        W4_CHECK(w4a16_moe_marlin_permute_scales(ds, X->scales, E, K, N, G, dt, NULL));
        GPU_CHECK(cudaDeviceSynchronize());
        cudaFree(dw);
        cudaFree(dz);
        cudaFree(ds);
    }
    free(hw);
    free(hz);
    free(hs);
    free(q);
}

static void experts_free(experts *X) {
    cudaFree(X->qweight);
    cudaFree(X->qzeros);
    cudaFree(X->scales);
    free(X->dense);
    memset(X, 0, sizeof *X);
}

enum { IDS_DISTINCT, IDS_DUP, IDS_ONE, IDS_FEW, IDS_DROP };
static const char *ids_name[] = {"distinct", "duplicates", "one expert", "few experts", "dropped pairs"};

/* topk_ids [T, top_k]: distinct experts per token (a router's top-k), drawn with replacement (duplicates), all on one
 * expert, on 3 of E experts (the others empty), or distinct with about 1 in 7 pairs outside [0, E) (not this
 * rank's). */
static void make_ids(int32_t *ids, int T, int top_k, int E, int mode) {
    const int one = (int)(w4a16_ref_rand_u64(&seed) % E);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < top_k; k++) {
            int32_t *v = &ids[(size_t)t * top_k + k];
            if (mode == IDS_ONE) {
                *v = one;
                continue;
            }
            if (mode == IDS_FEW) {
                *v = (one + 5 * (int)(w4a16_ref_rand_u64(&seed) % 3)) % E;
                continue;
            }
            if (mode == IDS_DUP || top_k > E) {
                *v = (int)(w4a16_ref_rand_u64(&seed) % E);
                continue;
            }
            int again;
            do { /* distinct within the token */
                *v = (int)(w4a16_ref_rand_u64(&seed) % E);
                again = 0;
                for (int j = 0; j < k; j++) again |= ids[(size_t)t * top_k + j] == *v;
            } while (again);
            if (mode == IDS_DROP && w4a16_ref_rand_u64(&seed) % 7 == 0) *v = w4a16_ref_rand_u64(&seed) % 2 ? -1 : E + k;
        }
}

static double tolerance(w4a16_dtype dt) { return dt == W4A16_BF16 ? 1e-2 : 2e-3; }

/* The split-K workspace every GPU test shares (zeroed once, as the header asks), its size, and the bytes of its
 * counter part (csrc/moe.c's layout: a counter per tile for 8 blocks per SM, rounded up to 256 bytes). */
static void *g_ws;
static size_t g_ws_bytes, g_ws_counters;
/* Whether the calls pass the workspace (1) or NULL (0: never split). */
static int g_use_ws = 1;

/* Every call leaves the workspace's counters zeroed (the next call, or a graph replay, relies on it). */
static void assert_counters_zero(const char *label) {
    GPU_CHECK(cudaDeviceSynchronize());
    int32_t *h = malloc(g_ws_counters);
    GPU_CHECK(cudaMemcpy(h, g_ws, g_ws_counters, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < g_ws_counters / 4; i++)
        if (h[i]) fail_msg("%s: workspace counter %zu is %d after the call, not 0", label, i, h[i]);
    free(h);
}

/* Whether anything was written to the workspace's partial sums since they were zeroed (the K split ran). */
static int partials_written(void) {
    GPU_CHECK(cudaDeviceSynchronize());
    const size_t n = g_ws_bytes - g_ws_counters;
    unsigned char *h = malloc(n);
    GPU_CHECK(cudaMemcpy(h, (char *)g_ws + g_ws_counters, n, cudaMemcpyDeviceToHost));
    int any = 0;
    for (size_t i = 0; i < n && !any; i++) any = h[i] != 0;
    free(h);
    return any;
}

typedef struct routing {
    int32_t *sorted, *eids, *npp;
    int cap, bcap, bs;
} routing;

/* Routing on the GPU for ids (device d_ids), checked against the CPU checker. */
static void route(routing *R, const int32_t *ids, const int32_t *d_ids, int T, int top_k, int E, int bs,
                  const char *label) {
    R->bs = bs;
    W4_CHECK(w4a16_moe_align_sizes(T, top_k, E, bs, &R->cap, &R->bcap));
    R->sorted = gpu_alloc((size_t)R->cap * 4);
    R->eids = gpu_alloc((size_t)R->bcap * 4);
    R->npp = gpu_alloc(4);
    GPU_CHECK(cudaMemset(R->sorted, 0x7F, (size_t)R->cap * 4)); /* poison: every entry must be written */
    GPU_CHECK(cudaMemset(R->eids, 0x7F, (size_t)R->bcap * 4));
    GPU_CHECK(cudaMemset(R->npp, 0x7F, 4));
    W4_CHECK(w4a16_moe_align_block_size(d_ids, T, top_k, E, bs, R->sorted, R->cap, R->eids, R->bcap, R->npp, NULL));
    GPU_CHECK(cudaDeviceSynchronize());
    int32_t *hs = malloc((size_t)R->cap * 4), *he = malloc((size_t)R->bcap * 4), np;
    GPU_CHECK(cudaMemcpy(hs, R->sorted, (size_t)R->cap * 4, cudaMemcpyDeviceToHost));
    GPU_CHECK(cudaMemcpy(he, R->eids, (size_t)R->bcap * 4, cudaMemcpyDeviceToHost));
    GPU_CHECK(cudaMemcpy(&np, R->npp, 4, cudaMemcpyDeviceToHost));
    char msg[256];
    if (w4a16_ref_moe_check_routing(ids, T * top_k, E, bs, hs, R->cap, he, R->bcap, np, msg, sizeof msg))
        fail_msg("routing %s: %s", label, msg);
    free(hs);
    free(he);
}

static void routing_free(routing *R) {
    cudaFree(R->sorted);
    cudaFree(R->eids);
    cudaFree(R->npp);
}

typedef err_stats stats;

/* One grouped GEMM (first: A [T, K] with top_k; second: A [T top_k, K] with top_k 1 and topk_weights) against the
 * per-expert reference; rows of dropped pairs must keep their poison. */
static void check_gemm(const experts *X, const routing *R, const int32_t *ids, int T, int top_k, int second,
                       int with_bias, const char *label, stats *st) {
    const int K = X->K, N = X->N, E = X->E, rows = T * top_k;
    const int M = second ? rows : T, tk = second ? 1 : top_k;
    const w4a16_dtype dt = X->dt;
    const size_t nA = (size_t)M * K, nC = (size_t)rows * N;
    uint16_t *hA = malloc(nA * 2), *hC = malloc(nC * 2), *hb = malloc((size_t)E * N * 2);
    float *fA = malloc(nA * 4), *fb = malloc((size_t)E * N * 4), *tw = malloc((size_t)rows * 4);
    double *ref = malloc(nC * sizeof(double));
    fill_random_half(hA, nA, -1.f, 1.f, dt, &seed);
    fill_random_half(hb, (size_t)E * N, -1.f, 1.f, dt, &seed);
    for (size_t i = 0; i < nA; i++) fA[i] = w4a16_ref_to_float(hA[i], dt);
    for (size_t i = 0; i < (size_t)E * N; i++) fb[i] = w4a16_ref_to_float(hb[i], dt);
    for (int i = 0; i < rows; i++) tw[i] = w4a16_ref_rand_uniform(&seed, 0.f, 1.f);
    void *A = gpu_upload(hA, nA * 2), *bias = with_bias ? gpu_upload(hb, (size_t)E * N * 2) : NULL;
    float *dtw = second ? gpu_upload(tw, (size_t)rows * 4) : NULL;
    void *C = gpu_alloc(nC * 2);
    GPU_CHECK(cudaMemset(C, 0xFF, nC * 2)); /* NaN in fp16 and bf16 */
    w4a16_status s = X->kind == KIND_AWQ
                         ? w4a16_moe_awq_gemm(A, X->qweight, X->scales, X->qzeros, bias, dtw, C, R->sorted, R->eids,
                                              R->npp, R->cap, R->bcap, R->bs, M, tk, E, N, K, X->G, dt,
                                              g_use_ws ? g_ws : NULL, g_use_ws ? g_ws_bytes : 0, NULL)
                         : w4a16_moe_marlin_gemm(A, X->qweight, X->scales, X->qzeros, bias, dtw, C, R->sorted, R->eids,
                                                 R->npp, R->cap, R->bcap, R->bs, M, tk, E, N, K, X->G, dt,
                                                 g_use_ws ? g_ws : NULL, g_use_ws ? g_ws_bytes : 0, NULL);
    if (s != W4A16_OK) fail_msg("%s: %s: %s", label, w4a16_status_string(s), w4a16_last_error_message());
    GPU_CHECK(cudaDeviceSynchronize());
    GPU_CHECK(cudaMemcpy(hC, C, nC * 2, cudaMemcpyDeviceToHost));
    w4a16_ref_moe_gemm(fA, X->dense, with_bias ? fb : NULL, second ? tw : NULL, ids, M, tk, E, N, K, ref);
    double num = 0, den = 0;
    size_t unwritten = 0, overwritten = 0;
    for (int i = 0; i < rows; i++) {
        const int routed = ids[i] >= 0 && ids[i] < E;
        for (int n = 0; n < N; n++) {
            const uint16_t c = hC[(size_t)i * N + n];
            if (!routed) {
                overwritten += c != 0xFFFF;
                continue;
            }
            const float v = w4a16_ref_to_float(c, dt);
            if (isnan(v)) unwritten++;
            const double r = ref[(size_t)i * N + n];
            num += (v - r) * (v - r);
            den += r * r;
        }
    }
    const double err = unwritten ? INFINITY : den > 0 ? sqrt(num / den) : sqrt(num);
    char full[200];
    snprintf(full, sizeof full, "%s %s%s", label, second ? "second GEMM (topk_weights)" : "first GEMM",
             with_bias ? " +bias" : "");
    if (unwritten) fail_msg("%s: %zu outputs of routed rows not written (still NaN)", full, unwritten);
    if (overwritten) fail_msg("%s: %zu outputs of dropped rows were written", full, overwritten);
    if (!(err < tolerance(dt))) fail_msg("%s: relative error %.3e >= %.0e", full, err, tolerance(dt));
    if (g_use_ws) assert_counters_zero(full);
    err_stats_add(st, err, full);
    cudaFree(A);
    cudaFree(bias);
    cudaFree(dtw);
    cudaFree(C);
    free(hA);
    free(hC);
    free(hb);
    free(fA);
    free(fb);
    free(tw);
    free(ref);
}

/* Both grouped GEMMs on a fresh set of E experts: the first with bias when bias_first, the second otherwise. */
static void check_both_gemms(const routing *R, const int32_t *ids, int T, int top_k, int E, int K, int N, int G,
                             w4a16_dtype dt, int kind, int bias_first, const char *label, stats *st) {
    experts X;
    experts_make(&X, E, K, N, G, dt, kind);
    check_gemm(&X, R, ids, T, top_k, 0, bias_first, label, st);
    check_gemm(&X, R, ids, T, top_k, 1, !bias_first, label, st);
    experts_free(&X);
}

static const int group_list[] = {32, 64, 128, -1};
static const int block_list[] = {8, 16, 32, 48, 64};

/* Routing plus both GEMMs for one (T, E, top_k, K, N, ids mode) over the three weight kinds and both dtypes; the group
 * size and block size rotate with the combination (every value is reached over the case list). */
static void run_case(int T, int E, int top_k, int K, int N, int mode, int rot, stats *st) {
    int32_t *ids = malloc((size_t)T * top_k * 4);
    make_ids(ids, T, top_k, E, mode);
    int32_t *d_ids = gpu_upload(ids, (size_t)T * top_k * 4);
    for (int combo = 0; combo < 6; combo++) {
        const int kind = combo % 3;
        const w4a16_dtype dt = combo < 3 ? W4A16_FP16 : W4A16_BF16;
        int G = group_list[(rot + combo) % 4];
        if (G > 0 && K % G) G = -1;
        const int bs = block_list[(rot * 7 + combo) % 5];
        char label[160];
        snprintf(label, sizeof label, "T=%d E=%d top_k=%d K=%d N=%d %s %s %s G=%d block=%d", T, E, top_k, K, N,
                 ids_name[mode], kind_name[kind], dt == W4A16_BF16 ? "bf16" : "fp16", G, bs);
        routing R;
        route(&R, ids, d_ids, T, top_k, E, bs, label);
        check_both_gemms(&R, ids, T, top_k, E, K, N, G, dt, kind, combo % 2, label, st);
        routing_free(&R);
    }
    cudaFree(d_ids);
    free(ids);
}

typedef struct moe_case {
    int T, E, top_k, K, N, mode;
} moe_case;

/* Every T of {1, 2, 7, 16, 33, 64, 256, 1024, 4096}, E of {8, 64, 128, 512} and top_k of {1, 2, 8, 10} appears. */
static const moe_case cases[] = {
    {1, 8, 2, 256, 192, IDS_DISTINCT},     {2, 64, 8, 256, 128, IDS_DISTINCT}, {7, 128, 10, 128, 128, IDS_DUP},
    {16, 512, 10, 128, 128, IDS_DISTINCT}, {33, 8, 1, 192, 192, IDS_DISTINCT}, {64, 64, 2, 128, 256, IDS_ONE},
    {256, 128, 8, 128, 128, IDS_FEW},      {1024, 8, 2, 128, 128, IDS_DROP},   {4096, 64, 1, 128, 64, IDS_DISTINCT},
    {4096, 8, 10, 64, 64, IDS_DUP},
};

static void test_moe_cases(void **state) {
    (void)state;
    REQUIRE_GPU();
    stats st = {0};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const moe_case *m = &cases[c];
        if (quick && m->T > 64) continue;
        run_case(m->T, m->E, m->top_k, m->K, m->N, m->mode, (int)c, &st);
    }
    printf("  %d GEMMs, worst relative error %.2e (%s)\n", st.cases, st.worst, st.worst_case);
}

/* Every group size x block size on one shape, both dtypes, the three kinds. */
static void test_moe_groups_blocks(void **state) {
    (void)state;
    REQUIRE_GPU();
    stats st = {0};
    const int T = 33, E = 8, top_k = 2, K = 256, N = 128;
    int32_t *ids = malloc((size_t)T * top_k * 4);
    make_ids(ids, T, top_k, E, IDS_DISTINCT);
    int32_t *d_ids = gpu_upload(ids, (size_t)T * top_k * 4);
    for (int gi = 0; gi < 4; gi++)
        for (int bi = 0; bi < 5; bi++) {
            if (quick && bi % 2) continue;
            routing R;
            char label[160];
            snprintf(label, sizeof label, "G=%d block=%d", group_list[gi], block_list[bi]);
            route(&R, ids, d_ids, T, top_k, E, block_list[bi], label);
            for (int combo = 0; combo < 6; combo++) {
                const int kind = combo % 3;
                const w4a16_dtype dt = combo < 3 ? W4A16_FP16 : W4A16_BF16;
                snprintf(label, sizeof label, "T=%d E=%d top_k=%d K=%d N=%d %s %s G=%d block=%d", T, E, top_k, K, N,
                         kind_name[kind], dt == W4A16_BF16 ? "bf16" : "fp16", group_list[gi], block_list[bi]);
                experts X;
                experts_make(&X, E, K, N, group_list[gi], dt, kind);
                check_gemm(&X, &R, ids, T, top_k, combo % 2, combo % 3 == 0, label, &st);
                experts_free(&X);
            }
            routing_free(&R);
        }
    cudaFree(d_ids);
    free(ids);
    printf("  %d GEMMs, worst relative error %.2e (%s)\n", st.cases, st.worst, st.worst_case);
}

/* Decode-sized layers whose K is long enough to split across blocks (16-row tile: block sizes 8 and 16), every kind,
 * dtype and group size, against the reference; each call must have gone through the split (its partial sums reached
 * the workspace) and left the counters zeroed (checked in check_gemm). Then the same layer without a workspace (never
 * split) and under the forced sm120 profile; and a workspace one byte short: refused, nothing written. */
static const moe_case split_cases[] = {
    {1, 8, 2, 2048, 192, IDS_DISTINCT},
    {2, 16, 4, 1344, 128, IDS_DROP}, /* K = 10 x 128 + 64: a K tail */
    {4, 64, 8, 2048, 128, IDS_DISTINCT},
    {16, 64, 4, 1280, 128, IDS_DUP},
};

static void test_moe_split_k(void **state) {
    (void)state;
    REQUIRE_GPU();
    stats st = {0};
    for (size_t c = 0; c < sizeof split_cases / sizeof split_cases[0]; c++) {
        const moe_case *m = &split_cases[c];
        int32_t *ids = malloc((size_t)m->T * m->top_k * 4);
        make_ids(ids, m->T, m->top_k, m->E, m->mode);
        int32_t *d_ids = gpu_upload(ids, (size_t)m->T * m->top_k * 4);
        for (int combo = 0; combo < 6; combo++) {
            if (quick && combo % 3 != (int)c % 3) continue;
            const int kind = combo % 3, bs = combo % 2 ? 8 : 16;
            const w4a16_dtype dt = combo < 3 ? W4A16_FP16 : W4A16_BF16;
            int G = group_list[(c + combo) % 4];
            if (G > 0 && m->K % G) G = -1;
            char label[160];
            snprintf(label, sizeof label, "split K: T=%d E=%d top_k=%d K=%d N=%d %s %s %s G=%d block=%d", m->T, m->E,
                     m->top_k, m->K, m->N, ids_name[m->mode], kind_name[kind], dt == W4A16_BF16 ? "bf16" : "fp16", G,
                     bs);
            routing R;
            route(&R, ids, d_ids, m->T, m->top_k, m->E, bs, label);
            experts X;
            experts_make(&X, m->E, m->K, m->N, G, dt, kind);
            for (int second = 0; second < 2; second++) {
                GPU_CHECK(cudaMemset((char *)g_ws + g_ws_counters, 0, g_ws_bytes - g_ws_counters));
                check_gemm(&X, &R, ids, m->T, m->top_k, second, (combo + second) % 2, label, &st);
                if (!partials_written()) fail_msg("%s: the K split did not run (no partial sums)", label);
            }
            if (combo == 0) {
                g_use_ws = 0; /* no workspace: the same layer unsplit */
                check_gemm(&X, &R, ids, m->T, m->top_k, 1, 0, label, &st);
                g_use_ws = 1;
                assert_int_equal(w4a16_force_profile("sm120"), W4A16_OK);
                check_gemm(&X, &R, ids, m->T, m->top_k, 0, 1, label, &st);
                assert_int_equal(w4a16_force_profile(NULL), W4A16_OK);
                /* a workspace one byte short: the specific status, nothing launched */
                const size_t nC = (size_t)m->T * m->top_k * m->N * 2;
                void *A = gpu_alloc((size_t)m->T * m->K * 2), *C = gpu_alloc(nC);
                GPU_CHECK(cudaMemset(A, 0, (size_t)m->T * m->K * 2));
                GPU_CHECK(cudaMemset(C, 0xFF, nC));
                w4a16_status s = w4a16_moe_marlin_gemm(A, X.qweight, X.scales, X.qzeros, NULL, NULL, C, R.sorted,
                                                       R.eids, R.npp, R.cap, R.bcap, bs, m->T, m->top_k, m->E, m->N,
                                                       m->K, G, dt, g_ws, g_ws_bytes - 1, NULL);
                if (s != W4A16_ERR_WORKSPACE_TOO_SMALL ||
                    !strstr(w4a16_last_error_message(), "w4a16_moe_workspace_size"))
                    fail_msg("%s: a short workspace returned %d '%s'", label, s, w4a16_last_error_message());
                GPU_CHECK(cudaDeviceSynchronize());
                unsigned char *h = malloc(nC);
                GPU_CHECK(cudaMemcpy(h, C, nC, cudaMemcpyDeviceToHost));
                for (size_t i = 0; i < nC; i++)
                    if (h[i] != 0xFF) fail_msg("%s: a refused call wrote C", label);
                free(h);
                cudaFree(A);
                cudaFree(C);
            }
            experts_free(&X);
            routing_free(&R);
        }
        cudaFree(d_ids);
        free(ids);
    }
    printf("  %d GEMMs with K split across blocks, worst relative error %.2e (%s)\n", st.cases, st.worst,
           st.worst_case);
}

/* Under a forced profile, every MoE kernel (each tile, layout and dtype, split or not) must get the resident blocks
 * per SM its plan counts on: on a GPU with larger SMs than the profile's architecture, only the carveout that holds
 * each SM to the profile's shared memory keeps more blocks from running than on that architecture. And the 64-row
 * tile's plans keep at least two of its 4-warp blocks per SM. */
static void check_moe_occupancy(const char *profile) {
    int dev_smem_per_sm = 0;
    GPU_CHECK(cudaDeviceGetAttribute(&dev_smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
    const int blocks[] = {8, 16, 32, 64};
    int plans = 0, emulated = 0, held = 0;
    for (int b = 0; b < 4; b++)
        for (int marlin = 0; marlin < 2; marlin++)
            for (int d = 0; d < 2; d++)
                for (int ws = 0; ws < 2; ws++) {
                    /* decode-sized routing (splits K with a workspace) on the 16-row tiles, many blocks on others */
                    const int cap = blocks[b] <= 16 ? 4 * blocks[b] : 512 * blocks[b];
                    w4a16_gemm_plan_info pi;
                    W4_CHECK(w4a16_moe_gemm_plan(marlin, cap, blocks[b], 2048, 4096, 128, d ? W4A16_BF16 : W4A16_FP16,
                                                 ws ? g_ws_bytes : 0, &pi));
                    if (pi.occupancy < 1 || pi.occupancy != pi.blocks_per_sm)
                        fail_msg("profile %s, %s %s block %d%s: the GPU gives %d blocks per SM, the plan counts on %d "
                                 "(%s)",
                                 profile, marlin ? "Marlin" : "AWQ", d ? "bf16" : "fp16", blocks[b],
                                 ws ? " with a workspace" : "", pi.occupancy, pi.blocks_per_sm, pi.text);
                    if (ws && blocks[b] <= 16 && pi.splits < 2)
                        fail_msg("profile %s: the decode-sized call did not split K (%s)", profile, pi.text);
                    /* the 64-row tile has 4 warps: one block per SM leaves too few to hide latency (on 100 KB SMs
                     * it runs 2 stages so that two fit) */
                    if (blocks[b] == 64 && pi.blocks_per_sm < 2)
                        fail_msg("profile %s: the 64-row tile holds %d block per SM (%s)", profile, pi.blocks_per_sm,
                                 pi.text);
                    emulated += pi.carveout >= 0;
                    held += pi.occupancy == pi.smem_blocks_per_sm;
                    plans++;
                }
    printf("  profile %s: %d MoE plans, %d with a carveout, %d held by shared memory\n", profile, plans, emulated,
           held);
    /* sm_120 SMs have 100 KB: on a GPU with more, every MoE kernel runs held to them */
    if (strcmp(profile, "sm120") == 0 && dev_smem_per_sm > 100 * 1024) {
        assert_int_equal(emulated, plans);
        assert_int_equal(held, plans);
    }
}

/* The three tiles of 16-row routing blocks (the plan picks 16x64, 16x128 or 16x256 from the routing blocks against
 * the GPU's block slots): for each, the smallest T of a geometric series whose plan names it, then both GEMMs of that
 * layer, every kind and dtype, against the reference (the plan's resident blocks per SM checked against the GPU's).
 * In the native profile and the forced sm120 one; a tile may be missing only where the largest T (8192) does not
 * reach it either (16x256 on profiles where it holds fewer blocks per SM than 16x128). */
static void check_tiles16(const char *profile, stats *st) {
    const char *want[] = {"16x64 ", "16x128 ", "16x256 "};
    const int E = 64, top_k = 4, K = 256, N = 512, bs = 16;
    for (int w = 0; w < 3; w++) {
        int T = 1, found = 0;
        w4a16_gemm_plan_info pi;
        for (; T <= 8192; T = T < 8 ? T + 1 : T * 9 / 8) {
            int cap, bcap;
            W4_CHECK(w4a16_moe_align_sizes(T, top_k, E, bs, &cap, &bcap));
            W4_CHECK(w4a16_moe_gemm_plan(1, cap, bs, N, K, 128, W4A16_FP16, g_ws_bytes, &pi));
            if (strncmp(pi.text, want[w], strlen(want[w])) == 0) {
                found = 1;
                break;
            }
        }
        if (!found) {
            if (w == 2 && strncmp(pi.text, "16x128 ", 7) == 0) {
                printf("  profile %s: no 16x256 tile up to T = 8192 (%s)\n", profile, pi.text);
                continue;
            }
            fail_msg("profile %s: no T up to 8192 runs the %s tile (last plan: %s)", profile, want[w], pi.text);
        }
        if (pi.occupancy < 1 || pi.occupancy != pi.blocks_per_sm)
            fail_msg("profile %s, T=%d: the GPU gives %d blocks per SM, the plan counts on %d (%s)", profile, T,
                     pi.occupancy, pi.blocks_per_sm, pi.text);
        printf("  profile %s: T=%d: %s\n", profile, T, pi.text);
        int32_t *ids = malloc((size_t)T * top_k * 4);
        make_ids(ids, T, top_k, E, IDS_DISTINCT);
        int32_t *d_ids = gpu_upload(ids, (size_t)T * top_k * 4);
        char label[160];
        snprintf(label, sizeof label, "%s tile %s(T=%d E=%d top_k=%d K=%d N=%d)", profile, want[w], T, E, top_k, K, N);
        routing R;
        route(&R, ids, d_ids, T, top_k, E, bs, label);
        for (int combo = 0; combo < 6; combo++) {
            if (quick && combo % 3 != w) continue;
            const int kind = combo % 3, G = group_list[(w + combo) % 3]; /* 32, 64, 128 */
            const w4a16_dtype dt = combo < 3 ? W4A16_FP16 : W4A16_BF16;
            snprintf(label, sizeof label, "%s tile %s(T=%d) %s %s G=%d", profile, want[w], T, kind_name[kind],
                     dt == W4A16_BF16 ? "bf16" : "fp16", G);
            check_both_gemms(&R, ids, T, top_k, E, K, N, G, dt, kind, combo % 2, label, st);
        }
        routing_free(&R);
        cudaFree(d_ids);
        free(ids);
    }
}

static void test_moe_tiles16(void **state) {
    (void)state;
    REQUIRE_GPU();
    stats st = {0};
    check_tiles16("native", &st);
    assert_int_equal(w4a16_force_profile("sm120"), W4A16_OK);
    check_tiles16("sm120", &st);
    assert_int_equal(w4a16_force_profile(NULL), W4A16_OK);
    printf("  %d GEMMs on the 16-row tiles, worst relative error %.2e (%s)\n", st.cases, st.worst, st.worst_case);
}

/* The sm120 profile (RTX 5090 / RTX PRO 6000 / DGX Spark family) forced on this GPU. */
static void test_moe_forced_sm120(void **state) {
    (void)state;
    REQUIRE_GPU();
    check_moe_occupancy("native");
    w4a16_status s = w4a16_force_profile("sm120");
    if (s != W4A16_OK) fail_msg("forcing sm120: %s", w4a16_last_error_message());
    check_moe_occupancy("sm120");
    stats st = {0};
    g_use_ws = 0; /* this test also covers the calls without a workspace */
    run_case(7, 128, 10, 128, 128, IDS_DUP, 1, &st);
    run_case(64, 64, 2, 128, 256, IDS_ONE, 2, &st);
    if (!quick) run_case(256, 8, 2, 256, 128, IDS_DISTINCT, 3, &st);
    g_use_ws = 1;
    assert_int_equal(w4a16_force_profile(NULL), W4A16_OK);
    printf("  sm120 profile: %d GEMMs, worst relative error %.2e (%s)\n", st.cases, st.worst, st.worst_case);
}

/* Stacked converters against the per-expert ones on each slice, bit for bit. */
static void test_moe_converters_bit_exact(void **state) {
    (void)state;
    REQUIRE_GPU();
    const int E = 5, K = 256, N = 192;
    const size_t ew = (size_t)K * N / 8;
    uint32_t *hw = malloc(E * ew * 4);
    uint16_t *hs = malloc((size_t)E * K * N * 2); /* enough for G = 32 scales */
    int32_t *hperm = malloc((size_t)E * K * 4);
    fill_random_words(hw, E * ew, &seed);
    fill_random_half(hs, (size_t)E * (K / 32) * N, 0.005f, 0.015f, W4A16_FP16, &seed);
    for (int e = 0; e < E; e++) { /* a random permutation per expert (Fisher-Yates) */
        int32_t *p = hperm + (size_t)e * K;
        for (int k = 0; k < K; k++) p[k] = k;
        for (int k = K - 1; k > 0; k--) {
            const int j = (int)(w4a16_ref_rand_u64(&seed) % (uint64_t)(k + 1));
            const int32_t t = p[k];
            p[k] = p[j];
            p[j] = t;
        }
    }
    int32_t *in = gpu_upload(hw, E * ew * 4), *perm = gpu_upload(hperm, (size_t)E * K * 4);
    uint16_t *sin = gpu_upload(hs, (size_t)E * (K / 32) * N * 2);
    int32_t *a = gpu_alloc(E * ew * 4), *b = gpu_alloc(E * ew * 4);
    uint32_t *ha = malloc(E * ew * 4), *hb = malloc(E * ew * 4);
#define COMPARE(bytes, what)                                                                                           \
    do {                                                                                                               \
        GPU_CHECK(cudaDeviceSynchronize());                                                                            \
        GPU_CHECK(cudaMemcpy(ha, a, (bytes), cudaMemcpyDeviceToHost));                                                 \
        GPU_CHECK(cudaMemcpy(hb, b, (bytes), cudaMemcpyDeviceToHost));                                                 \
        if (memcmp(ha, hb, (bytes))) fail_msg("%s: stacked and per-expert results differ", what);                      \
    } while (0)
    GPU_CHECK(cudaMemset(a, 0x11, E * ew * 4));
    GPU_CHECK(cudaMemset(b, 0x22, E * ew * 4));
    W4_CHECK(w4a16_moe_marlin_repack_awq(in, a, E, K, N, NULL));
    for (int e = 0; e < E; e++) W4_CHECK(w4a16_marlin_repack_awq(in + e * ew, b + e * ew, K, N, NULL));
    COMPARE(E * ew * 4, "repack awq");
    for (int with_perm = 0; with_perm < 2; with_perm++) {
        GPU_CHECK(cudaMemset(a, 0x11, E * ew * 4));
        GPU_CHECK(cudaMemset(b, 0x22, E * ew * 4));
        W4_CHECK(w4a16_moe_marlin_repack_gptq(in, with_perm ? perm : NULL, a, E, K, N, NULL));
        for (int e = 0; e < E; e++)
            W4_CHECK(
                w4a16_marlin_repack_gptq(in + e * ew, with_perm ? perm + (size_t)e * K : NULL, b + e * ew, K, N, NULL));
        COMPARE(E * ew * 4, with_perm ? "repack gptq (act-order perm)" : "repack gptq");
    }
    for (int gi = 0; gi < 4; gi++) {
        const int G = group_list[gi], groups = G == -1 ? 1 : K / G;
        const size_t sb = (size_t)groups * N * 2, zw = (size_t)groups * N / 8;
        GPU_CHECK(cudaMemset(a, 0x11, E * sb));
        GPU_CHECK(cudaMemset(b, 0x22, E * sb));
        W4_CHECK(w4a16_moe_marlin_permute_scales(sin, a, E, K, N, G, W4A16_FP16, NULL));
        for (int e = 0; e < E; e++)
            W4_CHECK(
                w4a16_marlin_permute_scales((const char *)sin + e * sb, (char *)b + e * sb, K, N, G, W4A16_FP16, NULL));
        COMPARE(E * sb, "permute scales");
        GPU_CHECK(cudaMemset(a, 0x11, E * zw * 4));
        GPU_CHECK(cudaMemset(b, 0x22, E * zw * 4));
        W4_CHECK(w4a16_moe_marlin_awq_zero_points(in, a, E, K, N, G, NULL));
        for (int e = 0; e < E; e++) W4_CHECK(w4a16_marlin_awq_zero_points(in + e * zw, b + e * zw, K, N, G, NULL));
        COMPARE(E * zw * 4, "zero points");
    }
#undef COMPARE
    printf("  repack awq, repack gptq (with and without perm), scales and zero points for every G: bit-identical\n");
    cudaFree(in);
    cudaFree(perm);
    cudaFree(sin);
    cudaFree(a);
    cudaFree(b);
    free(hw);
    free(hs);
    free(hperm);
    free(ha);
    free(hb);
}

/* Routing + both GEMMs captured in a CUDA graph on a non-default stream: replays give the eager result bit for bit. */
static void test_moe_graph_capture(void **state) {
    (void)state;
    REQUIRE_GPU();
    const int T = 16, E = 64, top_k = 8, K = 2048, N = 128, bs = 16; /* 136 tiles of 16 k-steps: K is split */
    experts X;
    experts_make(&X, E, K, N, 128, W4A16_FP16, KIND_MARLIN_AWQ);
    int32_t *ids = malloc((size_t)T * top_k * 4);
    make_ids(ids, T, top_k, E, IDS_DISTINCT);
    int32_t *d_ids = gpu_upload(ids, (size_t)T * top_k * 4);
    int cap, bcap;
    W4_CHECK(w4a16_moe_align_sizes(T, top_k, E, bs, &cap, &bcap));
    int32_t *sorted = gpu_alloc((size_t)cap * 4), *eids = gpu_alloc((size_t)bcap * 4), *npp = gpu_alloc(4);
    uint16_t *hA = malloc((size_t)T * K * 2);
    fill_random_half(hA, (size_t)T * K, -1.f, 1.f, W4A16_FP16, &seed);
    void *A = gpu_upload(hA, (size_t)T * K * 2);
    const size_t nC = (size_t)T * top_k * N;
    void *C = gpu_alloc(nC * 2), *C2 = gpu_alloc(nC * 2);
    cudaStream_t s;
    GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
#define FORWARD(out)                                                                                                   \
    do {                                                                                                               \
        W4_CHECK(w4a16_moe_align_block_size(d_ids, T, top_k, E, bs, sorted, cap, eids, bcap, npp, s));                 \
        W4_CHECK(w4a16_moe_marlin_gemm(A, X.qweight, X.scales, X.qzeros, NULL, NULL, out, sorted, eids, npp, cap,      \
                                       bcap, bs, T, top_k, E, N, K, 128, W4A16_FP16, g_ws, g_ws_bytes, s));            \
    } while (0)
    FORWARD(C);
    GPU_CHECK(cudaStreamSynchronize(s));
    uint16_t *h1 = malloc(nC * 2), *h2 = malloc(nC * 2);
    GPU_CHECK(cudaMemcpy(h1, C, nC * 2, cudaMemcpyDeviceToHost));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    GPU_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    FORWARD(C2);
    GPU_CHECK(cudaStreamEndCapture(s, &graph));
    GPU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 3; rep++) {
        GPU_CHECK(cudaMemsetAsync(C2, 0xFF, nC * 2, s));
        GPU_CHECK(cudaMemsetAsync(sorted, 0x7F, (size_t)cap * 4, s));
        GPU_CHECK(cudaGraphLaunch(exec, s));
        GPU_CHECK(cudaStreamSynchronize(s));
        GPU_CHECK(cudaMemcpy(h2, C2, nC * 2, cudaMemcpyDeviceToHost));
        assert_memory_equal(h1, h2, nC * 2);
        assert_counters_zero("graph replay");
    }
#undef FORWARD
    printf("  3 graph replays of routing + grouped GEMM: bit-identical to the eager launch\n");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
    cudaFree(d_ids);
    cudaFree(sorted);
    cudaFree(eids);
    cudaFree(npp);
    cudaFree(A);
    cudaFree(C);
    cudaFree(C2);
    free(ids);
    free(hA);
    free(h1);
    free(h2);
    experts_free(&X);
}

/* The launch order: channel tiles in gridDim.x and the routing blocks in y (the live blocks, which come first in the
 * routing buffers, launch first) for every layout and block size, while the routing blocks fit gridDim.y (65535);
 * beyond, the routing blocks in x. Then a GEMM that needs the second order (block size 8, 65543 routing blocks),
 * against the reference. */
static void test_moe_grid_order(void **state) {
    (void)state;
    REQUIRE_GPU();
    const int N = 512, K = 256;
    for (int marlin = 0; marlin < 2; marlin++)
        for (int b = 0; b < 5; b++) {
            const int bs = block_list[b];
            for (int big = 0; big < 2; big++) {
                const int blocks = big ? 65536 : 4096, cap = blocks * bs;
                w4a16_gemm_plan_info pi;
                W4_CHECK(w4a16_moe_gemm_plan(marlin, cap, bs, N, K, 128, W4A16_FP16, g_ws_bytes, &pi));
                const int routing_dim = big ? 0 : 1, channel_dim = !routing_dim;
                if (pi.grid[routing_dim] != blocks || pi.grid[channel_dim] * 64 > N || pi.grid[channel_dim] < 1)
                    fail_msg("%s block %d, %d routing blocks: grid %dx%dx%d, routing blocks expected in %s (%s)",
                             marlin ? "Marlin" : "AWQ", bs, blocks, pi.grid[0], pi.grid[1], pi.grid[2], big ? "x" : "y",
                             pi.text);
            }
        }
    if (quick) return; /* 4 M rows of reference */
    const int T = 65536, E = 8, top_k = 8, bs = 8;
    int32_t *ids = malloc((size_t)T * top_k * 4);
    make_ids(ids, T, top_k, E, IDS_DISTINCT);
    int32_t *d_ids = gpu_upload(ids, (size_t)T * top_k * 4);
    char label[160];
    snprintf(label, sizeof label, "T=%d E=%d top_k=%d K=64 N=64 marlin(awq) fp16 G=64 block=%d", T, E, top_k, bs);
    routing R;
    route(&R, ids, d_ids, T, top_k, E, bs, label);
    assert_true(R.bcap > 65535);
    experts X;
    experts_make(&X, E, 64, 64, 64, W4A16_FP16, 1);
    stats st = {0};
    check_gemm(&X, &R, ids, T, top_k, 0, 1, label, &st);
    printf("  %s: %d routing blocks, relative error %.2e\n", label, R.bcap, st.worst);
    experts_free(&X);
    routing_free(&R);
    cudaFree(d_ids);
    free(ids);
}

static int setup(void **state) {
    (void)state;
    w4a16_device_info info;
    if (!gpu_suite_device("test_moe", (unsigned long long)seed, &info, skip_reason, sizeof skip_reason)) return 0;
    int sms = 0;
    GPU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    W4_CHECK(w4a16_moe_workspace_size(&g_ws_bytes));
    g_ws_counters = ((size_t)sms * 8 * 4 + 255) & ~(size_t)255;
    assert_true(g_ws_bytes > g_ws_counters);
    g_ws = gpu_alloc(g_ws_bytes);
    GPU_CHECK(cudaMemset(g_ws, 0, g_ws_bytes));
    have_gpu = 1;
    return 0;
}

int main(void) {
    seed = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull + (uint64_t)clock();
    quick = getenv("W4A16_TEST_QUICK") && atoi(getenv("W4A16_TEST_QUICK"));
    if (getenv("W4A16_TEST_FILTER")) cmocka_set_test_filter(getenv("W4A16_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_align_sizes),     cmocka_unit_test(test_cpu_align_checks),
        cmocka_unit_test(test_cpu_gemm_checks),     cmocka_unit_test(test_cpu_converter_checks),
        cmocka_unit_test(test_cpu_routing_checker), cmocka_unit_test(test_moe_converters_bit_exact),
        cmocka_unit_test(test_moe_cases),           cmocka_unit_test(test_moe_groups_blocks),
        cmocka_unit_test(test_moe_split_k),         cmocka_unit_test(test_moe_forced_sm120),
        cmocka_unit_test(test_moe_graph_capture),   cmocka_unit_test(test_moe_tiles16),
        cmocka_unit_test(test_moe_grid_order),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
