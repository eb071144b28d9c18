/*
 * ball_query/brute.cuh -- path "brute", the reference: a warp per query scans the cloud's refs
 * in index order and appends the hits until it has S.
 *
 * What it does: a block of kWarps warps takes kWarps consecutive queries of one cloud and walks
 * the cloud in tiles of kThreads refs, staged in shared memory (one ref per thread, structure of
 * arrays) so the refs are read from L2 once per block rather than once per query. Each warp
 * scans the tile 32 refs at a time: lane j tests ref j, a __ballot_sync gathers the hits, and
 * each hit's slot is the warp's count so far plus the number of hits in lower lanes (popc of
 * the ballot under the lane mask). A warp stops when it has S; the block stops loading tiles
 * once no warp is left scanning (__syncthreads_or), so a dense ball costs a tile or two, not
 * the whole cloud. A warp per query (rather than a thread) keeps the GPU busy when there are few
 * queries and many refs, and makes a query's early exit exact to 32 refs.
 *
 * When it wins: nsample above the split kernels' limit (S > 64) on clouds below the grid's
 * threshold (ball_query/plan.cuh). Any S, no workspace; pcops_ball_query_cuda runs it.
 *
 * Invariants: hits are appended in index order and the scan stops at S: the first S in range.
 */
#pragma once

#include <climits>
#include <cstdint>

#include "common.cuh"

namespace {

// ------------------------------------------------------------------------------------------
// CUDA kernels

template <typename T>
__global__ void __launch_bounds__(kThreads)
ball_query_kernel(const T* __restrict__ query, const T* __restrict__ ref,
                  const int64_t* __restrict__ query_lengths,
                  const int64_t* __restrict__ ref_lengths,
                  int64_t M, int64_t N, T lim, int64_t S, int64_t blocks_per_cloud,
                  int64_t num_blocks, int64_t* __restrict__ idx, int64_t* __restrict__ count) {
    __shared__ T tile_x[kThreads], tile_y[kThreads], tile_z[kThreads];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const unsigned lower_lanes = (1u << lane) - 1u;

    // Grid-stride over blocks of queries; every branch below that contains a barrier depends
    // only on the block's cloud (b, L_ref) or on a block-wide vote, so all threads reach it.
    for (int64_t blk = blockIdx.x; blk < num_blocks; blk += gridDim.x) {
        const int64_t b = blk / blocks_per_cloud;
        const int64_t m = (blk - b * blocks_per_cloud) * kWarps + warp;
        const int64_t L_query = pcops_valid_length(query_lengths, b, M);
        const int64_t L_ref = pcops_valid_length(ref_lengths, b, N);
        const T* cloud = ref + b * N * 3;
        const bool in_range = m < M;  // a warp past the last query writes nothing
        bool scanning = in_range && m < L_query;
        T qx = T(0), qy = T(0), qz = T(0);
        if (scanning) {
            const T* q = query + (b * M + m) * 3;
            qx = staged_x(q[0], q[1], q[2]);  // NaN when not finite
            qy = q[1];
            qz = q[2];
        }
        int64_t* out = idx + (b * M + m) * S;
        int64_t found = 0;     // warp-uniform
        int64_t first = -1;    // warp-uniform: the first neighbour, for the fill

        for (int64_t t0 = 0; t0 < L_ref; t0 += kThreads) {
            // Barrier: the previous tile is no longer read by anyone, and the block votes.
            if (!__syncthreads_or(scanning)) break;
            const int64_t n = t0 + threadIdx.x;
            if (n < L_ref) {
                tile_x[threadIdx.x] = staged_x(cloud[3 * n + 0], cloud[3 * n + 1],
                                               cloud[3 * n + 2]);  // NaN when not finite
                tile_y[threadIdx.x] = cloud[3 * n + 1];
                tile_z[threadIdx.x] = cloud[3 * n + 2];
            }
            __syncthreads();
            if (!scanning) continue;
            const int tile_len = (int)(L_ref - t0 < kThreads ? L_ref - t0 : kThreads);
            for (int c = 0; c < tile_len; c += 32) {
                const int j = c + lane;
                bool hit = false;
                if (j < tile_len) {  // only entries written for this tile are read
                    const T d = dist2(tile_x[j], tile_y[j], tile_z[j], qx, qy, qz);
                    hit = d <= lim;                            // NaN is never a neighbour
                }
                const unsigned ballot = __ballot_sync(kFullMask, hit);
                if (ballot == 0u) continue;
                if (first < 0) first = t0 + c + (__ffs(ballot) - 1);
                if (hit) {
                    const int64_t slot = found + __popc(ballot & lower_lanes);
                    if (slot < S) out[slot] = t0 + j;
                }
                found += __popc(ballot);
                if (found >= S) {
                    found = S;
                    scanning = false;
                    break;
                }
            }
        }
        if (in_range) {
            for (int64_t s = found + lane; s < S; s += 32) out[s] = first;  // -1 if none
            if (lane == 0) count[b * M + m] = found;
        }
    }
}

// ------------------------------------------------------------------------------------------
// kernel launchers

template <typename T>
cudaError_t launch_ball_query(const T* query, const T* ref, const int64_t* query_lengths,
                              const int64_t* ref_lengths, int64_t B, int64_t M, int64_t N,
                              double radius2, int64_t S, int64_t* idx, int64_t* count,
                              cudaStream_t stream) {
    const int64_t blocks_per_cloud = (M + kWarps - 1) / kWarps;
    const int64_t num_blocks = B * blocks_per_cloud;
    const unsigned grid = (unsigned)(num_blocks < INT_MAX ? num_blocks : INT_MAX);
    ball_query_kernel<T><<<grid, kThreads, 0, stream>>>(query, ref, query_lengths, ref_lengths,
                                                        M, N, ball_limit((T)radius2), S,
                                                        blocks_per_cloud, num_blocks, idx, count);
    return cudaGetLastError();
}

template <>
struct BallQueryPath<PCOPS_BALL_QUERY_BRUTE> {
    static constexpr bool kGrid = false;
    static bool takes(const BallQuerySizes&) { return true; }
    template <typename T>
    static cudaError_t launch(const pcops_ball_query_cuda_plan& plan, const BallQueryArgs<T>& a) {
        return launch_ball_query<T>(a.query, a.ref, a.query_lengths, a.ref_lengths, plan.B,
                                    plan.M, plan.N, plan.radius2, plan.S, a.idx, a.count,
                                    a.stream);
    }
};

}  // namespace
