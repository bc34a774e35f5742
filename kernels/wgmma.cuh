// Hopper (sm_90a) warpgroup MMA: the few PTX instructions the wgmma GEMM uses, one wrapper each.
// Compiled only into the sm_90a image (wgmma does not exist on sm_80/86/89/120/121, and sm_100 has its own
// tensor-core path): the host dispatches here only on compute capability 9.0 after probing the image. The mbarrier and
// TMA / bulk-copy helpers below also serve the warp-specialised tile's sm_120a / sm_121a images (kernels/tile_ws.cu).
#pragma once
#include <cuda.h> // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <type_traits>

namespace w4a16 {

// Shared-memory matrix descriptor of a K-major tile written with 128-byte rows, 16-byte chunks XOR-swizzled by
// row (ActTile with BK = 64), the tile base 1024-byte aligned: 8-row core groups 1024 bytes apart (stride byte
// offset); the leading byte offset is unused by swizzled K-major layouts. A k16 step inside the 128-byte row is
// addressed by advancing the start address by 32 bytes: the hardware applies the swizzle to the final address.
__device__ __forceinline__ uint64_t smem_desc_sw128(const void *tile) {
    uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(tile));
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

// Orders this warpgroup's register writes (A fragments, accumulators) before the wgmma that reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Closes the batch of wgmma issued since the last commit.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed batches are still running.
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Orders this thread's earlier generic-proxy accesses to shared memory (cp.async writes, ordinary stores) before later
// async-proxy ones (wgmma's reads, TMA's writes).
__device__ __forceinline__ void fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Pins accumulator registers at this point of the program: the compiler must not move their reads or writes
// across a wgmma wait (the hardware writes them asynchronously).
template <int N> __device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for wgmma register operands (A fragments): keeps them in their registers until this point, so a
// batch still running never sees them reused.
template <int R, int N> __device__ __forceinline__ void fence_operands(uint32_t (&a)[R][N]) {
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int j = 0; j < N; j++) asm volatile("" : "+r"(a[i][j])::"memory");
}

// wgmma m64nNk16, fp32 accumulators d (N/2 per thread: rows r and r + 8 of warp w's slab 16w..16w+15, columns
// 8c + 2q, 8c + 2q + 1); `accumulate` 0 overwrites d. B (the activations) is K-major in shared memory, by
// descriptor. A is either registers (RS: 4 per thread, the m16n8k16 A-fragment layout per warp, warp w holding
// rows 16w..16w+15) or a K-major shared-memory tile by descriptor (SS). The accumulate flag is operand N/2;
// W4A16_D32_(i) names the accumulator operands d[i] .. d[i + 31].
#define W4A16_D8_(i)                                                                                                   \
    "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), "+f"(d[(i) + 5]),            \
        "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define W4A16_D32_(i) W4A16_D8_(i), W4A16_D8_((i) + 8), W4A16_D8_((i) + 16), W4A16_D8_((i) + 24)

#define W4A16_WGMMA_N256_(TY, OPS, ...)                                                                                \
    asm volatile(                                                                                                      \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %128, 0;\n"                                                                  \
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " {"                                                  \
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,"                                       \
        "%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,"                             \
        "%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,"                             \
        "%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"                             \
        "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,"                             \
        "%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,"         \
        "%120,%121,%122,%123,%124,%125,%126,%127"                                                                      \
        "}, " OPS ";\n}\n"                                                                                             \
        : W4A16_D32_(0), W4A16_D32_(32), W4A16_D32_(64), W4A16_D32_(96)                                                \
        : "r"(accumulate), __VA_ARGS__)

#define W4A16_WGMMA_N128_(TY, OPS, ...)                                                                                \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %64, 0;\n"                                                          \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {"                                         \
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,"                              \
                 "%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,"                    \
                 "%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,"                    \
                 "%60,%61,%62,%63"                                                                                     \
                 "}, " OPS ";\n}\n"                                                                                    \
                 : W4A16_D32_(0), W4A16_D32_(32)                                                                       \
                 : "r"(accumulate), __VA_ARGS__)

#define W4A16_WGMMA_N64_(TY, OPS, ...)                                                                                 \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %32, 0;\n"                                                          \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {"                                          \
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,"                              \
                 "%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"                                                     \
                 "}, " OPS ";\n}\n"                                                                                    \
                 : W4A16_D32_(0)                                                                                       \
                 : "r"(accumulate), __VA_ARGS__)

template <typename T, int N>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[N / 2], const uint32_t a[4], uint64_t desc, int accumulate) {
    static_assert(N == 64 || N == 128 || N == 256, "the wgmma tile widths the kernels use");
    constexpr bool bf16 = std::is_same<T, __nv_bfloat16>::value;
#define W4A16_RS_IN_ "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
    if constexpr (N == 256) {
        if constexpr (bf16)
            W4A16_WGMMA_N256_("bf16", "{%129,%130,%131,%132}, %133, p, 1, 1, 0", W4A16_RS_IN_);
        else
            W4A16_WGMMA_N256_("f16", "{%129,%130,%131,%132}, %133, p, 1, 1, 0", W4A16_RS_IN_);
    } else if constexpr (N == 128) {
        if constexpr (bf16)
            W4A16_WGMMA_N128_("bf16", "{%65,%66,%67,%68}, %69, p, 1, 1, 0", W4A16_RS_IN_);
        else
            W4A16_WGMMA_N128_("f16", "{%65,%66,%67,%68}, %69, p, 1, 1, 0", W4A16_RS_IN_);
    } else {
        if constexpr (bf16)
            W4A16_WGMMA_N64_("bf16", "{%33,%34,%35,%36}, %37, p, 1, 1, 0", W4A16_RS_IN_);
        else
            W4A16_WGMMA_N64_("f16", "{%33,%34,%35,%36}, %37, p, 1, 1, 0", W4A16_RS_IN_);
    }
#undef W4A16_RS_IN_
}

// The same with A from shared memory (K-major, descriptor `desc_a`) and B by `desc_b`.
template <typename T, int N>
__device__ __forceinline__ void wgmma_m64k16_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    static_assert(N == 64 || N == 128 || N == 256, "the wgmma tile widths the kernels use");
    constexpr bool bf16 = std::is_same<T, __nv_bfloat16>::value;
    if constexpr (N == 256) {
        if constexpr (bf16)
            W4A16_WGMMA_N256_("bf16", "%129, %130, p, 1, 1, 0, 0", "l"(desc_a), "l"(desc_b));
        else
            W4A16_WGMMA_N256_("f16", "%129, %130, p, 1, 1, 0, 0", "l"(desc_a), "l"(desc_b));
    } else if constexpr (N == 128) {
        if constexpr (bf16)
            W4A16_WGMMA_N128_("bf16", "%65, %66, p, 1, 1, 0, 0", "l"(desc_a), "l"(desc_b));
        else
            W4A16_WGMMA_N128_("f16", "%65, %66, p, 1, 1, 0, 0", "l"(desc_a), "l"(desc_b));
    } else {
        if constexpr (bf16)
            W4A16_WGMMA_N64_("bf16", "%33, %34, p, 1, 1, 0, 0", "l"(desc_a), "l"(desc_b));
        else
            W4A16_WGMMA_N64_("f16", "%33, %34, p, 1, 1, 0, 0", "l"(desc_a), "l"(desc_b));
    }
}
#undef W4A16_WGMMA_N256_
#undef W4A16_WGMMA_N128_
#undef W4A16_WGMMA_N64_
#undef W4A16_D32_
#undef W4A16_D8_

// ---- mbarriers (shared-memory arrival counters with phases) and TMA tile loads: the dense GEMM's pipeline.
__device__ __forceinline__ void mbar_init(uint64_t *bar, int count) {
    asm volatile(
        "mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
        "r"(count)
        : "memory");
}
// (bar: the barrier's shared-window address, for a caller that keeps it in a register across a pipeline: the
// generic-to-shared conversion costs a few uniform instructions per use)
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    mbar_arrive(static_cast<uint32_t>(__cvta_generic_to_shared(bar)));
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
    mbar_expect_tx(static_cast<uint32_t>(__cvta_generic_to_shared(bar)), bytes);
}
// Waits until the barrier's phase of this parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile("{\n.reg .pred done;\nwait_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait_%=;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    mbar_wait(static_cast<uint32_t>(__cvta_generic_to_shared(bar)), parity);
}
// ---- the dense GEMM's epilogue: a warpgroup's own barrier, fragments to shared memory, and TMA stores.
// Named barrier `id` (1..15; 0 is __syncthreads) over THREADS threads, so one warpgroup waits while the others run on.
template <int THREADS> __device__ __forceinline__ void named_barrier_sync(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
}
// Four 8 x 8 b16 matrices from mma fragments (r[j]: this lane's pair of matrix j) to shared memory, transposed; lane t
// gives the address of row t % 8 of matrix t / 8.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
                 "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}
// Stores the shared-memory box at `src` to coordinates (c0, c1) of the tensor map, as a bulk group of this thread.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap *map, int c0, int c1, const void *src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
                 "cp.async.bulk.commit_group;\n" ::"l"(reinterpret_cast<uint64_t>(map)),
                 "r"(c0), "r"(c1), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(src)))
                 : "memory");
}
// Waits until at most N of this thread's bulk groups still read shared memory (their global writes may still run).
template <int N> __device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// A 2-D box of the tensor map at coordinates (c0 along the contiguous dimension, c1 along rows) into shared memory,
// completing its bytes on the mbarrier (OOB elements zero-filled and counted).
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cta.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, int c0, int c1, uint64_t *bar) {
    tma_load_2d(dst, map, c0, c1, static_cast<uint32_t>(__cvta_generic_to_shared(bar)));
}
// A contiguous bulk copy (16-byte aligned, a multiple of 16 bytes) into shared memory, completing on the mbarrier.
__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cta.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

} // namespace w4a16
