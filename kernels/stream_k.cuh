// Stream-K's division of (tile, k-tile) units among blocks, shared by the MoE kernel's dense rows-64 tile
// (kernels/moe.cu) and the warp-specialised rows-128 tile (kernels/tile_ws.cu).
#pragma once

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

} // namespace moe
} // namespace w4a16
