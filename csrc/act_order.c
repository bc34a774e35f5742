/* Act-order (desc_act) GPTQ on the host: the row permutation that sorts g_idx, checked to give whole groups. */
#include "internal.h"
#include <stdlib.h>

/* Rows per group of g_idx, in a new array of groups + 1 ints (counts[g]; the extra slot is for the callers' prefix
 * sums), or NULL with the failure recorded: out of memory, or a g_idx entry outside [0, groups) (`bound` names the
 * limit in the message). */
static int *count_groups(const int32_t *g_idx, int K, int groups, const char *bound, w4a16_status *status) {
    int *counts = calloc((size_t)groups + 1, sizeof(int));
    if (!counts) {
        *status = w4a16_fail(W4A16_ERR_INTERNAL, "out of host memory for %d groups", groups);
        return NULL;
    }
    for (int k = 0; k < K; k++) {
        if (g_idx[k] < 0 || g_idx[k] >= groups) {
            *status =
                w4a16_fail(W4A16_ERR_INVALID_VALUE, "g_idx[%d]=%d is outside [0, %s=%d)", k, g_idx[k], bound, groups);
            free(counts);
            return NULL;
        }
        counts[g_idx[k]]++;
    }
    return counts;
}

w4a16_status w4a16_act_order_sort(const int32_t *g_idx, int K, int group_size, int32_t *perm, int32_t *sorted_g_idx) {
    w4a16_clear_error();
    w4a16_status s;
    int G;
    if ((s = w4a16_check_ptr(g_idx, "g_idx", 4, 1)) || (s = w4a16_check_ptr(perm, "perm", 4, 1))) return s;
    if (K < 1) return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "K=%d must be at least 1", K);
    if ((s = w4a16_check_group(K, group_size, &G))) return s;
    const int groups = K / G;
    /* counting sort: stable, O(K) */
    int *start = count_groups(g_idx, K, groups, "K/G", &s); /* counts, then each group's next slot */
    if (!start) return s;
    for (int g = 0, first = 0; g < groups; g++) {
        if (start[g] != G) {
            int n = start[g];
            free(start);
            return w4a16_fail(W4A16_ERR_NOT_IMPLEMENTED,
                              "group %d holds %d rows, not group_size=%d: groups are cut (a K shard, is_k_full=false): "
                              "use w4a16_act_order_plan",
                              g, n, G);
        }
        start[g] = first;
        first += G;
    }
    for (int k = 0; k < K; k++) perm[start[g_idx[k]]++] = k;
    if (sorted_g_idx)
        for (int k = 0; k < K; k++) sorted_g_idx[k] = k / G;
    free(start);
    return W4A16_OK;
}

w4a16_status w4a16_act_order_plan(const int32_t *g_idx, int K, int groups, int32_t *row_src, int capacity,
                                  int *K_padded, int32_t *block_group) {
    w4a16_clear_error();
    w4a16_status s;
    if ((s = w4a16_check_ptr(g_idx, "g_idx", 4, 1)) || (s = w4a16_check_ptr(K_padded, "K_padded", 4, 1)) ||
        (s = w4a16_check_ptr(row_src, "row_src", 4, 0)) || (s = w4a16_check_ptr(block_group, "block_group", 4, 0)))
        return s;
    if (K < 1 || groups < 1 || K > (1 << 28) || groups > (1 << 28))
        return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "K=%d and groups=%d must be in [1, 2^28]", K, groups);
    int *start = count_groups(g_idx, K, groups, "groups", &s); /* first counts, then each group's next slot */
    if (!start) return s;
    long long pos = 0;
    for (int g = 0; g < groups; g++) { /* counts -> start of each group's run, runs padded to 32 rows */
        int run = (start[g] + 31) / 32 * 32;
        if (block_group && row_src)
            for (long long b = pos / 32; b < (pos + run) / 32; b++) block_group[b] = g;
        start[g] = (int)pos;
        pos += run;
    }
    long long kp = (pos + 127) / 128 * 128; /* the Marlin GEMM wants K % 128 == 0 */
    *K_padded = (int)kp;
    if (row_src && capacity < kp) {
        free(start);
        return w4a16_fail(W4A16_ERR_INVALID_VALUE, "capacity=%d is less than K_padded=%lld", capacity, kp);
    }
    if (row_src) {
        if (block_group)
            for (long long b = pos / 32; b < kp / 32; b++) block_group[b] = groups - 1; /* tail: empty rows */
        for (long long i = 0; i < kp; i++) row_src[i] = -1;
        for (int k = 0; k < K; k++) row_src[start[g_idx[k]]++] = k; /* stable within a group */
    }
    free(start);
    return W4A16_OK;
}
