/*
 * neighbor_edges.cu -- neighbour lists to COO edges, on CUDA. Same contract as
 * neighbor_edges.c:
 *
 *   idx[B,M,S] int64, count[B,M]? -> edges[2,E]: the slots (b,m,s) with 0 <= idx < N (and
 *   s < count[b,m] when count is given), in (b,m,s) order; row = row_offset[b] + m (default
 *   b*M + m), col = col_offset[b] + idx (default b*N + idx).
 *
 * Two launchers around the caller's one read of E (the output size depends on the data):
 *   count: per row r = b*M + m its number of edges (count_kernel), then their inclusive prefix
 *          sum with cub::DeviceScan into ends[r] (E = ends[B*M - 1]);
 *   write: row r's edges at [ends[r] - its count, ends[r]) (write_kernel).
 *
 * Threads: a warp per row, grid-stride over the rows. The warp reads 32 consecutive slots at a
 * time (coalesced), __ballot_sync marks the edges, and a slot's place among the row's edges is
 * the number of edges so far plus the edges of the lower lanes (__popc of the ballot below the
 * lane), so the edges keep slot order.
 */
#include <climits>

#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>

#include "geometry.h"
#include "pcops.h"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ bool edge_slot(const int64_t* __restrict__ idx,
                                          const int64_t* __restrict__ count, int64_t r,
                                          int64_t s, int64_t N, int64_t S) {
    if (s >= S) return false;
    const int64_t n = idx[r * S + s];
    return n >= 0 && n < N && (!count || s < count[r]);
}

__global__ void count_kernel(const int64_t* __restrict__ idx, const int64_t* __restrict__ count,
                             int64_t R, int64_t N, int64_t S, int64_t* __restrict__ per_row) {
    const int lane = threadIdx.x & 31;
    for (int64_t r = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32; r < R;
         r += (int64_t)gridDim.x * kWarps) {
        int64_t c = 0;
        for (int64_t s0 = 0; s0 < S; s0 += 32)
            c += __popc(__ballot_sync(0xffffffffu, edge_slot(idx, count, r, s0 + lane, N, S)));
        if (lane == 0) per_row[r] = c;
    }
}

__global__ void write_kernel(const int64_t* __restrict__ idx, const int64_t* __restrict__ count,
                             const int64_t* __restrict__ row_offset,
                             const int64_t* __restrict__ col_offset, int64_t M, int64_t R,
                             int64_t N, int64_t S, const int64_t* __restrict__ ends, int64_t E,
                             int64_t* __restrict__ edges) {
    const int lane = threadIdx.x & 31;
    const unsigned below = (1u << lane) - 1u;
    for (int64_t r = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32; r < R;
         r += (int64_t)gridDim.x * kWarps) {
        const int64_t b = r / M, m = r - b * M;
        const int64_t row = (row_offset ? row_offset[b] : b * M) + m;
        const int64_t col0 = col_offset ? col_offset[b] : b * N;
        const int64_t end = ends[r];
        int64_t e = r > 0 ? ends[r - 1] : 0;
        for (int64_t s0 = 0; s0 < S && e < end; s0 += 32) {
            const bool hit = edge_slot(idx, count, r, s0 + lane, N, S);
            const unsigned ballot = __ballot_sync(0xffffffffu, hit);
            if (hit) {
                const int64_t at = e + __popc(ballot & below);
                edges[at] = row;
                edges[E + at] = col0 + idx[r * S + s0 + lane];
            }
            e += __popc(ballot);
        }
    }
}

unsigned row_blocks(int64_t R) { return pcops_grid_stride_blocks(R * 32, kThreads); }

size_t scan_temp_bytes(int64_t R) {
    size_t bytes = 0;
    cub::DeviceScan::InclusiveSum(nullptr, bytes, (const int64_t*)nullptr, (int64_t*)nullptr,
                                  (int)(R > 0 ? R : 1));
    return bytes;
}

}  // namespace

extern "C" size_t pcops_neighbor_edges_cuda_workspace_bytes(int64_t B, int64_t M) {
    const int64_t R = B > 0 && M > 0 ? B * M : 0;
    pcops_carver w = pcops_carver_init(NULL);
    pcops_carve(&w, R, sizeof(int64_t));  // per-row counts
    pcops_carve(&w, (int64_t)scan_temp_bytes(R), 1);
    return pcops_carver_bytes(&w);
}

extern "C" cudaError_t pcops_neighbor_edges_count_cuda(const int64_t* idx, const int64_t* count,
                                                       int64_t B, int64_t M, int64_t N,
                                                       int64_t S, void* workspace,
                                                       int64_t* ends, cudaStream_t stream) {
    if (B < 0 || M < 0 || N < 0 || S < 0) return cudaErrorInvalidValue;
    const int64_t R = B * M;
    if (R == 0) return cudaSuccess;
    if (R > INT_MAX || !ends || !workspace || (S > 0 && !idx)) return cudaErrorInvalidValue;
    pcops_carver w = pcops_carver_init(workspace);
    int64_t* per_row = (int64_t*)pcops_carve(&w, R, sizeof(int64_t));
    size_t temp_bytes = scan_temp_bytes(R);
    void* temp = pcops_carve(&w, (int64_t)temp_bytes, 1);
    count_kernel<<<row_blocks(R), kThreads, 0, stream>>>(idx, count, R, N, S, per_row);
    cudaError_t err = pcops_launch_tail(cudaGetLastError(), stream);
    if (err != cudaSuccess) return err;
    err = cub::DeviceScan::InclusiveSum(temp, temp_bytes, per_row, ends, (int)R, stream);
    return pcops_launch_tail(err, stream);
}

extern "C" cudaError_t pcops_neighbor_edges_write_cuda(const int64_t* idx, const int64_t* count,
                                                       const int64_t* row_offset,
                                                       const int64_t* col_offset, int64_t B,
                                                       int64_t M, int64_t N, int64_t S,
                                                       const int64_t* ends, int64_t E,
                                                       int64_t* edges, cudaStream_t stream) {
    if (B < 0 || M < 0 || N < 0 || S < 0 || E < 0) return cudaErrorInvalidValue;
    const int64_t R = B * M;
    if (R == 0 || E == 0) return cudaSuccess;
    if (!idx || !ends || !edges) return cudaErrorInvalidValue;
    write_kernel<<<row_blocks(R), kThreads, 0, stream>>>(idx, count, row_offset, col_offset, M,
                                                         R, N, S, ends, E, edges);
    return pcops_launch_tail(cudaGetLastError(), stream);
}
