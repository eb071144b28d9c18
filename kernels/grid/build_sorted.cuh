/*
 * grid/build_sorted.cuh -- the stable grid build (ball query): the refs of B clouds binned into
 * their grids by a radix sort of cell keys, so that inside a cell the refs stay in index order
 * (the ball-query walk leaves a cell at the first index above its list's largest).
 *
 *  1. grid_box_kernel (grid/common.cuh): the box of each cloud's valid finite refs, its grid;
 *  2. grid_key_kernel: key = b * C + cell of every valid finite ref, B * C for the others
 *     (sorted to the end), value = its index in the cloud;
 *  3. cub::DeviceRadixSort::SortPairs on the keys (stable: index order inside a cell);
 *  4. grid_start_kernel: start[key] = the first sorted position of every key read later (a
 *     binary search per key);
 *  5. grid_gather_kernel: the sorted refs as Point4 (x, y, z, -).
 * The cells of cloud b are start[b * C + c] .. start[b * C + c + 1], c < grids[b].cells;
 * vals_out holds the ref index of each sorted position.
 */
#pragma once

#include <cub/device/device_radix_sort.cuh>

#include <cstdint>

#include "common.cuh"

namespace pcops_grid_cuda {
namespace {

// Device scratch of the stable build of a call, carved from one workspace by carve_sorted().
template <typename T>
struct SortedScratch {
    pcops_grid* grids;   // [B]
    unsigned long long* box;  // [B * 7]: the box (6 order-preserving codes) and a block count
    int32_t* start;      // [B * C + 1]
    int32_t* keys_in;    // [B * N]
    int32_t* keys_out;   // [B * N]
    int32_t* vals_in;    // [B * N]
    int32_t* vals_out;   // [B * N] the ref index of each sorted position
    Point4<T>* pts;      // [B * N] the sorted refs
    void* sort_temp;
    size_t sort_temp_bytes;
};

inline int key_bits(int64_t keys) {  // bits of the largest key B * C
    int bits = 1;
    while (bits < 31 && ((int64_t)1 << bits) <= keys) ++bits;
    return bits;
}

// Bytes of cub's radix sort of `items` pairs of int32.
inline size_t sort_temp_bytes(int64_t items, int bits) {
    size_t bytes = 0;
    cub::DeviceRadixSort::SortPairs((void*)nullptr, bytes, (const int32_t*)nullptr,
                                    (int32_t*)nullptr, (const int32_t*)nullptr,
                                    (int32_t*)nullptr, (int)items, 0, bits, (cudaStream_t)0);
    return bytes;
}

// Carves the scratch of B grids of N refs and C cells each (a carver with base NULL only
// counts: pcops_carver_bytes is then the workspace the build needs).
template <typename T>
void carve_sorted(pcops_carver* w, int64_t B, int64_t N, int64_t C, SortedScratch<T>* s) {
    const int64_t items = B * N;
    const size_t temp = sort_temp_bytes(items > 0 ? items : 1, key_bits(B * C));
    s->grids = (pcops_grid*)pcops_carve(w, B, sizeof(pcops_grid));
    s->box = (unsigned long long*)pcops_carve(w, B * 7, 8);
    s->start = (int32_t*)pcops_carve(w, B * C + 1, 4);
    s->keys_in = (int32_t*)pcops_carve(w, items, 4);
    s->keys_out = (int32_t*)pcops_carve(w, items, 4);
    s->vals_in = (int32_t*)pcops_carve(w, items, 4);
    s->vals_out = (int32_t*)pcops_carve(w, items, 4);
    s->pts = (Point4<T>*)pcops_carve(w, items, sizeof(Point4<T>));
    s->sort_temp = pcops_carve(w, (int64_t)temp, 1);
    s->sort_temp_bytes = temp;
}

// One thread per ref slot: its key (b * C + cell, or B * C) and value (its index).
template <typename T>
__global__ void grid_key_kernel(const T* __restrict__ ref, const int64_t* __restrict__ ref_lengths,
                                int64_t B, int64_t N, int64_t C,
                                const pcops_grid* __restrict__ grids, int32_t* __restrict__ keys,
                                int32_t* __restrict__ vals) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= B * N) return;
    const int64_t b = t / N, i = t % N;
    int64_t key = B * C;
    if (i < pcops_valid_length(ref_lengths, b, N)) {
        const double x = ref[3 * t], y = ref[3 * t + 1], z = ref[3 * t + 2];
        if (pcops_grid_finite3(x, y, z)) {
            const pcops_grid g = grids[b];
            key = b * C + pcops_grid_cell(&g, x, y, z);
        }
    }
    keys[t] = (int32_t)key;
    vals[t] = (int32_t)i;
}

// One thread per key c in [0, B * C]: start[c] = the first sorted position whose key is >= c
// (a lower bound in the ascending keys), written only where it is read: the cells 0 ..
// grids[b].cells of cloud b (the last one the end of the cloud's run) and B * C. A binary search
// per key keeps every thread's work at log2(items) loads, wherever the empty cells lie (one
// thread per sorted position filling the keys up to its own would write every key past the last
// cloud's last cell, up to B * C, alone: 3 ms at 1e6 refs).
__global__ void grid_start_kernel(const int32_t* __restrict__ keys, int64_t items, int64_t B,
                                  int64_t C, const pcops_grid* __restrict__ grids,
                                  int32_t* __restrict__ start) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c > B * C) return;
    if (c < B * C && c % C > (int64_t)grids[c / C].cells) return;  // never read
    int64_t lo = 0, hi = items;  // the answer lies in [lo, hi]
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if ((int64_t)keys[mid] < c) lo = mid + 1;
        else hi = mid;
    }
    start[c] = (int32_t)lo;
}

// One thread per sorted position: the ref itself, next to its neighbours in the cell.
template <typename T>
__global__ void grid_gather_kernel(const T* __restrict__ ref, int64_t B, int64_t N, int64_t C,
                                   const int32_t* __restrict__ keys,
                                   const int32_t* __restrict__ vals, Point4<T>* __restrict__ pts) {
    const int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= B * N) return;
    const int64_t key = keys[p];
    if (key >= B * C) return;  // past the last cell: never read
    const int64_t b = key / C;
    const T* r = ref + (b * N + vals[p]) * 3;
    pts[p] = Point4<T>{r[0], r[1], r[2], T(0)};
}

// Builds the grids; every kernel on `stream`, nothing read back.
template <typename T>
cudaError_t build_sorted(const T* ref, const int64_t* ref_lengths, int64_t B, int64_t N,
                         int64_t C, double min_cell, const SortedScratch<T>& s,
                         cudaStream_t stream) {
    cudaError_t err = cudaMemsetAsync(s.box, 0xff, (size_t)B * 7 * 8, stream);
    if (err != cudaSuccess) return err;
    err = launch_box<T>(ref, ref_lengths, B, N, C, min_cell, s.box, s.grids, stream);
    if (err != cudaSuccess) return err;
    const int64_t items = B * N;
    constexpr int kThreads = 256;
    if (items > 0) {
        grid_key_kernel<T><<<(unsigned)((items + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
            ref, ref_lengths, B, N, C, s.grids, s.keys_in, s.vals_in);
        err = cudaGetLastError();
        if (err != cudaSuccess) return err;
        size_t temp = s.sort_temp_bytes;
        err = cub::DeviceRadixSort::SortPairs(s.sort_temp, temp, s.keys_in, s.keys_out, s.vals_in,
                                              s.vals_out, (int)items, 0, key_bits(B * C), stream);
        if (err != cudaSuccess) return err;
    }
    const int64_t start_threads = B * C + 1;
    grid_start_kernel<<<(unsigned)((start_threads + kThreads - 1) / kThreads), kThreads, 0,
                        stream>>>(s.keys_out, items, B, C, s.grids, s.start);
    err = cudaGetLastError();
    if (err != cudaSuccess || items == 0) return err;
    grid_gather_kernel<T><<<(unsigned)((items + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        ref, B, N, C, s.keys_out, s.vals_out, s.pts);
    return cudaGetLastError();
}

}  // namespace
}  // namespace pcops_grid_cuda
