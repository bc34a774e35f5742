/* Act-order (desc_act) GPTQ on the host: the row permutation that sorts g_idx, checked to give whole groups. */
#include <stdlib.h>
#include "internal.h"

w4a16_status w4a16_act_order_sort(const int32_t *g_idx, int K, int group_size, int32_t *perm, int32_t *sorted_g_idx) {
    w4a16_clear_error();
    w4a16_status s;
    int G;
    if ((s = w4a16_check_ptr(g_idx, "g_idx", 4, 1)) || (s = w4a16_check_ptr(perm, "perm", 4, 1))) return s;
    if (K < 1) return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "K=%d must be at least 1", K);
    if ((s = w4a16_check_group(K, group_size, &G))) return s;
    const int groups = K / G;
    /* counting sort: stable, O(K) */
    int *start = calloc((size_t)groups + 1, sizeof(int));
    if (!start) return w4a16_fail(W4A16_ERR_INTERNAL, "out of host memory for %d groups", groups);
    for (int k = 0; k < K; k++) {
        if (g_idx[k] < 0 || g_idx[k] >= groups) {
            int bad = g_idx[k];
            free(start);
            return w4a16_fail(W4A16_ERR_INVALID_VALUE, "g_idx[%d]=%d is outside [0, K/G=%d)", k, bad, groups);
        }
        start[g_idx[k] + 1]++;
    }
    for (int g = 0; g < groups; g++) {
        if (start[g + 1] != G) {
            int n = start[g + 1];
            free(start);
            return w4a16_fail(W4A16_ERR_NOT_IMPLEMENTED,
                              "group %d holds %d rows, not group_size=%d: a K shard with cut groups (is_k_full=false) "
                              "is not supported yet", g, n, G);
        }
        start[g + 1] += start[g];
    }
    for (int k = 0; k < K; k++) perm[start[g_idx[k]]++] = k;
    if (sorted_g_idx)
        for (int k = 0; k < K; k++) sorted_g_idx[k] = k / G;
    free(start);
    return W4A16_OK;
}
