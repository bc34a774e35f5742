/* Argument checks shared by the entry points. Each names the failed check with its values. */
#include "internal.h"
#include <stdint.h>

/* Largest tensor we accept, in elements: far above any real layer, and it keeps every byte offset and
 * every product of two dimensions well inside 64-bit arithmetic. */
#define W4A16_MAX_ELEMENTS (1LL << 40)
/* gridDim.y counts 64-column tiles at most 65535 times (the smallest tile is 64 wide). */
#define W4A16_MAX_N (65535LL * 64)

w4a16_status w4a16_check_ptr(const void *p, const char *name, unsigned align, int required) {
    if (!p) return required ? w4a16_fail(W4A16_ERR_NULL_POINTER, "%s is NULL", name) : W4A16_OK;
    if ((uintptr_t)p % align) return w4a16_fail(W4A16_ERR_MISALIGNED, "%s=%p is not %u-byte aligned", name, p, align);
    return W4A16_OK;
}

w4a16_status w4a16_check_dtype(int dtype) {
    if (dtype != W4A16_FP16 && dtype != W4A16_BF16)
        return w4a16_fail(W4A16_ERR_UNSUPPORTED_DTYPE, "dtype=%d is neither W4A16_FP16 (0) nor W4A16_BF16 (1)", dtype);
    return W4A16_OK;
}

w4a16_status w4a16_check_group(int K, int group_size, int *resolved) {
    if (group_size == -1 || (group_size == K && K > 0)) {
        *resolved = K;
        return W4A16_OK;
    }
    if (group_size != 32 && group_size != 64 && group_size != 128)
        return w4a16_fail(W4A16_ERR_UNSUPPORTED_GROUP_SIZE, "group_size=%d is not one of 32, 64, 128, -1", group_size);
    if (K % group_size)
        return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "K=%d is not a multiple of group_size=%d", K, group_size);
    *resolved = group_size;
    return W4A16_OK;
}

w4a16_status w4a16_check_size(const char *what, long long a, long long b) {
    if (a * b > W4A16_MAX_ELEMENTS)
        return w4a16_fail(W4A16_ERR_SIZE_OVERFLOW, "%s has %lld x %lld elements, more than 2^40", what, a, b);
    return W4A16_OK;
}

w4a16_status w4a16_check_gemm_shape(int M, int N, int K, int group_size, int k_multiple, int *resolved_group) {
    if (M < 1) return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "M=%d must be at least 1", M);
    if (N < 64 || N % 64) return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "N=%d must be a positive multiple of 64", N);
    if (K < k_multiple || K % k_multiple)
        return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "K=%d must be a positive multiple of %d", K, k_multiple);
    if (N > W4A16_MAX_N) return w4a16_fail(W4A16_ERR_SIZE_OVERFLOW, "N=%d is larger than %lld", N, W4A16_MAX_N);
    w4a16_status s;
    if ((s = w4a16_check_size("A[M,K]", M, K)) || (s = w4a16_check_size("C[M,N]", M, N)) ||
        (s = w4a16_check_size("W[K,N]", K, N)))
        return s;
    int g;
    return w4a16_check_group(K, group_size, resolved_group ? resolved_group : &g);
}

int w4a16_group_shift(int G) {
    if (G & (G - 1)) return 31;
    int s = 0;
    while ((1 << s) < G) s++;
    return s;
}

w4a16_status w4a16_check_convert(const void *in, const void *out, int K, int N, int k_multiple) {
    w4a16_status s;
    if ((s = w4a16_check_ptr(in, "input", 16, 1)) || (s = w4a16_check_ptr(out, "output", 16, 1))) return s;
    if (in == out) return w4a16_fail(W4A16_ERR_INVALID_VALUE, "input and output are the same buffer (%p)", in);
    return w4a16_check_gemm_shape(1, N, K, -1, k_multiple, NULL);
}
