/* Public entry points: validate everything, pick the tile from the device's profile, then launch.
 * Nothing here allocates or synchronises; a non-OK status means nothing was launched. */
#include <cuda_runtime_api.h>
#include "internal.h"

/* K splits across blocks: only when the tiles alone leave resident block slots (SMs x the config's blocks per
 * SM) idle; never more blocks than those slots (the workspace is sized for that), at most 16 splits, and every
 * split keeps at least min_kt k-tiles. */
int w4a16_choose_splits(int blocks_per_sm, int tiles, int num_kt, int sm_count, int min_kt) {
    int slots = sm_count * blocks_per_sm;
    if (tiles * 2 > slots) return 1;
    int s = slots / tiles;
    if (s > num_kt / min_kt) s = num_kt / min_kt;
    if (s > 16) s = 16;
    return s < 1 ? 1 : s;
}

/* log2(G) for a power of two; 31 otherwise (then G = K: every k is in group 0). */
static int group_shift(int G) {
    if (G & (G - 1)) return 31;
    int s = 0;
    while ((1 << s) < G) s++;
    return s;
}

int w4a16_staged_slab_channels(int M, int N, int K, size_t workspace_bytes, int sm_count) {
    const size_t off = w4a16_workspace_slab_offset(sm_count);
    long long nc = workspace_bytes > off ? (long long)((workspace_bytes - off) / ((size_t)K * 2)) : 0;
    nc = nc >= N ? N : nc / W4A16_DENSE_BN * W4A16_DENSE_BN;
    const long long tiles_m = (M + W4A16_DENSE_TM - 1) / W4A16_DENSE_TM;
    return nc > 0 && tiles_m * ((nc + W4A16_DENSE_BN - 1) / W4A16_DENSE_BN) >= sm_count ? (int)nc : 0;
}

static w4a16_status launch_status(int err, const char *op) {
    if (err == cudaSuccess) return W4A16_OK;
    return w4a16_fail(W4A16_ERR_LAUNCH_FAILED, "%s: kernel launch failed: %s", op,
                      cudaGetErrorString((cudaError_t)err));
}

static w4a16_status run_gemm(int layout, const void *A, const void *B, const void *scales, const void *zeros,
                             const void *bias, void *C, int M, int N, int K, int G, int dtype, void *workspace,
                             size_t workspace_bytes, unsigned flags, w4a16_stream_t stream, const char *op) {
    int device;
    const w4a16_device_state *st;
    w4a16_status s = w4a16_current_device(&device, &st);
    if (s != W4A16_OK) return s;
    const w4a16_profile *p = st->profile;
    size_t need = w4a16_workspace_bytes_for(st->sm_count);
    if (workspace_bytes > 0 && workspace_bytes < need)
        return w4a16_fail(W4A16_ERR_WORKSPACE_TOO_SMALL, "%s: workspace_bytes=%zu is less than the %zu bytes "
                          "w4a16_workspace_size() asks for on device %d", op, workspace_bytes, need, device);
    w4a16_gemm_launch a = {0};
    a.A = A; a.B = B; a.scales = scales; a.zeros = zeros; a.bias = bias; a.C = C;
    a.M = M; a.N = N; a.K = K;
    a.gshift = group_shift(G);
    a.dtype = dtype;
    a.layout = layout;
    a.marlin_channelwise = layout == W4A16_LAYOUT_MARLIN && G == K;
    a.reduce_dtype = (flags & W4A16_FLAG_REDUCE_IN_DTYPE) != 0;
    a.pdl = (flags & W4A16_FLAG_PDL) != 0 && st->pdl;
    a.counters = workspace;
    a.partials = (char *)workspace + w4a16_workspace_counters_bytes(st->sm_count);
    a.stream = stream;
    a.splits = 1;
    const int nc = st->wgmma && p->staged_min_m > 0 && M >= p->staged_min_m
                       ? w4a16_staged_slab_channels(M, N, K, workspace_bytes, st->sm_count)
                       : 0;
    if (nc > 0) {
        /* staged: slabs of nc channels dequantised into the workspace after the split-K part, each multiplied by the
         * dense GEMM */
        void *slab = (char *)workspace + w4a16_workspace_slab_offset(st->sm_count);
        const size_t elt = 2; /* fp16 / bf16 */
        for (int n0 = 0; n0 < N; n0 += nc) {
            const int n = N - n0 < nc ? N - n0 : nc;
            int e = layout == W4A16_LAYOUT_AWQ
                        ? w4a16_launch_awq_dequant_t(B, scales, zeros, slab, K, N, G, n0, n, dtype, stream)
                        : w4a16_launch_marlin_dequant_t(B, scales, zeros, slab, K, N, a.gshift, a.marlin_channelwise,
                                                        n0, n, dtype, stream);
            if (e == 0)
                e = w4a16_launch_dense_gemm(A, slab, bias ? (const char *)bias + n0 * elt : NULL,
                                            (char *)C + n0 * elt, M, n, K, N, dtype, st->sm_count, stream);
            if (e != 0) return launch_status(e, op);
        }
        return W4A16_OK;
    }
    if (st->wgmma && p->wgmma_min_m > 0 && M >= p->wgmma_min_m) { /* Hopper: the wgmma kernels */
        int id = M >= p->wgmma_large_min_m ? 0 : M > 64 ? 1 : 2;
        /* Narrow layers at M 65-128: fewer than 32 blocks of the 128-token tile leave the SMs to split-K; the
         * 64-token tile (two blocks per SM) was measured faster there (llama3-8b.o M = 128: 41 -> 24 us) and slower
         * on wider layers (qwen2.5-72b.o, 32 tiles: 58 -> 69 us). */
        if (id == 1 && (long long)((M + 127) / 128) * ((N + w4a16_wgmma_bn(1) - 1) / w4a16_wgmma_bn(1)) < 32) id = 2;
        /* Very wide layers at M 17-64: the 256-channel tile halves the per-stage work per weight and still makes 1.5
         * blocks per SM (qwen2.5-72b.gate_up, N = 59136: 224 -> 184 us at M = 64; 8B gate_up, 112 tiles, is slower). */
        if (id == 2 && (long long)((N + w4a16_wgmma_bn(3) - 1) / w4a16_wgmma_bn(3)) * 2 >= 3LL * st->sm_count) id = 3;
        const int tm = w4a16_wgmma_tm(id), bn = w4a16_wgmma_bn(id);
        const int tiles_m = (M + tm - 1) / tm, tiles_n = (N + bn - 1) / bn, num_kt = (K + 63) / 64;
        a.wgmma = 1 + id;
        if (workspace_bytes > 0)
            a.splits = w4a16_choose_splits(w4a16_wgmma_minb(id), tiles_m * tiles_n, num_kt, st->sm_count, 2);
        return launch_status(w4a16_launch_gemm(&a), op);
    }
    const w4a16_tile_choice *tc = M <= p->small_max_m             ? &p->small
                                  : M <= p->mid_max_m             ? &p->mid
                                  : M <= p->mid2_max_m            ? &p->mid2
                                  : layout == W4A16_LAYOUT_MARLIN ? &p->large
                                                                  : &p->large_awq;
    const w4a16_gemm_config *cfg = w4a16_config(tc->cfg);
    int bm = w4a16_cfg_bm(cfg), bn = w4a16_cfg_bn(cfg);
    if (tc == &p->mid && (long long)((M + bm - 1) / bm) * ((N + bn - 1) / bn) >= st->sm_count) {
        tc = &p->mid_wide; /* wide layer: enough blocks without the 8-warp tile; the 4-warp one runs two per SM */
        cfg = w4a16_config(tc->cfg);
        bm = w4a16_cfg_bm(cfg);
        bn = w4a16_cfg_bn(cfg);
    }
    if (tc == &p->small && (long long)((M + bm - 1) / bm) * ((N + bn - 1) / bn) < 2LL * st->sm_count) {
        tc = &p->small_split; /* K will be split across blocks: the deeper stage amortises its fixed costs better */
        cfg = w4a16_config(tc->cfg);
        bm = w4a16_cfg_bm(cfg);
        bn = w4a16_cfg_bn(cfg);
    }
    const int tiles_m = (M + bm - 1) / bm, tiles_n = (N + bn - 1) / bn;
    if (tiles_m > 2147483647 / tiles_n)
        return w4a16_fail(W4A16_ERR_SIZE_OVERFLOW, "%s: M=%d, N=%d make too many tiles", op, M, N);
    const int tiles = tiles_m * tiles_n, bk = w4a16_cfg_bk(cfg), num_kt = (K + bk - 1) / bk;
    a.cfg = tc->cfg;
    a.stages = tc->stages;
    a.smem_bytes = w4a16_cfg_smem_bytes(cfg, layout, tc->stages);
    if (workspace_bytes > 0) {
        /* resident blocks per SM: the register budget of the config, or fewer where shared memory runs out first
         * (an SM holds the per-block opt-in limit + 1 KB, and each block reserves 1 KB) */
        int per_sm = (int)((st->smem_optin + 1024) / ((size_t)a.smem_bytes + 1024));
        /* the budget the instance was built for: the config's, or that of the decode kernel's 16-token instance */
        const int decode = w4a16_cfg_is_decode(cfg);
        const int minb = decode && M > 8 && cfg->minb <= 3 ? W4A16_DECODE16_MINB(cfg->minb, layout, dtype) : cfg->minb;
        if (per_sm > minb) per_sm = minb;
        if (per_sm < 1) per_sm = 1;
        /* the deep decode tile (256 k per stage) keeps at least 4 stages per split: measured on the H100 with
         * llama3-8b.qkv / .o (K = 4096, 48 / 32 tiles) at M <= 16, 4 splits instead of 5 / 8 were 5-11% / 2-17%
         * faster, while llama3-8b.down (K = 14336) keeps its 8 (docs/PERFORMANCE.md v18) */
        const int min_kt = decode && bk >= 256 ? 4 : 2;
        a.splits = w4a16_choose_splits(per_sm, tiles, num_kt, st->sm_count, min_kt);
    }
    return launch_status(w4a16_launch_gemm(&a), op);
}

static w4a16_status check_flags(unsigned flags) {
    const unsigned known = W4A16_FLAG_REDUCE_IN_DTYPE | W4A16_FLAG_PDL;
    if (flags & ~known)
        return w4a16_fail(W4A16_ERR_INVALID_VALUE, "flags=0x%x has unknown bits (known: 0x%x)", flags, known);
    return W4A16_OK;
}

w4a16_status w4a16_awq_gemm(const void *A, const int32_t *qweight, const void *scales, const int32_t *qzeros,
                            const void *bias, void *C, int M, int N, int K, int group_size, w4a16_dtype dtype,
                            void *workspace, size_t workspace_bytes, w4a16_stream_t stream) {
    return w4a16_awq_gemm_ex(A, qweight, scales, qzeros, bias, C, M, N, K, group_size, dtype, workspace,
                             workspace_bytes, 0, stream);
}

w4a16_status w4a16_awq_gemm_ex(const void *A, const int32_t *qweight, const void *scales, const int32_t *qzeros,
                               const void *bias, void *C, int M, int N, int K, int group_size, w4a16_dtype dtype,
                               void *workspace, size_t workspace_bytes, unsigned flags, w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int G;
    if ((s = check_flags(flags)) || (s = w4a16_check_dtype(dtype)) || (s = w4a16_check_ptr(A, "A", 16, 1)) ||
        (s = w4a16_check_ptr(qweight, "qweight", 16, 1)) || (s = w4a16_check_ptr(scales, "scales", 16, 1)) ||
        (s = w4a16_check_ptr(qzeros, "qzeros", 16, 1)) || (s = w4a16_check_ptr(bias, "bias", 4, 0)) ||
        (s = w4a16_check_ptr(C, "C", 16, 1)) || (s = w4a16_check_gemm_shape(M, N, K, group_size, 32, &G)) ||
        (s = w4a16_check_ptr(workspace, "workspace", 16, workspace_bytes > 0)))
        return s;
    return run_gemm(W4A16_LAYOUT_AWQ, A, qweight, scales, qzeros, bias, C, M, N, K, G, dtype, workspace,
                    workspace_bytes, flags, stream, "w4a16_awq_gemm");
}

w4a16_status w4a16_marlin_gemm(const void *A, const int32_t *marlin_weight, const void *marlin_scales,
                               const int32_t *marlin_zeros, const void *bias, void *C, int M, int N, int K,
                               int group_size, w4a16_dtype dtype, void *workspace, size_t workspace_bytes,
                               w4a16_stream_t stream) {
    return w4a16_marlin_gemm_ex(A, marlin_weight, marlin_scales, marlin_zeros, bias, C, M, N, K, group_size, dtype,
                                workspace, workspace_bytes, 0, stream);
}

w4a16_status w4a16_marlin_gemm_ex(const void *A, const int32_t *marlin_weight, const void *marlin_scales,
                                  const int32_t *marlin_zeros, const void *bias, void *C, int M, int N, int K,
                                  int group_size, w4a16_dtype dtype, void *workspace, size_t workspace_bytes,
                                  unsigned flags, w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int G;
    if ((s = check_flags(flags)) || (s = w4a16_check_dtype(dtype)) || (s = w4a16_check_ptr(A, "A", 16, 1)) ||
        (s = w4a16_check_ptr(marlin_weight, "marlin_weight", 16, 1)) ||
        (s = w4a16_check_ptr(marlin_scales, "marlin_scales", 16, 1)) ||
        (s = w4a16_check_ptr(marlin_zeros, "marlin_zeros", 16, 0)) || (s = w4a16_check_ptr(bias, "bias", 4, 0)) ||
        (s = w4a16_check_ptr(C, "C", 16, 1)) || (s = w4a16_check_gemm_shape(M, N, K, group_size, 128, &G)) ||
        (s = w4a16_check_ptr(workspace, "workspace", 16, workspace_bytes > 0)))
        return s;
    return run_gemm(W4A16_LAYOUT_MARLIN, A, marlin_weight, marlin_scales, marlin_zeros, bias, C, M, N, K, G, dtype,
                    workspace, workspace_bytes, flags, stream, "w4a16_marlin_gemm");
}

w4a16_status w4a16_awq_dequantize(const int32_t *qweight, const void *scales, const int32_t *qzeros, void *W, int K,
                                  int N, int group_size, w4a16_dtype dtype, w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int G, device;
    const w4a16_device_state *st;
    if ((s = w4a16_check_dtype(dtype)) || (s = w4a16_check_ptr(qweight, "qweight", 16, 1)) ||
        (s = w4a16_check_ptr(scales, "scales", 16, 1)) || (s = w4a16_check_ptr(qzeros, "qzeros", 16, 1)) ||
        (s = w4a16_check_ptr(W, "W", 16, 1)) || (s = w4a16_check_gemm_shape(1, N, K, group_size, 1, &G)) ||
        (s = w4a16_current_device(&device, &st)))
        return s;
    return launch_status(w4a16_launch_awq_dequant(qweight, scales, qzeros, W, K, N, G, dtype, stream),
                         "w4a16_awq_dequantize");
}

/* Shapes of the converters: N % 64, K % k_multiple, in != out. */
static w4a16_status check_convert(const void *in, const void *out, int K, int N, int k_multiple) {
    w4a16_status s;
    if ((s = w4a16_check_ptr(in, "input", 16, 1)) || (s = w4a16_check_ptr(out, "output", 16, 1))) return s;
    if (in == out) return w4a16_fail(W4A16_ERR_INVALID_VALUE, "input and output are the same buffer (%p)", in);
    return w4a16_check_gemm_shape(1, N, K, -1, k_multiple, NULL);
}

w4a16_status w4a16_marlin_repack_awq(const int32_t *awq_qweight, int32_t *marlin_weight, int K, int N,
                                     w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int device;
    const w4a16_device_state *st;
    if ((s = check_convert(awq_qweight, marlin_weight, K, N, 16)) || (s = w4a16_current_device(&device, &st)))
        return s;
    return launch_status(w4a16_launch_repack_awq(awq_qweight, marlin_weight, K, N, stream), "w4a16_marlin_repack_awq");
}

w4a16_status w4a16_marlin_repack_gptq(const int32_t *gptq_qweight, const int32_t *perm, int32_t *marlin_weight,
                                      int K, int N, w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int device;
    const w4a16_device_state *st;
    if ((s = check_convert(gptq_qweight, marlin_weight, K, N, 16)) || (s = w4a16_check_ptr(perm, "perm", 4, 0)) ||
        (s = w4a16_current_device(&device, &st)))
        return s;
    return launch_status(w4a16_launch_repack_gptq(gptq_qweight, perm, marlin_weight, K, N, stream),
                         "w4a16_marlin_repack_gptq");
}

w4a16_status w4a16_marlin_permute_scales(const void *scales, void *marlin_scales, int K, int N, int group_size,
                                         w4a16_dtype dtype, w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int G, device;
    const w4a16_device_state *st;
    if ((s = w4a16_check_dtype(dtype)) || (s = check_convert(scales, marlin_scales, K, N, 16)) ||
        (s = w4a16_check_group(K, group_size, &G)) || (s = w4a16_current_device(&device, &st)))
        return s;
    return launch_status(w4a16_launch_permute_scales(scales, marlin_scales, K / G, N, G == K, stream),
                         "w4a16_marlin_permute_scales");
}

w4a16_status w4a16_marlin_awq_zero_points(const int32_t *awq_qzeros, int32_t *marlin_zeros, int K, int N,
                                          int group_size, w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int G, device;
    const w4a16_device_state *st;
    if ((s = check_convert(awq_qzeros, marlin_zeros, K, N, 16)) || (s = w4a16_check_group(K, group_size, &G)) ||
        (s = w4a16_current_device(&device, &st)))
        return s;
    return launch_status(w4a16_launch_awq_zero_points(awq_qzeros, marlin_zeros, K / G, N, stream),
                         "w4a16_marlin_awq_zero_points");
}

w4a16_status w4a16_permute_cols(const void *A, const int32_t *perm, void *A_out, int M, int K_in, int K_out,
                                w4a16_dtype dtype, w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int device;
    const w4a16_device_state *st;
    if ((s = w4a16_check_dtype(dtype)) || (s = w4a16_check_ptr(A, "A", 16, 1)) ||
        (s = w4a16_check_ptr(perm, "perm", 4, 1)) || (s = w4a16_check_ptr(A_out, "A_out", 16, 1)))
        return s;
    if (A == A_out) return w4a16_fail(W4A16_ERR_INVALID_VALUE, "A and A_out are the same buffer (%p)", A);
    if (M < 1 || K_in < 1 || K_out < 1)
        return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "M=%d, K_in=%d and K_out=%d must be at least 1", M, K_in, K_out);
    if ((s = w4a16_check_size("A[M,K_in]", M, K_in)) || (s = w4a16_check_size("A_out[M,K_out]", M, K_out)) ||
        (s = w4a16_current_device(&device, &st)))
        return s;
    return launch_status(w4a16_launch_permute_cols(A, perm, A_out, M, K_in, K_out, stream), "w4a16_permute_cols");
}

w4a16_status w4a16_gather_rows(const void *in, int rows_in, const int32_t *idx, void *out, int rows_out, int cols,
                               w4a16_dtype dtype, w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int device;
    const w4a16_device_state *st;
    if ((s = w4a16_check_dtype(dtype)) || (s = w4a16_check_ptr(in, "in", 16, 1)) ||
        (s = w4a16_check_ptr(idx, "idx", 4, 1)) || (s = w4a16_check_ptr(out, "out", 16, 1)))
        return s;
    if (in == out) return w4a16_fail(W4A16_ERR_INVALID_VALUE, "in and out are the same buffer (%p)", in);
    if (rows_in < 1 || rows_out < 1 || cols < 1)
        return w4a16_fail(W4A16_ERR_INVALID_SHAPE, "rows_in=%d, rows_out=%d and cols=%d must be at least 1", rows_in,
                          rows_out, cols);
    if ((s = w4a16_check_size("in[rows_in,cols]", rows_in, cols)) ||
        (s = w4a16_check_size("out[rows_out,cols]", rows_out, cols)) || (s = w4a16_current_device(&device, &st)))
        return s;
    return launch_status(w4a16_launch_gather_rows(in, rows_in, idx, out, rows_out, cols, stream), "w4a16_gather_rows");
}
