// The C-callable GEMM entry points: the kernel a host plan (csrc/plan.c) names, launched with the plan's grid,
// threads and shared memory, in the instance of its (dtype, layout) pair (kernels/instances.h); probes of the images.
#include <atomic>

#include "gemm.cuh"
#include "instances.h"
#include "launch.h"
#ifdef W4A16_HAVE_WGMMA
#include "gemm_sm90_dense.cuh"
#endif

namespace w4a16 {
#define W4A16_DECL_(d, l) GemmKernelRef gemm_kernel_##d##_##l(int kind, int cfg, int stages);
W4A16_GEMM_INSTANCES(W4A16_DECL_)
#undef W4A16_DECL_
#ifdef W4A16_HAVE_WGMMA
#define W4A16_DECL_(d, l) GemmKernelRef gemm_sm90_kernel_##d##_##l(int id, int sk);
W4A16_GEMM_INSTANCES(W4A16_DECL_)
#undef W4A16_DECL_
cudaError_t launch_dense_sm90_0_0(const DenseArgs &, int, cudaStream_t);
cudaError_t launch_dense_sm90_1_0(const DenseArgs &, int, cudaStream_t);
cudaError_t probe_dense_sm90_0_0(cudaFuncAttributes *);
cudaError_t probe_dense_sm90_1_0(cudaFuncAttributes *);
int dense_smem_bytes_0_0();
int dense_smem_bytes_1_0();
#define W4A16_SM90_KERNEL_(d, l, id, sk) gemm_sm90_kernel_##d##_##l(id, sk)
#else
#define W4A16_SM90_KERNEL_(d, l, id, sk)                                                                               \
    GemmKernelRef {}
#endif

// The compiled kernel of (kind, cfg, stages) for a (dtype, layout) pair; no kernel (fn null) for a combination never
// built (stages matters to the tile kernel only; sk, the stream-K instance, to the wgmma kernel only).
static GemmKernelRef find_kernel(int dtype, int layout, int kind, int cfg, int stages, int sk = 0) {
#define W4A16_PICK_(d, l)                                                                                              \
    if (dtype == d && layout == l)                                                                                     \
        return kind == W4A16_KERNEL_WGMMA ? W4A16_SM90_KERNEL_(d, l, cfg, sk)                                          \
                                          : gemm_kernel_##d##_##l(kind, cfg, stages);
    W4A16_GEMM_INSTANCES(W4A16_PICK_)
#undef W4A16_PICK_
    return {};
}

// Once any plan emulated a smaller SM by a shared-memory carveout, every later launch sets its own (the default when
// none) so that a kernel does not keep an earlier profile's carveout.
static std::atomic<bool> carveout_used{false};
} // namespace w4a16

extern "C" int w4a16_set_kernel_smem(const void *fn, int smem_bytes, int carveout) {
    cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (e == cudaSuccess && (carveout >= 0 || w4a16::carveout_used.load(std::memory_order_relaxed))) {
        w4a16::carveout_used.store(true, std::memory_order_relaxed);
        e = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 carveout >= 0 ? carveout : (int)cudaSharedmemCarveoutDefault);
    }
    return e;
}

namespace w4a16 {

// The plan's kernel with its dynamic shared memory and carveout set, as the launch and the occupancy query need it.
static cudaError_t prepare(const w4a16_gemm_launch *a, GemmKernelRef *k, int *smem) {
    const w4a16_plan &p = a->plan;
    *k = find_kernel(a->dtype, a->layout, p.kind, p.cfg, p.stages, p.sk_blocks > 0);
    if (!k->fn) return p.kind == W4A16_KERNEL_WGMMA ? cudaErrorInvalidDeviceFunction : cudaErrorInvalidValue;
    if (k->threads != p.threads) return cudaErrorInvalidValue; // the plan and the compiled kernel disagree
    *smem = k->smem_bytes ? k->smem_bytes : p.smem_bytes;
    return (cudaError_t)w4a16_set_kernel_smem((const void *)k->fn, *smem, p.carveout);
}
} // namespace w4a16

using namespace w4a16;

// Launches with programmatic stream serialization when args.pdl (W4A16_FLAG_PDL on a device that has it).
extern "C" int w4a16_launch_gemm(const w4a16_gemm_launch *a) {
    GemmKernelRef k;
    int smem = 0;
    cudaError_t e = prepare(a, &k, &smem);
    if (e != cudaSuccess) return e;
    const w4a16_plan &p = a->plan;
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(p.grid[0], p.grid[1], p.grid[2]);
    c.blockDim = dim3(p.threads);
    c.dynamicSmemBytes = smem;
    c.stream = static_cast<cudaStream_t>(a->stream);
    cudaLaunchAttribute at;
    set_pdl(c, at, a->args.pdl);
    return cudaLaunchKernelEx(&c, k.fn, a->args);
}

extern "C" int w4a16_gemm_occupancy(const w4a16_gemm_launch *a, int *blocks_per_sm) {
    GemmKernelRef k;
    int smem = 0;
    cudaError_t e = prepare(a, &k, &smem);
    if (e != cudaSuccess) return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, k.fn, a->plan.threads, smem);
}

extern "C" int w4a16_probe_gemm(int dtype, int layout, int cfg, int *binary_version) {
    GemmKernelRef k = find_kernel(dtype, layout, W4A16_KERNEL_DECODE8, cfg, 0);
    if (!k.fn) k = find_kernel(dtype, layout, W4A16_KERNEL_MMA, cfg, w4a16_tile_min_stages(cfg));
    if (!k.fn) return cudaErrorInvalidValue;
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, k.fn);
    if (e == cudaSuccess && binary_version) *binary_version = attr.binaryVersion;
    return e;
}

extern "C" int w4a16_probe_gemm_wgmma(void) {
#ifdef W4A16_HAVE_WGMMA
    cudaFuncAttributes attr;
    cudaError_t e = cudaSuccess;
    for (int id = 0; id < W4A16_NUM_WGMMA_CONFIGS && e == cudaSuccess; id++) {
#define W4A16_PROBE_(d, l)                                                                                             \
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, gemm_sm90_kernel_##d##_##l(id, 0).fn);                      \
    if (e == cudaSuccess && gemm_sm90_kernel_##d##_##l(id, 1).fn)                                                      \
        e = cudaFuncGetAttributes(&attr, gemm_sm90_kernel_##d##_##l(id, 1).fn);
        W4A16_GEMM_INSTANCES(W4A16_PROBE_)
#undef W4A16_PROBE_
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
        int a = gemm_sm90_kernel_0_0(id, 0).smem_bytes, b = gemm_sm90_kernel_0_1(id, 0).smem_bytes;
        r = a > r ? a : r;
        r = b > r ? b : r;
    }
    r = dense_smem_bytes_0_0() > r ? dense_smem_bytes_0_0() : r;
#endif
    return r;
}

extern "C" int w4a16_launch_dense_gemm(const void *A, const void *Wt, const void *bias, void *C, int M, int nc, int K,
                                       int ldc, int dtype, int grid, void *stream) {
#ifdef W4A16_HAVE_WGMMA
    DenseArgs d;
    d.A = A;
    d.W = Wt;
    d.bias = bias;
    d.C = C;
    d.M = M;
    d.N = nc;
    d.K = K;
    d.ldc = ldc;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return dtype == 0 ? launch_dense_sm90_0_0(d, grid, s) : launch_dense_sm90_1_0(d, grid, s);
#else
    (void)A;
    (void)Wt;
    (void)bias;
    (void)C;
    (void)M;
    (void)nc;
    (void)K;
    (void)ldc;
    (void)dtype;
    (void)grid;
    (void)stream;
    return cudaErrorInvalidDeviceFunction;
#endif
}
