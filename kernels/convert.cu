// Element-wise kernels: AWQ dequantisation (also transposed, for the staged path) and the load-time Marlin
// converters. The index maps here have plain-C twins in tests/ref/marlin_ref.c; tests compare them bit for bit.
#include "common.cuh"
#include "launch.h"
#include "marlin_index.h"

namespace w4a16 {

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

// ---- AWQ dequantisation, transposed, for the staged path: Wt[n - n0, k] for channels n0 .. n0 + nc - 1. A warp
// takes 32 k x 64 channels (8 word columns); lane: word column lane % 8, rows 8 (lane / 8) .. + 7, all in one group
// (G >= 32 and a multiple of 32). It dequantises its 8 words as awq_dequant_kernel does (column pairs), regroups them
// by column (prmt: rows 2i, 2i + 1 of a column in one word), and stores 16 bytes per channel: the 4 lanes of a word
// column fill 64 contiguous bytes of each channel row. No shared memory. K % 32 == 0 (AWQ): every 32-row task is whole.
template <typename T>
__global__ void __launch_bounds__(256)
    awq_dequant_t_kernel(const uint32_t *__restrict__ qw, const T *__restrict__ s, const uint32_t *__restrict__ qz,
                         T *__restrict__ Wt, int K, int N, int G, int n0, int nc) {
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
// (n0 a multiple of 64). The format (w4a16_marlin_source) puts word u = 16 l + 4 q + j of a 16-row tile's 64-column
// chunk (128 words) in columns 16 j + l and 16 j + l + 8, rows 2q, 2q + 1 (nibbles 0, 4 and 2, 6) and 2q + 8, 2q + 9
// (nibbles 1, 5 and 3, 7): each nibble pair at bits 4i, 4i + 16 is a k pair of one column, which dq_lo dequantises as
// the fused kernel does. So a thread reads the 16 consecutive words of one l (64 bytes) and owns 8 whole columns
// (l, l + 8, ..., l + 56) x 16 k of the tile: per column 8 k pairs, 32 bytes, stored as two 16-byte chunks after a
// shuffle (below). A warp task is 4 tiles (64 k, lane / 8) x one 64-column chunk, all in one group (G >= 32).
// K % 128 == 0 (Marlin): every task is whole.
template <typename T>
__global__ void __launch_bounds__(256)
    marlin_dequant_t_kernel(const uint32_t *__restrict__ mw, const T *__restrict__ s, const uint32_t *__restrict__ mz,
                            T *__restrict__ Wt, int K, int N, int gshift, int channelwise, int n0, int nc) {
    const int lane = threadIdx.x % 32, l = lane % 8, kts = K / 64;
    const long long task = (long long)blockIdx.x * 8 + threadIdx.x / 32; // k of one chunk consecutive
    if (task >= (long long)kts * (nc / 64)) return;
    const int cr = (int)(task / kts), kt = (int)(task % kts) * 4 + lane / 8, chunk = n0 / 64 + cr,
              g = (16 * kt) >> gshift;
    const uint4 *src = reinterpret_cast<const uint4 *>(mw + (size_t)kt * (2 * N) + 128 * chunk + 16 * l);
    uint32_t wd[16]; // word 4 q + j
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint4 v = src[i];
        wd[4 * i] = v.x;
        wd[4 * i + 1] = v.y;
        wd[4 * i + 2] = v.z;
        wd[4 * i + 3] = v.w;
    }
    const uint16_t *s16 = reinterpret_cast<const uint16_t *>(s);
    const int t = lane / 8, src_a = l + 8 * (t / 2);     // this lane's tile of the task; the lane holding chunk t
    T *out = Wt + (size_t)(64 * cr) * K + 16 * (kt - t); // the task's first k
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) { // column 16 j + l + 8 h: nibble pairs 2h (rows 2q, 2q + 1), 2h + 1 (+ 8)
            const int col = 16 * j + l + 8 * h, n = 64 * chunk + col, p = w4a16_marlin_scale_pos(n, 0);
            const uint32_t z = mz ? (mz[(size_t)g * (N / 8) + p / 8] >> (4 * w4a16_awq_reverse(p % 8))) & 0xF : 8;
            const GroupConst<T> gc = make_group_const_bits<T>(
                prmt(s16[(size_t)g * N + w4a16_marlin_scale_pos(n, channelwise)], 0u, 0x1010u), z);
            uint32_t pr[8];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                pr[q] = dq_lo<T>(wd[4 * q + j] >> (8 * h), gc);
                pr[4 + q] = dq_lo<T>(wd[4 * q + j] >> (8 * h + 4), gc);
            }
            // The task's 4 tiles of this column are 8 chunks of 8 k (16 bytes); the lane of tile t (same l) holds
            // chunks 2t, 2t + 1. So that one store instruction of those 4 lanes fills 64 contiguous bytes, it stores
            // chunks t and 4 + t, which the lanes of tiles t / 2 and 2 + t / 2 hold (as their chunk t % 2): half the
            // write requests of storing its own two.
            uint32_t ca[4], cb[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint32_t a0 = __shfl_sync(0xffffffffu, pr[i], src_a),
                               a1 = __shfl_sync(0xffffffffu, pr[4 + i], src_a);
                const uint32_t b0 = __shfl_sync(0xffffffffu, pr[i], src_a + 16),
                               b1 = __shfl_sync(0xffffffffu, pr[4 + i], src_a + 16);
                ca[i] = t & 1 ? a1 : a0;
                cb[i] = t & 1 ? b1 : b0;
            }
            uint4 *dst = reinterpret_cast<uint4 *>(out + (size_t)col * K);
            dst[t] = make_uint4(ca[0], ca[1], ca[2], ca[3]);
            dst[4 + t] = make_uint4(cb[0], cb[1], cb[2], cb[3]);
        }
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
    for (int t = 0; t < 8; t++)
        res |= w4a16_source_nibble(in, nullptr, g, w4a16_marlin_zero_source(w, t), N, 0) << (4 * t);
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

extern "C" int w4a16_launch_awq_dequant_t(const int32_t *qweight, const void *scales, const int32_t *qzeros, void *Wt,
                                          int K, int N, int G, int n0, int nc, int dtype, void *stream) {
    const unsigned blocks = blocks_for((long long)(K / 32) * (nc / 64), 8); // 8 warp tasks per block
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const uint32_t *qw = reinterpret_cast<const uint32_t *>(qweight), *qz = reinterpret_cast<const uint32_t *>(qzeros);
    if (dtype == 0)
        awq_dequant_t_kernel<__half><<<blocks, 256, 0, st>>>(qw, static_cast<const __half *>(scales), qz,
                                                             static_cast<__half *>(Wt), K, N, G, n0, nc);
    else
        awq_dequant_t_kernel<__nv_bfloat16><<<blocks, 256, 0, st>>>(qw, static_cast<const __nv_bfloat16 *>(scales), qz,
                                                                    static_cast<__nv_bfloat16 *>(Wt), K, N, G, n0, nc);
    return cudaGetLastError();
}

extern "C" int w4a16_launch_marlin_dequant_t(const int32_t *weight, const void *scales, const int32_t *zeros, void *Wt,
                                             int K, int N, int gshift, int channelwise, int n0, int nc, int dtype,
                                             void *stream) {
    const unsigned blocks = blocks_for((long long)(K / 64) * (nc / 64), 8); // 8 warp tasks per block
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const uint32_t *w = reinterpret_cast<const uint32_t *>(weight), *z = reinterpret_cast<const uint32_t *>(zeros);
    if (dtype == 0)
        marlin_dequant_t_kernel<__half><<<blocks, 256, 0, st>>>(
            w, static_cast<const __half *>(scales), z, static_cast<__half *>(Wt), K, N, gshift, channelwise, n0, nc);
    else
        marlin_dequant_t_kernel<__nv_bfloat16><<<blocks, 256, 0, st>>>(w, static_cast<const __nv_bfloat16 *>(scales), z,
                                                                       static_cast<__nv_bfloat16 *>(Wt), K, N, gshift,
                                                                       channelwise, n0, nc);
    return cudaGetLastError();
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
