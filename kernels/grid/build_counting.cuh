/*
 * grid/build_counting.cuh -- the counting-sort grid build (kNN), and the query order alone
 * (ball query). Refs and queries are binned together by a counting sort -- the box
 * (grid/common.cuh), counts per key, cub's exclusive scan of the counts, the scatter -- in four
 * kernels and a scan: the binned refs of each cell, and the queries in cell order, so that the
 * 32 queries of a warp are neighbours in space and walk nearly the same cells (less divergence,
 * the cells' refs shared in L1).
 *
 * The order of the refs inside a cell (and of the queries) is that of the atomic counts, so it
 * may change from call to call: the kNN lists compare full (dist2, idx) keys and do not depend
 * on it (ball query, which stops inside a cell by index, bins its refs with the stable
 * grid/build_sorted.cuh and only its queries here: order_queries).
 *
 *  counts [2 * B * C + 1]: refs per key b * C + cell (key B * C: refs without a cell), then
 *           queries per key (a slot without a valid finite query: its cloud's last cell);
 *  start  [2 * B * C + 1]: the exclusive sum: start[b * C + c] is the first sorted ref of the
 *           cell, start[B * C] the end of the binned refs; start[B * C + 1 + key] - B * N the
 *           first sorted query slot of the key, so cloud b's slots are [b * M, (b + 1) * M).
 */
#pragma once

#include <cub/device/device_scan.cuh>

#include <cstdint>

#include "common.cuh"

namespace pcops_grid_cuda {
namespace {

// Device scratch of the counting build of a call, carved from one workspace by carve_counting().
template <typename T>
struct CountScratch {
    pcops_grid* grids;        // [B]
    unsigned long long* box;  // [B * 7]
    int32_t* counts;          // [2 * B * C + 1]
    int32_t* start;           // [2 * B * C + 1]
    int32_t* keys;            // [B * N + B * M]
    int32_t* rank;            // [B * N + B * M] rank of the item in its key
    int32_t* ids;             // [B * N] the ref index of each sorted position
    int32_t* order;           // [B * M] the query index of each sorted slot of its cloud
    Point4<T>* pts;           // [B * N] the sorted refs
    void* scan_temp;
    size_t scan_temp_bytes;
};

inline size_t scan_temp_bytes(int64_t items) {
    size_t bytes = 0;
    cub::DeviceScan::ExclusiveSum((void*)nullptr, bytes, (const int32_t*)nullptr,
                                  (int32_t*)nullptr, (int)items, (cudaStream_t)0);
    return bytes;
}

// Carves the scratch of B grids of N refs, M queries and C cells each (a carver with base NULL
// only counts). `scan`: whether the build scans the counts with cub (build_counting,
// order_queries); the one-block build (grid/build_small.cuh) does not, and skips cub's size
// query (host time on every call).
template <typename T>
void carve_counting(pcops_carver* w, int64_t B, int64_t N, int64_t M, int64_t C,
                    CountScratch<T>* s, bool scan = true) {
    const int64_t keys = 2 * B * C + 1, items = B * N + B * M;
    const size_t temp = scan ? scan_temp_bytes(keys) : 0;
    s->grids = (pcops_grid*)pcops_carve(w, B, sizeof(pcops_grid));
    s->box = (unsigned long long*)pcops_carve(w, B * 7, 8);
    s->counts = (int32_t*)pcops_carve(w, keys, 4);
    s->start = (int32_t*)pcops_carve(w, keys, 4);
    s->keys = (int32_t*)pcops_carve(w, items, 4);
    s->rank = (int32_t*)pcops_carve(w, items, 4);
    s->ids = (int32_t*)pcops_carve(w, B * N, 4);
    s->order = (int32_t*)pcops_carve(w, B * M, 4);
    s->pts = (Point4<T>*)pcops_carve(w, B * N, sizeof(Point4<T>));
    s->scan_temp = pcops_carve(w, (int64_t)temp, 1);
    s->scan_temp_bytes = temp;
}

// One thread per ref slot, then per query slot: its key and its rank among the key's items.
template <typename T>
__global__ void count_kernel(const T* __restrict__ ref, const int64_t* __restrict__ ref_lengths,
                             const T* __restrict__ query,
                             const int64_t* __restrict__ query_lengths, int64_t B, int64_t N,
                             int64_t M, int64_t C, const pcops_grid* __restrict__ grids,
                             int32_t* __restrict__ counts, int32_t* __restrict__ keys,
                             int32_t* __restrict__ rank) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= B * N + B * M) return;
    int64_t key;
    if (t < B * N) {
        const int64_t b = t / N, i = t % N;
        key = B * C;
        if (i < pcops_valid_length(ref_lengths, b, N)) {
            const double x = ref[3 * t], y = ref[3 * t + 1], z = ref[3 * t + 2];
            if (pcops_grid_finite3(x, y, z)) {
                const pcops_grid g = grids[b];
                key = b * C + pcops_grid_cell(&g, x, y, z);
            }
        }
    } else {
        const int64_t u = t - B * N, b = u / M, m = u % M;
        int64_t cell = C - 1;
        if (m < pcops_valid_length(query_lengths, b, M)) {
            const double x = query[3 * u], y = query[3 * u + 1], z = query[3 * u + 2];
            const pcops_grid g = grids[b];
            if (g.cells > 0 && pcops_grid_finite3(x, y, z)) cell = pcops_grid_cell(&g, x, y, z);
        }
        key = B * C + 1 + b * C + cell;
    }
    keys[t] = (int32_t)key;
    rank[t] = atomicAdd(counts + key, 1);
}

// One thread per ref slot, then per query slot: the binned ref (coordinates and index) at its
// sorted position, the query index at its sorted slot.
template <typename T>
__global__ void scatter_kernel(const T* __restrict__ ref, int64_t B, int64_t N, int64_t M,
                               int64_t C, const int32_t* __restrict__ keys,
                               const int32_t* __restrict__ rank,
                               const int32_t* __restrict__ start, Point4<T>* __restrict__ pts,
                               int32_t* __restrict__ ids, int32_t* __restrict__ order) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= B * N + B * M) return;
    const int64_t key = keys[t];
    if (t < B * N) {
        if (key >= B * C) return;  // no cell: never read
        const int64_t pos = (int64_t)start[key] + rank[t];
        const T* r = ref + t * 3;
        const int32_t i = (int32_t)(t % N);
        pts[pos] = Point4<T>{r[0], r[1], r[2], index_as<T>(i)};  // the index in w
        ids[pos] = i;
    } else {
        const int64_t slot = (int64_t)start[key] - B * N + rank[t];
        order[slot] = (int32_t)((t - B * N) % M);
    }
}

// Builds the grids and the query order; every kernel on `stream`, nothing read back.
template <typename T>
cudaError_t build_counting(const T* ref, const int64_t* ref_lengths, const T* query,
                           const int64_t* query_lengths, int64_t B, int64_t N, int64_t M,
                           int64_t C, const CountScratch<T>& s, cudaStream_t stream) {
    const int64_t keys = 2 * B * C + 1, items = B * N + B * M;
    cudaError_t err = cudaMemsetAsync(s.box, 0xff, (size_t)B * 7 * 8, stream);
    if (err == cudaSuccess) err = cudaMemsetAsync(s.counts, 0, (size_t)keys * 4, stream);
    if (err != cudaSuccess) return err;
    err = launch_box<T>(ref, ref_lengths, B, N, C, 0.0, s.box, s.grids, stream);
    if (err != cudaSuccess) return err;
    constexpr int kThreads = 256;
    const unsigned blocks = (unsigned)((items + kThreads - 1) / kThreads);
    if (items > 0) {
        count_kernel<T><<<blocks, kThreads, 0, stream>>>(ref, ref_lengths, query, query_lengths,
                                                         B, N, M, C, s.grids, s.counts, s.keys,
                                                         s.rank);
        err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    size_t temp = s.scan_temp_bytes;
    err = cub::DeviceScan::ExclusiveSum(s.scan_temp, temp, s.counts, s.start, (int)keys, stream);
    if (err != cudaSuccess || items == 0) return err;
    scatter_kernel<T><<<blocks, kThreads, 0, stream>>>(ref, B, N, M, C, s.keys, s.rank, s.start,
                                                       s.pts, s.ids, s.order);
    return cudaGetLastError();
}

// The query order alone (ball query: its refs come from the stable build_sorted()): the query
// slots of every cloud by their cell in `grids`, with the counting-sort scratch of N = 0 refs
// (carve_counting(w, B, 0, M, C)). After build_sorted().
template <typename T>
cudaError_t order_queries(const T* query, const int64_t* query_lengths, int64_t B, int64_t M,
                          int64_t C, const pcops_grid* grids, const CountScratch<T>& s,
                          cudaStream_t stream) {
    const int64_t keys = 2 * B * C + 1, items = B * M;
    cudaError_t err = cudaMemsetAsync(s.counts, 0, (size_t)keys * 4, stream);
    if (err != cudaSuccess || items == 0) return err;
    constexpr int kThreads = 256;
    const unsigned blocks = (unsigned)((items + kThreads - 1) / kThreads);
    count_kernel<T><<<blocks, kThreads, 0, stream>>>((const T*)nullptr, nullptr, query,
                                                     query_lengths, B, 0, M, C, grids, s.counts,
                                                     s.keys, s.rank);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    size_t temp = s.scan_temp_bytes;
    err = cub::DeviceScan::ExclusiveSum(s.scan_temp, temp, s.counts, s.start, (int)keys, stream);
    if (err != cudaSuccess) return err;
    scatter_kernel<T><<<blocks, kThreads, 0, stream>>>((const T*)nullptr, B, 0, M, C, s.keys,
                                                       s.rank, s.start, s.pts, s.ids, s.order);
    return cudaGetLastError();
}

}  // namespace
}  // namespace pcops_grid_cuda
