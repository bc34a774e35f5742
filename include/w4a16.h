/*
 * w4a16.h - int4 weight-only GEMM (fp16/bf16 activations x 4-bit weights with group scales).
 *
 * This is the whole public contract of libw4a16. Plain C99, usable from C++.
 *
 * Notation: a linear layer computes C[M,N] = A[M,K] * W[K,N] (+ bias[N]);
 *   K = in_features, N = out_features, G = group size (-1 means one group of K rows).
 * All matrices are row-major and dense (leading dimension = number of columns).
 * Pointers marked "device" must point to GPU memory of the current device.
 *
 * Rules every entry point follows:
 *  - Arguments are validated completely before anything is launched. On any non-OK status nothing
 *    was launched and nothing was written; w4a16_last_error_message() names the failed check.
 *  - Nothing is allocated and the device is never synchronised. Work is enqueued on the caller's
 *    stream, so every launching call can be captured in a CUDA graph.
 *  - The device used is the current device of the calling thread (cudaGetDevice()).
 */
#ifndef W4A16_H
#define W4A16_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define W4A16_API
#else
#define W4A16_API __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------- version */
#define W4A16_VERSION_MAJOR 0
#define W4A16_VERSION_MINOR 2
#define W4A16_VERSION_PATCH 0
#define W4A16_VERSION_NUMBER (W4A16_VERSION_MAJOR * 10000 + W4A16_VERSION_MINOR * 100 + W4A16_VERSION_PATCH)

/* The library's W4A16_VERSION_NUMBER; compare with the macro to detect a header/library mismatch. */
W4A16_API unsigned w4a16_version_number(void);
/* "MAJOR.MINOR.PATCH" of the library. */
W4A16_API const char *w4a16_version_string(void);

/* ---------------------------------------------------------------- status codes
 * One list: values never change meaning; w4a16_status_string() returns the sentence.
 * 1-19: the caller's arguments; 20-39: the GPU, driver or build; 40+: internal. */
#define W4A16_STATUS_LIST(X)                                                                                           \
    X(W4A16_OK, 0, "success")                                                                                          \
    X(W4A16_ERR_NULL_POINTER, 1, "a required pointer is NULL")                                                         \
    X(W4A16_ERR_MISALIGNED, 2, "a pointer is not aligned as the operation requires")                                   \
    X(W4A16_ERR_INVALID_SHAPE, 3, "a dimension is out of range or not a required multiple")                            \
    X(W4A16_ERR_UNSUPPORTED_GROUP_SIZE, 4, "group size must be 32, 64, 128 or -1 (one group)")                         \
    X(W4A16_ERR_UNSUPPORTED_DTYPE, 5, "data type must be W4A16_FP16 or W4A16_BF16")                                    \
    X(W4A16_ERR_WORKSPACE_TOO_SMALL, 6, "the workspace is smaller than w4a16_workspace_size()")                        \
    X(W4A16_ERR_SIZE_OVERFLOW, 7, "a tensor size does not fit the supported index range")                              \
    X(W4A16_ERR_INVALID_VALUE, 8, "an argument has a value outside its allowed set")                                   \
    X(W4A16_ERR_NO_DEVICE, 20, "no CUDA device is available")                                                          \
    X(W4A16_ERR_DRIVER_TOO_OLD, 21, "the NVIDIA driver is older than this build of w4a16 needs")                       \
    X(W4A16_ERR_ARCH_UNSUPPORTED, 22, "this GPU architecture cannot run any kernel in this build")                     \
    X(W4A16_ERR_PROFILE_UNAVAILABLE, 23, "the requested profile does not fit this GPU")                                \
    X(W4A16_ERR_CUDA, 24, "a CUDA runtime call failed")                                                                \
    X(W4A16_ERR_LAUNCH_FAILED, 25, "a kernel launch failed")                                                           \
    X(W4A16_ERR_NOT_IMPLEMENTED, 26, "this combination of options is not implemented yet")                             \
    X(W4A16_ERR_INTERNAL, 40, "internal error in w4a16 (please report)")

typedef enum w4a16_status {
#define W4A16_STATUS_ENUM_(name, value, text) name = value,
    W4A16_STATUS_LIST(W4A16_STATUS_ENUM_)
#undef W4A16_STATUS_ENUM_
} w4a16_status;

/* The fixed sentence for a status; "unknown w4a16 status" for values outside the list. Never NULL. */
W4A16_API const char *w4a16_status_string(w4a16_status status);

/* The message of the last failed call on this thread, naming the check and its values
 * (e.g. "K=4000 is not a multiple of group_size=128"); "" after a successful call. Never NULL.
 * The pointer stays valid until the next w4a16 call on the same thread. */
W4A16_API const char *w4a16_last_error_message(void);

/* ---------------------------------------------------------------- types */
typedef enum w4a16_dtype {
    W4A16_FP16 = 0, /* IEEE half */
    W4A16_BF16 = 1  /* bfloat16 */
} w4a16_dtype;

/* Same type as cudaStream_t (struct CUstream_st *); NULL is the legacy default stream. */
typedef struct CUstream_st *w4a16_stream_t;

/* ---------------------------------------------------------------- build and device introspection */

/* Architectures with real machine code (SASS) in this library, e.g. "80,86,89,90,100,120,121",
 * followed by " ptx:120" naming the PTX kept as last resort. Never NULL. */
W4A16_API const char *w4a16_compiled_archs(void);

typedef struct w4a16_device_info {
    int device;                  /* CUDA ordinal */
    char name[128];              /* e.g. "NVIDIA H100 80GB HBM3" */
    int cc_major, cc_minor;      /* compute capability */
    int sm_count;                /* multiprocessors */
    size_t smem_per_block_optin; /* sharedMemPerBlockOptin in bytes (99 KB on sm_120, 227 KB on sm_90) */
    size_t l2_bytes;             /* L2 cache size */
    int driver_version;          /* cudaDriverGetVersion, e.g. 13000 */
    int runtime_version;         /* the CUDA runtime w4a16 was built with, e.g. 13000 */
    char profile[32];            /* tuning profile in use, e.g. "sm90"; "" when unsupported */
    int native_sass;             /* 1: this build holds machine code for this GPU; 0: PTX JIT or none */
    int supported;               /* 1: w4a16 can run on this device */
    w4a16_status status;         /* why not, when supported == 0 */
    char reason[256];            /* a sentence: what w4a16 will do on this device, or why it cannot */
} w4a16_device_info;

/* Fill *info for CUDA device `device`. Returns W4A16_OK whenever *info was filled, also for an
 * unsupported device (then info->supported == 0 and info->status/reason say why);
 * W4A16_ERR_NULL_POINTER, W4A16_ERR_INVALID_VALUE (no such ordinal), W4A16_ERR_NO_DEVICE or
 * W4A16_ERR_DRIVER_TOO_OLD when no device can be queried. */
W4A16_API w4a16_status w4a16_get_device_info(int device, w4a16_device_info *info);

/* The tuning profiles, one per architecture it was tuned for (oldest first): the names W4A16_PROFILE and
 * w4a16_force_profile take, and w4a16_profile_names() lists. */
#define W4A16_PROFILE_LIST(X) X(sm80) X(sm86) X(sm89) X(sm90) X(sm100) X(sm120) X(sm121)

/* Force the tuning profile for the current device: a name of W4A16_PROFILE_LIST, or NULL / "" / "auto" for
 * automatic choice. The environment variable W4A16_PROFILE does the same at first use; W4A16_LOG=1 prints every
 * choice on stderr, W4A16_LOG=2 also the launch plan of every GEMM. A profile of an architecture with less shared
 * memory per SM than the device (sm120 on an H100) also holds each SM to that architecture's shared memory (a
 * carveout), so that as many blocks run per SM as would there. (Testing override: W4A16_FAKE_DRIVER_VERSION=12020
 * makes w4a16 act as if the driver supported only CUDA 12.2.)
 * Returns W4A16_ERR_INVALID_VALUE for an unknown name, W4A16_ERR_PROFILE_UNAVAILABLE when the
 * profile's tiles need more shared memory than the device has (the previous choice stays). Safe while other threads
 * run GEMMs on the device: each call plans with the profile in force when it started, never a mix of two. */
W4A16_API w4a16_status w4a16_force_profile(const char *name);

/* Names of all profiles, NULL-terminated. */
W4A16_API const char *const *w4a16_profile_names(void);

/* ---------------------------------------------------------------- workspace
 * The GEMMs split K across blocks at decode sizes, and the mma.sync tile kernel shares the k-tiles of a partial last
 * wave of tiles among all SMs (stream-K); both reduce through a caller-owned workspace: per-tile counters followed by
 * fp32 partial sums (about 35 MB on a 132-SM H100: two 128 x 256 fp32 tiles per SM, less on GPUs with fewer SMs).
 * Size it once per device with this query, zero it
 * once (cudaMemset) after allocating it, and pass it to every GEMM on that device: each call leaves
 * the counters zeroed again, so one workspace serves a whole model and CUDA-graph replays.
 * A workspace must not be used by two calls that run concurrently (use one per stream). */
W4A16_API w4a16_status w4a16_workspace_size(size_t *bytes);

/* Staged large-M GEMMs (compute capability 9.0): with at least `staged_min_m` tokens (4096 in the sm90 profile;
 * w4a16-doctor prints it) w4a16_awq_gemm and w4a16_marlin_gemm can dequantise the weights into the workspace, a slab
 * of channels at a time, and multiply each slab with a dense tensor-core GEMM (TMA + wgmma), which is faster there
 * than dequantising inside the GEMM (vLLM's AWQ path does the same with cuBLAS from 256 tokens on). It runs when the
 * workspace is larger than w4a16_workspace_size() by at least one slab that fills the GPU; this query gives the bytes
 * for one slab of all N channels (w4a16_workspace_size() rounded up to 256, plus a K x N weight in dtype: 2 N K bytes).
 * Smaller workspaces use narrower slabs (multiples of 128 channels) down to the narrowest whose tiles still cover
 * every SM, and otherwise the fused kernel runs; either way the result agrees with the fused kernel's within the
 * tolerance of the tests. Sizing for the largest layer of a model serves all of its layers. The slab needs no zeroing.
 * Returns W4A16_ERR_NULL_POINTER, W4A16_ERR_INVALID_SHAPE (N not a positive multiple of 64, K not of 32) or a device
 * status, and then writes nothing. */
W4A16_API w4a16_status w4a16_workspace_size_staged(int N, int K, size_t *bytes);

/* ---------------------------------------------------------------- launch plans
 * What a GEMM call would launch on the current device, without launching it: the kernel, tile config, pipeline
 * stages, K splits and grid (what W4A16_LOG=2 prints for every call), the resident blocks per SM the plan sized its
 * K split for, and those the device gives that kernel (cudaOccupancyMaxActiveBlocksPerMultiprocessor with the plan's
 * shared memory and carveout, which this sets on the kernel as a launch would). Arguments as for w4a16_awq_gemm
 * (marlin = 0) or w4a16_marlin_gemm (marlin = 1), without the tensors. Returns a validation or device status. */
typedef struct w4a16_gemm_plan_info {
    char kernel[16]; /* "decode-8", "decode-16", "mma.sync", "wgmma", "staged", "rows-64", "rows-32", "rows-16",
                        "rows-16w" or "rows-32n" (the MoE kernel's 64 x 256, 32 x 128, 16 x 64, 16 x 128 and 32 x 64
                        tiles), "rows-128", "ws-64" or "ws-32" (the warp-specialised 128 x 256, 64 x 256 and 32 x 256
                        tiles) */
    int config;      /* tile config id (mma.sync or wgmma list, by kernel; rows-*: the tile's rows) */
    int stages, splits, grid[3], threads, smem_bytes;
    int blocks_per_sm;      /* resident blocks per SM the plan sized its K split for */
    int smem_blocks_per_sm; /* blocks the profile's SM holds by shared memory (mma.sync kernels; 0 otherwise) */
    int occupancy;          /* resident blocks per SM the device gives the kernel (0 for the staged path) */
    int carveout;           /* shared-memory carveout (percent) emulating the profile's SM, or -1 */
    char text[256];         /* the plan in one line */
} w4a16_gemm_plan_info;
W4A16_API w4a16_status w4a16_gemm_plan(int marlin, int M, int N, int K, int group_size, w4a16_dtype dtype,
                                       size_t workspace_bytes, w4a16_gemm_plan_info *info);

/* ---------------------------------------------------------------- pure AWQ path
 * Works on AutoAWQ "gemm" checkpoint tensors exactly as stored:
 *   qweight int32 [K, N/8], qzeros int32 [K/G, N/8]: 8 nibbles per word along N, nibble i holds
 *   column 8c + {0,2,4,6,1,3,5,7}[i]; scales [K/G, N] in dtype; W[k,n] = (q[k,n] - z[k/G,n]) * s[k/G,n].
 *
 * w4a16_awq_gemm: C[M,N] = A[M,K] * W (+ bias[N]); A, scales, bias, C in dtype; fp32 accumulation.
 * Preconditions: M >= 1; N a multiple of 64; K a multiple of 32 and of G; G in {32, 64, 128, -1};
 * A, C, qweight, scales 16-byte aligned, qzeros and bias 4-byte aligned; bias may be NULL;
 * workspace of at least w4a16_workspace_size() bytes, zeroed once (see above); may be NULL only when
 * workspace_bytes == 0 and then the call never splits K (slower at decode sizes).
 * Returns W4A16_OK once the kernel is enqueued; argument statuses (1-19) and device statuses
 * (20-39) as listed above; W4A16_ERR_LAUNCH_FAILED if the launch itself is rejected. */
W4A16_API w4a16_status w4a16_awq_gemm(const void *A, const int32_t *qweight, const void *scales, const int32_t *qzeros,
                                      const void *bias, void *C, int M, int N, int K, int group_size, w4a16_dtype dtype,
                                      void *workspace, size_t workspace_bytes, w4a16_stream_t stream);

/* w4a16_awq_dequantize: W[K,N] (dtype) = dequant(qweight, qzeros, scales).
 * Same shape rules and alignment as w4a16_awq_gemm (W 16-byte aligned). */
/* Options of the *_ex GEMM entry points (bit flags; other bits are rejected with W4A16_ERR_INVALID_VALUE).
 * W4A16_FLAG_REDUCE_IN_DTYPE: when K is split across blocks, round the partial sums to the output dtype before
 * adding them (vLLM's use_fp32_reduce = false): half the workspace traffic, slightly less accurate. The default
 * (flags = 0) adds fp32 partials, as the plain entry points do. Plans of kind "rows-64", "rows-32", "rows-16",
 * "rows-16w", "rows-32n" (the MoE kernel's tiles), "rows-128", "ws-64" and "ws-32" always add fp32 partials. */
#define W4A16_FLAG_REDUCE_IN_DTYPE 1u
/* W4A16_FLAG_PDL: launch with programmatic dependent launch (compute capability 9.0 and up; ignored below). The
 * GEMM may start while the previous kernel in the stream is still running: it loads its first weight tiles (weights,
 * scales, zero points) at once and waits for that kernel to finish before it reads A or the bias or writes C or the
 * workspace, and it lets the next kernel, if that one was launched the same way, start early in turn (after its own
 * main loop). Saved 1-3 us per GEMM on an H100 when GEMMs follow each other (docs/PERFORMANCE.md v18). The caller
 * promises that the weight tensors are not written by any kernel that can still be running when this call's kernel
 * starts: do not pass the flag on the first GEMM after the kernels that convert or load its weights unless a plain
 * launch, a synchronisation or an event wait lies in between (once the weights are loaded, as in serving, this
 * holds). Of the plans on the MoE launch's tiles only "rows-16" uses it; the others ("rows-64", "rows-32",
 * "rows-16w", "rows-32n", "rows-128", "ws-64", "ws-32") and the staged large-M path (sm_90) launch plainly. */
#define W4A16_FLAG_PDL 2u
W4A16_API w4a16_status w4a16_awq_gemm_ex(const void *A, const int32_t *qweight, const void *scales,
                                         const int32_t *qzeros, const void *bias, void *C, int M, int N, int K,
                                         int group_size, w4a16_dtype dtype, void *workspace, size_t workspace_bytes,
                                         unsigned flags, w4a16_stream_t stream);

W4A16_API w4a16_status w4a16_awq_dequantize(const int32_t *qweight, const void *scales, const int32_t *qzeros, void *W,
                                            int K, int N, int group_size, w4a16_dtype dtype, w4a16_stream_t stream);

/* ---------------------------------------------------------------- Marlin-layout path
 * The public Marlin layout (IST-DASLab Marlin, vLLM gptq_marlin / awq_marlin):
 *   weight int32 [K/16, 2N]; scales [K/G, N] permuted per row (chunks of 64 when grouped, of 32 when
 *   G = -1 or G = K); zero points (AWQ only) int32 [K/G, N/8] in Marlin order.
 * Converters run once at load time on the caller's stream; output equals vLLM's bit for bit.
 * Preconditions for all converters: N a multiple of 64, K a multiple of 16 (and of 8 for GPTQ,
 * of G for scales/zeros), 16-byte aligned tensors, in != out. */

/* AWQ qweight [K, N/8] -> Marlin weight [K/16, 2N]. */
W4A16_API w4a16_status w4a16_marlin_repack_awq(const int32_t *awq_qweight, int32_t *marlin_weight, int K, int N,
                                               w4a16_stream_t stream);
/* GPTQ qweight [K/8, N] (nibble i of row r holds k = 8r + i) -> Marlin weight [K/16, 2N].
 * perm (device int32 [K], may be NULL): act-order row permutation; row k of the result is source
 * row perm[k] (perm = argsort(g_idx)); perm[k] = -1 makes row k an empty (zero) row: see w4a16_act_order_plan. */
W4A16_API w4a16_status w4a16_marlin_repack_gptq(const int32_t *gptq_qweight, const int32_t *perm,
                                                int32_t *marlin_weight, int K, int N, w4a16_stream_t stream);
/* scales [K/G, N] -> Marlin order. */
W4A16_API w4a16_status w4a16_marlin_permute_scales(const void *scales, void *marlin_scales, int K, int N,
                                                   int group_size, w4a16_dtype dtype, w4a16_stream_t stream);
/* AWQ qzeros [K/G, N/8] -> Marlin zero points [K/G, N/8]. */
W4A16_API w4a16_status w4a16_marlin_awq_zero_points(const int32_t *awq_qzeros, int32_t *marlin_zeros, int K, int N,
                                                    int group_size, w4a16_stream_t stream);

/* Act-order GPTQ (desc_act), whole K (is_k_full): sort the rows by group once at load time, repack with the
 * permutation, and permute the activation columns the same way before each GEMM:
 *   w4a16_act_order_sort(g_idx, K, G, perm, sorted)          host, once      -> perm = stable argsort(g_idx)
 *   w4a16_marlin_repack_gptq(qweight, d_perm, ...)           device, once
 *   w4a16_permute_cols(A, d_perm, A_sorted, M, K, K, ...)    device, per call -> w4a16_marlin_gemm(A_sorted, ..., G)
 * After sorting, row k belongs to group k / G exactly when every group holds G rows, which is what a whole-K
 * checkpoint has; w4a16_act_order_sort checks it and returns W4A16_ERR_NOT_IMPLEMENTED otherwise.
 *
 * A row-parallel K shard (is_k_full = false) holds cut groups. w4a16_act_order_plan sorts its rows by group and pads
 * each group's run with empty rows (-1) to a multiple of 32, and the end to a multiple of 128, so that every
 * 32-row block lies in one group; the GEMM then runs with group size 32 on K_padded rows:
 *   w4a16_act_order_plan(g_idx, K, groups, NULL, 0, &Kp, NULL)  host: K_padded only (size the buffers)
 *   w4a16_act_order_plan(g_idx, K, groups, row_src, Kp, &Kp, block_group)        row_src [Kp], block_group [Kp/32]
 *   w4a16_marlin_repack_gptq(qweight, d_row_src, mweight, Kp, N, ...)   empty rows become zero weights
 *   w4a16_gather_rows(scales, groups, d_block_group, scales32, Kp/32, N, ...) then permute scales32 with G = 32
 *   w4a16_permute_cols(A, d_row_src, A_pad, M, K, Kp, ...)              per call; empty rows become zero columns
 *   w4a16_marlin_gemm(A_pad, mweight, mscales32, NULL, bias, C, M, N, Kp, 32, ...)
 * Padding costs at most 31 rows per group present in the shard, plus 127.
 * w4a16_act_order_sort: host arrays; g_idx [K] values in [0, K/G); perm and sorted_g_idx [K] outputs (sorted_g_idx
 * may be NULL). Returns W4A16_OK, W4A16_ERR_NULL_POINTER, W4A16_ERR_INVALID_SHAPE, W4A16_ERR_UNSUPPORTED_GROUP_SIZE,
 * W4A16_ERR_INVALID_VALUE (a g_idx value out of range) or W4A16_ERR_NOT_IMPLEMENTED (groups not whole). */
W4A16_API w4a16_status w4a16_act_order_sort(const int32_t *g_idx, int K, int group_size, int32_t *perm,
                                            int32_t *sorted_g_idx);
/* w4a16_act_order_plan: host arrays; g_idx [K] in [0, groups). Writes *K_padded always; row_src (capacity entries,
 * may be NULL) gets the source row of each padded row or -1, block_group (may be NULL) the group of each 32-row
 * block. Returns W4A16_ERR_NULL_POINTER, W4A16_ERR_INVALID_SHAPE, W4A16_ERR_INVALID_VALUE (g_idx out of range, or
 * capacity < *K_padded with row_src given) or W4A16_OK. */
W4A16_API w4a16_status w4a16_act_order_plan(const int32_t *g_idx, int K, int groups, int32_t *row_src, int capacity,
                                            int *K_padded, int32_t *block_group);
/* A_out[m, k] = perm[k] in [0, K_in) ? A[m, perm[k]] : 0 for k < K_out (device; A [M, K_in], A_out [M, K_out], both
 * 16-byte aligned and distinct; perm a device int32 [K_out]). */
W4A16_API w4a16_status w4a16_permute_cols(const void *A, const int32_t *perm, void *A_out, int M, int K_in, int K_out,
                                          w4a16_dtype dtype, w4a16_stream_t stream);
/* out[r, :] = idx[r] in [0, rows_in) ? in[idx[r], :] : 0 for r < rows_out (device; in [rows_in, cols], out
 * [rows_out, cols] in dtype, 16-byte aligned, distinct; idx a device int32 [rows_out]). */
W4A16_API w4a16_status w4a16_gather_rows(const void *in, int rows_in, const int32_t *idx, void *out, int rows_out,
                                         int cols, w4a16_dtype dtype, w4a16_stream_t stream);

/* w4a16_marlin_gemm: C[M,N] = A[M,K] * dequant(marlin_weight, marlin_scales[, marlin_zeros]) (+ bias).
 * marlin_zeros != NULL: weight type uint4 with zero points (AWQ): W = (q - z) * s.
 * marlin_zeros == NULL: symmetric uint4b8 (GPTQ): W = (q - 8) * s.
 * Preconditions: M >= 1; N a multiple of 64; K a multiple of 128 and of G; G in {32, 64, 128, -1};
 * alignment and workspace as for w4a16_awq_gemm.
 * Act-order GPTQ: see w4a16_act_order_sort above (whole K only). */
W4A16_API w4a16_status w4a16_marlin_gemm(const void *A, const int32_t *marlin_weight, const void *marlin_scales,
                                         const int32_t *marlin_zeros, const void *bias, void *C, int M, int N, int K,
                                         int group_size, w4a16_dtype dtype, void *workspace, size_t workspace_bytes,
                                         w4a16_stream_t stream);

/* w4a16_marlin_gemm with options (see W4A16_FLAG_REDUCE_IN_DTYPE). */
W4A16_API w4a16_status w4a16_marlin_gemm_ex(const void *A, const int32_t *marlin_weight, const void *marlin_scales,
                                            const int32_t *marlin_zeros, const void *bias, void *C, int M, int N, int K,
                                            int group_size, w4a16_dtype dtype, void *workspace, size_t workspace_bytes,
                                            unsigned flags, w4a16_stream_t stream);

/* ---------------------------------------------------------------- mixture of experts (MoE)
 * An MoE layer sends each token to top_k of E experts (topk_ids [T, top_k], int32 expert numbers) and sums the
 * experts' outputs weighted by topk_weights [T, top_k] (fp32). Entry i = t * top_k + k of the flattened topk_ids is
 * the pair (token t, its k-th expert). The grouped GEMMs below compute every pair's product with its expert's int4
 * weights in one launch, in blocks of `block_size` pairs of one expert:
 *
 *   w4a16_moe_align_sizes      host: the sizes of the routing buffers below
 *   w4a16_moe_align_block_size device: topk_ids -> sorted_ids, expert_ids, num_tokens_post_padded (vLLM's
 *                              moe_align_block_size): the pairs grouped by expert, each expert's run padded to a
 *                              multiple of block_size with the value T * top_k
 *   w4a16_moe_marlin_gemm / w4a16_moe_awq_gemm: C[T * top_k, N] = A[rows] * dequant(W[e]) for each block's expert e
 *
 * A first MoE GEMM (tokens x experts' gate/up weights) passes A = the tokens [T, K] with top_k: pair i reads A row
 * i / top_k. The second (the down projection) passes the first one's activated output [T * top_k, K'] as A with
 * M = T * top_k and top_k = 1 (pair i reads row i), usually with topk_weights, and the caller sums the top_k rows of
 * each token. Expert numbers outside [0, E) in topk_ids are dropped (expert parallelism: not this rank's expert):
 * their pairs appear in no block and their rows of C are not written.
 * Experts are stacked: W[e] is the e-th of E equal slices of each weight tensor ([E, ...] below). */

/* Routing buffer sizes for T tokens x top_k experts of num_experts, blocks of block_size (1..1024): sorted_ids needs
 * *sorted_capacity int32 entries (T * top_k + min(E, T * top_k) * (block_size - 1), rounded down to block_size) and
 * expert_ids *blocks_capacity = *sorted_capacity / block_size. Returns W4A16_ERR_NULL_POINTER, W4A16_ERR_INVALID_SHAPE
 * (a count < 1, num_experts > 2048, block_size out of range) or W4A16_ERR_SIZE_OVERFLOW (past 2^31 entries). */
W4A16_API w4a16_status w4a16_moe_align_sizes(int num_tokens, int top_k, int num_experts, int block_size,
                                             int *sorted_capacity, int *blocks_capacity);

/* Routing on the GPU (one small kernel; device buffers, 4-byte aligned): from topk_ids [num_tokens * top_k] writes
 * sorted_ids [sorted_capacity]: for each expert in turn, the indices i of its pairs (in no particular order inside
 * the expert's run), then the pad value num_tokens * top_k up to a multiple of block_size; every entry past the
 * runs holds the pad value too; expert_ids [blocks_capacity]: the expert of each block, -1 for blocks past the runs;
 * num_tokens_post_padded [1]: the length of the runs (a multiple of block_size). Capacities of at least
 * w4a16_moe_align_sizes()'s (larger ones, like vLLM's numel + E (block_size - 1), are fine; at most 2^31 - 1025).
 * Argument statuses as for w4a16_moe_align_sizes, W4A16_ERR_NULL_POINTER / _MISALIGNED for the buffers, and
 * W4A16_ERR_INVALID_SHAPE for capacities below the sizes. */
W4A16_API w4a16_status w4a16_moe_align_block_size(const int32_t *topk_ids, int num_tokens, int top_k, int num_experts,
                                                  int block_size, int32_t *sorted_ids, int sorted_capacity,
                                                  int32_t *expert_ids, int blocks_capacity,
                                                  int32_t *num_tokens_post_padded, w4a16_stream_t stream);

/* Grouped GEMM, Marlin layout (per expert as for w4a16_marlin_gemm): weight int32 [E, K/16, 2N], scales [E, K/G, N]
 * in dtype (Marlin-permuted), zeros int32 [E, K/G, N/8] (Marlin order; AWQ) or NULL (symmetric GPTQ, uint4b8).
 * For each block b < *num_tokens_post_padded / block_size with expert e = expert_ids[b] in [0, E), and each of its
 * block_size entries i = sorted_ids[b * block_size + r] < M * top_k:
 *   C[i, :] = (A[i / top_k, :] * dequant(W[e]) + bias[e, :]) * topk_weights[i]
 * A [M, K], C [M * top_k, N], bias [E, N] (dtype, may be NULL), topk_weights fp32 [M * top_k] (may be NULL: factor 1).
 * The routing buffers are those of w4a16_moe_align_block_size with the same block_size, which must be a multiple of
 * 8 up to 64 here; sorted_capacity / blocks_capacity are their sizes (blocks_capacity * block_size >= sorted_capacity).
 * Preconditions: M, top_k, E >= 1; N a multiple of 64; K a multiple of 64 and of G; G in {32, 64, 128, -1};
 * A, C, weight, scales, zeros 16-byte aligned, bias, topk_weights and the routing buffers 4-byte aligned.
 * workspace: at least w4a16_moe_workspace_size() bytes, 16-byte aligned, zeroed once after allocation (each call
 * leaves it zeroed again, so one workspace serves every MoE GEMM on the device and CUDA-graph replays; not shared by
 * calls that run concurrently); or NULL with workspace_bytes == 0, and then K is never split (slower at decode sizes).
 * W4A16_ERR_WORKSPACE_TOO_SMALL when 0 < workspace_bytes < that size; nothing is launched then.
 * Accumulates in fp32, deterministic: the same arguments give the same bits on every run. A row's result does not
 * depend on where its entry sits in sorted_ids; with a workspace, the K split (at most 16 parts, chosen from N, K,
 * block_size and sorted_capacity when block_size <= 16 and the blocks would leave most SMs idle) changes the order
 * of the fp32 additions, so rows may differ in the last bits between calls with different sizes. */
/* Bytes of the MoE GEMMs' split-K workspace on the current device (a few MB: per-tile counters and fp32 sums for
 * up to 8 blocks per SM). Returns W4A16_ERR_NULL_POINTER or a device status, and then writes nothing. */
W4A16_API w4a16_status w4a16_moe_workspace_size(size_t *bytes);

W4A16_API w4a16_status w4a16_moe_marlin_gemm(const void *A, const int32_t *weight, const void *scales,
                                             const int32_t *zeros, const void *bias, const float *topk_weights, void *C,
                                             const int32_t *sorted_ids, const int32_t *expert_ids,
                                             const int32_t *num_tokens_post_padded, int sorted_capacity,
                                             int blocks_capacity, int block_size, int M, int top_k, int num_experts,
                                             int N, int K, int group_size, w4a16_dtype dtype, void *workspace,
                                             size_t workspace_bytes, w4a16_stream_t stream);

/* w4a16_moe_gemm_plan: the launch a w4a16_moe_marlin_gemm (marlin = 1) or w4a16_moe_awq_gemm (marlin = 0) call with
 * these sizes makes on the current device (what W4A16_LOG=2 prints for every call), without the tensors: kernel
 * "moe-16" / "moe-32" / "moe-64" (rows per tile; the text names rows x channels, e.g. "16x256 tile": 16-row blocks run
 * 64, 128 or 256 channels by the number of blocks), stages, K splits, grid, shared memory, the resident blocks per SM
 * its K split is counted with (the kernel's occupancy, at most what the profile's SM holds by shared memory), the
 * blocks the device gives the kernel with its shared memory and carveout set as a launch sets them, and the carveout
 * emulating a forced profile's smaller SM (-1: none). Returns a validation or device status. */
W4A16_API w4a16_status w4a16_moe_gemm_plan(int marlin, int sorted_capacity, int block_size, int N, int K,
                                           int group_size, w4a16_dtype dtype, size_t workspace_bytes,
                                           w4a16_gemm_plan_info *info);

/* The same on AutoAWQ checkpoint tensors as stored, stacked: qweight [E, K, N/8], scales [E, K/G, N],
 * qzeros [E, K/G, N/8] (required). Same preconditions. */
W4A16_API w4a16_status w4a16_moe_awq_gemm(const void *A, const int32_t *qweight, const void *scales,
                                          const int32_t *qzeros, const void *bias, const float *topk_weights, void *C,
                                          const int32_t *sorted_ids, const int32_t *expert_ids,
                                          const int32_t *num_tokens_post_padded, int sorted_capacity,
                                          int blocks_capacity, int block_size, int M, int top_k, int num_experts, int N,
                                          int K, int group_size, w4a16_dtype dtype, void *workspace,
                                          size_t workspace_bytes, w4a16_stream_t stream);

/* Converters for stacked experts: the per-expert converters above applied to each of the E slices (same output bit
 * for bit, same preconditions per expert). perm (device int32 [E, K], may be NULL): act-order permutation per
 * expert. */
W4A16_API w4a16_status w4a16_moe_marlin_repack_awq(const int32_t *awq_qweight, int32_t *marlin_weight, int num_experts,
                                                   int K, int N, w4a16_stream_t stream);
W4A16_API w4a16_status w4a16_moe_marlin_repack_gptq(const int32_t *gptq_qweight, const int32_t *perm,
                                                    int32_t *marlin_weight, int num_experts, int K, int N,
                                                    w4a16_stream_t stream);
W4A16_API w4a16_status w4a16_moe_marlin_permute_scales(const void *scales, void *marlin_scales, int num_experts, int K,
                                                       int N, int group_size, w4a16_dtype dtype, w4a16_stream_t stream);
W4A16_API w4a16_status w4a16_moe_marlin_awq_zero_points(const int32_t *awq_qzeros, int32_t *marlin_zeros,
                                                        int num_experts, int K, int N, int group_size,
                                                        w4a16_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* W4A16_H */
