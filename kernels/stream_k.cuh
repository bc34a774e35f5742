// Stream-K's division of (tile, k-tile) units among blocks and its partial-tile epilogue, shared by the MoE kernel's
// dense rows-64 and rows-32 tiles (kernels/moe.cu) and the warp-specialised tiles (kernels/tile_ws.cu).
#pragma once
#include "common.cuh"

namespace w4a16 {
namespace moe {

// Stream-K of a dense call (SPLIT = 2): block b of B takes units [b U / B, (b + 1) U / B) of the U = tiles x nkt
// (tile, k-tile) units, tile-major, channel tiles fastest; the block that holds unit x, and the workspace slot of
// block b's partial sums of tile t (0: the tile its range starts in, 1: the one it ends in; the tiles in between it
// computes whole).
__device__ __forceinline__ int sk_block_of(long long x, long long U, long long B) {
    return (int)(((x + 1) * B - 1) / U);
}
__device__ __forceinline__ int sk_slot(int b, int t, int nkt, long long U, long long B) {
    return (long long)b * U / B / nkt == t ? 0 : 1;
}

// A block's partial tile of stream-K: its fp32 sums to its workspace slot as they lie in the registers (acc: MT m16
// tiles x NB n8 blocks per warp; `part` points at this warp's and lane's first float4 of slot 0 of block 0, a block's
// slot holding TILE_F4 float4, consecutive fragments STRIDE float4 apart).
template <int MT, int NB, int TILE_F4, int STRIDE = 32>
__device__ __forceinline__ void sk_store_part(const float (&acc)[MT][NB][4], float4 *part, int slot) {
    float4 *const mine = part + ((size_t)blockIdx.x * 2 + slot) * TILE_F4;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < NB; j++)
            __stcg(mine + (mt * NB + j) * STRIDE,
                   make_float4(acc[mt][j][0], acc[mt][j][1], acc[mt][j][2], acc[mt][j][3]));
}

// The same (nk of tile t's nkt k-tiles), then `arrive(add, total)` adds the block's k-tiles to the tile's counter and
// tells whether they completed it (a barrier of every thread holding sums on each side, the sums made visible first).
// The block that completes the tile adds every block's part in block order into acc (deterministic) and returns true;
// the others return false.
template <int MT, int NB, int TILE_F4, int STRIDE = 32, typename Arrive>
__device__ __forceinline__ bool sk_partial(float (&acc)[MT][NB][4], float4 *part, int slot, int t, int nk, int nkt,
                                           long long U, long long B, Arrive &&arrive) {
    sk_store_part<MT, NB, TILE_F4, STRIDE>(acc, part, slot);
    if (!arrive(nk, nkt)) return false;
    const int c0 = sk_block_of((long long)t * nkt, U, B), c1 = sk_block_of((long long)t * nkt + nkt - 1, U, B);
    zero_sums(acc);
    for (int c = c0; c <= c1; c++) {
        const float4 *src = part + ((size_t)c * 2 + sk_slot(c, t, nkt, U, B)) * TILE_F4;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < NB; j++) {
                const float4 v = __ldcg(src + (mt * NB + j) * STRIDE);
                acc[mt][j][0] += v.x;
                acc[mt][j][1] += v.y;
                acc[mt][j][2] += v.z;
                acc[mt][j][3] += v.w;
            }
    }
    return true;
}

} // namespace moe
} // namespace w4a16
