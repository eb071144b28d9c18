/*
 * knn.cu -- k nearest neighbours on CUDA.
 *
 * B = batch, M = queries per cloud, N = reference points per cloud, K = neighbours (k at run
 * time), Lq / L = valid queries / refs of a cloud (lengths clamped to [0, M] / [0, N]),
 * S = splits of the refs. query[B,M,3], ref[B,N,3] -> dist2[B,M,K], idx[B,M,K] (int64).
 *
 * Same selection as kernels/knn.c, bit for bit: the squared distance is (dx*dx + dy*dy) + dz*dz
 * with explicitly rounded operations (no contraction whatever the flags), refs are visited in
 * index order and taken only when strictly below the current K-th distance, so the result is
 * exactly the K smallest keys (dist2, idx) among the valid refs with a distance below +inf,
 * sorted; the CPU and CUDA return the same indices.
 *
 * Work distribution: one thread owns one query. The block's threads stage the refs of their
 * cloud through shared memory, TILE points at a time, and every thread scans each tile (all
 * lanes read the same point: a broadcast). Two selection structures:
 *  - knn_registers_kernel<T, K> for k <= K (K a bucket: 1, 4, 8, 16, 32, 64): the best K
 *    (dist2, idx) pairs live in registers, sorted; insertion is fully unrolled so the arrays
 *    are indexed by compile-time constants only. A runtime k < K is handled by filling the
 *    first K - k slots with -inf: they never move, and the K-th slot is always the threshold.
 *    When there are too few queries to fill the GPU, the refs are split into S ranges; each
 *    (query, range) thread writes a sorted partial list to the workspace [B,S,M,k], and
 *    knn_merge_kernel<T, K> feeds the S lists, in range order, through the same insertion
 *    (ties still go to the lower index, since range s holds lower indices than range s + 1).
 *    The result does not depend on S.
 *  - knn_heap_kernel<T, SHARED> for larger k (no cap): a max-heap on the key (dist2, idx) per
 *    thread (float32: packed into one 64-bit integer, as on the CPU), in shared memory when it
 *    fits (interleaved by thread), else in the thread's own output rows in global memory;
 *    sorted in place (heapsort) at the end. Slower, correct. The heaps are kernels/geometry.h's
 *    (pcops_heap_*, with a stride for the interleaving), the ones the CPU uses.
 *  - the grid path (knn_grid_kernel, kernels/grid.h, grid_cuda.cuh): the refs AND the queries
 *    of every cloud binned into a uniform grid on the device by one counting sort
 *    (build_counting: box, count, scan, scatter); one thread per query, the threads in the
 *    queries' cell order (a warp's queries are neighbours: they walk nearly the same cells),
 *    visits the cells in rings of growing distance, a row of new cells as one run of sorted
 *    refs, and keeps the best keys (full (dist2, idx) compares: refs come in any index order)
 *    in a register list (float32: (dist2, idx) packed in one 64-bit key), or (k > 64) a heap
 *    in its output rows.
 *  - knn_warp_select_kernel<R> (float32, N <= 32 R, R <= 32; any k): a warp per query holds
 *    the query's keys (the float bits of every distance) in registers, finds the k-th key bit
 *    by bit with warp sums, and sorts only the k selected keys: one launch, no list to insert
 *    into, so its cost barely grows with k.
 *  - knn_grid_select_kernel (float32, k <= 128): the grid path with a warp per query; the lanes
 *    load a run's refs 32 at a time and append those below the current bound to the warp's
 *    candidate buffer in shared memory, which the warp select's bit search shrinks to the k
 *    best (ties by index) when it fills and at the end of each ring.
 *  - knn_grid_batch_kernel<K> (float32, k <= 64; AUTO for k = 5..16): the grid path's walk
 *    with a thread per query, whose candidates wait in a buffer of 8 in shared memory; the
 *    lanes that run together merge their buffers into their lists at the same time (a sorting
 *    network and a bitonic merge), instead of one 110-instruction insertion per candidate at
 *    scattered times.
 * Every path returns the same result. The path is chosen once per call by a plan
 * (pcops_knn_cuda_plan_make: sizes, device, the caller's forced variant), which also sizes
 * the workspace; the launcher only follows it.
 */
#include <atomic>
#include <cfloat>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "geometry.h"
#include "grid.h"
#include "grid_cuda.cuh"
#include "warp.cuh"
#include "pcops.h"

namespace {

constexpr int kTile = 128;        // refs per shared-memory tile
constexpr int kThreads = 128;     // most threads (queries) per block
constexpr int kHeapThreads = 32;  // threads per block of the heap kernel

// The largest register bucket per dtype (beyond it the lists would spill to local memory).
template <typename T>
struct MaxRegisterK;
template <>
struct MaxRegisterK<float> {
    static constexpr int value = 64;
};
template <>
struct MaxRegisterK<double> {
    static constexpr int value = 64;
};

using pcops_grid_cuda::Point4;

// The squared distance of geometry.h (the one the CPU computes, bit for bit).
__device__ __forceinline__ float squared_distance(float qx, float qy, float qz, const Point4<float>& r) {
    return pcops_dist2_f32(qx, qy, qz, r.x, r.y, r.z);
}

__device__ __forceinline__ double squared_distance(double qx, double qy, double qz,
                                                   const Point4<double>& r) {
    return pcops_dist2_f64(qx, qy, qz, r.x, r.y, r.z);
}

using pcops_grid_cuda::point_id;  // the ref index a grid build stored in a binned point's w slot

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

// Stages refs [t0, t0 + n) of a cloud into the shared tile (n <= kTile). Every thread of the
// block calls it; the barriers around make the tile safe to overwrite and then to read.
template <typename T>
__device__ __forceinline__ void load_tile(Point4<T>* tile, const T* __restrict__ cloud,
                                          int64_t t0, int n) {
    __syncthreads();  // everyone is done with the previous tile
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const T* p = cloud + (t0 + j) * 3;
        tile[j] = Point4<T>{p[0], p[1], p[2], T(0)};
    }
    __syncthreads();
}

// The coordinates of query row `row` (zeros for a thread without a valid query, which only
// helps stage the tiles).
template <typename T>
__device__ __forceinline__ Point4<T> load_query(const T* query, int64_t row, bool active) {
    Point4<T> q{T(0), T(0), T(0), T(0)};
    if (active) {
        const T* p = query + row * 3;
        q.x = p[0];
        q.y = p[1];
        q.z = p[2];
    }
    return q;
}

// ------------------------------------------------------------------------------------------
// CUDA kernels

// Grid: B * S * query_blocks blocks of blockDim.x threads; block -> (b, s, query block).
template <typename T, int K>
__global__ void __launch_bounds__(kThreads)
knn_registers_kernel(const T* __restrict__ query, const T* __restrict__ ref, KnnParams p,
                     T* __restrict__ out_d, int64_t* __restrict__ out_i,
                     T* __restrict__ part_d, int* __restrict__ part_i) {
    __shared__ Point4<T> tile[kTile];

    const int64_t qb = blockIdx.x % p.query_blocks;
    const int64_t rest = blockIdx.x / p.query_blocks;
    const int64_t s = rest % p.splits;
    const int64_t b = rest / p.splits;
    const int64_t m0 = qb * blockDim.x;  // the block's first query
    const int64_t m = m0 + threadIdx.x;
    const int64_t Lq = pcops_valid_length(p.query_lengths, b, p.M);
    const int64_t L = pcops_valid_length(p.ref_lengths, b, p.N);
    const int64_t n0 = s * p.split_len;
    const int64_t n1 = n0 + p.split_len < L ? n0 + p.split_len : L;
    const bool active = m < Lq;

    // (written out, not through load_query: the helper costs this kernel 2-3 registers and,
    // for double K = 16, spills -- ptxas -v, CUDA 13)
    T qx = T(0), qy = T(0), qz = T(0);
    if (active) {
        const T* q = query + (b * p.M + m) * 3;
        qx = q[0];
        qy = q[1];
        qz = q[2];
    }
    RegisterList<T, K> list;
    list.init(p.k);
    if (m0 < Lq) {  // uniform over the block: some thread has a valid query
        const T* cloud = ref + b * p.N * 3;
        for (int64_t t0 = n0; t0 < n1; t0 += kTile) {
            const int n = n1 - t0 < kTile ? (int)(n1 - t0) : kTile;
            load_tile(tile, cloud, t0, n);
            if (active) {
#pragma unroll 2
                for (int j = 0; j < n; ++j) {
                    const T d = squared_distance(qx, qy, qz, tile[j]);
                    if (d < list.threshold()) list.insert(d, (int)(t0 + j));
                }
            }
        }
    }
    if (m < p.M) {
        if (p.splits == 1) {
            const int64_t row = (b * p.M + m) * p.k;
            list.write(out_d + row, out_i + row, p.k);
        } else {
            const int64_t row = ((b * p.splits + s) * p.M + m) * p.k;
            list.write(part_d + row, part_i + row, p.k);
        }
    }
}

// One thread per query (B * M threads): merges the S sorted partial lists of the query.
template <typename T, int K>
__global__ void __launch_bounds__(kThreads)
knn_merge_kernel(KnnParams p, int64_t B, const T* __restrict__ part_d,
                 const int* __restrict__ part_i, T* __restrict__ out_d,
                 int64_t* __restrict__ out_i) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= B * p.M) return;
    const int64_t b = t / p.M;
    const int64_t m = t % p.M;
    RegisterList<T, K> list;
    list.init(p.k);
    if (m < pcops_valid_length(p.query_lengths, b, p.M)) {
        for (int s = 0; s < p.splits; ++s) {
            const int64_t row = ((b * p.splits + s) * p.M + m) * p.k;
            for (int j = 0; j < p.k; ++j) {
                const T d = part_d[row + j];
                if (!(d < list.threshold())) break;  // the rest of this sorted list is no better
                list.insert(d, part_i[row + j]);
            }
        }
    }
    const int64_t row = t * p.k;
    list.write(out_d + row, out_i + row, p.k);
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
// The warp select (float32, N <= 32 R): a warp per query, no list at all.
//
// Lane l computes the keys of refs j = 32 i + l (i < R): the float bits of the squared distance
// (non-negative, so their unsigned order is the float order), 0x7fffffff for a ref that can
// never be a neighbour (j >= L, a distance of +inf or NaN). The kk-th smallest valid key
// (kk = min(k, valid refs)) is found bit by bit from the top: tau gains bit b when fewer than kk
// keys are below tau | 2^b (a warp sum of per-lane counts a bit, 31 bits). The answer is then
// every key below tau and, among the keys equal to tau, the ones of lowest index until there
// are kk (the ballots run in index order): exactly the kk smallest (dist2, idx) keys. For
// kk <= 64 the search runs only on the keys at or below a bound taken from the lanes' second
// smallest keys (select_filtered). The selected keys are gathered in the warp's shared buffer as
// packed 64-bit (dist2 bits, idx) keys and written out sorted (write_selected: in registers up
// to 32, else a bitonic sort in the buffer); slots past kk get (+inf, -1). Every step is a count
// or a compare of the same float bits the other paths compare, so the result is theirs bit for
// bit.
using pcops_warp::max_u32;
using pcops_warp::sum_u32;

constexpr int kSelectWarps = 4;                  // queries (warps) per block
constexpr uint32_t kSelectNever = 0x7fffffffu;   // above every finite float's bits

__device__ __forceinline__ uint32_t lanes_below() {
    uint32_t m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

// Sorts buf[0, n) (n a power of two, n >= 2) ascending with the 32 lanes of the warp.
__device__ __forceinline__ void warp_bitonic_sort(unsigned long long* buf, int n) {
    const int lane = threadIdx.x & 31;
    for (int size = 2; size <= n; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = lane; t < (n >> 1); t += 32) {
                // the t-th position with bit `stride` clear (stride a power of two)
                const int i = ((t & ~(stride - 1)) << 1) | (t & (stride - 1));
                const int j = i + stride;
                const unsigned long long a = buf[i], b = buf[j];
                const bool up = (i & size) == 0;
                if ((a > b) == up) {
                    buf[i] = b;
                    buf[j] = a;
                }
            }
            __syncwarp();
        }
    }
}

// c + (key >= cand): the carry of key - cand added in (two instructions, where the compare and
// a select into a running count take three, in a chain).
__device__ __forceinline__ unsigned add_if_not_below(unsigned c, uint32_t key, uint32_t cand) {
    unsigned r;
    asm("{\n\t.reg .u32 diff;\n\tsub.cc.u32 diff, %1, %2;\n\taddc.u32 %0, %3, 0;\n\t}"
        : "=r"(r)
        : "r"(key), "r"(cand), "r"(c));
    return r;
}

// The kk-th smallest of the warp's keys (slots i < S of every lane: key_at(i); kk >= 1 and at
// most the number of keys below kSelectNever): tau takes bit b, from the top, when fewer than kk
// keys are below tau | 2^b.
template <int S, typename KeyAt>
__device__ __forceinline__ uint32_t warp_kth_key(KeyAt key_at, int kk) {
    uint32_t tau = 0;
    for (int bit = 30; bit >= 0; --bit) {
        const uint32_t cand = tau | (1u << bit);
        unsigned ge0 = 0, ge1 = 0;  // two counts: two independent chains
#pragma unroll
        for (int i = 0; i < S; i += 2) {
            ge0 = add_if_not_below(ge0, key_at(i), cand);
            if (i + 1 < S) ge1 = add_if_not_below(ge1, key_at(i + 1), cand);
        }
        const int below = 32 * S - (int)sum_u32(ge0 + ge1);
        if (below < kk) tau = cand;
    }
    return tau;
}

// Writes to buf[0, kk), in slot order (slot i of lane l before slot i of lane l + 1, before slot
// i + 1 of lane 0: the index order), entry_at(i) of every slot whose key is below tau, then of
// the first slots whose key equals tau until there are kk.
template <int S, typename KeyAt, typename EntryAt>
__device__ __forceinline__ void warp_gather_selected(KeyAt key_at, EntryAt entry_at,
                                                     uint32_t tau, int kk,
                                                     unsigned long long* buf) {
    int below = 0;
#pragma unroll
    for (int i = 0; i < S; ++i) below += key_at(i) < tau;
    const int need = kk - (int)sum_u32((unsigned)below);
    const uint32_t lt = lanes_below();
    int base = 0, ties = 0;
#pragma unroll
    for (int i = 0; i < S; ++i) {
        const uint32_t key = key_at(i);
        const bool eq = key == tau;
        const uint32_t be = __ballot_sync(0xffffffffu, eq);
        const bool sel = key < tau || (eq && ties + __popc(be & lt) < need);
        ties += __popc(be);
        const uint32_t bs = __ballot_sync(0xffffffffu, sel);
        if (sel) buf[base + __popc(bs & lt)] = entry_at(i);
        base += __popc(bs);
    }
}

// Slots of candidates the filtered select holds in registers (32 entries a slot).
constexpr int kSelectSlots = 8;

// The select for kk <= 64 with the keys filtered first: every lane's second smallest key, the
// ceil(kk / 2)-th smallest of those (U) has at least kk keys <= U below or at it (two in each of
// ceil(kk / 2) lanes), so the kk smallest keys are all <= U. The keys <= U (candidates) are
// gathered in index order into buf, read back as packed (key, index) entries, kSelectSlots per
// lane at most, and the bit search and the gather run on those few. Returns false (buf
// untouched: nothing written) where there are more candidates than that.
template <int R>
__device__ __forceinline__ bool select_filtered(const uint32_t (&key)[R], int kk,
                                                unsigned long long* buf) {
    const int lane = threadIdx.x & 31;
    uint32_t a0 = kSelectNever, a1 = kSelectNever;  // the lane's two smallest keys
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const uint32_t hi = max(a0, key[i]);
        a0 = min(a0, key[i]);
        a1 = min(a1, hi);
    }
    // the lanes' a1 sorted across the warp (bitonic, one value a lane)
    uint32_t v = a1;
#pragma unroll
    for (int size = 2; size <= 32; size <<= 1) {
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            const uint32_t other = __shfl_xor_sync(0xffffffffu, v, stride);
            const bool keep_min = ((lane & stride) == 0) == ((lane & size) == 0);
            v = keep_min ? min(v, other) : max(v, other);
        }
    }
    const uint32_t U = __shfl_sync(0xffffffffu, v, (kk + 1) / 2 - 1);
    if (U == kSelectNever) return false;  // a lane with fewer than two keys: no bound
    int c = 0;
#pragma unroll
    for (int i = 0; i < R; ++i) c += key[i] <= U;
    const int C = (int)sum_u32((unsigned)c);
    if (C > 32 * kSelectSlots) return false;
    const uint32_t lt = lanes_below();
    int base = 0;
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const bool sel = key[i] <= U;
        const uint32_t bs = __ballot_sync(0xffffffffu, sel);
        if (sel)
            buf[base + __popc(bs & lt)] =
                ((unsigned long long)key[i] << 32) | (unsigned)(32 * i + lane);
        base += __popc(bs);
    }
    __syncwarp();
    unsigned long long e[kSelectSlots];
#pragma unroll
    for (int i = 0; i < kSelectSlots; ++i) e[i] = 32 * i + lane < C ? buf[32 * i + lane] : ~0ull;
    __syncwarp();  // every entry is read before the gather below overwrites buf
    auto key_at = [&](int i) { return (uint32_t)(e[i] >> 32); };  // empty: 0xffffffff
    auto entry_at = [&](int i) { return e[i]; };
    if (C <= 32 * (kSelectSlots / 2)) {
        const uint32_t tau = warp_kth_key<kSelectSlots / 2>(key_at, kk);
        warp_gather_selected<kSelectSlots / 2>(key_at, entry_at, tau, kk, buf);
    } else {
        const uint32_t tau = warp_kth_key<kSelectSlots>(key_at, kk);
        warp_gather_selected<kSelectSlots>(key_at, entry_at, tau, kk, buf);
    }
    return true;
}

// Sorts the warp's 32 entries (one a lane) ascending across the lanes, in registers.
__device__ __forceinline__ unsigned long long warp_sort32(unsigned long long v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int size = 2; size <= 32; size <<= 1) {
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            const unsigned long long other = __shfl_xor_sync(0xffffffffu, v, stride);
            const bool keep_min = ((lane & stride) == 0) == ((lane & size) == 0);
            v = keep_min ? (other < v ? other : v) : (other > v ? other : v);
        }
    }
    return v;
}

// Writes a query's row: the kk packed (dist2 bits, idx) entries of buf sorted (in registers for
// kk <= 32, else by the bitonic sort in buf, which holds the next power of two >= max(kk, 64)
// entries), then (+inf, -1) up to k. buf's entries must be visible to the whole warp.
__device__ __forceinline__ void write_selected(unsigned long long* buf, int kk, int k,
                                               float* od, int64_t* oi) {
    const int lane = threadIdx.x & 31;
    if (kk > 0 && kk <= 32) {
        unsigned long long e = lane < kk ? buf[lane] : ~0ull;
        e = warp_sort32(e);
        if (lane < kk) {
            od[lane] = __uint_as_float((uint32_t)(e >> 32));
            oi[lane] = (int64_t)(uint32_t)e;
        }
    } else if (kk > 32) {
        int n = 64;
        while (n < kk) n <<= 1;
        for (int s = kk + lane; s < n; s += 32) buf[s] = ~0ull;
        __syncwarp();
        warp_bitonic_sort(buf, n);
        for (int s = lane; s < kk; s += 32) {
            const unsigned long long e = buf[s];
            od[s] = __uint_as_float((uint32_t)(e >> 32));
            oi[s] = (int64_t)(uint32_t)e;
        }
    }
    for (int s = kk + lane; s < k; s += 32) {
        od[s] = INFINITY;
        oi[s] = -1;
    }
}

// Grid: ceil(B * M / kSelectWarps) blocks of 32 * kSelectWarps threads; dynamic shared memory:
// buf_n entries per warp (select_buf_entries).
template <int R>
__global__ void __launch_bounds__(32 * kSelectWarps)
knn_warp_select_kernel(const float* __restrict__ query, const float* __restrict__ ref,
                       KnnParams p, int64_t B, int buf_n, float* __restrict__ out_d,
                       int64_t* __restrict__ out_i) {
    extern __shared__ unsigned long long select_buf[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int64_t t = (int64_t)blockIdx.x * kSelectWarps + warp;  // the query of this warp
    if (t >= B * p.M) return;  // warp-uniform
    unsigned long long* buf = select_buf + (int64_t)warp * buf_n;
    const int64_t b = t / p.M;
    const int64_t m = t - b * p.M;
    const int64_t L = pcops_valid_length(p.ref_lengths, b, p.N);
    const int k = p.k;
    float* od = out_d + t * k;
    int64_t* oi = out_i + t * k;
    int kk = 0;
    if (m < pcops_valid_length(p.query_lengths, b, p.M)) {
        const float* q = query + t * 3;
        const float qx = q[0], qy = q[1], qz = q[2];
        const float* cloud = ref + b * p.N * 3;
        uint32_t key[R];
        int valid = 0;
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const int64_t j = 32 * i + lane;
            key[i] = kSelectNever;
            if (j < L) {
                const float d = pcops_dist2_f32(qx, qy, qz, cloud[3 * j], cloud[3 * j + 1],
                                                cloud[3 * j + 2]);
                const uint32_t u = __float_as_uint(d);
                if (u < 0x7f800000u) key[i] = u;  // +inf and NaN are never neighbours
            }
            valid += key[i] != kSelectNever;
        }
        valid = (int)sum_u32((unsigned)valid);
        kk = valid < k ? valid : k;
        if (kk > 0) {
            bool done = false;
            if constexpr (R >= 16) {
                // buf holds 256 entries where k <= 64 (select_buf_entries); where k > 64 but
                // kk <= 64 (fewer valid refs), at most kk <= 64 candidates are written
                if (kk <= 64) done = select_filtered<R>(key, kk, buf);
            }
            if (!done) {
                const uint32_t tau = warp_kth_key<R>([&](int i) { return key[i]; }, kk);
                warp_gather_selected<R>(
                    [&](int i) { return key[i]; },
                    [&](int i) {
                        return ((unsigned long long)key[i] << 32) | (unsigned)(32 * i + lane);
                    },
                    tau, kk, buf);
            }
            __syncwarp();
        }
    }
    write_selected(buf, kk, k, od, oi);
}

// ------------------------------------------------------------------------------------------
// kernel launchers

// The device the launch will run on: its SM count and shared-memory limit per block.
struct DeviceInfo {
    int device = 0;
    int sms = 1;
    int smem_optin = 48 * 1024;
};

cudaError_t device_info(DeviceInfo* info) {
    cudaError_t err = cudaGetDevice(&info->device);
    if (err != cudaSuccess) return err;
    const int dev = info->device;
    err = cudaDeviceGetAttribute(&info->sms, cudaDevAttrMultiProcessorCount, dev);
    if (err != cudaSuccess) return err;
    return cudaDeviceGetAttribute(&info->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                  dev);
}

int register_bucket(int64_t k) {
    return k <= 1 ? 1 : k <= 4 ? 4 : k <= 8 ? 8 : k <= 16 ? 16 : k <= 32 ? 32 : 64;
}

// Threads per block for a cloud of M queries: a multiple of 32, at most kThreads.
int threads_for(int64_t M) {
    const int64_t t = (M + 31) / 32 * 32;
    return (int)(t < 32 ? 32 : t > kThreads ? kThreads : t);
}

// Ref ranges per query: enough (query, range) threads to fill the GPU when there are few
// queries, each range at least max(kMinSplitLen, 8 k) refs long, so that scanning a range
// stays the larger part of the work (a merge inserts up to k entries per range).
constexpr int64_t kMinSplitLen = 256;
constexpr int64_t kMaxSplits = 64;

int64_t choose_splits(int64_t B, int64_t M, int64_t N, int64_t K, int sms) {
    const int64_t target_threads = (int64_t)sms * 1024;
    const int64_t queries = B * M;
    if (queries <= 0 || queries >= target_threads / 2) return 1;
    int64_t s = (target_threads + queries - 1) / queries;
    const int64_t by_len = N / (8 * K > kMinSplitLen ? 8 * K : kMinSplitLen);
    if (s > by_len) s = by_len;
    if (s > kMaxSplits) s = kMaxSplits;
    return s < 1 ? 1 : s;
}

template <typename T, int K>
cudaError_t launch_registers(const T* query, const T* ref, KnnParams p, int64_t B,
                             void* workspace, T* dist2, int64_t* idx, cudaStream_t stream) {
    const int threads = threads_for(p.M);
    p.query_blocks = (p.M + threads - 1) / threads;
    const int64_t blocks = B * p.splits * p.query_blocks;
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
    T* part_d = nullptr;
    int* part_i = nullptr;
    if (p.splits > 1) {
        part_d = static_cast<T*>(workspace);
        part_i = reinterpret_cast<int*>(part_d + B * p.splits * p.M * p.k);
    }
    knn_registers_kernel<T, K><<<(unsigned)blocks, threads, 0, stream>>>(query, ref, p, dist2,
                                                                          idx, part_d, part_i);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess || p.splits == 1) return err;
    const int64_t merge_blocks = (B * p.M + kThreads - 1) / kThreads;
    if (merge_blocks > INT_MAX) return cudaErrorInvalidValue;
    knn_merge_kernel<T, K><<<(unsigned)merge_blocks, kThreads, 0, stream>>>(p, B, part_d, part_i,
                                                                            dist2, idx);
    return cudaGetLastError();
}

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
cudaError_t launch_heap(const T* query, const T* ref, KnnParams p, int64_t B,
                        const DeviceInfo& info, T* dist2, int64_t* idx, cudaStream_t stream) {
    const int threads = kHeapThreads;
    p.query_blocks = (p.M + threads - 1) / threads;
    const int64_t blocks = B * p.query_blocks;
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
    const int64_t cap = p.k < p.N ? p.k : p.N;
    const size_t tile_bytes = kTile * sizeof(Point4<T>);
    const size_t heap_bytes = (size_t)cap * threads * HeapTraits<T>::shared_entry_bytes;
    // Shared heaps while at least two blocks fit on an SM; the output rows beyond that.
    const size_t shared_bytes = tile_bytes + heap_bytes;
    if (cap <= INT_MAX / threads && shared_bytes <= (size_t)info.smem_optin / 2) {
        if (shared_bytes > 48 * 1024) {
            const cudaError_t err = allow_shared_heaps<T>(info.device, info.smem_optin / 2);
            if (err != cudaSuccess) return err;
        }
        knn_heap_kernel<T, true><<<(unsigned)blocks, threads, shared_bytes, stream>>>(
            query, ref, p, cap, dist2, idx);
    } else {
        knn_heap_kernel<T, false><<<(unsigned)blocks, threads, tile_bytes, stream>>>(
            query, ref, p, 0, dist2, idx);
    }
    return cudaGetLastError();
}

// ------------------------------------------------------------------------------------------
// the grid path

// The list of a grid query: the register list with full key compares (refs arrive in cell
// order, not index order), or for large k a max-heap in the thread's output rows.
template <typename T, int K>
struct GridRegisterList {
    RegisterList<T, K> l;
    __device__ __forceinline__ void init(int k) { l.init(k); }
    __device__ __forceinline__ bool full() const { return l.i[K - 1] >= 0; }
    __device__ __forceinline__ T threshold() const { return l.d[K - 1]; }
    // (dist, n) is kept when its key is below the largest kept key (dist < +inf). The compares
    // use & and | (no short circuit): the insertion is straight-line code without branches.
    __device__ __forceinline__ void offer(T dist, int n) {
        const T td = l.d[K - 1];
        if (!((dist < td) | ((dist == td) & (n < l.i[K - 1])))) return;
#pragma unroll
        for (int s = K - 1; s > 0; --s) {
            const bool shift = (l.d[s - 1] > dist) | ((l.d[s - 1] == dist) & (l.i[s - 1] > n));
            const bool here = (l.d[s] > dist) | ((l.d[s] == dist) & (l.i[s] > n));
            l.d[s] = shift ? l.d[s - 1] : (here ? dist : l.d[s]);
            l.i[s] = shift ? l.i[s - 1] : (here ? n : l.i[s]);
        }
        const bool here = (l.d[0] > dist) | ((l.d[0] == dist) & (l.i[0] > n));
        l.d[0] = here ? dist : l.d[0];
        l.i[0] = here ? n : l.i[0];
    }
    __device__ __forceinline__ void finish(T* out_d, int64_t* out_i, int k) const {
        l.write(out_d, out_i, k);
    }
};

// The float32 list with each (dist2, idx) packed into one 64-bit key: dist2 >= 0 (or +inf)
// and its bits order as unsigned integers, so the key order is the (dist2, idx) order and a
// compare is one 64-bit integer compare. Padding slots (k < K) hold 0 (never above a key:
// they never move), empty slots ~0 (above every key).
// Writes the last k of an ascending packed-key list (float32 dist2 bits << 32 | index; all ones
// for an empty slot: +inf / -1) to a query's output rows.
template <int K>
__device__ __forceinline__ void write_keys(const uint64_t (&key)[K], float* out_d, int64_t* out_i,
                                           int k) {
#pragma unroll
    for (int s = 0; s < K; ++s) {
        if (s >= K - k) {
            const bool empty = key[s] == ~(uint64_t)0;
            out_d[s - (K - k)] = empty ? INFINITY : __uint_as_float((unsigned)(key[s] >> 32));
            out_i[s - (K - k)] = empty ? -1 : (int64_t)(uint32_t)key[s];
        }
    }
}

template <int K>
struct GridKeyList {
    static constexpr uint64_t kEmpty = ~(uint64_t)0;
    uint64_t key[K];
    __device__ __forceinline__ void init(int k) {
#pragma unroll
        for (int s = 0; s < K; ++s) key[s] = s < K - k ? 0 : kEmpty;
    }
    __device__ __forceinline__ bool full() const { return key[K - 1] != kEmpty; }
    __device__ __forceinline__ float threshold() const {
        return full() ? __uint_as_float((unsigned)(key[K - 1] >> 32)) : INFINITY;
    }
    __device__ __forceinline__ void offer(float dist, int n) {
        const uint64_t kk = ((uint64_t)__float_as_uint(dist) << 32) | (unsigned)n;
        if (!(kk < key[K - 1]) || !(dist < INFINITY)) return;
        pcops_grid_cuda::insert_sorted(key, kk);
    }
    __device__ __forceinline__ void finish(float* out_d, int64_t* out_i, int k) const {
        write_keys(key, out_d, out_i, k);
    }
};

// The register list of a grid query: packed keys for float32, (dist2, idx) pairs for float64.
template <typename T, int K>
struct GridList {
    using type = GridRegisterList<T, K>;
};
template <int K>
struct GridList<float, K> {
    using type = GridKeyList<K>;
};

template <typename T>
struct GridHeapList {
    typename HeapTraits<T>::GlobalHeap heap;
    int64_t count, cap;
    T th;
    __device__ __forceinline__ bool full() const { return count == cap; }
    __device__ __forceinline__ T threshold() const { return th; }
    __device__ __forceinline__ void offer(T dist, int n) {
        if (!(dist <= th) || !(dist < T(INFINITY))) return;
        if ((count < cap || heap.top_above(dist, n)) && heap.keep(cap, &count, dist, n))
            th = heap.top_dist();
    }
    __device__ void finish(T* out_d, int64_t* out_i, int k) const {
        heap.finish(count, k, out_d, out_i);
    }
};

struct GridParams {
    const int64_t* query_lengths;
    const int64_t* ref_lengths;
    int64_t B, M, N, C;
    int k;
    const pcops_grid* grids;
    const int32_t* start;  // [B * C + 1]
    const int32_t* ids;    // the ref index of each sorted position
};

// Offers the sorted refs [j, end) to the list, two a step with both loads issued before either
// is used (a ref's index travels in its w slot: one 16- or 32-byte load a ref).
template <typename T, typename List>
__device__ __forceinline__ void scan_run(const Point4<T>* __restrict__ pts, int32_t j,
                                         int32_t end, T qx, T qy, T qz, List& list) {
    for (; j + 1 < end; j += 2) {
        const Point4<T> r0 = pts[j], r1 = pts[j + 1];
        list.offer(squared_distance(qx, qy, qz, r0), point_id(r0));
        list.offer(squared_distance(qx, qy, qz, r1), point_id(r1));
    }
    if (j < end) {
        const Point4<T> r0 = pts[j];
        list.offer(squared_distance(qx, qy, qz, r0), point_id(r0));
    }
}

// The end of a ring of grid_walk: nothing to do for the lists of one thread (the grid select's
// buffer has its own overload).
template <typename List>
__device__ __forceinline__ void ring_done(List&) {}

// Visits the grid of cloud b around q in rings (kernels/knn_cpu.inc, knn_grid_query, is the
// same walk) and offers every ref of a visited cell to the list (scan_run).
template <typename T, typename List>
__device__ __forceinline__ void grid_walk(const GridParams& p, int64_t b, const Point4<T>* pts,
                                          T qx, T qy, T qz, List& list) {
    const pcops_grid g = p.grids[b];
    if (g.cells == 0 || !pcops_grid_finite3(qx, qy, qz)) return;
    const double q[3] = {qx, qy, qz};
    int32_t c[3];
    for (int a = 0; a < 3; ++a) c[a] = pcops_grid_coord(&g, a, q[a]);
    const int32_t rmax = pcops_grid_max_ring(&g, c);
    const int32_t dx = g.dims[0], dy = g.dims[1];
    const int32_t* start = p.start + b * p.C;
    for (int32_t r = 0; r <= rmax; ++r) {
        const int32_t z0 = max(c[2] - r, 0), z1 = min(c[2] + r, g.dims[2] - 1);
        const int32_t y0 = max(c[1] - r, 0), y1 = min(c[1] + r, dy - 1);
        const int32_t x0 = max(c[0] - r, 0), x1 = min(c[0] + r, dx - 1);
        // planes and rows with no new cell in the grid are stepped over (knn_cpu.inc)
        const bool xends = c[0] - r >= 0 || c[0] + r <= dx - 1;
        const bool yedges = c[1] - r >= 0 || c[1] + r <= dy - 1;
        for (int32_t cz = z0; cz <= z1; ++cz) {
            const bool zedge = cz == c[2] - r || cz == c[2] + r;
            if (!zedge && !xends && !yedges) {
                if (c[2] + r > z1) break; /* cz is strictly inside the shell */
                cz = c[2] + r - 1;
                continue;
            }
            const double gz = pcops_grid_axis_gap(&g, 2, q[2], cz, cz);
            const double bz = gz * gz;
            if (list.full() && bz * PCOPS_GRID_SHRINK > (double)list.threshold()) continue;
            for (int32_t cy = y0; cy <= y1; ++cy) {
                const bool edge = zedge || cy == c[1] - r || cy == c[1] + r;
                if (!edge && !xends) {
                    if (c[1] + r > y1) break; /* cy is strictly inside the shell */
                    cy = c[1] + r - 1;
                    continue;
                }
                const double gy = pcops_grid_axis_gap(&g, 1, q[1], cy, cy);
                const double byz = bz + gy * gy;
                if (list.full() && byz * PCOPS_GRID_SHRINK > (double)list.threshold()) continue;
                const int64_t row = ((int64_t)cz * dy + cy) * dx;
                if (edge || r == 0) {
                    // every cell of the row is new: one contiguous run of sorted refs, less
                    // the cells at its ends beyond the k-th distance (the gap grows away from
                    // the query, so the cells between two kept ends are kept too)
                    int32_t xa = x0, xb = x1;
                    if (list.full())
                        pcops_grid_cuda::trim_row<false>(&g, q[0], byz,
                                                         (double)list.threshold(), xa, xb);
                    if (xa <= xb) scan_run(pts, start[row + xa], start[row + xb + 1], qx, qy, qz, list);
                } else {
                    // the row's two end cells, c - r and c + r
                    for (int32_t cx = c[0] - r; cx <= c[0] + r; cx += 2 * r) {
                        if (cx < x0 || cx > x1) continue;
                        if (list.full()) {
                            const double gx = pcops_grid_axis_gap(&g, 0, q[0], cx, cx);
                            if ((byz + gx * gx) * PCOPS_GRID_SHRINK > (double)list.threshold())
                                continue;
                        }
                        scan_run(pts, start[row + cx], start[row + cx + 1], qx, qy, qz, list);
                    }
                }
            }
        }
        ring_done(list);
        if (list.full() && (double)list.threshold() < pcops_grid_ring_bound(&g, q, c, r)) break;
    }
}

// Blocks of kThreads an SM should hold for the grid kernel: the registers of 6 for k <= 16
// (85 a thread), fewer for longer lists.
template <int K>
struct GridMinBlocks {
    static constexpr int value = K >= 1 && K <= 16 ? 6 : 1;
};

// The query of grid thread t: its cloud b, its index m in the cloud and its flat index b * M + m
// (the threads take the queries in their cell order, build_counting's `order`: the queries of a
// warp are neighbours).
struct GridQuery {
    int64_t b, m, flat;
};
__device__ __forceinline__ GridQuery grid_query(const GridParams& p, const int32_t* order,
                                                int64_t t) {
    const int64_t b = t / p.M;
    const int64_t flat = b * p.M + order[t];
    return {b, flat % p.M, flat};
}

// One thread per query (B * M threads).
template <typename T, int K>
__global__ void __launch_bounds__(kThreads, GridMinBlocks<K>::value)
knn_grid_kernel(const T* __restrict__ query, GridParams p, const Point4<T>* __restrict__ pts,
                T* __restrict__ out_d, int64_t* __restrict__ out_i,
                const int32_t* __restrict__ order) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= p.B * p.M) return;
    const auto [b, m, flat] = grid_query(p, order, t);
    const int64_t row = flat * p.k;
    const T* q = query + flat * 3;
    if constexpr (K > 0) {
        typename GridList<T, K>::type list;
        list.init(p.k);
        if (m < pcops_valid_length(p.query_lengths, b, p.M))
            grid_walk<T>(p, b, pts, q[0], q[1], q[2], list);
        list.finish(out_d + row, out_i + row, p.k);
    } else {
        const int64_t L = pcops_valid_length(p.ref_lengths, b, p.N);
        GridHeapList<T> list{HeapTraits<T>::global(out_d, out_i, row), 0,
                            (int64_t)p.k < L ? (int64_t)p.k : L, T(INFINITY)};
        if (list.cap > 0 && m < pcops_valid_length(p.query_lengths, b, p.M))
            grid_walk<T>(p, b, pts, q[0], q[1], q[2], list);
        list.finish(out_d + row, out_i + row, p.k);
    }
}

// ------------------------------------------------------------------------------------------
// The grid with batched insertion (float32, k <= 64): the walk of knn_grid_kernel, but a
// thread's candidates (packed keys below its list's largest) are appended to a buffer of
// kBatch in shared memory instead of being inserted one by one. An insertion into the sorted
// register list is ~110 instructions, and in a warp whose lanes walk neighbouring cells the
// lanes' insertions fall on different refs: the warp paid one for nearly every ref offered
// (ncu at K2: ~120 insertions a warp for ~41 a lane). Here the lanes that run together flush
// together: after each pair of refs, when any of them has fewer than two free slots, every one
// of them sorts its buffer (a bitonic network) and merges it into its list (the K smallest of
// the list and the sorted buffer are min(list[i], buf[K-1-i]), a bitonic sequence, sorted by a
// bitonic merge): ~45 instructions a candidate, once for the lanes together. The list then
// holds the K smallest keys of everything offered, as grid_walk's list does: the same bits.
// Until a flush the list's largest key is a stale (larger) bound: more candidates and less
// pruning, never a wrong one. A ring ends with a drain of the lanes' buffers.
// Candidates a thread buffers (sort8 sorts them). H100, B=16 M=N=4096 k=16, ms idle / queued:
// 4 0.180 / 0.148, 8 0.162 / 0.137, 16 0.199 / 0.175 (a longer sort, a staler bound).
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
        list.offer(squared_distance(qx, qy, qz, r0), point_id(r0));
        list.offer(squared_distance(qx, qy, qz, r1), point_id(r1));
    }
    if (j < end) {
        list.flush_together(1);
        const Point4<float> r0 = pts[j];
        list.offer(squared_distance(qx, qy, qz, r0), point_id(r0));
    }
}
template <int K>
__device__ __forceinline__ void ring_done(GridBatchList<K>& list) {
    list.drain_together();
}

// Blocks of kThreads an SM for the batched grid: 4 (128 registers a thread; the grids of the
// peer rows have at most ~16 warps an SM of work) up to k = 16, fewer for longer lists.
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
// The grid select (float32, k <= 128): a warp per query walks the same rings as grid_walk, its
// lanes loading 32 refs of a run at once; the refs whose packed key (dist2 bits, idx) is below
// the current bound are appended to the warp's candidate buffer (shared memory, ballots). When
// the buffer would overflow, and at the end of each ring once k candidates are there, it is
// shrunk to exactly the kk smallest packed keys (the kk-th key by the bit search, then, among
// the refs tied at it, the lowest indices by a second bit search on the indices); the largest
// kept key becomes the bound (only smaller keys can still enter) and its distance the ring
// walk's k-th distance. The result is the kk smallest keys of every ref the walk can reach, as
// for grid_walk's list: the same bits.
constexpr int kGridSelectSlots = 16;                      // candidates a lane holds in a shrink
constexpr int kGridSelectCap = 32 * kGridSelectSlots;     // candidates per warp
constexpr int kGridSelectWarps = 4;
constexpr int kGridSelectMaxK = 128;

struct GridSelect {
    unsigned long long* buf;  // [kGridSelectCap]
    int count;                // candidates in buf (warp-uniform)
    int k;
    unsigned long long bound;  // a candidate enters iff its packed key is below this
    bool shrunk;               // the buffer was shrunk to k entries at least once

    // Keeps the kk = min(k, count) smallest entries of buf (exactly kk of them).
    __device__ void shrink() {
        const int lane = threadIdx.x & 31;
        __syncwarp();  // the entries other lanes appended are visible
        const int kk = count < k ? count : k;
        unsigned long long e[kGridSelectSlots];
#pragma unroll
        for (int i = 0; i < kGridSelectSlots; ++i)
            e[i] = 32 * i + lane < count ? buf[32 * i + lane] : ~0ull;
        __syncwarp();  // every entry is read before the compaction below overwrites buf
        auto key_at = [&](int i) { return (uint32_t)(e[i] >> 32); };
        const uint32_t tau = warp_kth_key<kGridSelectSlots>(key_at, kk);
        int below = 0, eq = 0;
#pragma unroll
        for (int i = 0; i < kGridSelectSlots; ++i) {
            below += key_at(i) < tau;
            eq += key_at(i) == tau;
        }
        below = (int)sum_u32((unsigned)below);
        eq = (int)sum_u32((unsigned)eq);
        const int need = kk - below;
        uint32_t id_tau = 0xffffffffu;  // ties at tau kept: index <= id_tau
        if (eq > need) {
            auto id_at = [&](int i) {
                return key_at(i) == tau ? (uint32_t)e[i] : 0xffffffffu;
            };
            id_tau = warp_kth_key<kGridSelectSlots>(id_at, need);
        }
        const uint32_t lt = lanes_below();
        int base = 0;
        uint32_t max_tie = 0;
#pragma unroll
        for (int i = 0; i < kGridSelectSlots; ++i) {
            const uint32_t key = key_at(i), id = (uint32_t)e[i];
            const bool sel = key < tau || (key == tau && id <= id_tau);
            if (sel && key == tau) max_tie = max(max_tie, id);
            const uint32_t bs = __ballot_sync(0xffffffffu, sel);
            if (sel) buf[base + __popc(bs & lt)] = e[i];
            base += __popc(bs);
        }
        __syncwarp();
        count = base;  // == kk
        if (kk == k) {
            max_tie = max_u32(max_tie);
            // the largest kept entry, plus one: equal keys cannot come again (indices are
            // unique), and a key below it still enters
            bound = (((unsigned long long)tau << 32) | max_tie) + 1ull;
            shrunk = true;
        }
    }

    // Offers the refs pts[j0, j1) (their packed keys) to the buffer.
    __device__ void offer_run(const Point4<float>* __restrict__ pts, int32_t j0, int32_t j1,
                              float qx, float qy, float qz) {
        const int lane = threadIdx.x & 31;
        const uint32_t lt = lanes_below();
        for (int32_t j = j0; j < j1; j += 32) {
            unsigned long long e = ~0ull;
            if (j + lane < j1) {
                const Point4<float> r = pts[j + lane];
                const float d = squared_distance(qx, qy, qz, r);
                const uint32_t u = __float_as_uint(d);
                if (u < 0x7f800000u)  // +inf and NaN are never neighbours
                    e = ((unsigned long long)u << 32) | (uint32_t)point_id(r);
            }
            const bool take = e < bound;
            const uint32_t bs = __ballot_sync(0xffffffffu, take);
            if (bs == 0u) continue;
            if (count + __popc(bs) > kGridSelectCap) shrink();  // warp-uniform
            const bool take2 = e < bound;  // the bound may have dropped
            const uint32_t b2 = __ballot_sync(0xffffffffu, take2);
            if (take2) buf[count + __popc(b2 & lt)] = e;
            count += __popc(b2);
        }
        __syncwarp();
    }
    // grid_walk's list interface: the k-th distance, once k candidates were kept
    __device__ bool full() const { return shrunk; }
    __device__ float threshold() const { return __uint_as_float((uint32_t)(bound >> 32)); }
};

// grid_walk's hooks for the grid select: a run of refs goes to the buffer, and a ring with k
// candidates ends with a shrink (its k-th distance then bounds the rest of the walk).
__device__ __forceinline__ void scan_run(const Point4<float>* __restrict__ pts, int32_t j,
                                         int32_t end, float qx, float qy, float qz,
                                         GridSelect& sel) {
    sel.offer_run(pts, j, end, qx, qy, qz);
}
__device__ __forceinline__ void ring_done(GridSelect& sel) {
    if (sel.count >= sel.k) sel.shrink();
}

// One warp per query (B * M warps, in the queries' cell order); dynamic shared memory:
// kGridSelectCap entries per warp.
__global__ void __launch_bounds__(32 * kGridSelectWarps)
knn_grid_select_kernel(const float* __restrict__ query, GridParams p,
                       const Point4<float>* __restrict__ pts, float* __restrict__ out_d,
                       int64_t* __restrict__ out_i, const int32_t* __restrict__ order) {
    extern __shared__ unsigned long long grid_select_buf[];
    const int warp = threadIdx.x >> 5;
    int64_t t = (int64_t)blockIdx.x * kGridSelectWarps + warp;
    if (t >= p.B * p.M) return;  // warp-uniform
    const int64_t b = t / p.M;
    t = b * p.M + order[t];
    const int64_t m = t % p.M;
    const int k = p.k;
    GridSelect sel{grid_select_buf + (int64_t)warp * kGridSelectCap, 0, k, ~0ull, false};
    const float* q = query + t * 3;
    const float qx = q[0], qy = q[1], qz = q[2];
    if (m < pcops_valid_length(p.query_lengths, b, p.M)) {
        grid_walk<float>(p, b, pts, qx, qy, qz, sel);
        if (sel.count > k) sel.shrink();
    }
    write_selected(sel.buf, sel.count, k, out_d + t * k, out_i + t * k);
}

// Cells per cloud of the grid path: about max(3.5, k / 8) refs per cell (H100, issue-8 rows,
// queries in cell order, rows scanned as runs: at k = 8, 16 and 32, 3.5 refs a cell were
// within noise of 3 and 4 and 10-15 % ahead of 2 and 5-7; at k = 64, 6-10 were 10-25 % ahead
// of 12-16).
double grid_refs_per_cell(int64_t K) {
    const double per = (double)K / 8.0;
    return per > 3.5 ? per : 3.5;
}

int64_t grid_cells(int64_t N, int64_t K) {
    return pcops_grid_budget(N, 1.0 / grid_refs_per_cell(K));
}

// Cells per cloud of the grid select: max(16, k / 4) refs a cell (H100, k = 64: 16 refs a cell
// 0.71 ms at B=16 M=N=4096 against 0.93 with 8 and 0.75 with 32; k = 100: 32 refs a cell 0.47,
// 16 0.51): a warp's 32 lanes take a run of refs at once, so runs longer than the list-per-
// thread walk's pay.
int64_t grid_select_cells(int64_t N, int64_t K) {
    const double per = (double)K / 4.0 > 16.0 ? (double)K / 4.0 : 16.0;
    return pcops_grid_budget(N, 1.0 / per);
}

template <typename T>
cudaError_t launch_grid(const pcops_knn_cuda_plan& plan, const T* query, const T* ref,
                        const int64_t* query_lengths, const int64_t* ref_lengths,
                        void* workspace, T* dist2, int64_t* idx, cudaStream_t stream) {
    // the one-block build lays the cell starts out with a stride of cells + 1 (grid_cuda.cuh)
    const int64_t stride = plan.small_build ? plan.cells + 1 : plan.cells;
    pcops_grid_cuda::CountScratch<T> s;
    pcops_grid_cuda::carve_counting<T>(workspace, plan.B, plan.N, plan.M, stride, &s,
                                       !plan.small_build);
    cudaError_t err =
        plan.small_build
            ? pcops_grid_cuda::build_small<T>(ref, ref_lengths, query, query_lengths, plan.B,
                                              plan.N, plan.M, plan.cells, s, stream)
            : pcops_grid_cuda::build_counting<T>(ref, ref_lengths, query, query_lengths, plan.B,
                                                 plan.N, plan.M, plan.cells, s, stream);
    if (err != cudaSuccess) return err;
    const int32_t* order = s.order;
    GridParams p{query_lengths, ref_lengths, plan.B, plan.M, plan.N, stride, (int)plan.K,
                 s.grids, s.start, s.ids};
    if (plan.path == PCOPS_KNN_GRID_SELECT) {
        if constexpr (std::is_same<T, float>::value) {
            const int64_t blocks = (plan.B * plan.M + kGridSelectWarps - 1) / kGridSelectWarps;
            if (blocks > INT_MAX) return cudaErrorInvalidValue;
            const size_t smem = (size_t)kGridSelectWarps * kGridSelectCap * sizeof(unsigned long long);
            knn_grid_select_kernel<<<(unsigned)blocks, 32 * kGridSelectWarps, smem, stream>>>(
                query, p, s.pts, dist2, idx, order);
            return cudaGetLastError();
        } else {
            return cudaErrorInvalidValue;  // the plan takes it for float32 only
        }
    }
    const int64_t blocks = (plan.B * plan.M + kThreads - 1) / kThreads;
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
    const unsigned g = (unsigned)blocks;
    if (plan.path == PCOPS_KNN_GRID_BATCH) {
        if constexpr (std::is_same<T, float>::value) {
            switch (register_bucket(plan.K)) {
                case 1:
                case 4:
                case 8: knn_grid_batch_kernel<8><<<g, kThreads, 0, stream>>>(query, p, s.pts, dist2, idx, order); break;
                case 16: knn_grid_batch_kernel<16><<<g, kThreads, 0, stream>>>(query, p, s.pts, dist2, idx, order); break;
                case 32: knn_grid_batch_kernel<32><<<g, kThreads, 0, stream>>>(query, p, s.pts, dist2, idx, order); break;
                default: knn_grid_batch_kernel<64><<<g, kThreads, 0, stream>>>(query, p, s.pts, dist2, idx, order); break;
            }
            return cudaGetLastError();
        } else {
            return cudaErrorInvalidValue;  // the plan takes it for float32 only
        }
    }
    switch (plan.K > MaxRegisterK<T>::value ? 0 : register_bucket(plan.K)) {
        case 1: knn_grid_kernel<T, 1><<<g, kThreads, 0, stream>>>(query, p, s.pts, dist2, idx, order); break;
        case 4: knn_grid_kernel<T, 4><<<g, kThreads, 0, stream>>>(query, p, s.pts, dist2, idx, order); break;
        case 8: knn_grid_kernel<T, 8><<<g, kThreads, 0, stream>>>(query, p, s.pts, dist2, idx, order); break;
        case 16: knn_grid_kernel<T, 16><<<g, kThreads, 0, stream>>>(query, p, s.pts, dist2, idx, order); break;
        case 32: knn_grid_kernel<T, 32><<<g, kThreads, 0, stream>>>(query, p, s.pts, dist2, idx, order); break;
        case 64: knn_grid_kernel<T, 64><<<g, kThreads, 0, stream>>>(query, p, s.pts, dist2, idx, order); break;
        default: knn_grid_kernel<T, 0><<<g, kThreads, 0, stream>>>(query, p, s.pts, dist2, idx, order); break;
    }
    return cudaGetLastError();
}

// ------------------------------------------------------------------------------------------
// the plan

size_t scalar_bytes(pcops_dtype dtype) { return dtype == PCOPS_FLOAT64 ? 8 : 4; }

// The warp select holds a query's keys in registers: float32 clouds of at most 32 * 32 refs.
constexpr int64_t kSelectMaxN = 32 * 32;
bool warp_select_ok(pcops_dtype dtype, int64_t N) {
    return dtype == PCOPS_FLOAT32 && N <= kSelectMaxN;
}

// Entries of the warp select's shared buffer per warp: the sort of min(k, N) keys (the next
// power of two, at least 2) and, where the filtered select can run (N > 256, k <= 64), its
// candidates.
int select_buf_entries(int64_t K, int64_t N) {
    const int64_t cap = K < N ? K : N;
    int n = 2;
    while (n < cap) n <<= 1;
    if (N > 256 && K <= 64 && n < 32 * kSelectSlots) n = 32 * kSelectSlots;
    return n;
}

cudaError_t make_plan(pcops_dtype dtype, int64_t B, int64_t M, int64_t N, int64_t K,
                      pcops_knn_path variant, pcops_knn_cuda_plan* plan) {
    if (!plan) return cudaErrorInvalidValue;
    *plan = pcops_knn_cuda_plan{};
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return cudaErrorInvalidValue;
    if (B < 0 || M < 0 || N < 0 || K < 1 || M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return cudaErrorInvalidValue;
    DeviceInfo info;
    cudaError_t err = device_info(&info);
    if (err != cudaSuccess) return err;
    // GRID_BASELINE: the grid with the general build even where the one-block build applies
    // (tests reach both builds)
    const pcops_knn_path requested = variant;
    const bool baseline_build = variant == PCOPS_KNN_GRID_BASELINE;
    if (baseline_build) variant = PCOPS_KNN_GRID;
    plan->dtype = dtype;
    plan->B = B;
    plan->M = M;
    plan->N = N;
    plan->K = K;
    plan->device = info.device;
    plan->sms = info.sms;
    plan->smem_optin = info.smem_optin;
    const int64_t max_reg = 64;
    // the grid's keys b * C + cell are int32
    const int64_t cells = grid_cells(N, K);
    const bool grid_ok = 2 * B * cells + 1 < INT_MAX && B * N + B * M < INT_MAX;
    // AUTO, from the H100 (BENCHMARKS.md, issue-8 rows): the grid from N = 1024 up for k <= 64
    // and N >= 8 k (N = 1024, k = 32: 0.17 ms against the brute force's 0.30; N = 4096,
    // k = 64: 0.93 against 4.7); the brute force below and for k > 64.
    // The warp select for float32 clouds of at most 1024 refs from k = 16 (H100, L2 flushed,
    // ms from an idle GPU): B=16 M=N=1024 k=128 0.158 against the heap's 0.772, B=32 M=512
    // N=1024 k=32 0.082 against the grid's 0.190 and the brute force's 0.310, k=16 0.078
    // against 0.116 / 0.131, N=256 k=16 0.067 against 0.059-0.14 (noise-level); k < 16 not
    // measured: the register lists keep it.
    if (variant == PCOPS_KNN_AUTO && warp_select_ok(dtype, N) && K >= 16)
        variant = PCOPS_KNN_WARP_SELECT;
    // The grid select from k = 64 (float32; H100, L2 flushed, ms from an idle GPU): B=16
    // M=N=4096 k=64 0.71 against the register grid's 0.96, M=N=1e5 k=64 1.13 against 1.38,
    // B=4 M=N=8192 k=100 0.51 against the heap grid's 1.14; at k = 16 it was 2-4x slower.
    if (variant == PCOPS_KNN_AUTO && dtype == PCOPS_FLOAT32 && K >= 64 &&
        K <= kGridSelectMaxK && 8 * K <= N)
        variant = PCOPS_KNN_GRID_SELECT;
    if (variant == PCOPS_KNN_AUTO)
        variant = K <= max_reg && 8 * K <= N && N >= 1024 ? PCOPS_KNN_GRID
                                                          : PCOPS_KNN_BRUTE;
    // The batched insertion for float32 lists of 8 and 16 (k = 5..16; H100, L2 flushed, ms from
    // an idle GPU / queued, register grid -> batched): B=16 M=N=4096 k=16 0.183 / 0.163 -> 0.152
    // / 0.131, B=8 M=N=16384 0.283 / 0.257 -> 0.242 / 0.218, M=N=1e5 0.240 / 0.216 -> 0.213 /
    // 0.191, the KITTI scan 1.103 / 1.073 -> 0.995 / 0.970, Gaussian blobs 16 x 4096 0.530 /
    // 0.509 -> 0.446 / 0.429, 4 x 8192 k=8 0.100 / 0.077 -> 0.096 / 0.074; k = 32 level (0.297
    // / 0.297 queued), k = 64 slower (the grid select takes it); k <= 4 keeps its short lists.
    if (variant == PCOPS_KNN_GRID && requested == PCOPS_KNN_AUTO &&
        dtype == PCOPS_FLOAT32 && K >= 5 && K <= 16)
        variant = PCOPS_KNN_GRID_BATCH;
    if (variant == PCOPS_KNN_GRID_SELECT && (dtype != PCOPS_FLOAT32 || K > kGridSelectMaxK))
        variant = PCOPS_KNN_GRID;
    if (variant == PCOPS_KNN_GRID_BATCH && (dtype != PCOPS_FLOAT32 || K > max_reg))
        variant = PCOPS_KNN_GRID;
    const bool on_grid = variant == PCOPS_KNN_GRID || variant == PCOPS_KNN_GRID_SELECT ||
                         variant == PCOPS_KNN_GRID_BATCH;
    if (on_grid && !grid_ok) variant = PCOPS_KNN_BRUTE;
    if (variant == PCOPS_KNN_WARP_SELECT && !warp_select_ok(dtype, N))
        variant = PCOPS_KNN_BRUTE;
    if (variant == PCOPS_KNN_BRUTE && K > max_reg) variant = PCOPS_KNN_BRUTE_HEAP;
    if (variant != PCOPS_KNN_GRID && variant != PCOPS_KNN_BRUTE_HEAP &&
        variant != PCOPS_KNN_WARP_SELECT && variant != PCOPS_KNN_GRID_SELECT &&
        variant != PCOPS_KNN_GRID_BATCH)
        variant = PCOPS_KNN_BRUTE;
    // A forced path runs as asked or not at all (the brute force keeps its lists in a heap past
    // the register lists; GRID_BASELINE is the grid's general build).
    if (requested != PCOPS_KNN_AUTO) {
        const pcops_knn_path want = baseline_build ? PCOPS_KNN_GRID : requested;
        if (variant != want && !(want == PCOPS_KNN_BRUTE && variant == PCOPS_KNN_BRUTE_HEAP))
            return cudaErrorInvalidValue;
    }
    plan->path = variant;
    plan->splits = 1;
    if (B == 0 || M == 0) return cudaSuccess;
    if (variant == PCOPS_KNN_GRID || variant == PCOPS_KNN_GRID_SELECT ||
        variant == PCOPS_KNN_GRID_BATCH) {
        plan->cells = variant == PCOPS_KNN_GRID_SELECT ? grid_select_cells(N, K) : cells;
        plan->small_build = pcops_grid_cuda::small_build_ok(N, M, plan->cells) && !baseline_build;
        const int64_t stride = plan->small_build ? plan->cells + 1 : plan->cells;
        plan->workspace_bytes =
            dtype == PCOPS_FLOAT32
                ? pcops_grid_cuda::carve_counting<float>(nullptr, B, N, M, stride, nullptr,
                                                         !plan->small_build)
                : pcops_grid_cuda::carve_counting<double>(nullptr, B, N, M, stride, nullptr,
                                                          !plan->small_build);
    } else if (variant == PCOPS_KNN_BRUTE) {
        plan->splits = choose_splits(B, M, N, K, info.sms);
        if (plan->splits > 1)
            // part_d [B,S,M,K] T, then part_i [B,S,M,K] int (T is 4 or 8 bytes: int aligned)
            plan->workspace_bytes =
                (size_t)(B * plan->splits * M * K) * (scalar_bytes(dtype) + sizeof(int));
    }
    return cudaSuccess;
}

template <typename T>
cudaError_t launch_knn(const pcops_knn_cuda_plan& plan, const T* query, const T* ref,
                       const int64_t* query_lengths, const int64_t* ref_lengths,
                       void* workspace, T* dist2, int64_t* idx, cudaStream_t stream) {
    if (plan.workspace_bytes > 0 && workspace == nullptr) return cudaErrorInvalidValue;
    if (plan.path == PCOPS_KNN_GRID || plan.path == PCOPS_KNN_GRID_SELECT ||
        plan.path == PCOPS_KNN_GRID_BATCH)
        return launch_grid<T>(plan, query, ref, query_lengths, ref_lengths, workspace, dist2, idx,
                              stream);
    DeviceInfo info;
    info.device = plan.device;
    info.sms = plan.sms;
    info.smem_optin = plan.smem_optin;
    const int64_t B = plan.B, M = plan.M, N = plan.N, K = plan.K;
    KnnParams p{};
    p.query_lengths = query_lengths;
    p.ref_lengths = ref_lengths;
    p.M = M;
    p.N = N;
    p.k = (int)K;
    if (plan.path == PCOPS_KNN_BRUTE_HEAP) {
        p.splits = 1;
        p.split_len = N;
        return launch_heap(query, ref, p, B, info, dist2, idx, stream);
    }
    if (plan.path == PCOPS_KNN_WARP_SELECT) {
        if constexpr (std::is_same<T, float>::value) {
            const int64_t blocks = (B * M + kSelectWarps - 1) / kSelectWarps;
            if (blocks > INT_MAX) return cudaErrorInvalidValue;
            const int buf_n = select_buf_entries(K, N);
            const size_t smem = (size_t)kSelectWarps * buf_n * sizeof(unsigned long long);
            const unsigned g = (unsigned)blocks;
            constexpr int kT = 32 * kSelectWarps;
            if (N <= 256)
                knn_warp_select_kernel<8><<<g, kT, smem, stream>>>(query, ref, p, B, buf_n, dist2, idx);
            else if (N <= 512)
                knn_warp_select_kernel<16><<<g, kT, smem, stream>>>(query, ref, p, B, buf_n, dist2, idx);
            else
                knn_warp_select_kernel<32><<<g, kT, smem, stream>>>(query, ref, p, B, buf_n, dist2, idx);
            return cudaGetLastError();
        } else {
            return cudaErrorInvalidValue;  // the plan takes it for float32 only
        }
    }
    p.splits = (int)plan.splits;
    p.split_len = (N + p.splits - 1) / p.splits;
    switch (register_bucket(K)) {
        case 1: return launch_registers<T, 1>(query, ref, p, B, workspace, dist2, idx, stream);
        case 4: return launch_registers<T, 4>(query, ref, p, B, workspace, dist2, idx, stream);
        case 8: return launch_registers<T, 8>(query, ref, p, B, workspace, dist2, idx, stream);
        case 16: return launch_registers<T, 16>(query, ref, p, B, workspace, dist2, idx, stream);
        case 32: return launch_registers<T, 32>(query, ref, p, B, workspace, dist2, idx, stream);
        default: return launch_registers<T, 64>(query, ref, p, B, workspace, dist2, idx, stream);
    }
}

}  // namespace

extern "C" cudaError_t pcops_knn_cuda_plan_make(pcops_dtype dtype, int64_t B, int64_t M,
                                                int64_t N, int64_t K,
                                                pcops_knn_path variant,
                                                pcops_knn_cuda_plan* plan) {
    return make_plan(dtype, B, M, N, K, variant, plan);
}

extern "C" cudaError_t pcops_knn_cuda_run(const pcops_knn_cuda_plan* plan, const void* query,
                                          const void* ref, const int64_t* query_lengths,
                                          const int64_t* ref_lengths, void* workspace,
                                          void* dist2, int64_t* idx, cudaStream_t stream) {
    if (!plan) return cudaErrorInvalidValue;
    if (plan->B == 0 || plan->M == 0) return cudaSuccess;
    return pcops_dispatch_float(plan->dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        return launch_knn(*plan, (const T*)query, (const T*)ref, query_lengths,
                             ref_lengths, workspace, (T*)dist2, idx, stream);
    });
}

extern "C" size_t pcops_knn_cuda_workspace_bytes(pcops_dtype dtype, int64_t B, int64_t M,
                                                 int64_t N, int64_t K) {
    pcops_knn_cuda_plan plan;
    if (make_plan(dtype, B, M, N, K, PCOPS_KNN_AUTO, &plan) != cudaSuccess) return 0;
    return plan.workspace_bytes;
}

extern "C" cudaError_t pcops_knn_cuda(pcops_dtype dtype, const void* query, const void* ref,
                                      const int64_t* query_lengths, const int64_t* ref_lengths,
                                      int64_t B, int64_t M, int64_t N, int64_t K,
                                      void* workspace, void* dist2, int64_t* idx,
                                      cudaStream_t stream) {
    pcops_knn_cuda_plan plan;
    const cudaError_t err = make_plan(dtype, B, M, N, K, PCOPS_KNN_AUTO, &plan);
    if (err != cudaSuccess) return err;
    return pcops_knn_cuda_run(&plan, query, ref, query_lengths, ref_lengths, workspace, dist2,
                              idx, stream);
}
