/* Stand-ins for the CUDA kernels (kernels/launch.h) in the fuzz build, which compiles the host sources with clang
 * and sanitizers. The fuzz target hides every GPU, so validation stops before these could be reached; if one ever
 * is, the fuzzer aborts and reports the input. */
#include "../kernels/launch.h"
#include <stdlib.h>

int w4a16_launch_gemm(const w4a16_gemm_launch *a) {
    (void)a;
    abort();
}
int w4a16_gemm_occupancy(const w4a16_gemm_launch *a, int *b) {
    (void)a;
    (void)b;
    abort();
}
int w4a16_probe_gemm(int dtype, int layout, int cfg, int *bv) {
    (void)dtype;
    (void)layout;
    (void)cfg;
    (void)bv;
    abort();
}
int w4a16_probe_gemm_wgmma(void) { abort(); }
int w4a16_gemm_wgmma_smem_bytes(void) { abort(); }
int w4a16_launch_awq_dequant(const int32_t *q, const void *s, const int32_t *z, void *W, int K, int N, int G, int dt,
                             void *st) {
    (void)q;
    (void)s;
    (void)z;
    (void)W;
    (void)K;
    (void)N;
    (void)G;
    (void)dt;
    (void)st;
    abort();
}
int w4a16_launch_awq_dequant_t(const int32_t *q, const void *s, const int32_t *z, void *W, int K, int N, int G, int n0,
                               int nc, int dt, void *st) {
    (void)q;
    (void)s;
    (void)z;
    (void)W;
    (void)K;
    (void)N;
    (void)G;
    (void)n0;
    (void)nc;
    (void)dt;
    (void)st;
    abort();
}
int w4a16_launch_marlin_dequant_t(const int32_t *w, const void *s, const int32_t *z, void *Wt, int K, int N, int G,
                                  int cw, int n0, int nc, int dt, void *st) {
    (void)w;
    (void)s;
    (void)z;
    (void)Wt;
    (void)K;
    (void)N;
    (void)G;
    (void)cw;
    (void)n0;
    (void)nc;
    (void)dt;
    (void)st;
    abort();
}
int w4a16_launch_dense_gemm(const void *A, const void *W, const void *b, void *C, int M, int nc, int K, int ldc, int dt,
                            int sms, void *st) {
    (void)A;
    (void)W;
    (void)b;
    (void)C;
    (void)M;
    (void)nc;
    (void)K;
    (void)ldc;
    (void)dt;
    (void)sms;
    (void)st;
    abort();
}
int w4a16_launch_repack_awq(const int32_t *in, int32_t *out, int K, int N, void *st) {
    (void)in;
    (void)out;
    (void)K;
    (void)N;
    (void)st;
    abort();
}
int w4a16_launch_repack_gptq(const int32_t *in, const int32_t *p, int32_t *out, int K, int N, void *st) {
    (void)in;
    (void)p;
    (void)out;
    (void)K;
    (void)N;
    (void)st;
    abort();
}
int w4a16_launch_permute_scales(const void *in, void *out, int rows, int N, int cw, void *st) {
    (void)in;
    (void)out;
    (void)rows;
    (void)N;
    (void)cw;
    (void)st;
    abort();
}
int w4a16_launch_awq_zero_points(const int32_t *in, int32_t *out, int rows, int N, void *st) {
    (void)in;
    (void)out;
    (void)rows;
    (void)N;
    (void)st;
    abort();
}
int w4a16_launch_permute_cols(const void *A, const int32_t *perm, void *out, int M, int Ki, int Ko, void *st) {
    (void)A;
    (void)perm;
    (void)out;
    (void)M;
    (void)Ki;
    (void)Ko;
    (void)st;
    abort();
}
int w4a16_launch_gather_rows(const void *in, int ri, const int32_t *idx, void *out, int ro, int c, void *st) {
    (void)in;
    (void)ri;
    (void)idx;
    (void)out;
    (void)ro;
    (void)c;
    (void)st;
    abort();
}
/* kernels/moe_launch.h */
#include "../kernels/moe_launch.h"
int w4a16_launch_moe_align(const int32_t *ids, int n, int E, int bs, int32_t *sorted, int scap, int32_t *eids, int bcap,
                           int32_t *npp, void *st) {
    (void)ids;
    (void)n;
    (void)E;
    (void)bs;
    (void)sorted;
    (void)scap;
    (void)eids;
    (void)bcap;
    (void)npp;
    (void)st;
    abort();
}
int w4a16_launch_moe_gemm(const w4a16_moe_launch *a) {
    (void)a;
    abort();
}
int w4a16_moe_prepare(const w4a16_moe_launch *a, int split, int *b) {
    (void)a;
    (void)split;
    (void)b;
    abort();
}
int w4a16_launch_ws(const w4a16_moe_launch *a) {
    (void)a;
    abort();
}
int w4a16_prepare_ws(const w4a16_moe_launch *a, int *b) {
    (void)a;
    (void)b;
    abort();
}
int w4a16_probe_ws(void) { abort(); }
