/* CPU references of the mixture-of-experts operations, for the tests (built into libw4a16_ref.a, not part of the
 * public ABI). */
#ifndef W4A16_MOE_REF_H
#define W4A16_MOE_REF_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Checks a routing result (w4a16_moe_align_block_size) for topk_ids [n] over E experts and block size bs: the runs
 * hold each expert's pair indices exactly once (any order) then the pad value n up to a multiple of bs, in expert
 * order; *npp is their total; every entry past them is n; expert_ids names each block's expert and -1 past the runs;
 * entries outside [0, E) appear nowhere. Returns 0, or -1 with a sentence in msg. */
int w4a16_ref_moe_check_routing(const int32_t *topk_ids, int n, int E, int bs, const int32_t *sorted, int sorted_cap,
                                const int32_t *expert_ids, int blocks_cap, int32_t npp, char *msg, size_t msg_len);

/* Per-expert dense reference of the grouped GEMM: for every pair i < M * top_k with e = topk_ids[i] in [0, E):
 *   C[i, :] = (A[i / top_k, :] * W[e] + bias[e, :]) * topk_weights[i]
 * in double. A [M, K], W [E, K, N], bias [E, N] (may be NULL), topk_weights [M * top_k] (may be NULL: 1); rows of
 * dropped pairs are left as they are. */
void w4a16_ref_moe_gemm(const float *A, const float *W, const float *bias, const float *topk_weights,
                        const int32_t *topk_ids, int M, int top_k, int E, int N, int K, double *C);

#ifdef __cplusplus
}
#endif
#endif
