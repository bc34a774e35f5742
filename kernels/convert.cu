// Element-wise kernels (AWQ dequantisation, load-time Marlin converters) and the C-callable dispatch into the
// GEMM instances. The index maps here have plain-C twins in csrc/marlin_ref.c; tests compare them bit for bit.
#include "common.cuh"
#include "gemm.cuh"
#include "launch.h"
#include "marlin_index.h"
#ifdef W4A16_HAVE_WGMMA
#include "gemm_sm90_dense.cuh"
#endif

namespace w4a16 {
#define W4A16_DECL_(d, l)                                                                                   \
    cudaError_t launch_gemm_##d##_##l(const GemmArgs &, int, int, int, cudaStream_t);                      \
    cudaError_t probe_gemm_##d##_##l(int, cudaFuncAttributes *);
W4A16_DECL_(0, 0)
W4A16_DECL_(0, 1)
W4A16_DECL_(1, 0)
W4A16_DECL_(1, 1)
#undef W4A16_DECL_
#ifdef W4A16_HAVE_WGMMA
#define W4A16_DECL_(d, l)                                                                                   \
    int sm90_smem_bytes_##d##_##l(int);                                                                     \
    cudaError_t launch_gemm_sm90_##d##_##l(const GemmArgs &, int, int, cudaStream_t);                       \
    cudaError_t probe_gemm_sm90_##d##_##l(int, cudaFuncAttributes *);
W4A16_DECL_(0, 0)
W4A16_DECL_(0, 1)
W4A16_DECL_(1, 0)
W4A16_DECL_(1, 1)
#undef W4A16_DECL_
cudaError_t launch_dense_sm90_0_0(const DenseArgs &, cudaStream_t);
cudaError_t launch_dense_sm90_1_0(const DenseArgs &, cudaStream_t);
cudaError_t probe_dense_sm90_0_0(cudaFuncAttributes *);
cudaError_t probe_dense_sm90_1_0(cudaFuncAttributes *);
int dense_smem_bytes_0_0();
int dense_smem_bytes_1_0();
#endif

// ---- AWQ dequantisation: one thread per packed word -> 8 adjacent outputs (one 16-byte store).
template <typename T>
__global__ void awq_dequant_kernel(const uint32_t *__restrict__ qw, const T *__restrict__ s,
                                   const uint32_t *__restrict__ qz, T *__restrict__ W, int K, int N, int G) {
    const int words = N / 8;
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)K * words) return;
    const int k = (int)(idx / words), c = (int)(idx % words), g = k / G;
    const uint4 sv = *reinterpret_cast<const uint4 *>(s + (size_t)g * N + 8 * c); // 16-byte aligned: N % 64 == 0
    *reinterpret_cast<uint4 *>(W + (size_t)k * N + 8 * c) = awq_dequant_word<T>(qw[idx], qz[(size_t)g * words + c], sv);
}

// The staged path's dequantisers finish alike: a shared tile of 64 channel rows x 64 k (32 words per row, PITCH apart)
// goes to rows blockIdx.y * 64 .. + 63 of Wt [*, K] at k0, as 128-byte row segments (k past K skipped: the AWQ tail).
template <int PITCH, typename T>
__device__ __forceinline__ void store_wt_tile(const uint32_t *tile, T *Wt, int K, int k0, int t) {
    uint32_t *out = reinterpret_cast<uint32_t *>(Wt);
    const size_t row0 = (size_t)blockIdx.y * 64;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int idx = t + 256 * j, n = idx / 32, w = idx % 32;
        if (k0 + 2 * w < K) out[(row0 + n) * (K / 2) + k0 / 2 + w] = tile[n * PITCH + w];
    }
}

// ---- AWQ dequantisation, transposed, for the staged path: Wt[n - n0, k] for channels n0 .. n0 + nc - 1. A warp
// takes 32 k x 64 channels (8 word columns); lane: word column lane % 8, rows 8 (lane / 8) .. + 7, all in one group
// (G >= 32 and a multiple of 32). It dequantises its 8 words as awq_dequant_kernel does (column pairs), regroups them by
// column (prmt: rows 2i, 2i + 1 of a column in one word), and stores 16 bytes per channel: the 4 lanes of a word column
// fill 64 contiguous bytes of each channel row. No shared memory. K % 32 == 0 (AWQ): every 32-row task is whole.
template <typename T>
__global__ void __launch_bounds__(256) awq_dequant_t_kernel(const uint32_t *__restrict__ qw, const T *__restrict__ s,
                                                            const uint32_t *__restrict__ qz, T *__restrict__ Wt, int K,
                                                            int N, int G, int n0, int nc) {
    const int lane = threadIdx.x % 32, kts = K / 32;
    const long long task = (long long)blockIdx.x * 8 + threadIdx.x / 32; // k tiles of a channel block consecutive
    if (task >= (long long)kts * (nc / 64)) return;
    const int cb = (int)(task / kts), k = (int)(task % kts) * 32 + 8 * (lane / 8), words = N / 8;
    const int c = (n0 + 64 * cb) / 8 + lane % 8, g = k / G; // packed word column (8 channels); group
    const uint32_t z = qz[(size_t)g * words + c];
    const uint4 sv = *reinterpret_cast<const uint4 *>(s + (size_t)g * N + 8 * c);
    uint4 v[8];
#pragma unroll
    for (int r = 0; r < 8; r++) v[r] = awq_dequant_word<T>(qw[(size_t)(k + r) * words + c], z, sv);
    T *out = Wt + (size_t)(64 * cb + 8 * (lane % 8)) * K + k;
#pragma unroll
    for (int j = 0; j < 4; j++) { // column pair j: columns 2j (low halves) and 2j + 1 (high halves)
        uint32_t lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t a = (&v[2 * i].x)[j], b = (&v[2 * i + 1].x)[j];
            lo[i] = prmt(a, b, 0x5410);
            hi[i] = prmt(a, b, 0x7632);
        }
        *reinterpret_cast<uint4 *>(out + (size_t)(2 * j) * K) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        *reinterpret_cast<uint4 *>(out + (size_t)(2 * j + 1) * K) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    }
}

// ---- Marlin-layout dequantisation, transposed, for the staged path: Wt[n - n0, k] for channels n0 .. n0 + nc - 1
// (n0 a multiple of 64). A block takes 4 rows of 16 k (64 k) of one 64-column chunk: 512 Marlin words, two per
// thread. The index map of the format (w4a16_marlin_source) puts a word's 8 nibbles in 2 columns (blocks) x 4 k rows
// of one 16-row tile, so one group: a word needs 2 scales and 2 zero points, staged in shared memory per block as
// floats (GPTQ without zero points: uint4b8, zero 8). Values go as 16-bit entries into a shared tile of 64 channel
// rows (pitch 36 words: the 8 columns x 4 k-pairs a warp writes fall in 32 distinct banks), then out as 128-byte row
// segments of Wt. Each value is (q - z) * s rounded once, as the fused kernel computes it. K % 128 == 0: no tail.
template <typename T>
__global__ void __launch_bounds__(256) marlin_dequant_t_kernel(const uint32_t *__restrict__ mw, const T *__restrict__ s,
                                                               const uint32_t *__restrict__ mz, T *__restrict__ Wt,
                                                               int K, int N, int gshift, int channelwise, int n0) {
    constexpr int PITCH = 36; // words per channel row of the tile
    __shared__ uint32_t tile[64 * PITCH];
    __shared__ float sc[2][64], zs[2][64]; // the block's (at most two, G >= 32) groups x 64 columns: scale, zero * scale
    uint16_t *tile16 = reinterpret_cast<uint16_t *>(tile);
    const int t = threadIdx.x, k0 = blockIdx.x * 64, chunk = (n0 / 64) + blockIdx.y, g0 = k0 >> gshift;
    const int g_last = (K - 1) >> gshift;
    if (t < 128) {
        const int gl = t / 64, n = 64 * chunk + t % 64, g = min(g0 + gl, g_last), p = w4a16_marlin_scale_pos(n, 0);
        const float v = Dtype<T>::to_float(s[(size_t)g * N + w4a16_marlin_scale_pos(n, channelwise)]);
        const int z = mz ? (int)((mz[(size_t)g * (N / 8) + p / 8] >> (4 * w4a16_awq_reverse(p % 8))) & 0xF) : 8;
        sc[gl][t % 64] = v;
        zs[gl][t % 64] = (float)z * v;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < 2; r++) {
        // word u = 4 lane + j of row kt (w4a16_marlin_source): a warp takes one j and 32 lanes
        const int idx = t + 256 * r, kt = k0 / 16 + idx / 128, j = (idx % 128) / 32, lane = idx % 32;
        const uint32_t word = mw[(size_t)kt * (2 * N) + 128 * chunk + 4 * lane + j];
        const int q = lane % 4, kb = 16 * kt + 2 * q - k0, cb = 16 * j + lane / 4, gl = ((16 * kt) >> gshift) - g0;
        const float s0 = sc[gl][cb], z0 = zs[gl][cb], s1 = sc[gl][cb + 8], z1 = zs[gl][cb + 8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int e = w4a16_awq_order(i), blk = e / 4, ri = e % 4; // as w4a16_marlin_source
            const int kl = kb + (ri & 1) + 8 * (ri >> 1), c = cb + 8 * blk;
            const float qv = (float)((word >> (4 * i)) & 0xF);
            const T v = Dtype<T>::from_float(blk ? qv * s1 - z1 : qv * s0 - z0);
            tile16[c * (2 * PITCH) + kl] = *reinterpret_cast<const uint16_t *>(&v);
        }
    }
    __syncthreads();
    store_wt_tile<PITCH>(tile, Wt, K, k0, t);
}

// ---- Marlin weight: one thread per output word; index maps in marlin_index.h.
__global__ void repack_kernel(const int32_t *__restrict__ in, const int32_t *__restrict__ perm,
                              uint32_t *__restrict__ out, int K, int N, int is_gptq) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)(K / 16) * 2 * N) return;
    out[idx] = w4a16_marlin_word(in, perm, (int)(idx / (2 * N)), (int)(idx % (2 * N)), N, is_gptq);
}

// ---- scales and zero points: index maps in marlin_index.h.
__global__ void permute_scales_kernel(const uint16_t *__restrict__ in, uint16_t *__restrict__ out, int rows, int N,
                                      int channelwise) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)rows * N) return;
    int g = (int)(idx / N), pos = (int)(idx % N);
    out[idx] = in[(size_t)g * N + w4a16_marlin_scale_source(pos, channelwise)];
}

__global__ void awq_zero_points_kernel(const int32_t *__restrict__ in, uint32_t *__restrict__ out, int rows, int N) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int words = N / 8;
    if (idx >= (long long)rows * words) return;
    int g = (int)(idx / words), w = (int)(idx % words);
    uint32_t res = 0;
#pragma unroll
    for (int t = 0; t < 8; t++) res |= w4a16_source_nibble(in, nullptr, g, w4a16_marlin_zero_source(w, t), N, 0) << (4 * t);
    out[idx] = res;
}

// ---- act-order: A_out[m, k] = A[m, perm[k]] (0 for empty rows), one 16-bit element per thread.
__global__ void permute_cols_kernel(const uint16_t *__restrict__ A, const int32_t *__restrict__ perm,
                                    uint16_t *__restrict__ out, int M, int K_in, int K_out) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)M * K_out) return;
    long long m = idx / K_out;
    int src = perm[idx % K_out];
    out[idx] = src >= 0 && src < K_in ? A[m * K_in + src] : (uint16_t)0;
}

// ---- out[r, :] = in[idx[r], :] (0 for idx outside [0, rows_in)): the scale rows of act-order's 32-row blocks.
__global__ void gather_rows_kernel(const uint16_t *__restrict__ in, int rows_in, const int32_t *__restrict__ idx,
                                   uint16_t *__restrict__ out, int rows_out, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows_out * cols) return;
    int src = idx[i / cols];
    out[i] = src >= 0 && src < rows_in ? in[(long long)src * cols + i % cols] : (uint16_t)0;
}

static unsigned blocks_for(long long n, int threads) { return (unsigned)((n + threads - 1) / threads); }

} // namespace w4a16

using namespace w4a16;

extern "C" int w4a16_launch_gemm(const w4a16_gemm_launch *a) {
    GemmArgs g;
    g.A = a->A;
    g.B = static_cast<const uint32_t *>(a->B);
    g.scales = a->scales;
    g.zeros = static_cast<const uint32_t *>(a->zeros);
    g.bias = a->bias;
    g.C = a->C;
    g.M = a->M; g.N = a->N; g.K = a->K;
    g.gshift = a->gshift;
    g.stages = a->stages;
    g.counters = static_cast<int *>(a->counters);
    g.partials = static_cast<float4 *>(a->partials);
    g.marlin_channelwise = a->marlin_channelwise;
    g.reduce_dtype = a->reduce_dtype;
    cudaStream_t s = static_cast<cudaStream_t>(a->stream);
    const int which = a->dtype * 2 + a->layout;
    if (a->wgmma) {
#ifdef W4A16_HAVE_WGMMA
        switch (which) {
        case 0: return launch_gemm_sm90_0_0(g, a->wgmma - 1, a->splits, s);
        case 1: return launch_gemm_sm90_0_1(g, a->wgmma - 1, a->splits, s);
        case 2: return launch_gemm_sm90_1_0(g, a->wgmma - 1, a->splits, s);
        case 3: return launch_gemm_sm90_1_1(g, a->wgmma - 1, a->splits, s);
        }
#endif
        return cudaErrorInvalidDeviceFunction;
    }
    switch (which) {
    case 0: return launch_gemm_0_0(g, a->cfg, a->splits, a->smem_bytes, s);
    case 1: return launch_gemm_0_1(g, a->cfg, a->splits, a->smem_bytes, s);
    case 2: return launch_gemm_1_0(g, a->cfg, a->splits, a->smem_bytes, s);
    case 3: return launch_gemm_1_1(g, a->cfg, a->splits, a->smem_bytes, s);
    }
    return cudaErrorInvalidValue;
}

extern "C" int w4a16_probe_gemm(int dtype, int layout, int cfg, int *binary_version) {
    cudaFuncAttributes attr;
    cudaError_t e = cudaErrorInvalidValue;
    switch (dtype * 2 + layout) {
    case 0: e = probe_gemm_0_0(cfg, &attr); break;
    case 1: e = probe_gemm_0_1(cfg, &attr); break;
    case 2: e = probe_gemm_1_0(cfg, &attr); break;
    case 3: e = probe_gemm_1_1(cfg, &attr); break;
    }
    if (e == cudaSuccess && binary_version) *binary_version = attr.binaryVersion;
    return e;
}

extern "C" int w4a16_probe_gemm_wgmma(void) {
#ifdef W4A16_HAVE_WGMMA
    cudaFuncAttributes attr;
    cudaError_t e = cudaSuccess;
    for (int id = 0; id < W4A16_NUM_WGMMA_CONFIGS && e == cudaSuccess; id++) {
        if (e == cudaSuccess) e = probe_gemm_sm90_0_0(id, &attr);
        if (e == cudaSuccess) e = probe_gemm_sm90_0_1(id, &attr);
        if (e == cudaSuccess) e = probe_gemm_sm90_1_0(id, &attr);
        if (e == cudaSuccess) e = probe_gemm_sm90_1_1(id, &attr);
    }
    if (e == cudaSuccess) e = probe_dense_sm90_0_0(&attr); // the staged path's dense GEMM
    if (e == cudaSuccess) e = probe_dense_sm90_1_0(&attr);
    return e;
#else
    return cudaErrorInvalidDeviceFunction;
#endif
}

extern "C" int w4a16_gemm_wgmma_smem_bytes(void) {
    int r = 0;
#ifdef W4A16_HAVE_WGMMA
    for (int id = 0; id < W4A16_NUM_WGMMA_CONFIGS; id++) {
        int a = sm90_smem_bytes_0_0(id), b = sm90_smem_bytes_0_1(id);
        r = a > r ? a : r;
        r = b > r ? b : r;
    }
    r = dense_smem_bytes_0_0() > r ? dense_smem_bytes_0_0() : r;
#endif
    return r;
}

extern "C" int w4a16_launch_awq_dequant(const int32_t *qweight, const void *scales, const int32_t *qzeros, void *W,
                                        int K, int N, int G, int dtype, void *stream) {
    long long n = (long long)K * (N / 8);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const uint32_t *qw = reinterpret_cast<const uint32_t *>(qweight), *qz = reinterpret_cast<const uint32_t *>(qzeros);
    if (dtype == 0)
        awq_dequant_kernel<__half><<<blocks_for(n, 256), 256, 0, s>>>(qw, static_cast<const __half *>(scales), qz,
                                                                      static_cast<__half *>(W), K, N, G);
    else
        awq_dequant_kernel<__nv_bfloat16><<<blocks_for(n, 256), 256, 0, s>>>(
            qw, static_cast<const __nv_bfloat16 *>(scales), qz, static_cast<__nv_bfloat16 *>(W), K, N, G);
    return cudaGetLastError();
}

extern "C" int w4a16_launch_awq_dequant_t(const int32_t *qweight, const void *scales, const int32_t *qzeros,
                                          void *Wt, int K, int N, int G, int n0, int nc, int dtype, void *stream) {
    const unsigned blocks = blocks_for((long long)(K / 32) * (nc / 64), 8); // 8 warp tasks per block
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const uint32_t *qw = reinterpret_cast<const uint32_t *>(qweight), *qz = reinterpret_cast<const uint32_t *>(qzeros);
    if (dtype == 0)
        awq_dequant_t_kernel<__half><<<blocks, 256, 0, st>>>(qw, static_cast<const __half *>(scales), qz,
                                                             static_cast<__half *>(Wt), K, N, G, n0, nc);
    else
        awq_dequant_t_kernel<__nv_bfloat16><<<blocks, 256, 0, st>>>(qw, static_cast<const __nv_bfloat16 *>(scales),
                                                                    qz, static_cast<__nv_bfloat16 *>(Wt), K, N, G, n0,
                                                                    nc);
    return cudaGetLastError();
}

extern "C" int w4a16_launch_marlin_dequant_t(const int32_t *weight, const void *scales, const int32_t *zeros, void *Wt,
                                             int K, int N, int gshift, int channelwise, int n0, int nc, int dtype,
                                             void *stream) {
    dim3 grid(K / 64, nc / 64);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const uint32_t *w = reinterpret_cast<const uint32_t *>(weight), *z = reinterpret_cast<const uint32_t *>(zeros);
    if (dtype == 0)
        marlin_dequant_t_kernel<__half><<<grid, 256, 0, st>>>(w, static_cast<const __half *>(scales), z,
                                                              static_cast<__half *>(Wt), K, N, gshift, channelwise, n0);
    else
        marlin_dequant_t_kernel<__nv_bfloat16><<<grid, 256, 0, st>>>(w, static_cast<const __nv_bfloat16 *>(scales), z,
                                                                     static_cast<__nv_bfloat16 *>(Wt), K, N, gshift,
                                                                     channelwise, n0);
    return cudaGetLastError();
}

extern "C" int w4a16_launch_dense_gemm(const void *A, const void *Wt, const void *bias, void *C, int M, int nc, int K,
                                       int ldc, int dtype, void *stream) {
#ifdef W4A16_HAVE_WGMMA
    DenseArgs d;
    d.A = A; d.W = Wt; d.bias = bias; d.C = C;
    d.M = M; d.N = nc; d.K = K; d.ldc = ldc;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return dtype == 0 ? launch_dense_sm90_0_0(d, s) : launch_dense_sm90_1_0(d, s);
#else
    (void)A; (void)Wt; (void)bias; (void)C; (void)M; (void)nc; (void)K; (void)ldc; (void)dtype; (void)stream;
    return cudaErrorInvalidDeviceFunction;
#endif
}

extern "C" int w4a16_launch_repack_awq(const int32_t *in, int32_t *out, int K, int N, void *stream) {
    long long n = (long long)(K / 16) * 2 * N;
    repack_kernel<<<blocks_for(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        in, nullptr, reinterpret_cast<uint32_t *>(out), K, N, 0);
    return cudaGetLastError();
}

extern "C" int w4a16_launch_repack_gptq(const int32_t *in, const int32_t *perm, int32_t *out, int K, int N,
                                        void *stream) {
    long long n = (long long)(K / 16) * 2 * N;
    repack_kernel<<<blocks_for(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        in, perm, reinterpret_cast<uint32_t *>(out), K, N, 1);
    return cudaGetLastError();
}

extern "C" int w4a16_launch_permute_scales(const void *in, void *out, int rows, int N, int channelwise, void *stream) {
    long long n = (long long)rows * N;
    permute_scales_kernel<<<blocks_for(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const uint16_t *>(in), static_cast<uint16_t *>(out), rows, N, channelwise);
    return cudaGetLastError();
}

extern "C" int w4a16_launch_permute_cols(const void *A, const int32_t *perm, void *out, int M, int K_in, int K_out,
                                         void *stream) {
    long long n = (long long)M * K_out;
    permute_cols_kernel<<<blocks_for(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const uint16_t *>(A), perm, static_cast<uint16_t *>(out), M, K_in, K_out);
    return cudaGetLastError();
}

extern "C" int w4a16_launch_gather_rows(const void *in, int rows_in, const int32_t *idx, void *out, int rows_out,
                                        int cols, void *stream) {
    long long n = (long long)rows_out * cols;
    gather_rows_kernel<<<blocks_for(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const uint16_t *>(in), rows_in, idx, static_cast<uint16_t *>(out), rows_out, cols);
    return cudaGetLastError();
}

extern "C" int w4a16_launch_awq_zero_points(const int32_t *in, int32_t *out, int rows, int N, void *stream) {
    long long n = (long long)rows * (N / 8);
    awq_zero_points_kernel<<<blocks_for(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        in, reinterpret_cast<uint32_t *>(out), rows, N);
    return cudaGetLastError();
}
