/*
 * knn/heap.cuh -- path "brute_heap": the brute force for any k, the best k of each query kept
 * in a max-heap instead of a register list.
 *
 * What it does: one thread owns one query, kHeapThreads a block; the refs are staged through
 * shared memory as in the register-list brute force (knn/brute.cuh). A thread's heap
 * (knn/common.cuh: packed 64-bit keys for float32, (dist2, idx) pairs for float64, geometry.h's
 * heaps, the ones the CPU uses) lives in dynamic shared memory after the tile when the block's
 * heaps fit in half the opt-in limit (interleaved by thread: each thread stays in its own bank),
 * else in the thread's own output rows in global memory; it is sorted in place (heapsort) at
 * the end.
 *
 * When it wins: k above the register lists (k > kMaxRegisterK) where no grid path takes the
 * inputs (knn/plan.cuh). Slower than the lists, no cap on k. The plan runs the brute force
 * with such a k as this path; forced, it takes every k (the same bits as the register lists).
 *
 * Invariants: refs in index order, a ref enters only below the heap's largest key (strictly
 * below the k-th distance): ties to the lower index, the same K smallest keys.
 */
#pragma once

#include <atomic>
#include <climits>
#include <cstdint>

#include "common.cuh"

namespace {

constexpr int kHeapThreads = 32;  // threads (queries) per block

// ------------------------------------------------------------------------------------------
// CUDA kernels

// Grid: B * query_blocks blocks of blockDim.x <= kThreads threads. Dynamic shared memory: the
// tile, then (SHARED) the heaps, heap_cap entries per thread.
template <typename T, bool SHARED>
__global__ void __launch_bounds__(kThreads)
knn_heap_kernel(const T* __restrict__ query, const T* __restrict__ ref, KnnParams p,
                int64_t heap_cap, T* __restrict__ out_d, int64_t* __restrict__ out_i) {
    extern __shared__ __align__(32) unsigned char smem[];
    Point4<T>* tile = reinterpret_cast<Point4<T>*>(smem);

    const int64_t qb = blockIdx.x % p.query_blocks;
    const int64_t b = blockIdx.x / p.query_blocks;
    const int64_t m0 = qb * blockDim.x;
    const int64_t m = m0 + threadIdx.x;
    const int64_t Lq = pcops_valid_length(p.query_lengths, b, p.M);
    const int64_t L = pcops_valid_length(p.ref_lengths, b, p.N);
    const bool active = m < Lq;
    const int64_t cap = p.k < L ? p.k : L;  // entries the heap can ever hold
    const int64_t row = (b * p.M + (m < p.M ? m : 0)) * p.k;

    using Traits = HeapTraits<T>;
    using Heap = typename std::conditional<SHARED, typename Traits::SharedHeap,
                                           typename Traits::GlobalHeap>::type;
    Heap heap;
    if constexpr (SHARED)
        heap = Traits::shared(smem + kTile * sizeof(Point4<T>), heap_cap);
    else
        heap = Traits::global(out_d, out_i, row);

    const Point4<T> q = load_query(query, b * p.M + m, active);
    const T qx = q.x, qy = q.y, qz = q.z;
    int64_t count = 0;
    T thr = T(INFINITY);
    if (m0 < Lq && cap > 0) {  // uniform over the block
        const T* cloud = ref + b * p.N * 3;
        for (int64_t t0 = 0; t0 < L; t0 += kTile) {
            const int n = L - t0 < kTile ? (int)(L - t0) : kTile;
            load_tile(tile, cloud, t0, n);
            if (active) {
                for (int j = 0; j < n; ++j) {
                    const T d = squared_distance(qx, qy, qz, tile[j]);
                    if (d < thr && heap.keep(cap, &count, d, t0 + j)) thr = heap.top_dist();
                }
            }
        }
    }
    if (m < p.M) heap.finish(count, p.k, out_d + row, out_i + row);
}

// ------------------------------------------------------------------------------------------
// kernel launchers

// Lets knn_heap_kernel<T, true> use up to `bytes` of dynamic shared memory (half the opt-in
// limit: the most launch_heap ever asks for), once per device and process: the attribute is
// set by the first large-k call (typically a warm-up), not again in later calls (a CUDA graph
// capture, concurrent calls from several threads).
template <typename T>
cudaError_t allow_shared_heaps(int device, int bytes) {
    constexpr int kMaxDevices = 64;
    static std::atomic<int> allowed[kMaxDevices];  // bytes allowed so far; zero-initialised
    if (device >= 0 && device < kMaxDevices && allowed[device].load() >= bytes) return cudaSuccess;
    const cudaError_t err = cudaFuncSetAttribute(
        knn_heap_kernel<T, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err == cudaSuccess && device >= 0 && device < kMaxDevices) allowed[device].store(bytes);
    return err;
}

template <typename T>
cudaError_t launch_heap(const pcops_knn_cuda_plan& plan, const KnnArgs<T>& a) {
    KnnParams p{};
    p.query_lengths = a.query_lengths;
    p.ref_lengths = a.ref_lengths;
    p.M = plan.M;
    p.N = plan.N;
    p.k = (int)plan.K;
    p.splits = 1;
    p.split_len = plan.N;
    const int threads = kHeapThreads;
    p.query_blocks = (p.M + threads - 1) / threads;
    const int64_t blocks = plan.B * p.query_blocks;
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
    const int64_t cap = p.k < p.N ? p.k : p.N;
    const size_t tile_bytes = kTile * sizeof(Point4<T>);
    const size_t heap_bytes = (size_t)cap * threads * HeapTraits<T>::shared_entry_bytes;
    // Shared heaps while at least two blocks fit on an SM; the output rows beyond that.
    const size_t shared_bytes = tile_bytes + heap_bytes;
    if (cap <= INT_MAX / threads && shared_bytes <= (size_t)plan.smem_optin / 2) {
        if (shared_bytes > 48 * 1024) {
            const cudaError_t err = allow_shared_heaps<T>(plan.device, plan.smem_optin / 2);
            if (err != cudaSuccess) return err;
        }
        knn_heap_kernel<T, true><<<(unsigned)blocks, threads, shared_bytes, a.stream>>>(
            a.query, a.ref, p, cap, a.dist2, a.idx);
    } else {
        knn_heap_kernel<T, false><<<(unsigned)blocks, threads, tile_bytes, a.stream>>>(
            a.query, a.ref, p, 0, a.dist2, a.idx);
    }
    return cudaGetLastError();
}

template <>
struct KnnPath<PCOPS_KNN_BRUTE_HEAP> {
    static constexpr bool kGrid = false;
    static bool takes(const KnnSizes&) { return true; }
    template <typename T>
    static cudaError_t launch(const pcops_knn_cuda_plan& plan, const KnnArgs<T>& a) {
        return launch_heap<T>(plan, a);
    }
};

}  // namespace
