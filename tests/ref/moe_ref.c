/* CPU references of the mixture-of-experts operations (see moe_ref.h). */
#include "moe_ref.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int w4a16_ref_moe_check_routing(const int32_t *topk_ids, int n, int E, int bs, const int32_t *sorted, int sorted_cap,
                                const int32_t *expert_ids, int blocks_cap, int32_t npp, char *msg, size_t msg_len) {
    int *count = calloc((size_t)E, sizeof(int));
    unsigned char *seen = calloc((size_t)n, 1);
    int rc = -1, pos = 0;
    for (int i = 0; i < n; i++)
        if (topk_ids[i] >= 0 && topk_ids[i] < E) count[topk_ids[i]]++;
    for (int e = 0; e < E; e++) {
        const int padded = (count[e] + bs - 1) / bs * bs;
        if (pos + padded > sorted_cap) {
            snprintf(msg, msg_len, "expert %d's run ends at %d, past sorted_capacity %d", e, pos + padded, sorted_cap);
            goto out;
        }
        for (int j = 0; j < padded; j++) {
            const int32_t v = sorted[pos + j];
            if (j < count[e]) {
                if (v < 0 || v >= n || topk_ids[v] != e || seen[v]) {
                    snprintf(msg, msg_len, "sorted[%d] = %d in expert %d's run (entry %d of %d)", pos + j, v, e, j,
                             count[e]);
                    goto out;
                }
                seen[v] = 1;
            } else if (v != n) {
                snprintf(msg, msg_len, "sorted[%d] = %d, expected the pad value %d after expert %d's %d pairs", pos + j,
                         v, n, e, count[e]);
                goto out;
            }
        }
        for (int b = pos / bs; b < (pos + padded) / bs; b++)
            if (expert_ids[b] != e) {
                snprintf(msg, msg_len, "expert_ids[%d] = %d, expected %d", b, expert_ids[b], e);
                goto out;
            }
        pos += padded;
    }
    if (npp != pos) {
        snprintf(msg, msg_len, "num_tokens_post_padded = %d, expected %d", npp, pos);
        goto out;
    }
    for (int j = pos; j < sorted_cap; j++)
        if (sorted[j] != n) {
            snprintf(msg, msg_len, "sorted[%d] = %d past the runs (%d), expected the pad value %d", j, sorted[j], pos,
                     n);
            goto out;
        }
    for (int b = pos / bs; b < blocks_cap; b++)
        if (expert_ids[b] != -1) {
            snprintf(msg, msg_len, "expert_ids[%d] = %d past the runs, expected -1", b, expert_ids[b]);
            goto out;
        }
    rc = 0;
out:
    free(count);
    free(seen);
    return rc;
}

void w4a16_ref_moe_gemm(const float *A, const float *W, const float *bias, const float *topk_weights,
                        const int32_t *topk_ids, int M, int top_k, int E, int N, int K, double *C) {
    double *row = malloc((size_t)N * sizeof(double));
    for (long long i = 0; i < (long long)M * top_k; i++) {
        const int e = topk_ids[i];
        if (e < 0 || e >= E) continue;
        const float *a = A + (size_t)(i / top_k) * K;
        const float *w = W + (size_t)e * K * N;
        for (int n = 0; n < N; n++) row[n] = 0;
        for (int k = 0; k < K; k++) {
            const double ak = a[k];
            const float *wk = w + (size_t)k * N;
            for (int n = 0; n < N; n++) row[n] += ak * wk[n];
        }
        const double tw = topk_weights ? topk_weights[i] : 1.0;
        for (int n = 0; n < N; n++) C[(size_t)i * N + n] = (row[n] + (bias ? bias[(size_t)e * N + n] : 0.0)) * tw;
    }
    free(row);
}
