// Device helpers shared by every w4a16 kernel: async copies, ldmatrix, mma.sync and the int4 -> fp16/bf16
// dequantisation. Each inline-asm wrapper says in one line why it exists.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace w4a16 {

// Plain cp.async.cg (no L2::cache_hint / createpolicy: that combination traps on sm_90 and sm_120 with recent
// ptxas). src-size 0 zero-fills the 16 bytes, so out-of-range rows cost no branch.
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool pred) {
    uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    int n = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
// Weight copies inside the matrix: the same copy with the L2 prefetch-size qualifier L2::128B (a fetch granularity,
// not an eviction policy: no createpolicy, no cache hint operand; SASS LDGSTS...LTC128B on every architecture). An AWQ
// tile row is a 64-byte piece and its neighbour belongs to the next block of channels, which runs at the same time, so
// one 128-byte fetch serves both (docs/PERFORMANCE.md, "Profile and kernel choices").
__device__ __forceinline__ void cp_async16_weights(void *smem, const void *gmem) {
    uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
// Closes the group of copies issued since the last commit (one group per pipeline stage).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// wait_group needs an immediate; the pipeline depth is a run-time profile value, hence the switch.
__device__ __forceinline__ void cp_async_wait_dyn(int n) {
    switch (n) {
    case 0:
        asm volatile("cp.async.wait_group 0;\n" ::);
        break;
    case 1:
        asm volatile("cp.async.wait_group 1;\n" ::);
        break;
    case 2:
        asm volatile("cp.async.wait_group 2;\n" ::);
        break;
    case 3:
        asm volatile("cp.async.wait_group 3;\n" ::);
        break;
    case 4:
        asm volatile("cp.async.wait_group 4;\n" ::);
        break;
    case 5:
        asm volatile("cp.async.wait_group 5;\n" ::);
        break;
    default:
        asm volatile("cp.async.wait_group 6;\n" ::);
        break;
    }
}
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }

// Programmatic dependent launch (sm_90+; compiled out below sm_90, and no-ops in a grid launched without it):
// launch_dependents lets the next kernel of the stream, when it was launched with programmatic stream serialization,
// start before this grid ends; wait blocks until every grid this one depends on has completed and its memory is
// visible. A kernel may read only data that no such grid writes (the weights, W4A16_FLAG_PDL) before its wait.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// The host side: launch config `c` with programmatic stream serialization when `on`; `at` holds the attribute and must
// live until the launch.
inline void set_pdl(cudaLaunchConfig_t &c, cudaLaunchAttribute &at, bool on) {
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    c.attrs = &at;
    c.numAttrs = on ? 1 : 0;
}

// Four 8x8 b16 matrices in the exact register layout of an m16n8k16 A fragment.
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *smem) {
    uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

// An MMA tile's fp32 sums (MT m16 tiles x NB n8 blocks, 4 a lane) set to zero.
template <int MT, int NB> __device__ __forceinline__ void zero_sums(float (&acc)[MT][NB][4]) {
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NB; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;
}

// Byte permute: gathers the nibbles of two k rows into one register pair (AWQ fragments).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

// (x & mask) | magic in one lop3: the int4 -> float "magic number" conversion.
template <uint32_t MASK, uint32_t MAGIC> __device__ __forceinline__ uint32_t lop3_and_or(uint32_t x) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(r) : "r"(x), "n"(MASK), "n"(MAGIC));
    return r;
}

// Per-dtype facts: the mma instruction and the magic-number dequantisation.
template <typename T> struct Dtype;

template <> struct Dtype<__half> {
    using T2 = __half2;
    static constexpr uint32_t MAGIC = 0x64006400u; // fp16 1024.0: (q | MAGIC) == 1024 + q
    static constexpr float BASE = 1024.0f;
    // fp16 has room for the high nibble of a byte in its mantissa: (x & 0x00F0) | MAGIC == 1024 + 16q.
    static constexpr bool HI_IN_PLACE = true;
    __device__ static __forceinline__ void mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    __device__ static __forceinline__ T2 from_bits(uint32_t x) { return *reinterpret_cast<T2 *>(&x); }
    __device__ static __forceinline__ T2 pair(float v) { return __float2half2_rn(v); }
    __device__ static __forceinline__ T2 pair2(float lo, float hi) { return __floats2half2_rn(lo, hi); }
    __device__ static __forceinline__ float to_float(__half v) { return __half2float(v); }
    __device__ static __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
};

template <> struct Dtype<__nv_bfloat16> {
    using T2 = __nv_bfloat162;
    static constexpr uint32_t MAGIC = 0x43004300u; // bf16 128.0: (q | MAGIC) == 128 + q
    static constexpr float BASE = 128.0f;
    static constexpr bool HI_IN_PLACE = false; // 7 mantissa bits: the high nibble must be shifted down
    __device__ static __forceinline__ void mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    __device__ static __forceinline__ T2 from_bits(uint32_t x) { return *reinterpret_cast<T2 *>(&x); }
    __device__ static __forceinline__ T2 pair(float v) { return __float2bfloat162_rn(v); }
    __device__ static __forceinline__ T2 pair2(float lo, float hi) { return __floats2bfloat162_rn(lo, hi); }
    __device__ static __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
    __device__ static __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};

template <typename T2> __device__ __forceinline__ uint32_t as_u32(T2 v) { return *reinterpret_cast<uint32_t *>(&v); }

// Per-group constants of one n8 column block, precomputed once per group so that a weight pair costs
// one subtract (or fma) and one multiply, both exact up to the final product rounding.
template <typename T> struct GroupConst {
    typename Dtype<T>::T2 zb;  // (BASE + z) in both halves: (BASE + q) - (BASE + z) = q - z exactly
    typename Dtype<T>::T2 z16; // -(BASE/16 + z): (BASE + 16q)/16 - (BASE/16 + z) = q - z (fp16 in-place high nibble)
    typename Dtype<T>::T2 s;   // scale in both halves
};

// Built from bit patterns: BASE + z and BASE/16 + z are exact small numbers, so no float conversion is needed.
//   fp16: 1024 + z = 0x6400 + z; -(64 + z) = 0xD400 + 16 z.   bf16: 128 + z = 0x4300 + z (z16 unused).
// `scale2` holds the scale in both half-words.
template <typename T> __device__ __forceinline__ GroupConst<T> make_group_const_bits(uint32_t scale2, uint32_t zero) {
    using D = Dtype<T>;
    GroupConst<T> g;
    g.zb = D::from_bits(D::MAGIC + zero * 0x00010001u);     // one IMAD
    g.z16 = D::from_bits(0xD400D400u + zero * 0x00100010u); // one IMAD
    g.s = D::from_bits(scale2);
    return g;
}

// Dequantise the two nibbles at bits 0-3 and 16-19 of x into a k-pair fragment register.
template <typename T> __device__ __forceinline__ uint32_t dq_lo(uint32_t x, const GroupConst<T> &g) {
    using D = Dtype<T>;
    auto v = D::from_bits(lop3_and_or<0x000F000Fu, D::MAGIC>(x));
    return as_u32(__hmul2(__hsub2(v, g.zb), g.s));
}
// Dequantise the two nibbles at bits 4-7 and 20-23 of x.
template <typename T> __device__ __forceinline__ uint32_t dq_hi(uint32_t x, const GroupConst<T> &g) {
    using D = Dtype<T>;
    if constexpr (D::HI_IN_PLACE) {
        auto v = D::from_bits(lop3_and_or<0x00F000F0u, D::MAGIC>(x));
        auto sixteenth = D::pair(1.0f / 16.0f);
        return as_u32(__hmul2(__hfma2(v, sixteenth, g.z16), g.s));
    } else {
        auto v = D::from_bits(lop3_and_or<0x000F000Fu, D::MAGIC>(x >> 4));
        return as_u32(__hmul2(__hsub2(v, g.zb), g.s));
    }
}

// AWQ: nibbles j and j + 4 of a word (bits 4j and 4j + 16) hold the adjacent columns 2j and 2j + 1 (ORDER), so one
// dq_lo dequantises the pair. Its constants: the same two nibbles of the zero word, and the two columns' scales (s2).
template <typename T> __device__ __forceinline__ GroupConst<T> awq_pair_const(uint32_t z, uint32_t s2, int j) {
    using D = Dtype<T>;
    GroupConst<T> g;
    g.zb = D::from_bits(lop3_and_or<0x000F000Fu, D::MAGIC>(z >> (4 * j)));
    g.z16 = g.zb; // unused by dq_lo
    g.s = D::from_bits(s2);
    return g;
}
// The 8 columns of AWQ word w (zero word z, the 8 scales s in column order), as 4 pairs in column order.
template <typename T> __device__ __forceinline__ uint4 awq_dequant_word(uint32_t w, uint32_t z, uint4 s) {
    return make_uint4(dq_lo<T>(w, awq_pair_const<T>(z, s.x, 0)), dq_lo<T>(w >> 4, awq_pair_const<T>(z, s.y, 1)),
                      dq_lo<T>(w >> 8, awq_pair_const<T>(z, s.z, 2)), dq_lo<T>(w >> 12, awq_pair_const<T>(z, s.w, 3)));
}

// AWQ stores nibble i of a word at column 8c + ORDER[i].
__host__ __device__ constexpr int awq_order(int i) { return (i % 4) * 2 + i / 4; }   // see marlin_index.h
__host__ __device__ constexpr int awq_reverse(int j) { return (j % 2) * 4 + j / 2; } // see marlin_index.h

} // namespace w4a16
