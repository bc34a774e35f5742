/* Public entry points: validate everything, plan the launch (csrc/plan.c), then launch.
 * Nothing here allocates or synchronises; a non-OK status means nothing was launched. */
#include "internal.h"
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

/* The launch of a GEMM call on the current device: arguments from the validated tensors, the plan of csrc/plan.c. */
static w4a16_status prepare_gemm(int layout, const void *A, const void *B, const void *scales, const void *zeros,
                                 const void *bias, void *C, int M, int N, int K, int G, int dtype, void *workspace,
                                 size_t workspace_bytes, unsigned flags, w4a16_stream_t stream, const char *op,
                                 const w4a16_device_state **state, w4a16_gemm_launch *a) {
    int device;
    const w4a16_device_state *st;
    w4a16_status s = w4a16_current_device(&device, &st);
    if (s != W4A16_OK) return s;
    size_t need = w4a16_workspace_bytes_for(st->sm_count);
    if (workspace_bytes > 0 && workspace_bytes < need)
        return w4a16_fail(W4A16_ERR_WORKSPACE_TOO_SMALL,
                          "%s: workspace_bytes=%zu is less than the %zu bytes "
                          "w4a16_workspace_size() asks for on device %d",
                          op, workspace_bytes, need, device);
    *state = st;
    *a = (w4a16_gemm_launch){0};
    a->args = (w4a16_gemm_args){
        .A = A,
        .B = B,
        .scales = scales,
        .zeros = zeros,
        .bias = bias,
        .C = C,
        .M = M,
        .N = N,
        .K = K,
        .gshift = w4a16_group_shift(G),
        .counters = workspace,
        .partials = workspace ? (char *)workspace + w4a16_workspace_counters_bytes(st->sm_count) : NULL,
        .marlin_channelwise = layout == W4A16_LAYOUT_MARLIN && G == K,
        .reduce_dtype = (flags & W4A16_FLAG_REDUCE_IN_DTYPE) != 0,
        .pdl = (flags & W4A16_FLAG_PDL) != 0 && st->pdl,
    };
    a->dtype = dtype;
    a->layout = layout;
    a->stream = stream;
    if ((s = w4a16_plan_gemm(st, layout, dtype, M, N, K, workspace_bytes, op, &a->plan)) != W4A16_OK) return s;
    a->args.stages = a->plan.stages;
    a->args.sk_blocks = a->plan.sk_blocks;
    a->args.sk_tiles = a->plan.sk_tiles;
    return W4A16_OK;
}

/* Staged: slabs of plan.slab_channels channels dequantised into the workspace after the split-K part, each
 * multiplied by the dense GEMM. */
static w4a16_status run_staged(const w4a16_gemm_launch *a, int G, void *workspace, int sm_count, const char *op) {
    const w4a16_gemm_args *g = &a->args;
    void *slab = (char *)workspace + w4a16_workspace_slab_offset(sm_count);
    const size_t elt = 2; /* fp16 / bf16 */
    const int N = g->N, nc = a->plan.slab_channels;
    for (int n0 = 0; n0 < N; n0 += nc) {
        const int n = N - n0 < nc ? N - n0 : nc;
        int e =
            a->layout == W4A16_LAYOUT_AWQ
                ? w4a16_launch_awq_dequant_t((const int32_t *)g->B, g->scales, (const int32_t *)g->zeros, slab, g->K, N,
                                             G, n0, n, a->dtype, a->stream)
                : w4a16_launch_marlin_dequant_t((const int32_t *)g->B, g->scales, (const int32_t *)g->zeros, slab, g->K,
                                                N, g->gshift, g->marlin_channelwise, n0, n, a->dtype, a->stream);
        if (e == 0)
            e = w4a16_launch_dense_gemm(g->A, slab, g->bias ? (const char *)g->bias + n0 * elt : NULL,
                                        (char *)g->C + n0 * elt, g->M, n, g->K, N, a->dtype,
                                        n == nc ? a->plan.grid[0] : w4a16_staged_grid(g->M, n, sm_count), a->stream);
        if (e != 0) return w4a16_launch_status(e, op);
    }
    return W4A16_OK;
}

static w4a16_status run_gemm(int layout, const void *A, const void *B, const void *scales, const void *zeros,
                             const void *bias, void *C, int M, int N, int K, int G, int dtype, void *workspace,
                             size_t workspace_bytes, unsigned flags, w4a16_stream_t stream, const char *op) {
    const w4a16_device_state *st;
    w4a16_gemm_launch a;
    w4a16_status s = prepare_gemm(layout, A, B, scales, zeros, bias, C, M, N, K, G, dtype, workspace, workspace_bytes,
                                  flags, stream, op, &st, &a);
    if (s != W4A16_OK) return s;
    if (st->log_level >= 2) {
        char text[256];
        w4a16_plan_text(&a.plan, text, sizeof text);
        fprintf(stderr, "w4a16: %s M=%d N=%d K=%d G=%d %s: %s\n", op, M, N, K, G, dtype ? "bf16" : "fp16", text);
    }
    if (a.plan.kind == W4A16_KERNEL_STAGED) return run_staged(&a, G, workspace, st->sm_count, op);
    if (W4A16_KERNEL_ROWS(a.plan.kind)) return w4a16_launch_status(w4a16_moe_dense_launch(&a), op);
    return w4a16_launch_status(w4a16_launch_gemm(&a), op);
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

w4a16_status w4a16_gemm_plan(int marlin, int M, int N, int K, int group_size, w4a16_dtype dtype, size_t workspace_bytes,
                             w4a16_gemm_plan_info *info) {
    w4a16_clear_error();
    w4a16_status s;
    int G;
    if (!info) return w4a16_fail(W4A16_ERR_NULL_POINTER, "info is NULL");
    if (marlin != 0 && marlin != 1) return w4a16_fail(W4A16_ERR_INVALID_VALUE, "marlin=%d is neither 0 nor 1", marlin);
    if ((s = w4a16_check_dtype(dtype)) || (s = w4a16_check_gemm_shape(M, N, K, group_size, marlin ? 128 : 32, &G)))
        return s;
    const w4a16_device_state *st;
    w4a16_gemm_launch a;
    if ((s = prepare_gemm(marlin ? W4A16_LAYOUT_MARLIN : W4A16_LAYOUT_AWQ, NULL, NULL, NULL, NULL, NULL, NULL, M, N, K,
                          G, dtype, NULL, workspace_bytes, 0, NULL, "w4a16_gemm_plan", &st, &a)))
        return s;
    int occupancy = 0;
    if (a.plan.kind != W4A16_KERNEL_STAGED) {
        int e = W4A16_KERNEL_ROWS(a.plan.kind) ? w4a16_moe_dense_occupancy(&a, &occupancy)
                                               : w4a16_gemm_occupancy(&a, &occupancy);
        if (e != cudaSuccess)
            return w4a16_fail(W4A16_ERR_CUDA, "w4a16_gemm_plan: occupancy of the %s kernel: %s",
                              w4a16_kernel_kind_name(a.plan.kind), cudaGetErrorString((cudaError_t)e));
    }
    const w4a16_plan *pl = &a.plan;
    memset(info, 0, sizeof *info);
    snprintf(info->kernel, sizeof info->kernel, "%s", w4a16_kernel_kind_name(pl->kind));
    info->config = pl->cfg;
    info->stages = pl->stages;
    info->splits = pl->splits;
    memcpy(info->grid, pl->grid, sizeof info->grid);
    info->threads = pl->threads;
    info->smem_bytes = pl->smem_bytes;
    info->blocks_per_sm = pl->blocks_per_sm;
    if (pl->smem_bytes > 0) info->smem_blocks_per_sm = st->smem_per_sm / (pl->smem_bytes + st->smem_reserved);
    info->occupancy = occupancy;
    info->carveout = pl->carveout;
    w4a16_plan_text(pl, info->text, sizeof info->text);
    return W4A16_OK;
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
    return w4a16_launch_status(w4a16_launch_awq_dequant(qweight, scales, qzeros, W, K, N, G, dtype, stream),
                               "w4a16_awq_dequantize");
}

w4a16_status w4a16_marlin_repack_awq(const int32_t *awq_qweight, int32_t *marlin_weight, int K, int N,
                                     w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int device;
    const w4a16_device_state *st;
    if ((s = w4a16_check_convert(awq_qweight, marlin_weight, K, N, 16)) || (s = w4a16_current_device(&device, &st)))
        return s;
    return w4a16_launch_status(w4a16_launch_repack_awq(awq_qweight, marlin_weight, K, N, stream),
                               "w4a16_marlin_repack_awq");
}

w4a16_status w4a16_marlin_repack_gptq(const int32_t *gptq_qweight, const int32_t *perm, int32_t *marlin_weight, int K,
                                      int N, w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int device;
    const w4a16_device_state *st;
    if ((s = w4a16_check_convert(gptq_qweight, marlin_weight, K, N, 16)) || (s = w4a16_check_ptr(perm, "perm", 4, 0)) ||
        (s = w4a16_current_device(&device, &st)))
        return s;
    return w4a16_launch_status(w4a16_launch_repack_gptq(gptq_qweight, perm, marlin_weight, K, N, stream),
                               "w4a16_marlin_repack_gptq");
}

w4a16_status w4a16_marlin_permute_scales(const void *scales, void *marlin_scales, int K, int N, int group_size,
                                         w4a16_dtype dtype, w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int G, device;
    const w4a16_device_state *st;
    if ((s = w4a16_check_dtype(dtype)) || (s = w4a16_check_convert(scales, marlin_scales, K, N, 16)) ||
        (s = w4a16_check_group(K, group_size, &G)) || (s = w4a16_current_device(&device, &st)))
        return s;
    return w4a16_launch_status(w4a16_launch_permute_scales(scales, marlin_scales, K / G, N, G == K, stream),
                               "w4a16_marlin_permute_scales");
}

w4a16_status w4a16_marlin_awq_zero_points(const int32_t *awq_qzeros, int32_t *marlin_zeros, int K, int N,
                                          int group_size, w4a16_stream_t stream) {
    w4a16_clear_error();
    w4a16_status s;
    int G, device;
    const w4a16_device_state *st;
    if ((s = w4a16_check_convert(awq_qzeros, marlin_zeros, K, N, 16)) || (s = w4a16_check_group(K, group_size, &G)) ||
        (s = w4a16_current_device(&device, &st)))
        return s;
    return w4a16_launch_status(w4a16_launch_awq_zero_points(awq_qzeros, marlin_zeros, K / G, N, stream),
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
    return w4a16_launch_status(w4a16_launch_permute_cols(A, perm, A_out, M, K_in, K_out, stream), "w4a16_permute_cols");
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
    return w4a16_launch_status(w4a16_launch_gather_rows(in, rows_in, idx, out, rows_out, cols, stream),
                               "w4a16_gather_rows");
}
