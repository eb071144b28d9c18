/*
 * knn/common.cuh -- what the CUDA kNN paths share (kernels/knn.cu includes it before them).
 *
 * B = batch, M = queries per cloud, N = reference points per cloud, K = neighbours (k at run
 * time), Lq / L = valid queries / refs of a cloud (lengths clamped to [0, M] / [0, N]),
 * S = splits of the refs. query[B,M,3], ref[B,N,3] -> dist2[B,M,K], idx[B,M,K] (int64).
 *
 * Every path returns exactly the K smallest keys (dist2, idx) among the valid refs with a
 * distance below +inf, sorted, +inf / -1 past them: the squared distance of geometry.h (bit for
 * bit the CPU's), ties to the lower index. Here: the distance on binned points, the sorted
 * register list, the per-thread max-heaps (large k), the staging of refs in shared memory, the
 * kernels' plain-data arguments, and the interface every path implements (KnnPath).
 */
#pragma once

#include <cstdint>
#include <type_traits>

#include "../geometry.h"
#include "../grid/common.cuh"
#include "../pcops.h"

namespace {

constexpr int kTile = 128;     // refs per shared-memory tile
constexpr int kThreads = 128;  // most threads (queries) per block
// The longest register list (a longer one would spill to local memory): beyond it the brute
// force and the grid keep their lists in heaps.
constexpr int64_t kMaxRegisterK = 64;

using pcops_grid_cuda::Point4;
using pcops_grid_cuda::point_id;  // the ref index a grid build stored in a binned point's w slot

// The squared distance of geometry.h (the one the CPU computes, bit for bit), saturated by its
// overflow rule: the points were staged (load_tile, load_query, staged_x; the grids hold only
// finite points), so a non-finite one gives NaN and an overflow between finite ones the max.
__device__ __forceinline__ float squared_distance(float qx, float qy, float qz, const Point4<float>& r) {
    return pcops_dist2_sat_f32(pcops_dist2_f32(qx, qy, qz, r.x, r.y, r.z));
}

__device__ __forceinline__ double squared_distance(double qx, double qy, double qz,
                                                   const Point4<double>& r) {
    return pcops_dist2_sat_f64(pcops_dist2_f64(qx, qy, qz, r.x, r.y, r.z));
}

// The same for points known finite (the grids bin only finite refs and walk only finite
// queries): no NaN to keep, so the saturation is a plain min.
__device__ __forceinline__ float finite_distance(float qx, float qy, float qz,
                                                 const Point4<float>& r) {
    return fminf(pcops_dist2_f32(qx, qy, qz, r.x, r.y, r.z), PCOPS_DIST2_MAX_f32);
}
__device__ __forceinline__ double finite_distance(double qx, double qy, double qz,
                                                  const Point4<double>& r) {
    return fmin(pcops_dist2_f64(qx, qy, qz, r.x, r.y, r.z), PCOPS_DIST2_MAX_f64);
}

// A point's x as the searches stage it (geometry.h): NaN when a coordinate is not finite.
__device__ __forceinline__ float staged_x(float x, float y, float z) {
    return pcops_staged_x_f32(x, y, z);
}
__device__ __forceinline__ double staged_x(double x, double y, double z) {
    return pcops_staged_x_f64(x, y, z);
}

// The pruning limit of a k-th distance th (geometry.h): th, or +inf once th has saturated at
// the type's maximum, where a ref of lower index at any larger true distance still ties.
__device__ __forceinline__ double prune_limit(float th) { return pcops_prune_limit_f32(th); }
__device__ __forceinline__ double prune_limit(double th) { return pcops_prune_limit_f64(th); }

// The sorted list of one thread in registers: d[0] <= d[1] <= ... <= d[K-1], ties in index
// order. The first K - k slots hold -inf and never move; d[K-1] is the k-th distance.
template <typename T, int K>
struct RegisterList {
    T d[K];
    int i[K];

    __device__ __forceinline__ void init(int k) {
#pragma unroll
        for (int s = 0; s < K; ++s) {
            d[s] = s < K - k ? T(-INFINITY) : T(INFINITY);
            i[s] = -1;
        }
    }

    __device__ __forceinline__ T threshold() const { return d[K - 1]; }

    // Inserts (dist, n) given dist < d[K-1]; n is above every index in the list, so it goes
    // after the entries of equal distance. Slot s takes slot s-1's entry if that one is larger
    // than dist, else dist itself if slot s's own entry is larger, else keeps its entry.
    __device__ __forceinline__ void insert(T dist, int n) {
#pragma unroll
        for (int s = K - 1; s > 0; --s) {
            const bool shift = d[s - 1] > dist;
            const bool here = d[s] > dist;
            d[s] = shift ? d[s - 1] : (here ? dist : d[s]);
            i[s] = shift ? i[s - 1] : (here ? n : i[s]);
        }
        const bool here = d[0] > dist;
        d[0] = here ? dist : d[0];
        i[0] = here ? n : i[0];
    }

    // Writes the k real entries (slots K-k .. K-1) to out_d[0, k), out_i[0, k).
    template <typename I>
    __device__ __forceinline__ void write(T* out_d, I* out_i, int k) const {
#pragma unroll
        for (int s = 0; s < K; ++s) {
            if (s >= K - k) {
                out_d[s - (K - k)] = d[s];
                out_i[s - (K - k)] = I(i[s]);
            }
        }
    }
};

// Plain-data arguments of the kernels.
struct KnnParams {
    const int64_t* query_lengths;
    const int64_t* ref_lengths;
    int64_t M, N;
    int k;
    int splits;           // S: ref ranges per query (1: no split)
    int64_t split_len;    // refs per range
    int64_t query_blocks; // blocks per (cloud, range)
};

// Stages refs [t0, t0 + n) of a cloud into the shared tile (n <= kTile), a non-finite one with
// x = NaN (staged_x). Every thread of the block calls it; the barriers around make the tile
// safe to overwrite and then to read.
template <typename T>
__device__ __forceinline__ void load_tile(Point4<T>* tile, const T* __restrict__ cloud,
                                          int64_t t0, int n) {
    __syncthreads();  // everyone is done with the previous tile
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const T* p = cloud + (t0 + j) * 3;
        tile[j] = Point4<T>{staged_x(p[0], p[1], p[2]), p[1], p[2], T(0)};
    }
    __syncthreads();
}

// The coordinates of query row `row`, staged (staged_x; zeros for a thread without a valid
// query, which only helps stage the tiles).
template <typename T>
__device__ __forceinline__ Point4<T> load_query(const T* query, int64_t row, bool active) {
    Point4<T> q{T(0), T(0), T(0), T(0)};
    if (active) {
        const T* p = query + row * 3;
        q.x = staged_x(p[0], p[1], p[2]);
        q.y = p[1];
        q.z = p[2];
    }
    return q;
}

// Slots [from, k) of an output row: empty (+inf, -1).
template <typename T>
__device__ __forceinline__ void pad_row(T* out_d, int64_t* out_i, int64_t from, int k) {
    for (int64_t j = from; j < k; ++j) {
        out_d[j] = T(INFINITY);
        out_i[j] = -1;
    }
}

// The max-heap of one thread (large k) on geometry.h's heaps, entry j at [j * stride]:
//  - float32 (PackedHeap): one 64-bit key per entry, pcops_key_pack_f32 (heap distances are
//    >= +0 and finite, so the integer order of the keys is the (dist2, idx) order): one 8-byte
//    load and one integer compare per node, as on the CPU;
//  - float64 (PairHeap<I>): (dist2, idx) in two arrays, idx int32 in shared memory
//    (pcops_heap_*_f64_i32) and int64 in the output rows (pcops_heap_*_f64).
// keep() adds an entry (geometry.h, pcops_heap_keep: push until full, then replace the root);
// finish() sorts the heap and writes entries [0, count) to out_d/out_i[0, count), then empty
// slots up to k (the global float32 heap is the idx row itself: entry j is read before slot j
// is written).
struct PackedHeap {
    uint64_t* h;
    int64_t stride;

    __device__ __forceinline__ bool keep(int64_t cap, int64_t* count, float d, int64_t n) const {
        return pcops_heap_keep_u64(h, stride, cap, count, pcops_key_pack_f32(d, n));
    }
    __device__ __forceinline__ float top_dist() const { return pcops_key_dist_f32(h[0]); }
    __device__ __forceinline__ bool top_above(float d, int64_t n) const {
        return h[0] > pcops_key_pack_f32(d, n);
    }
    __device__ void finish(int64_t count, int k, float* out_d, int64_t* out_i) const {
        pcops_heap_sort_u64(h, stride, count);
        pcops_key_unpack_f32(h, stride, count, out_d, out_i);
        pad_row(out_d, out_i, count, k);
    }
};

template <typename I>
struct PairHeap {
    static constexpr bool kI32 = std::is_same<I, int32_t>::value;
    double* d;
    I* i;
    int64_t stride;

    __device__ __forceinline__ bool keep(int64_t cap, int64_t* count, double dn, int64_t n) const {
        if constexpr (kI32) return pcops_heap_keep_f64_i32(d, i, stride, cap, count, dn, n);
        else return pcops_heap_keep_f64(d, i, stride, cap, count, dn, n);
    }
    __device__ __forceinline__ double top_dist() const { return d[0]; }
    __device__ __forceinline__ bool top_above(double dn, int64_t n) const {
        return pcops_key_greater_f64(d[0], (int64_t)i[0], dn, n);
    }
    __device__ void finish(int64_t count, int k, double* out_d, int64_t* out_i) const {
        if constexpr (kI32) pcops_heap_sort_f64_i32(d, i, stride, count);
        else pcops_heap_sort_f64(d, i, stride, count);
        for (int64_t j = 0; j < count; ++j) {
            out_d[j] = d[j * stride];
            out_i[j] = (int64_t)i[j * stride];
        }
        pad_row(out_d, out_i, count, k);
    }
};

// The heap of one thread, per dtype: in dynamic shared memory after the tile (heap_cap entries
// per thread, interleaved: entry j of thread t at j * blockDim.x + t, so each thread stays in
// its own bank), or in the thread's output rows (float32: the idx row holds the packed keys;
// float64: the two rows).
template <typename T>
struct HeapTraits;
template <>
struct HeapTraits<float> {
    using SharedHeap = PackedHeap;
    using GlobalHeap = PackedHeap;
    static constexpr size_t shared_entry_bytes = sizeof(uint64_t);
    __device__ static SharedHeap shared(unsigned char* smem, int64_t) {
        return {reinterpret_cast<uint64_t*>(smem) + threadIdx.x, (int64_t)blockDim.x};
    }
    __device__ static GlobalHeap global(float*, int64_t* out_i, int64_t row) {
        return {reinterpret_cast<uint64_t*>(out_i + row), 1};
    }
};
template <>
struct HeapTraits<double> {
    using SharedHeap = PairHeap<int32_t>;
    using GlobalHeap = PairHeap<int64_t>;
    static constexpr size_t shared_entry_bytes = sizeof(double) + sizeof(int32_t);
    __device__ static SharedHeap shared(unsigned char* smem, int64_t heap_cap) {
        double* d = reinterpret_cast<double*>(smem);
        int32_t* i = reinterpret_cast<int32_t*>(d + heap_cap * blockDim.x);
        return {d + threadIdx.x, i + threadIdx.x, (int64_t)blockDim.x};
    }
    __device__ static GlobalHeap global(double* out_d, int64_t* out_i, int64_t row) {
        return {out_d + row, out_i + row, 1};
    }
};

// ------------------------------------------------------------------------------------------
// The interface of a path

// The inputs a plan is made for.
struct KnnSizes {
    pcops_dtype dtype;
    int64_t B, M, N, K;
};

// The buffers of a launch (the plan holds the sizes).
template <typename T>
struct KnnArgs {
    const T* query;
    const T* ref;
    const int64_t* query_lengths;
    const int64_t* ref_lengths;
    void* workspace;
    T* dist2;
    int64_t* idx;
    cudaStream_t stream;
};

// Each path (kernels/knn/<path>.cuh) specialises KnnPath for its row of kernels/knn_paths.h:
//   static constexpr bool kGrid     whether it walks a grid (the plan then sizes the grid, and
//                                    checks that its keys fit int32);
//   static bool takes(const KnnSizes&)  whether it can run these inputs (dtype, k and N bounds):
//                                    eligibility; which eligible path is fastest is
//                                    knn/plan.cuh's preference;
//   template <typename T>
//   static cudaError_t launch(const pcops_knn_cuda_plan&, const KnnArgs<T>&)   its launcher.
// The rows with no kernel of their own keep this primary template: AUTO (the plan chooses) and
// GRID_BASELINE (a build option of GRID, knn/plan.cuh).
template <pcops_knn_path P>
struct KnnPath {
    static constexpr bool kGrid = false;
    static bool takes(const KnnSizes&) { return false; }
    template <typename T>
    static cudaError_t launch(const pcops_knn_cuda_plan&, const KnnArgs<T>&) {
        return cudaErrorInvalidValue;
    }
};

// f(std::integral_constant<int, K>{}) for the register bucket K of k: the smallest of 1, 4, 8,
// 16, 32, 64 that holds k (64 for any larger k: callers keep k <= kMaxRegisterK).
template <typename F>
cudaError_t with_register_bucket(int64_t k, F&& f) {
    if (k <= 1) return f(std::integral_constant<int, 1>{});
    if (k <= 4) return f(std::integral_constant<int, 4>{});
    if (k <= 8) return f(std::integral_constant<int, 8>{});
    if (k <= 16) return f(std::integral_constant<int, 16>{});
    if (k <= 32) return f(std::integral_constant<int, 32>{});
    return f(std::integral_constant<int, 64>{});
}

}  // namespace
