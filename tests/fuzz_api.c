/* libFuzzer target (clang -fsanitize=fuzzer,address,undefined) for the host side: every entry point's argument
 * validation with arbitrary sizes, group sizes, dtypes, NULL and misaligned pointers, and the CPU packers and
 * converters with arbitrary nibbles. Runs with no visible GPU (CUDA_VISIBLE_DEVICES is cleared at start), so a call
 * that passes validation stops at W4A16_ERR_NO_DEVICE and nothing is ever launched on the fake pointers.
 * Checked: no crash or sanitizer report, every status is in the list, every failure has a message, and the
 * pack/unpack and Marlin repack/unpack round trips are the identity.
 *   make fuzz FUZZ_SECONDS=60      (CI runs it briefly; longer runs: raise FUZZ_SECONDS) */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ref/reference.h"
#include "w4a16.h"

static _Alignas(256) unsigned char arena[1 << 16];

static int known_status(w4a16_status s) {
    switch (s) {
#define W4A16_FUZZ_CASE_(name, value, text) case name:
        W4A16_STATUS_LIST(W4A16_FUZZ_CASE_)
#undef W4A16_FUZZ_CASE_
        return 1;
    }
    return 0;
}

static void check(w4a16_status s) {
    if (!known_status(s)) abort();
    if (s != W4A16_OK && w4a16_last_error_message()[0] == '\0') abort();
    if (s == W4A16_OK) abort(); /* no GPU is visible: nothing may succeed */
}

typedef struct {
    const uint8_t *p;
    size_t n;
} reader;

static uint32_t take(reader *r, int bytes) {
    uint32_t v = 0;
    for (int i = 0; i < bytes; i++) v = (v << 8) | (r->n ? (r->n--, *r->p++) : 0);
    return v;
}

static const void *ptr(reader *r) { /* NULL, aligned, or misaligned by 1..15 bytes */
    uint32_t m = take(r, 1);
    if (m < 16) return NULL;
    return arena + (m & 0x80 ? (m & 15) : 0) + 256;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    reader r = {data, size};
    int op = (int)(take(&r, 1) % 12);
    int M = (int)take(&r, 4), N = (int)take(&r, 4), K = (int)take(&r, 4), G = (int)take(&r, 4);
    int dt = (int)(take(&r, 1) % 4);
    size_t wsb = take(&r, 4);
    const void *a = ptr(&r), *b = ptr(&r), *c = ptr(&r), *d = ptr(&r), *e = ptr(&r), *f = ptr(&r), *ws = ptr(&r);
    switch (op) {
    case 0:
        check(w4a16_awq_gemm(a, b, c, d, e, (void *)f, M, N, K, G, (w4a16_dtype)dt, (void *)ws, wsb, NULL));
        break;
    case 1:
        check(w4a16_marlin_gemm(a, b, c, d, e, (void *)f, M, N, K, G, (w4a16_dtype)dt, (void *)ws, wsb, NULL));
        break;
    case 2:
        check(w4a16_awq_dequantize(b, c, d, (void *)f, K, N, G, (w4a16_dtype)dt, NULL));
        break;
    case 3:
        check(w4a16_marlin_repack_awq(b, (int32_t *)f, K, N, NULL));
        break;
    case 4:
        check(w4a16_marlin_repack_gptq(b, d, (int32_t *)f, K, N, NULL));
        break;
    case 5:
        check(w4a16_marlin_permute_scales(c, (void *)f, K, N, G, (w4a16_dtype)dt, NULL));
        break;
    case 6:
        check(w4a16_marlin_awq_zero_points(d, (int32_t *)f, K, N, G, NULL));
        break;
    case 8:
    case 9:
    case 10:
    case 11: { /* mixture of experts: routing, grouped GEMMs, stacked converters */
        int top_k = (int)take(&r, 2) - 8, E = (int)take(&r, 2) - 8, bs = (int)take(&r, 2) - 8;
        int cap = (int)take(&r, 4), bcap = (int)take(&r, 4);
        if (op == 8)
            check(w4a16_moe_marlin_gemm(a, b, c, d, e, (const float *)ws, (void *)f, b, d, e, cap, bcap, bs, M, top_k,
                                        E, N, K, G, (w4a16_dtype)dt, (void *)ws, wsb, NULL));
        else if (op == 9)
            check(w4a16_moe_awq_gemm(a, b, c, d, e, (const float *)ws, (void *)f, b, d, e, cap, bcap, bs, M, top_k, E,
                                     N, K, G, (w4a16_dtype)dt, (void *)ws, wsb, NULL));
        else if (op == 10)
            check(w4a16_moe_align_block_size(b, M, top_k, E, bs, (int32_t *)f, cap, (int32_t *)(void *)ws, bcap,
                                             (int32_t *)(void *)ws, NULL));
        else {
            int sc = -1, bc = -1;
            w4a16_status s = w4a16_moe_align_sizes(M, top_k, E, bs, (G & 4) ? NULL : &sc, &bc);
            if (!known_status(s) || (s != W4A16_OK && w4a16_last_error_message()[0] == '\0')) abort();
            if (s == W4A16_OK && (sc < bs || sc % bs || bc != sc / bs || sc < M * top_k)) abort();
            switch (G & 3) {
            case 0:
                check(w4a16_moe_marlin_repack_awq(b, (int32_t *)f, E, K, N, NULL));
                break;
            case 1:
                check(w4a16_moe_marlin_repack_gptq(b, d, (int32_t *)f, E, K, N, NULL));
                break;
            case 2:
                check(w4a16_moe_marlin_permute_scales(c, (void *)f, E, K, N, M, (w4a16_dtype)dt, NULL));
                break;
            default:
                check(w4a16_moe_marlin_awq_zero_points(d, (int32_t *)f, E, K, N, M, NULL));
                break;
            }
        }
        break;
    }
    default: { /* CPU packers: small shapes from the input, nibbles from the rest of it */
        int k = 16 * (1 + (int)(K & 3)), n = 64 * (1 + (int)(N & 1));
        uint8_t q[128 * 64], back[128 * 64];
        int32_t p1[128 * 64 / 8], p2[128 * 64 / 8];
        for (int i = 0; i < k * n; i++) q[i] = (uint8_t)((i < (int)r.n ? r.p[i] : (uint8_t)(i * 7)) & 0xF);
        w4a16_ref_awq_pack(q, k, n, p1);
        w4a16_ref_awq_unpack(p1, k, n, back);
        if (memcmp(q, back, (size_t)k * n)) abort();
        w4a16_ref_marlin_repack_awq(p1, k, n, p2);
        w4a16_ref_marlin_unpack(p2, k, n, back);
        if (memcmp(q, back, (size_t)k * n)) abort();
        w4a16_ref_gptq_pack(q, k, n, p1);
        w4a16_ref_marlin_repack_gptq(p1, NULL, k, n, p2);
        w4a16_ref_marlin_unpack(p2, k, n, back);
        if (memcmp(q, back, (size_t)k * n)) abort();
    }
    }
    return 0;
}
