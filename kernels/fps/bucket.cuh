/*
 * fps/bucket.cuh -- BUCKET, and the Morton sort and bucket boxes that every bucket path
 * (BUCKET, BUCKET_GROUPS, BUCKET_ROUNDS, BUCKET_ROUNDS_CLUSTER) starts from.
 *
 * The sort: the points of each cloud are sorted along a Morton curve (a cub radix sort on
 * (cloud, Morton code of the point in the cloud's box) keys, stable) and cut into buckets of
 * S = 32 * ppl consecutive sorted points, each with its bounding box and its farthest (temp,
 * index). Valid finite points come first, then the non-finite ones, then the padding.
 *
 * The bucket rule, which all bucket paths rely on: a bucket whose box is at squared distance
 * m >= its largest temp from the new sample c keeps every temp (each point's distance is
 * >= m: the rounded distance of kernels/geometry.h is monotone in |dx|, |dy|, |dz|), and its
 * candidate. The bucket that holds c (m == 0) is always updated (the chosen point's temp
 * becomes -1), and so is any bucket when m is NaN (non-finite c or box).
 *
 * BUCKET: one block per cloud; bucket k belongs to warp k % W, lane (k / W) % 32, slot
 * k / (32 W) of that lane (neighbouring buckets go to different warps). A step updates only
 * the buckets the new sample can change, a flagged bucket by its whole warp (a point a lane),
 * then the block reduces the warps' farthest. Late in the run a step touches a few buckets, so
 * its cost is the block's reduction, not the cloud's size.
 *
 * When it wins: AUTO takes it for the clouds past BLOCK_PRUNED's reach that the float-only
 * grouped paths do not take -- double clouds of more than 4096 points, float clouds of more
 * than 2**20 points (one block's 4096 buckets of 256) that BUCKET_ROUNDS_CLUSTER does not
 * take -- except a single cloud of more than bucket_single_cloud_max_points
 * (kernels/fps/plan.cuh), for which one block is too little of the GPU (GRID). B * N <=
 * 2**31 - 1: cub sorts an int count of items, and sorted positions are int.
 */
#pragma once

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

#include "common.cuh"

namespace {

// ------------------------------------------------------------------------------------------
// the sort (every bucket path)

// A sorted point: coordinates and its index in the cloud (16 bytes for float).
template <typename T>
struct alignas(sizeof(T) == 4 ? 16 : 32) BucketPoint {
    T x, y, z;
    int idx;
};

// 10 bits of v spread to every third bit (bits 0, 3, ..., 27).
__device__ __forceinline__ uint32_t spread_bits(uint32_t v) {
    v &= 0x3ffu;
    v = (v | (v << 16)) & 0x030000ffu;
    v = (v | (v << 8)) & 0x0300f00fu;
    v = (v | (v << 4)) & 0x030c30c3u;
    v = (v | (v << 2)) & 0x09249249u;
    return v;
}

// One block per cloud: the box of its valid finite points, as (lo, 1023.99 / largest extent)
// into boxes[b * 4 .. b * 4 + 3] (scale 0 for an empty or flat box).
template <typename T>
__global__ void bucket_box_kernel(const T* __restrict__ xyz, const int64_t* __restrict__ lengths,
                                  int64_t N, T* __restrict__ boxes) {
    __shared__ T part[6][32];
    const int64_t b = blockIdx.x;
    const T* cloud = xyz + b * N * 3;
    const int64_t L = pcops_valid_length(lengths, b, N);
    T lo[3] = {T(INFINITY), T(INFINITY), T(INFINITY)}, hi[3] = {-T(INFINITY), -T(INFINITY), -T(INFINITY)};
    for (int64_t n = threadIdx.x; n < L; n += blockDim.x) {
        const T p[3] = {cloud[3 * n], cloud[3 * n + 1], cloud[3 * n + 2]};
        if (!(isfinite(p[0]) && isfinite(p[1]) && isfinite(p[2]))) continue;
        for (int a = 0; a < 3; ++a) {
            lo[a] = fmin(lo[a], p[a]);
            hi[a] = fmax(hi[a], p[a]);
        }
    }
    for (int off = 16; off > 0; off /= 2)
        for (int a = 0; a < 3; ++a) {
            lo[a] = fmin(lo[a], __shfl_xor_sync(0xffffffffu, lo[a], off));
            hi[a] = fmax(hi[a], __shfl_xor_sync(0xffffffffu, hi[a], off));
        }
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    if (lane == 0)
        for (int a = 0; a < 3; ++a) {
            part[a][w] = lo[a];
            part[3 + a][w] = hi[a];
        }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int v = 1; v < warps; ++v)
            for (int a = 0; a < 3; ++a) {
                lo[a] = fmin(lo[a], part[a][v]);
                hi[a] = fmax(hi[a], part[3 + a][v]);
            }
        T extent = 0;
        for (int a = 0; a < 3; ++a) extent = hi[a] > lo[a] ? fmax(extent, hi[a] - lo[a]) : extent;
        const bool ok = extent > 0 && isfinite(extent);
        for (int a = 0; a < 3; ++a) boxes[b * 4 + a] = ok ? lo[a] : T(0);
        boxes[b * 4 + 3] = ok ? T(1023.99) / extent : T(0);
    }
}

// key[i] = (b << 32) | Morton code for the valid finite point i = b * N + n; non-finite points
// after them (0xfffffffe), padding last (0xffffffff). vals[i] = n.
template <typename T>
__global__ void bucket_key_kernel(const T* __restrict__ xyz, const int64_t* __restrict__ lengths,
                                  int64_t B, int64_t N, const T* __restrict__ boxes,
                                  uint64_t* __restrict__ keys, int32_t* __restrict__ vals) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < B * N;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / N, n = i - b * N;
        uint32_t code = 0xffffffffu;
        if (n < pcops_valid_length(lengths, b, N)) {
            const T* p = xyz + 3 * i;
            const T* box = boxes + 4 * b;
            code = 0xfffffffeu;
            if (isfinite(p[0]) && isfinite(p[1]) && isfinite(p[2])) {
                uint32_t q[3];
                for (int a = 0; a < 3; ++a) {
                    const T v = (p[a] - box[a]) * box[3];  // in [0, 1024) for a finite point
                    q[a] = v > T(0) ? (uint32_t)fmin(v, T(1023)) : 0u;
                }
                code = spread_bits(q[0]) | (spread_bits(q[1]) << 1) | (spread_bits(q[2]) << 2);
            }
        }
        keys[i] = ((uint64_t)b << 32) | code;
        vals[i] = (int32_t)n;
    }
}

template <typename T>
__global__ void bucket_gather_kernel(const T* __restrict__ xyz, int64_t B, int64_t N,
                                     const int32_t* __restrict__ order,
                                     BucketPoint<T>* __restrict__ pts) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < B * N;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / N;
        const int n = order[i];
        const T* p = xyz + (b * N + n) * 3;
        pts[i] = {staged_x(p[0], p[1], p[2]), p[1], p[2], n};  // staged (common.cuh)
    }
}


// The workspace of the sort: carved by carve_bucket_sort (with base NULL it only counts).
template <typename T>
struct BucketSort {
    T* boxes;                // [B, 4] the Morton frame of each cloud
    uint64_t* keys_in;       // [B * N] sort keys and the point index of each
    uint64_t* keys_out;
    int32_t* order_in;
    int32_t* order_out;      // the point index of each sorted position
    BucketPoint<T>* sorted;  // [B * N] the points in sorted order
    void* sort_temp;         // cub's temporary storage
    size_t sort_bytes;
    int sort_bits;           // key bits to sort: 32 + bits of B - 1
};

template <typename T>
void carve_bucket_sort(pcops_carver* w, int64_t B, int64_t items, BucketSort<T>* s) {
    s->sort_bits = 32;
    while (s->sort_bits < 64 && ((int64_t)1 << (s->sort_bits - 32)) < B) ++s->sort_bits;
    // size only: cub returns the temp size when the temp pointer is NULL
    cub::DeviceRadixSort::SortPairs(nullptr, s->sort_bytes, (const uint64_t*)nullptr,
                                    (uint64_t*)nullptr, (const int32_t*)nullptr,
                                    (int32_t*)nullptr, (int)(items > 0 ? items : 1), 0,
                                    s->sort_bits);
    s->boxes = (T*)pcops_carve(w, 4 * B, sizeof(T));
    s->keys_in = (uint64_t*)pcops_carve(w, items, sizeof(uint64_t));
    s->keys_out = (uint64_t*)pcops_carve(w, items, sizeof(uint64_t));
    s->order_in = (int32_t*)pcops_carve(w, items, sizeof(int32_t));
    s->order_out = (int32_t*)pcops_carve(w, items, sizeof(int32_t));
    s->sorted = (BucketPoint<T>*)pcops_carve(w, items, sizeof(BucketPoint<T>));
    s->sort_temp = pcops_carve(w, (int64_t)s->sort_bytes, 1);
}

// Sorts the points of every cloud into Morton order (s.sorted), on `stream`.
template <typename T>
cudaError_t sort_into_buckets(const BucketSort<T>& s, const T* xyz, const int64_t* lengths,
                              int64_t B, int64_t N, cudaStream_t stream) {
    const int64_t items = B * N;
    if (items > 0) {
        bucket_box_kernel<T><<<(unsigned)B, 256, 0, stream>>>(xyz, lengths, N, s.boxes);
        const unsigned blocks = pcops_grid_stride_blocks(items, 256);
        bucket_key_kernel<T><<<blocks, 256, 0, stream>>>(xyz, lengths, B, N, s.boxes,
                                                         s.keys_in, s.order_in);
        size_t bytes = s.sort_bytes;
        cudaError_t err = cub::DeviceRadixSort::SortPairs(
            s.sort_temp, bytes, s.keys_in, s.keys_out, s.order_in, s.order_out, (int)items, 0,
            s.sort_bits, stream);
        if (err != cudaSuccess) return err;
        bucket_gather_kernel<T><<<blocks, 256, 0, stream>>>(xyz, B, N, s.order_out, s.sorted);
    }
    return cudaSuccess;
}

// ------------------------------------------------------------------------------------------
// BUCKET

// A bucket a lane keeps: its box [lo, hi] and its farthest (temp, index).
template <typename T>
struct Bucket {
    T lx, ly, lz, hx, hy, hz;
    Candidate<T> best;

    // Squared distance from c to the box: the distance to the box's point nearest c, by the
    // same formula as the points' distances (NaN when c or the box is not finite).
    __device__ __forceinline__ T dist2_to(T cx, T cy, T cz) const {
        return fps_dist2(fmin(fmax(cx, lx), hx), fmin(fmax(cy, ly), hy), fmin(fmax(cz, lz), hz),
                         cx, cy, cz);
    }
};

// A warp's farthest candidate with its coordinates: what the block reduces at each step.
template <typename T>
struct Sample {
    Candidate<T> c;
    T x, y, z;
};

// A bucket before the first step: no box, no candidate; then set() from its sorted points
// [p0, p1): the box (fmin / fmax pass over NaN coordinates) and the point with the lowest index
// (every temp starts at +inf: that is its farthest), whose coordinates go to (fx, fy, fz).
template <typename T>
__device__ __forceinline__ void bucket_clear(Bucket<T>& u) {
    u.best = no_candidate<T>();
    u.lx = u.ly = u.lz = T(INFINITY);
    u.hx = u.hy = u.hz = -T(INFINITY);
}
template <typename T>
__device__ __forceinline__ void bucket_set(Bucket<T>& u, const BucketPoint<T>* pts, int p0,
                                           int p1, T& fx, T& fy, T& fz) {
    for (int p = p0; p < p1; ++p) {
        const BucketPoint<T> q = pts[p];
        u.lx = fmin(u.lx, q.x), u.hx = fmax(u.hx, q.x);
        u.ly = fmin(u.ly, q.y), u.hy = fmax(u.hy, q.y);
        u.lz = fmin(u.lz, q.z), u.hz = fmax(u.hz, q.z);
        if (q.idx < u.best.index) u.best.index = q.idx, fx = q.x, fy = q.y, fz = q.z;
    }
    u.best.value = T(INFINITY);
}

// The end of a step of the bucket kernels: lane 0 of each warp publishes the warp's farthest
// (best, coordinates from at(), called in lane 0 only), one barrier (samples are
// double-buffered by step parity, see group_farthest), every warp reduces the warps'; thread 0
// writes sample j. Returns the winner; (cx, cy, cz) become its coordinates.
template <typename T, class At>
__device__ __forceinline__ Candidate<T> bucket_step_winner(Sample<T> (&samples)[2][16],
                                                           int64_t j, Candidate<T> best, At at,
                                                           const CloudRow<T>& row, T& cx,
                                                           T& cy, T& cz) {
    const int warps = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int parity = (int)(j & 1);
    if (lane == 0) {
        T x, y, z;
        at(x, y, z);
        samples[parity][w] = {best, x, y, z};
    }
    named_barrier(0, blockDim.x);
    Candidate<T> c = lane < warps ? samples[parity][lane].c : no_candidate<T>();
    const Sample<T>& win = samples[parity][warp_argmax(c)];
    cx = win.x, cy = win.y, cz = win.z;
    if (threadIdx.x == 0) {
        row.idx[j] = c.index;
        row.dist2[j] = c.value;
    }
    return c;
}

// Static shared memory of fps_bucket_kernel (the warps' samples), counted against the opt-in
// limit.
template <typename T>
__host__ __device__ constexpr size_t bucket_static_smem() {
    return (size_t)2 * 16 * sizeof(Sample<T>);
}

// Dynamic shared memory: the coordinates of each bucket's candidate (3 * buckets T), written
// and read only by the warp that owns the bucket. (A warp updates its flagged buckets one at a
// time: holding several in flight at once costs more registers than it saves.)
template <typename T, int SLOTS>
__global__ void __launch_bounds__(512)
fps_bucket_kernel(const T* __restrict__ xyz, const int64_t* __restrict__ lengths,
                  const int64_t* __restrict__ start, int64_t N, int64_t npoint,
                  const BucketPoint<T>* __restrict__ sorted, T* __restrict__ temp_ws, int ppl,
                  int64_t* __restrict__ idx, T* __restrict__ dist2) {
    extern __shared__ __align__(16) unsigned char fps_smem[];
    __shared__ Sample<T> samples[2][16];  // the warps' candidates, by step parity
    static_assert(sizeof(samples) == bucket_static_smem<T>(), "the plan's count");
    T* bucket_xyz = reinterpret_cast<T*>(fps_smem);
    const int warps = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t b = blockIdx.x;
    const CloudRow<T> row(xyz, lengths, b, N, npoint, idx, dist2);
    const BucketPoint<T>* pts = sorted + b * N;
    T* temp = temp_ws + b * N;
    pad_row(row.idx, row.dist2, row.n_out, npoint, threadIdx.x, blockDim.x);
    if (row.n_out == 0) return;
    const int S = 32 * ppl;  // points per bucket; sorted positions < L are the valid points
    const int buckets = (row.L + S - 1) / S;

    for (int p = threadIdx.x; p < row.L; p += blockDim.x) temp[p] = T(INFINITY);
    Bucket<T> bk[SLOTS];
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
        const int k = (s * 32 + lane) * warps + w;
        bucket_clear(bk[s]);
        if (k >= buckets) continue;
        bucket_set(bk[s], pts, k * S, min(row.L, (k + 1) * S), bucket_xyz[3 * k],
                   bucket_xyz[3 * k + 1], bucket_xyz[3 * k + 2]);
    }
    __syncthreads();  // the temps are set

    int cur = start ? (int)pcops_positive_mod(start[b], row.L) : 0;
    T cx, cy, cz;
    load_point(row.cloud, cur, cx, cy, cz);
    if (threadIdx.x == 0) {
        row.idx[0] = cur;
        row.dist2[0] = T(0);
    }
    for (int64_t j = 1; j < row.n_out; ++j) {
        // the buckets c can change, one at a time (every lane checks its own; the warp updates
        // the flagged ones together, a point a lane), then this lane's farthest candidate
        Candidate<T> best = no_candidate<T>();
        int best_k = -1;
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
            const int k = (s * 32 + lane) * warps + w;
            const T m = bk[s].dist2_to(cx, cy, cz);
            const bool update = k < buckets && (!(m >= bk[s].best.value) || m == T(0));
            for (unsigned mask = __ballot_sync(0xffffffffu, update); mask; mask &= mask - 1) {
                const int owner = __ffs(mask) - 1;
                const int ko = (s * 32 + owner) * warps + w;
                Candidate<T> c = no_candidate<T>();
                T px = 0, py = 0, pz = 0;
                for (int p = ko * S + lane; p < (ko + 1) * S && p < row.L; p += 32) {
                    // both loads issued before either is used: the temp is read whatever q.idx
                    // holds (`q.idx == cur ? -1 : temp[p]` made the temp load wait for the
                    // point's, two L2 round trips a bucket in a row on large clouds)
                    const BucketPoint<T> q = pts[p];
                    T t = temp[p];
                    const T d = fps_dist2(q.x, q.y, q.z, cx, cy, cz);
                    t = q.idx == cur ? T(-1) : t;
                    t = d < t ? d : t;
                    temp[p] = t;
                    const Candidate<T> o = {t, q.idx};
                    if (farther(o, c)) c = o, px = q.x, py = q.y, pz = q.z;
                }
                if (lane == warp_argmax(c))
                    bucket_xyz[3 * ko] = px, bucket_xyz[3 * ko + 1] = py, bucket_xyz[3 * ko + 2] = pz;
                if (lane == owner) bk[s].best = c;
            }
            if (farther(bk[s].best, best)) best = bk[s].best, best_k = k;
        }
        best_k = __shfl_sync(0xffffffffu, best_k, warp_argmax(best));
        __syncwarp();  // this warp's bucket_xyz writes are visible to lane 0
        cur = bucket_step_winner(samples, j, best, [&](T& x, T& y, T& z) {
                  x = best_k >= 0 ? bucket_xyz[3 * best_k] : T(0);
                  y = best_k >= 0 ? bucket_xyz[3 * best_k + 1] : T(0);
                  z = best_k >= 0 ? bucket_xyz[3 * best_k + 2] : T(0);
              }, row, cx, cy, cz).index;
    }
}

// Shape of a BUCKET plan: buckets of 32 * ppl points, at most 4096 per cloud (16 warps of 32
// lanes with 8 slots each; 2048 and 4 for double); 1 to 16 warps, 1, 2, 4 or 8 slots per lane.
// False when B * N > INT_MAX (sorted positions are int and cub sorts an int count of items), or
// past the device's shared memory (48 KiB of dynamic at most: every supported GPU holds it).
template <typename T>
bool plan_bucket(pcops_fps_cuda_plan* p, const Device& d, int64_t B, int64_t N) {
    if (B * N > INT_MAX) return false;
    const int max_slots = sizeof(T) == 4 ? 8 : 4;  // without spilling (-Xptxas -v, sm_90)
    const int64_t Np = N > 0 ? N : 1;
    int64_t ppl = 1;
    while ((Np + 32 * ppl - 1) / (32 * ppl) > 16 * 32 * max_slots) ppl *= 2;
    const int64_t buckets = (Np + 32 * ppl - 1) / (32 * ppl);
    const int warps = (int)std::min<int64_t>(16, (buckets + 31) / 32);
    int slots = 1;
    while ((int64_t)slots * 32 * warps < buckets) slots *= 2;
    if (slots > max_slots) return false;
    p->points_per_thread = (int)ppl;
    p->bucket_slots = slots;
    p->warps_per_cloud = warps;
    p->threads = 32 * warps;
    p->clouds_per_block = 1;
    p->blocks_per_cloud = 1;
    p->blocks = B;
    const size_t bytes = (size_t)3 * buckets * sizeof(T);  // launch_bucket's (N = 0: 1 bucket)
    p->smem_bytes = bytes + bucket_static_smem<T>();
    return smem_fits(d, bytes, bucket_static_smem<T>());
}

// Launches BUCKET on the sorted points (sort_into_buckets) and the workspace's temps.
template <typename T>
cudaError_t launch_bucket(const pcops_fps_cuda_plan* p, const BucketPoint<T>* sorted, T* temp,
                          const T* xyz, const int64_t* lengths, const int64_t* start, int64_t B,
                          int64_t N, int64_t npoint, int64_t* idx, T* dist2,
                          cudaStream_t stream) {
    const int64_t S = 32 * (int64_t)p->points_per_thread;
    const size_t smem = (size_t)3 * ((N + S - 1) / S) * sizeof(T);  // <= 48 KiB (4096 float buckets)
    auto launch = [&](auto kernel) {
        // with the kernel's static shared memory, 48 KiB of dynamic needs the opt-in
        cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)smem);
        if (err != cudaSuccess) return err;
        kernel<<<(unsigned)B, p->threads, smem, stream>>>(xyz, lengths, start, N, npoint, sorted,
                                                      temp, p->points_per_thread, idx, dist2);
        return cudaGetLastError();
    };
    switch (p->bucket_slots) {
        case 1: return launch(fps_bucket_kernel<T, 1>);
        case 2: return launch(fps_bucket_kernel<T, 2>);
        case 4: return launch(fps_bucket_kernel<T, 4>);
        case 8:
            if constexpr (sizeof(T) == 4) return launch(fps_bucket_kernel<T, 8>);
            return cudaErrorInvalidValue;
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace
