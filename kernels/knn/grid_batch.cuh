/*
 * knn/grid_batch.cuh -- path "grid_batch" (float32, k <= kMaxRegisterK): the grid path's walk
 * (knn/grid.cuh) with a thread per query, whose candidates wait in a small buffer in shared
 * memory and enter the register list in batches, the lanes of a warp together.
 *
 * What it does: a thread's candidates (packed keys below its list's largest) are appended to a
 * buffer of kBatch in shared memory instead of being inserted one by one. An insertion into the
 * sorted register list costs about a hundred instructions, and in a warp whose lanes walk
 * neighbouring cells the lanes' insertions fall on different refs: the warp pays one for nearly
 * every ref offered. Here the lanes that run together flush together: after each pair of refs,
 * when any of them has fewer than two free slots, every one of them sorts its buffer (sort8)
 * and merges it into its list (the K smallest of the list and the sorted buffer are
 * min(list[i], buf[K-1-i]), a bitonic sequence, sorted by a bitonic merge): a fraction of an
 * insertion a candidate, once for the lanes together. A ring ends with a drain of the lanes'
 * buffers.
 *
 * When it wins: float32 grids with short lists (k from about 5 to 16), where the insertions
 * dominate a query's walk; for k <= 4 the lists are short enough to insert directly, longer
 * ones pay more for the networks (knn/plan.cuh).
 *
 * Invariants: the list holds the K smallest keys of everything offered, as grid_walk's list
 * does: the same bits. Until a flush the list's largest key is a stale (larger) bound: more
 * candidates and less pruning, never a wrong one.
 */
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "grid.cuh"

namespace {

// Candidates a thread buffers (sort8 sorts them): fewer flush too often, more sort longer and
// prune with a staler bound.
constexpr int kBatch = 8;

// Compare-exchange of two keys into ascending order (lo gets the smaller).
__device__ __forceinline__ void cas_up(uint64_t& lo, uint64_t& hi) {
    const bool swap = hi < lo;
    const uint64_t a = swap ? hi : lo, b = swap ? lo : hi;
    lo = a;
    hi = b;
}

// Sorts v ascending: Batcher's odd-even merge sort of 8 (19 compare-exchanges, against a
// bitonic sort's 24).
__device__ __forceinline__ void sort8(uint64_t (&v)[8]) {
    cas_up(v[0], v[1]), cas_up(v[2], v[3]), cas_up(v[4], v[5]), cas_up(v[6], v[7]);
    cas_up(v[0], v[2]), cas_up(v[1], v[3]), cas_up(v[4], v[6]), cas_up(v[5], v[7]);
    cas_up(v[1], v[2]), cas_up(v[5], v[6]);
    cas_up(v[0], v[4]), cas_up(v[1], v[5]), cas_up(v[2], v[6]), cas_up(v[3], v[7]);
    cas_up(v[2], v[4]), cas_up(v[3], v[5]);
    cas_up(v[1], v[2]), cas_up(v[3], v[4]), cas_up(v[5], v[6]);
}

// Sorts a bitonic v[0, n) (ascending then descending) ascending: half-cleaners.
template <int n>
__device__ __forceinline__ void bitonic_merge(uint64_t (&v)[n]) {
#pragma unroll
    for (int j = n >> 1; j > 0; j >>= 1) {
#pragma unroll
        for (int i = 0; i < n; ++i)
            if ((i & j) == 0) cas_up(v[i], v[i + j]);
    }
}

template <int K>
struct GridBatchList {
    static_assert(K >= kBatch && (K & (K - 1)) == 0, "K: a power of two >= kBatch");
    static constexpr uint64_t kEmpty = ~(uint64_t)0;
    uint64_t key[K];     // ascending; K - k zero sentinels first, as GridKeyList
    uint64_t* buf;       // this thread's column of the block's buffer: buf[j * kThreads]
    int cnt;             // candidates in buf

    __device__ __forceinline__ void init(int k, uint64_t* column) {
#pragma unroll
        for (int s = 0; s < K; ++s) key[s] = s < K - k ? 0 : kEmpty;
        buf = column;
        cnt = 0;
    }
    __device__ __forceinline__ bool full() const { return key[K - 1] != kEmpty; }
    __device__ __forceinline__ float threshold() const {
        return full() ? __uint_as_float((unsigned)(key[K - 1] >> 32)) : INFINITY;
    }
    __device__ __forceinline__ void offer(float dist, int n) {
        const uint64_t kk = ((uint64_t)__float_as_uint(dist) << 32) | (unsigned)n;
        if (kk < key[K - 1] && dist < INFINITY) buf[kThreads * cnt++] = kk;
    }
    // Merges the buffer into the list (a no-op on the keys when it is empty).
    __device__ __forceinline__ void flush() {
        uint64_t b[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) b[j] = j < cnt ? buf[kThreads * j] : kEmpty;
        cnt = 0;
        sort8(b);
#pragma unroll
        for (int j = 0; j < kBatch; ++j) key[K - 1 - j] = b[j] < key[K - 1 - j] ? b[j] : key[K - 1 - j];
        bitonic_merge(key);
    }
    // Every lane running here flushes when one of them has fewer than `room` free slots.
    __device__ __forceinline__ void flush_together(int room) {
        if (__any_sync(__activemask(), cnt > kBatch - room)) flush();
    }
    // Every lane running here empties its buffer: by insertions while none holds more than
    // two candidates (two insertions cost less than the networks), else by flush().
    __device__ __forceinline__ void drain_together() {
        const unsigned lanes = __activemask();
        if (!__any_sync(lanes, cnt > 0)) return;
        if (__any_sync(lanes, cnt > 2)) {
            flush();
            return;
        }
#pragma unroll
        for (int j = 0; j < 2; ++j)
            if (j < cnt) pcops_grid_cuda::insert_sorted(key, buf[kThreads * j]);
        cnt = 0;
    }
    __device__ __forceinline__ void finish(float* out_d, int64_t* out_i, int k) {
        drain_together();
        write_keys(key, out_d, out_i, k);
    }
};

// grid_walk's hooks for the batched list: a run two refs a step, the lanes flushing together
// when a step might not fit; a ring ends with a flush of the lanes that hold candidates.
template <int K>
__device__ __forceinline__ void scan_run(const Point4<float>* __restrict__ pts, int32_t j,
                                         int32_t end, float qx, float qy, float qz,
                                         GridBatchList<K>& list) {
    for (; j + 1 < end; j += 2) {
        list.flush_together(2);
        const Point4<float> r0 = pts[j], r1 = pts[j + 1];
        list.offer(finite_distance(qx, qy, qz, r0), point_id(r0));
        list.offer(finite_distance(qx, qy, qz, r1), point_id(r1));
    }
    if (j < end) {
        list.flush_together(1);
        const Point4<float> r0 = pts[j];
        list.offer(finite_distance(qx, qy, qz, r0), point_id(r0));
    }
}
template <int K>
__device__ __forceinline__ void ring_done(GridBatchList<K>& list) {
    list.drain_together();
}

// Blocks of kThreads an SM for the batched grid: 4 (128 registers a thread) up to k = 16, fewer
// for longer lists.
template <int K>
struct BatchMinBlocks {
    static constexpr int value = K <= 16 ? 4 : K <= 32 ? 3 : 2;
};

// One thread per query, as knn_grid_kernel; float32, K in {8, 16, 32, 64}.
template <int K>
__global__ void __launch_bounds__(kThreads, BatchMinBlocks<K>::value)
knn_grid_batch_kernel(const float* __restrict__ query, GridParams p,
                      const Point4<float>* __restrict__ pts, float* __restrict__ out_d,
                      int64_t* __restrict__ out_i, const int32_t* __restrict__ order) {
    __shared__ uint64_t batch_buf[kBatch * kThreads];
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= p.B * p.M) return;
    const auto [b, m, flat] = grid_query(p, order, t);
    const int64_t row = flat * p.k;
    const float* q = query + flat * 3;
    GridBatchList<K> list;
    list.init(p.k, batch_buf + threadIdx.x);
    if (m < pcops_valid_length(p.query_lengths, b, p.M))
        grid_walk<float>(p, b, pts, q[0], q[1], q[2], list);
    list.finish(out_d + row, out_i + row, p.k);
}

// ------------------------------------------------------------------------------------------
// kernel launchers

template <>
struct KnnPath<PCOPS_KNN_GRID_BATCH> {
    static constexpr bool kGrid = true;
    static bool takes(const KnnSizes& s) {
        return s.dtype == PCOPS_FLOAT32 && s.K <= kMaxRegisterK;
    }
    template <typename T>
    static cudaError_t launch(const pcops_knn_cuda_plan& plan, const KnnArgs<T>& a) {
        if constexpr (std::is_same<T, float>::value) {
            GridParams p;
            const Point4<T>* pts;
            const int32_t* order;
            cudaError_t err = build_grid<T>(plan, a, &p, &pts, &order);
            if (err != cudaSuccess) return err;
            const int64_t blocks = (plan.B * plan.M + kThreads - 1) / kThreads;
            if (blocks > INT_MAX) return cudaErrorInvalidValue;
            const unsigned g = (unsigned)blocks;
            return with_register_bucket(plan.K, [&](auto bucket) {
                // lists of at least kBatch: k <= 8 takes the list of 8
                constexpr int bucket_k = decltype(bucket)::value;
                constexpr int K = bucket_k < kBatch ? kBatch : bucket_k;
                knn_grid_batch_kernel<K><<<g, kThreads, 0, a.stream>>>(a.query, p, pts, a.dist2,
                                                                    a.idx, order);
                return cudaGetLastError();
            });
        } else {
            return cudaErrorInvalidValue;  // float32 only (takes)
        }
    }
};

}  // namespace
