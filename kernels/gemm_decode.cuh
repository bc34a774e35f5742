// The decode GEMM (tiles of 16 tokens: configs with MT = WM = NH = 1), with the operands of mma.sync swapped and the
// group scales and zero points applied to fp32 accumulators instead of to every weight.
//
// Swapped operands: D[16 channels x 8 tokens] += W[16 channels x k16] * A^T[k16 x 8 tokens]. The dequantised weights
// are the m16n8k16 A operand: for a pair of n8 blocks (rows g and g + 8 of the MMA) they are the same four registers
// the other kernels use as two B fragments (tiles.cuh), and the activations are the B operand, read by the same
// ldmatrix as an A fragment (its matrices 0/2 are tokens 0-7, 1/3 tokens 8-15). An MMA then carries 16 channels of
// weights instead of 8: half the HMMAs for M <= 8, and half the accumulator registers.
//
// Deferred scales: a weight register is only the magic-number value (one LOP3 per k pair, no subtract, no multiply):
// fp16 low nibble BASE + q, fp16 high nibble (in place) BASE + 16 q, bf16 BASE + q for both (shifted). So for a run
// of k inside one group, with SA = sum of the activations and C1 = the MMA of the constant BASE row,
//     sum_k A (q - z) s  =  s' * (P - C1 - z' * SA)
// where P is the MMA of the raw values, s' = s / u and z' = z u for a row whose values carry u q (u = 16 for the
// in-place high nibble). The Marlin layout mixes both nibbles in one row (k rows 0-7 low, 8-15 high): there the
// activations of k rows 8-15 are divided by 16 first (exact in fp16 down to 2^-10, below which the product loses
// less than 2^-21 absolute), which makes every row u = 1 and C1 = BASE (SA_lo + SA_hi / 16). C1 and SA come from one
// more MMA per k16 step whose A operand is constant (rows g: BASE; rows g + 8: 1 for k 0-7 and 1 or 16 for k 8-15).
// Every lane gets them for its own tokens (MMA columns 2t, 2t + 1). The raw sums stay exact within fp32's range for a
// group (|BASE * SA| is ~1000x a typical output); they are folded into the output accumulators, with the group's
// constants read from the stage in shared memory, at the end of each warp's k range of a stage (at most 128 k, so
// rounding does not build up over long groups) and wherever a group ends inside it.
#pragma once
#include "gemm.cuh"

namespace w4a16 {

// Two 8x8 b16 matrices: the m16n8k16 B fragment (k 0-7, k 8-15) of 8 tokens.
__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void *smem) {
    uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}

template <typename T> struct DecodeDq {
    using D = Dtype<T>;
    __device__ static __forceinline__ uint32_t lo(uint32_t x) { return lop3_and_or<0x000F000Fu, D::MAGIC>(x); }
    __device__ static __forceinline__ uint32_t hi(uint32_t x) {
        if constexpr (D::HI_IN_PLACE)
            return lop3_and_or<0x00F000F0u, D::MAGIC>(x);
        else
            return lop3_and_or<0x000F000Fu, D::MAGIC>(x >> 4);
    }
    static constexpr int HI_MUL = D::HI_IN_PLACE ? 16 : 1; // what an in-place high nibble carries
};

// TB: token blocks of 8: 1 for M <= 8; 2 for M 9-16 where the config allows 168 registers (gemm_instance.cu).
template <typename T, int LAYOUT, int WN, int WK, int KS, int MINB, int TB>
__global__ void __launch_bounds__(32 * WN * WK, MINB) gemm_decode_kernel(const GemmArgs p) {
    using D = Dtype<T>;
    using Dq = DecodeDq<T>;
    constexpr int THREADS = 32 * WN * WK, BM = 16, BN = 64 * WN, BK = 16 * WK * KS;
    using ATile = ActTile<T, BM, BK, THREADS>;
    using WTile = WeightTile<T, LAYOUT, BN, BK, 1, THREADS>;
    using F = WeightFormat<LAYOUT>;
    constexpr int A_BYTES = ATile::BYTES, STAGE_BYTES = A_BYTES + WTile::BYTES;
    // k rows 8-15 of a register in high nibbles, read in place (16 q): their activations are divided by 16.
    constexpr bool PRESCALE = F::HIGH_K_IN_HIGH_NIBBLES && D::HI_IN_PLACE;
    static_assert(16 * KS <= 128, "the raw sums are folded at least every 128 k");

    extern __shared__ __align__(16) unsigned char smem[];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wn = warp % WN, wk = warp / WN;
    const int t = lane & 3, g = lane >> 2;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int M = p.M, N = p.N;
    const int splits = gridDim.z;
    const int stages = p.stages;

    StageCopy<T, ATile, WTile, BK> copy;
    copy.plan(p, m0, n0, tid);
    const int kt_begin = copy.kt_begin, nk = copy.nk, gshift = copy.gshift, g_last = copy.g_last;

    // Pair i of this warp's 64 channels is MMA rows g (A) and g + 8 (B); constant c = 2i + row is column
    // F::decode_column(g, c).
    float acc[4][TB][4], raw[4][TB][4], cor[TB][4]; // cor: C1 (tokens 2t, 2t + 1), SA (tokens 2t, 2t + 1)
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int b = 0; b < TB; b++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][b][e] = raw[i][b][e] = 0.f;
#pragma unroll
    for (int b = 0; b < TB; b++)
#pragma unroll
        for (int e = 0; e < 4; e++) cor[b][e] = 0.f;

    // The constant A operand of the C1 / SA MMA.
    uint32_t konst[4];
    konst[0] = konst[2] = as_u32(D::pair(D::BASE));
    konst[1] = as_u32(D::pair(1.0f));
    konst[3] = as_u32(D::pair(PRESCALE ? 16.0f : 1.0f));

    // Folds the raw sums into the output accumulators with the constants of group slot `sl` of stage `st` (read here,
    // while the stage is still resident: no per-group registers), then clears them.
    auto fold = [&](const unsigned char *st, int sl) {
        const T *sS = reinterpret_cast<const T *>(st + A_BYTES + WTile::B_BYTES) + sl * BN + wn * 64;
        const uint32_t *sZ =
            reinterpret_cast<const uint32_t *>(st + A_BYTES + WTile::B_BYTES + WTile::S_BYTES) + sl * (BN / 8) + wn * 8;
        // Scale of constant c: half-word c of positions 8g .. 8g + 7 (grouped scales of both formats).
        uint32_t sw[4];
        if (F::CHANNELWISE_PERM && p.marlin_channelwise) {
            const uint16_t *s16 = reinterpret_cast<const uint16_t *>(sS);
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int m = 2 * c; // blocks m, m + 1 (as in WeightTile::group)
                const uint32_t a = s16[F::channelwise_scale_pos(m, g)];
                const uint32_t b = s16[F::channelwise_scale_pos(m + 1, g)];
                sw[c] = a | (b << 16);
            }
        } else {
            const uint4 v = *reinterpret_cast<const uint4 *>(sS + 8 * g);
            sw[0] = v.x;
            sw[1] = v.y;
            sw[2] = v.z;
            sw[3] = v.w;
        }
        const uint32_t zw = p.zeros ? sZ[g] : 0x88888888u;
#pragma unroll
        for (int c = 0; c < 8; c++) {
            const int i = c / 2, row = c % 2;
            const int nib = F::decode_zero_nibble(i, row, c);
            const int u = F::template decode_weight_scale<Dq::HI_MUL>(i);
            const auto s2 = D::from_bits(sw[c / 2]);
            const float cs = D::to_float(row ? s2.y : s2.x) * (1.0f / u);
            const float cz = (float)(((zw >> (4 * nib)) & 0xF) * u);
#pragma unroll
            for (int b = 0; b < TB; b++)
#pragma unroll
                for (int h = 0; h < 2; h++) { // tokens 2t + h
                    const int e = 2 * row + h;
                    const float x = fmaf(-cz, cor[b][2 + h], raw[i][b][e] - cor[b][h]);
                    acc[i][b][e] = fmaf(cs, x, acc[i][b][e]);
                    raw[i][b][e] = 0.f;
                }
        }
#pragma unroll
        for (int b = 0; b < TB; b++)
#pragma unroll
            for (int e = 0; e < 4; e++) cor[b][e] = 0.f;
    };

    // ---- fragments, double-buffered across k16 steps
    uint32_t fa[2][2 * TB];
    auto load_frags = [&](const unsigned char *st, int ks, int buf) {
        const T *sA = reinterpret_cast<const T *>(st);
        const int kk = wk * KS + ks;
        if constexpr (TB == 2) {
            const int row = lane & 15, ch = kk * 2 + (lane >> 4);
            ldmatrix_x4(fa[buf], sA + row * BK + ((ch ^ (row & 7)) * 8));
        } else {
            const int row = lane & 7, ch = kk * 2 + ((lane >> 3) & 1);
            ldmatrix_x2(fa[buf], sA + row * BK + ((ch ^ (row & 7)) * 8));
        }
        copy.wt.fetch(st + A_BYTES, kk, wn, 0, lane, buf);
    };
    auto compute = [&](int buf) {
        uint32_t bt[TB][2]; // activations of token block b: k 0-7, k 8-15
#pragma unroll
        for (int b = 0; b < TB; b++) {
            bt[b][0] = fa[buf][TB == 2 ? b : 0];
            bt[b][1] = fa[buf][TB == 2 ? 2 + b : 1];
            if constexpr (PRESCALE) bt[b][1] = as_u32(__hmul2(D::from_bits(bt[b][1]), D::pair(1.0f / 16.0f)));
        }
        const uint32_t *fb = copy.wt.fb[buf];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t a[4];
            F::template decode_operand<Dq>(fb, i, a);
#pragma unroll
            for (int b = 0; b < TB; b++) D::mma(raw[i][b], a, bt[b]);
        }
#pragma unroll
        for (int b = 0; b < TB; b++) D::mma(cor[b], konst, bt[b]);
    };

    // ---- main loop: as gemm_kernel's (one barrier per stage, the next stage's copies issued first)
    StageRing<STAGE_BYTES> ring(smem, stages, nk);
    auto issue = [&](int j, unsigned char *buf) { copy.issue(p, buf, kt_begin + j); };
    ring.prologue(copy, p, kt_begin);
    for (int i = 0; i < nk; i++) {
        const unsigned char *st = ring.step(i, issue);
        const int k0 = (kt_begin + i) * BK;
        const int kw = k0 + wk * KS * 16; // this warp's K range of the stage: [kw, kw + 16 KS), at most 128 k
        auto group_slot = [&](int k) { return min(k >> gshift, g_last) - (k0 >> gshift); };
        load_frags(st, 0, 0);
        if ((kw >> gshift) == ((kw + 16 * KS - 1) >> gshift)) { // one group: fold once, at the end of the range
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                if (ks + 1 < KS) load_frags(st, ks + 1, (ks + 1) & 1);
                compute(ks & 1);
            }
            fold(st, group_slot(kw));
        } else { // small groups: fold where each ends
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                if (ks + 1 < KS) load_frags(st, ks + 1, (ks + 1) & 1);
                compute(ks & 1);
                const int k = kw + 16 * ks;
                if (ks + 1 == KS || ((k + 16) >> gshift) != (k >> gshift)) fold(st, group_slot(k));
            }
        }
    }
    cp_async_wait_all();
    if (p.pdl) pdl_launch_dependents(); // main loop done: the next GEMM may start its weight loads

    // ---- K-split warps: add partial sums through shared memory
    constexpr int F4 = 4 * TB; // float4 per lane
    auto slot = [&](int s) -> float * { return acc[s / TB][s % TB]; };
    if constexpr (WK > 1) {
        if (!reduce_k_warps<F4, WK, WN>(smem, wk, wn, lane, slot)) return;
    }

    // ---- split-K across blocks: partials to the workspace, the last arriving block reduces (as gemm_kernel)
    if (splits > 1) {
        auto epi_sync = []() { asm volatile("bar.sync 1, %0;\n" ::"n"(32 * WN)); }; // only the epilogue warps
        if (!split_k_reduce<T, F4>(
                p, WN * F4 * 32, wn * (F4 * 32) + lane, 32, tid, slot, [](int) { return true; }, epi_sync))
            return;
    }

    // ---- store C (+ bias): lane holds tokens 2t, 2t + 1 of each token block for its 8 channels
    T *C = static_cast<T *>(p.C);
    const T *bias = static_cast<const T *>(p.bias);
    const int col_base = n0 + wn * 64;
    if (col_base >= N) return;
#pragma unroll
    for (int b = 0; b < TB; b++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = m0 + 8 * b + 2 * t + h;
            if (row >= M) continue;
            T *crow = C + (size_t)row * N + col_base;
            if constexpr (F::DECODE_COLUMNS_ADJACENT) { // the 8 constants are 8 adjacent columns: one 16-byte store
                __align__(16) T out[8];
#pragma unroll
                for (int c = 0; c < 8; c++) {
                    float v = acc[c / 2][b][2 * (c % 2) + h];
                    if (bias) v += D::to_float(bias[col_base + F::decode_column(g, c)]);
                    out[c] = D::from_float(v);
                }
                *reinterpret_cast<uint4 *>(crow + F::decode_column(g, 0)) = *reinterpret_cast<uint4 *>(out);
            } else {
#pragma unroll
                for (int c = 0; c < 8; c++) {
                    float v = acc[c / 2][b][2 * (c % 2) + h];
                    if (bias) v += D::to_float(bias[col_base + F::decode_column(g, c)]);
                    crow[F::decode_column(g, c)] = D::from_float(v);
                }
            }
        }
}

} // namespace w4a16
