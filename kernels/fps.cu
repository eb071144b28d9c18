/*
 * fps.cu -- furthest point sampling on CUDA.
 *
 * B = batch, N = points per cloud, L = valid points of a cloud (lengths[b] clamped to [0, N]),
 * npoint = samples. xyz[B,N,3] -> idx[B,npoint] (int64), dist2[B,npoint].
 *
 * Same algorithm and arithmetic as fps.c (temp distance buffer starting at +inf, chosen points
 * set to -1, the squared distance of kernels/geometry.h, ties to the lower index), so every
 * path here and on the CPU chooses bitwise the same indices.
 *
 * A step is the same everywhere: every thread lowers the temps of the points it owns with the
 * distance to the newest sample and keeps its farthest (temp, index) -- fps_visit, the only
 * place the update and the arg-max are written -- and then the candidates are reduced over
 * the threads that share the cloud. The paths differ in who shares a cloud and where the
 * points live (top to bottom in this file):
 *
 *   SIMPLE   one block per cloud, temp in the workspace, coordinates from xyz (any N; the
 *            reference path).
 *   WARP     several clouds per block, a few warps per cloud, points and temps in registers;
 *            one named barrier per step among the cloud's warps (none with one warp).
 *   BLOCK    the same kernel with one cloud per block and up to 32 warps.
 *   CLUSTER  (sm_90) a thread-block cluster per cloud; each block holds a slice of the cloud
 *            (in registers, or temp in the workspace for clouds too large for them) and
 *            publishes its candidate in shared memory; after one cluster barrier every warp
 *            reads the cluster's candidates (distributed shared memory) and picks the winner.
 *   GRID     a cooperative grid on one cloud at a time (huge single clouds): each block
 *            publishes its candidate in the workspace, one grid barrier per step, then every
 *            block reads them all.
 * Reductions use warp shuffles; candidate slots are double-buffered by step parity, so one
 * barrier per level and step suffices.
 *
 * The launch plan (pcops_fps_cuda_make_plan) picks the path and its shape from the sizes and
 * the device once; pcops_fps_cuda_run launches it.
 */
#include <cooperative_groups.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "geometry.h"

namespace {

namespace cg = cooperative_groups;

template <typename T>
struct Candidate {
    T value;
    int index;
};

template <typename T>
__device__ __forceinline__ Candidate<T> no_candidate() {
    return {T(-INFINITY), INT_MAX};
}

__device__ __forceinline__ float fps_dist2(float x, float y, float z, float cx, float cy,
                                           float cz) {
    return pcops_dist2_f32(x, y, z, cx, cy, cz);
}
__device__ __forceinline__ double fps_dist2(double x, double y, double z, double cx, double cy,
                                            double cz) {
    return pcops_dist2_f64(x, y, z, cx, cy, cz);
}

// The key order of kernels/geometry.h on (temp, -index): the larger temp, ties to the lower index.
__device__ __forceinline__ bool farther(const Candidate<float>& a, const Candidate<float>& b) {
    return pcops_key_greater_f32(a.value, -(int64_t)a.index, b.value, -(int64_t)b.index);
}
__device__ __forceinline__ bool farther(const Candidate<double>& a, const Candidate<double>& b) {
    return pcops_key_greater_f64(a.value, -(int64_t)a.index, b.value, -(int64_t)b.index);
}

// One point of one step: lower its temp with the distance to the newest sample (cx, cy, cz)
// and keep the farther of (temp, n) and best. A thread visits its points in ascending n, so
// the strict > keeps its first maximum. A NaN distance leaves temp unchanged; a chosen point
// (temp -1) and a padding slot (temp -inf) never become a candidate against a real point.
template <typename T>
__device__ __forceinline__ void fps_visit(T x, T y, T z, T& temp, int n, T cx, T cy, T cz,
                                          Candidate<T>& best) {
    const T d = fps_dist2(x, y, z, cx, cy, cz);
    const T t = d < temp ? d : temp;
    temp = t;
    if (t > best.value) best = {t, n};
}

// ------------------------------------------------------------------------------------------
// Where a thread's points live. Both have load() (temps to +inf) and step() (one step over
// the thread's points: first, first + stride, ... below end).

// Points and temps in registers: slot p holds point first + p * stride. Requires
// end - first <= PPT * stride (the plan guarantees it).
template <typename T, int PPT>
struct RegisterPoints {
    static constexpr int kPerThread = PPT;
    T x[PPT], y[PPT], z[PPT], temp[PPT];
    int first, stride;

    __device__ __forceinline__ void load(const T* cloud, T* /*temp_ws*/, int first_, int end,
                                         int stride_) {
        first = first_;
        stride = stride_;
#pragma unroll
        for (int p = 0; p < PPT; ++p) {
            const int n = first + p * stride;
            const bool valid = n < end;
            x[p] = valid ? cloud[3 * (int64_t)n + 0] : T(0);
            y[p] = valid ? cloud[3 * (int64_t)n + 1] : T(0);
            z[p] = valid ? cloud[3 * (int64_t)n + 2] : T(0);
            temp[p] = valid ? T(INFINITY) : T(-INFINITY);  // padding slots never win
        }
    }

    __device__ __forceinline__ Candidate<T> step(int cur, T cx, T cy, T cz) {
        Candidate<T> best = no_candidate<T>();
#pragma unroll
        for (int p = 0; p < PPT; ++p) {
            const int n = first + p * stride;
            if (n == cur) temp[p] = T(-1);
            fps_visit(x[p], y[p], z[p], temp[p], n, cx, cy, cz, best);
        }
        return best;
    }
};

// Temps in the workspace, coordinates read from xyz (L2-resident for clouds up to millions of
// points): any size. Each thread only touches its own temps, so load() needs no barrier.
template <typename T>
struct GlobalPoints {
    static constexpr int kPerThread = 0;
    const T* cloud;
    T* temp;
    int first, end, stride;

    __device__ __forceinline__ void load(const T* cloud_, T* temp_ws, int first_, int end_,
                                         int stride_) {
        cloud = cloud_;
        temp = temp_ws;
        first = first_;
        end = end_;
        stride = stride_;
        for (int n = first; n < end; n += stride) temp[n] = T(INFINITY);
    }

    __device__ __forceinline__ Candidate<T> step(int cur, T cx, T cy, T cz) {
        Candidate<T> best = no_candidate<T>();
        for (int n = first; n < end; n += stride) {
            T t = n == cur ? T(-1) : temp[n];
            fps_visit(cloud[3 * (int64_t)n + 0], cloud[3 * (int64_t)n + 1],
                      cloud[3 * (int64_t)n + 2], t, n, cx, cy, cz, best);
            temp[n] = t;
        }
        return best;
    }
};

// The most threads per block a point set can use without spilling (65536 registers per SM;
// four registers per float point, eight per double point, plus about 40 for the rest;
// checked with -Xptxas -v on sm_90: no spills).
template <typename Points, typename T>
constexpr int max_threads() {
    return Points::kPerThread * (int)sizeof(T) <= 16                       ? 1024
           : Points::kPerThread * (int)sizeof(T) <= 32 && sizeof(T) == 4 ? 1024
           : Points::kPerThread * (int)sizeof(T) <= 32                   ? 768
                                                                         : 512;
}

// ------------------------------------------------------------------------------------------
// reductions

// The farthest candidate of the warp, in every lane.
template <typename T>
__device__ __forceinline__ Candidate<T> warp_farthest(Candidate<T> c) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
        Candidate<T> o = {__shfl_xor_sync(0xffffffffu, c.value, offset),
                          __shfl_xor_sync(0xffffffffu, c.index, offset)};
        if (farther(o, c)) c = o;
    }
    return c;
}

// Barrier `id` (0: the whole block) among `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// The farthest candidate of `warps` warps (warp w of them passes w), in every thread of them:
// a warp reduction, lane 0 writes slots[parity * warps + w], one barrier, every warp reduces
// the slots. The slots are double-buffered by step parity: a warp can write slots of step
// j + 1 while another still reads those of step j, but not those of step j + 2 before it
// passed the barrier of step j + 1.
template <typename T>
__device__ __forceinline__ Candidate<T> group_farthest(Candidate<T> c, Candidate<T>* slots,
                                                       int parity, int warps, int w,
                                                       int barrier_id) {
    c = warp_farthest(c);
    if (warps == 1) return c;
    const int lane = threadIdx.x & 31;
    if (lane == 0) slots[parity * warps + w] = c;
    named_barrier(barrier_id, warps * 32);
    c = lane < warps ? slots[parity * warps + lane] : no_candidate<T>();
    return warp_farthest(c);
}

template <typename T>
__device__ __forceinline__ void load_point(const T* cloud, int n, T& x, T& y, T& z) {
    x = __ldg(cloud + 3 * (int64_t)n + 0);
    y = __ldg(cloud + 3 * (int64_t)n + 1);
    z = __ldg(cloud + 3 * (int64_t)n + 2);
}

// Writes -1 / 0 to the slots [n_out, npoint) of one row, threads t0, t0 + step, ...
template <typename T>
__device__ void pad_row(int64_t* idx, T* dist2, int64_t n_out, int64_t npoint, int t0, int step) {
    for (int64_t j = n_out + t0; j < npoint; j += step) {
        idx[j] = -1;
        dist2[j] = T(0);
    }
}

// ------------------------------------------------------------------------------------------
// SIMPLE, WARP and BLOCK: `warps` warps per cloud, `clouds` clouds per block (<= 15: cloud g
// of the block syncs on named barrier 1 + g). Dynamic shared memory: the slots,
// clouds * 2 * warps candidates.

template <typename T, class Points>
__global__ void __launch_bounds__(max_threads<Points, T>())
fps_group_kernel(const T* __restrict__ xyz, const int64_t* __restrict__ lengths,
                 const int64_t* __restrict__ start, int64_t B, int64_t N, int64_t npoint,
                 T* __restrict__ workspace, int64_t* __restrict__ idx, T* __restrict__ dist2,
                 int warps, int clouds) {
    extern __shared__ __align__(16) unsigned char fps_smem[];
    const int warp = threadIdx.x >> 5;
    const int group = warp / warps, w = warp % warps;
    const int rank = threadIdx.x - group * warps * 32;  // thread rank inside the cloud's group
    const int64_t b = (int64_t)blockIdx.x * clouds + group;
    if (group >= clouds || b >= B) return;  // whole groups leave: their barrier is their own
    Candidate<T>* slots = reinterpret_cast<Candidate<T>*>(fps_smem) + group * 2 * warps;
    const T* cloud = xyz + b * N * 3;
    int64_t* out_idx = idx + b * npoint;
    T* out_dist2 = dist2 + b * npoint;
    const int L = (int)pcops_valid_length(lengths, b, N);
    const int64_t n_out = npoint < L ? npoint : L;
    pad_row(out_idx, out_dist2, n_out, npoint, rank, warps * 32);
    if (n_out == 0) return;

    Points pts;
    pts.load(cloud, workspace ? workspace + b * N : nullptr, rank, L, warps * 32);
    int cur = start ? (int)pcops_positive_mod(start[b], L) : 0;
    if (rank == 0) {
        out_idx[0] = cur;
        out_dist2[0] = T(0);
    }
    for (int64_t j = 1; j < n_out; ++j) {
        T cx, cy, cz;
        load_point(cloud, cur, cx, cy, cz);
        Candidate<T> c = pts.step(cur, cx, cy, cz);
        c = group_farthest(c, slots, (int)(j & 1), warps, w, 1 + group);
        if (rank == 0) {
            out_idx[j] = c.index;
            out_dist2[j] = c.value;
        }
        cur = c.index;
    }
}

// ------------------------------------------------------------------------------------------
// CLUSTER: gridDim.x = B * cluster size; block `rank` of a cluster owns the slice
// [rank * chunk, (rank + 1) * chunk) of its cloud.

template <typename T, class Points>
__global__ void __launch_bounds__(max_threads<Points, T>())
fps_cluster_kernel(const T* __restrict__ xyz, const int64_t* __restrict__ lengths,
                   const int64_t* __restrict__ start, int64_t B, int64_t N, int64_t npoint,
                   T* __restrict__ workspace, int64_t* __restrict__ idx, T* __restrict__ dist2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ Candidate<T> warp_slots[2 * 32];
    __shared__ Candidate<T> block_slot[2];  // this block's candidate, by step parity

    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    const int blocks = (int)cluster.num_blocks();
    const int warps = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t b = blockIdx.x / blocks;
    const T* cloud = xyz + b * N * 3;
    int64_t* out_idx = idx + b * npoint;
    T* out_dist2 = dist2 + b * npoint;
    const int L = (int)pcops_valid_length(lengths, b, N);
    const int64_t n_out = npoint < L ? npoint : L;
    if (rank == 0) pad_row(out_idx, out_dist2, n_out, npoint, threadIdx.x, blockDim.x);
    if (n_out == 0) return;  // the whole cluster returns here: no shared memory was shared

    const int chunk = (int)(((int64_t)L + blocks - 1) / blocks);
    const int lo = (int)min((int64_t)L, (int64_t)rank * chunk);
    const int hi = (int)min((int64_t)L, (int64_t)lo + chunk);
    Points pts;
    pts.load(cloud, workspace ? workspace + b * N : nullptr, lo + threadIdx.x, hi, blockDim.x);
    int cur = start ? (int)pcops_positive_mod(start[b], L) : 0;
    if (rank == 0 && threadIdx.x == 0) {
        out_idx[0] = cur;
        out_dist2[0] = T(0);
    }
    for (int64_t j = 1; j < n_out; ++j) {
        const int parity = (int)(j & 1);
        T cx, cy, cz;
        load_point(cloud, cur, cx, cy, cz);
        Candidate<T> c = pts.step(cur, cx, cy, cz);
        c = group_farthest(c, warp_slots, parity, warps, w, 0);
        if (threadIdx.x == 0) block_slot[parity] = c;
        cluster.sync();  // every block's candidate of step j is visible cluster-wide
        c = lane < blocks ? *cluster.map_shared_rank(&block_slot[parity], lane) : no_candidate<T>();
        c = warp_farthest(c);
        if (rank == 0 && threadIdx.x == 0) {
            out_idx[j] = c.index;
            out_dist2[j] = c.value;
        }
        cur = c.index;
    }
    cluster.sync();  // no block may exit while another can still read its shared memory
#endif
}

// ------------------------------------------------------------------------------------------
// GRID: a cooperative launch of gridDim.x co-resident blocks works on cloud 0, then 1, ...
// Block r owns the slice [r * chunk, (r + 1) * chunk). slots: 2 * gridDim.x candidates in the
// workspace, by step parity (the parity runs on across clouds).

template <typename T, class Points>
__global__ void __launch_bounds__(max_threads<Points, T>())
fps_grid_kernel(const T* __restrict__ xyz, const int64_t* __restrict__ lengths,
                const int64_t* __restrict__ start, int64_t B, int64_t N, int64_t npoint,
                T* __restrict__ workspace, int64_t* __restrict__ idx, T* __restrict__ dist2,
                Candidate<T>* __restrict__ slots) {
    __shared__ Candidate<T> warp_slots[2 * 32];
    __shared__ Candidate<T> s_winner;
    cg::grid_group grid = cg::this_grid();
    const int blocks = gridDim.x, rank = blockIdx.x;
    const int warps = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t steps = 0;
    for (int64_t b = 0; b < B; ++b) {
        const T* cloud = xyz + b * N * 3;
        int64_t* out_idx = idx + b * npoint;
        T* out_dist2 = dist2 + b * npoint;
        const int L = (int)pcops_valid_length(lengths, b, N);
        const int64_t n_out = npoint < L ? npoint : L;
        if (rank == 0) pad_row(out_idx, out_dist2, n_out, npoint, threadIdx.x, blockDim.x);
        if (n_out == 0) continue;
        const int chunk = (int)(((int64_t)L + blocks - 1) / blocks);
        const int lo = (int)min((int64_t)L, (int64_t)rank * chunk);
        const int hi = (int)min((int64_t)L, (int64_t)lo + chunk);
        Points pts;
        pts.load(cloud, workspace ? workspace + b * N : nullptr, lo + threadIdx.x, hi,
                 blockDim.x);
        int cur = start ? (int)pcops_positive_mod(start[b], L) : 0;
        if (rank == 0 && threadIdx.x == 0) {
            out_idx[0] = cur;
            out_dist2[0] = T(0);
        }
        for (int64_t j = 1; j < n_out; ++j, ++steps) {
            const int parity = (int)(steps & 1);
            T cx, cy, cz;
            load_point(cloud, cur, cx, cy, cz);
            Candidate<T> c = pts.step(cur, cx, cy, cz);
            c = group_farthest(c, warp_slots, parity, warps, w, 0);
            if (threadIdx.x == 0) {
                slots[parity * blocks + rank].value = c.value;
                slots[parity * blocks + rank].index = c.index;
            }
            grid.sync();  // every block's candidate of this step is visible grid-wide
            if (w == 0) {
                Candidate<T> best = no_candidate<T>();
                for (int r = lane; r < blocks; r += 32) {
                    Candidate<T> o = {__ldcg(&slots[parity * blocks + r].value),
                                      __ldcg(&slots[parity * blocks + r].index)};
                    if (farther(o, best)) best = o;
                }
                best = warp_farthest(best);
                if (lane == 0) s_winner = best;
            }
            __syncthreads();  // s_winner is visible; it is rewritten only after the next grid.sync
            c = s_winner;
            if (rank == 0 && threadIdx.x == 0) {
                out_idx[j] = c.index;
                out_dist2[j] = c.value;
            }
            cur = c.index;
        }
    }
}

// ------------------------------------------------------------------------------------------
// launch plans

// The register slot counts a plan may use: 2, 4, 8, 16 for float, 2, 4, 8 for double.
template <typename T>
constexpr int max_points_per_thread() {
    return sizeof(T) == 4 ? 16 : 8;
}

// Calls f(Points{}) with the point set of `ppt` register slots (0: GlobalPoints).
template <typename T, typename F>
cudaError_t with_points(int ppt, F&& f) {
    switch (ppt) {
        case 0: return f(GlobalPoints<T>{});
        case 2: return f(RegisterPoints<T, 2>{});
        case 4: return f(RegisterPoints<T, 4>{});
        case 8: return f(RegisterPoints<T, 8>{});
        case 16:
            if constexpr (sizeof(T) == 4) return f(RegisterPoints<T, 16>{});
            return cudaErrorInvalidValue;
        default: return cudaErrorInvalidValue;
    }
}

template <typename T>
int max_threads_for(int ppt) {
    int m = 0;
    with_points<T>(ppt, [&](auto pts) {
        m = max_threads<decltype(pts), T>();
        return cudaSuccess;
    });
    return m;
}

struct Device {
    int sms = 0, major = 0, cooperative = 0;
};

cudaError_t current_device(Device* d) {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&d->sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&d->major, cudaDevAttrComputeCapabilityMajor, device);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&d->cooperative, cudaDevAttrCooperativeLaunch, device);
    return err;
}

// Whether a cluster kernel can run: the device has clusters (compute capability 9.0+) AND the
// kernel was built from sm_90 (or newer) code. Its body only exists for __CUDA_ARCH__ >= 900,
// so a build without sm_90 code (JIT-compiled by the driver for an H100) holds an empty kernel
// that must never be launched: it would leave idx unwritten.
template <typename T, class Points>
bool cluster_kernel_usable(const Device& d) {
    if (d.major < 9) return false;
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, fps_cluster_kernel<T, Points>) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return attr.ptxVersion >= 90;
}

// The smallest register slot count (of 2, 4, 8, 16) with which `threads_max`-capped blocks
// hold `points` points; 0 when none does.
template <typename T>
int fit_points_per_thread(int64_t points, int prefer) {
    for (int ppt = prefer; ppt <= max_points_per_thread<T>(); ppt *= 2)
        if (points <= (int64_t)ppt * max_threads_for<T>(ppt)) return ppt;
    return 0;
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Fills the shape of a SIMPLE / WARP / BLOCK plan for clouds of N points.
//   SIMPLE: 8 warps per cloud, temp in the workspace.
//   WARP:   1 warp per cloud up to 256 points, else 2 (up to 64 * 16 points), 8 warps a block.
//   BLOCK:  4 points per thread up to 2048 points, else 8 (more when they do not fit),
//           2 to 32 warps, one cloud per block.
template <typename T>
bool plan_group(pcops_fps_cuda_plan* p, int64_t B, int64_t N, int variant) {
    const int64_t Np = N > 0 ? N : 1;
    int ppt = 0, warps = 8;
    if (variant == PCOPS_FPS_WARP) {
        warps = Np <= 32 * 8 ? 1 : 2;
        for (ppt = 2; ppt <= max_points_per_thread<T>() && Np > (int64_t)warps * 32 * ppt;) ppt *= 2;
        if (ppt > max_points_per_thread<T>()) return false;
    } else if (variant == PCOPS_FPS_BLOCK) {
        for (ppt = Np <= 2048 ? 4 : 8; ppt && ppt <= max_points_per_thread<T>(); ppt *= 2) {
            warps = (int)std::max<int64_t>(2, (Np + 32LL * ppt - 1) / (32LL * ppt));
            if (warps <= 32 && warps * 32 <= max_threads_for<T>(ppt)) break;
        }
        if (ppt > max_points_per_thread<T>()) return false;
    }
    p->points_per_thread = ppt;
    p->warps_per_cloud = warps;
    p->clouds_per_block = variant == PCOPS_FPS_WARP ? 8 / warps : 1;
    p->threads = 32 * p->warps_per_cloud * p->clouds_per_block;
    p->blocks_per_cloud = 1;
    p->blocks = (B + p->clouds_per_block - 1) / p->clouds_per_block;
    return true;
}

template <typename T>
bool plan_cluster(pcops_fps_cuda_plan* p, const Device& d, int64_t B, int64_t N, int blocks) {
    if (d.major < 9 || B > INT_MAX / 8) return false;
    const int64_t Np = N > 0 ? N : 1;
    const int64_t per_block = (Np + blocks - 1) / blocks;
    const int ppt = fit_points_per_thread<T>(per_block, 4);  // 0: temp in the workspace
    const int threads =
        ppt ? (int)std::min<int64_t>(max_threads_for<T>(ppt), round_up((per_block + ppt - 1) / ppt, 32))
            : 1024;
    p->points_per_thread = ppt;
    p->threads = threads < 64 ? 64 : threads;
    p->warps_per_cloud = p->threads / 32;
    p->clouds_per_block = 1;
    p->blocks_per_cloud = blocks;
    p->blocks = B * blocks;
    // the kernel was built for clusters, and a cluster of this shape fits the device
    int clusters = 0;
    cudaError_t err = with_points<T>(ppt, [&](auto pts) -> cudaError_t {
        using Points = decltype(pts);
        if (!cluster_kernel_usable<T, Points>(d)) return cudaErrorInvalidValue;
        cudaLaunchConfig_t config = {};
        config.gridDim = dim3((unsigned)blocks);
        config.blockDim = dim3(p->threads);
        cudaLaunchAttribute attribute[1];
        attribute[0].id = cudaLaunchAttributeClusterDimension;
        attribute[0].val.clusterDim.x = blocks;
        attribute[0].val.clusterDim.y = 1;
        attribute[0].val.clusterDim.z = 1;
        config.attrs = attribute;
        config.numAttrs = 1;
        return cudaOccupancyMaxActiveClusters(&clusters, fps_cluster_kernel<T, Points>, &config);
    });
    if (err != cudaSuccess) (void)cudaGetLastError();
    return err == cudaSuccess && clusters > 0;
}

template <typename T>
bool plan_grid(pcops_fps_cuda_plan* p, const Device& d, int64_t N) {
    if (!d.cooperative) return false;
    const int64_t Np = N > 0 ? N : 1;
    // blocks: about one per SM, fewer when the cloud is small (each block >= 1024 points)
    int blocks = (int)std::min<int64_t>(d.sms, (Np + 1023) / 1024);
    if (blocks < 1) blocks = 1;
    const int64_t per_block = (Np + blocks - 1) / blocks;
    int ppt = fit_points_per_thread<T>(per_block, 2);
    const int threads =
        ppt ? (int)std::min<int64_t>(max_threads_for<T>(ppt), round_up((per_block + ppt - 1) / ppt, 32))
            : 1024;
    p->points_per_thread = ppt;
    p->threads = threads < 64 ? 64 : threads;
    p->warps_per_cloud = p->threads / 32;
    p->clouds_per_block = 1;
    // every block must be co-resident
    int per_sm = 0;
    cudaError_t err = with_points<T>(ppt, [&](auto pts) {
        return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, fps_grid_kernel<T, decltype(pts)>, p->threads, 0);
    });
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    if ((int64_t)per_sm * d.sms < blocks) return false;
    p->blocks_per_cloud = blocks;
    p->blocks = blocks;
    return true;
}

template <typename T>
cudaError_t make_plan(int64_t B, int64_t N, int64_t npoint, int variant,
                      pcops_fps_cuda_plan* p) {
    (void)npoint;
    Device d;
    cudaError_t err = current_device(&d);
    if (err != cudaSuccess) return err;
    if (variant == PCOPS_FPS_AUTO) {
        // Small clouds: a warp or two each, several per block (latency of one warp's shuffles).
        // Clouds that fit one block's registers: a block each. Larger clouds: a cluster of 8
        // each (registers while they fit, else temp in the workspace); a few huge clouds: the
        // whole grid, one cloud at a time. Measured on the H100: BENCHMARKS.md.
        const int64_t block_cap = sizeof(T) == 4 ? 8192 : 4096;  // see plan_group
        if (N <= 512) variant = PCOPS_FPS_WARP;
        else if (N <= block_cap) variant = PCOPS_FPS_BLOCK;
        else if (d.major >= 9 && (N <= 8 * block_cap || B * 8 >= d.sms)) variant = PCOPS_FPS_CLUSTER;
        else variant = PCOPS_FPS_GRID;
        pcops_fps_cuda_plan q = *p;
        q.variant = variant;
        bool ok = false;
        switch (variant) {
            case PCOPS_FPS_WARP:
            case PCOPS_FPS_BLOCK: ok = plan_group<T>(&q, B, N, variant); break;
            case PCOPS_FPS_CLUSTER: ok = plan_cluster<T>(&q, d, B, N, 8); break;
            case PCOPS_FPS_GRID: ok = plan_grid<T>(&q, d, N); break;
        }
        if (!ok) {  // e.g. no clusters on this device: the reference path takes any size
            q.variant = PCOPS_FPS_SIMPLE;
            ok = plan_group<T>(&q, B, N, PCOPS_FPS_SIMPLE);
        }
        *p = q;
        return ok ? cudaSuccess : cudaErrorInvalidValue;
    }
    p->variant = variant;
    bool ok = false;
    switch (variant) {
        case PCOPS_FPS_SIMPLE:
        case PCOPS_FPS_WARP:
        case PCOPS_FPS_BLOCK: ok = plan_group<T>(p, B, N, variant); break;
        case PCOPS_FPS_CLUSTER: {
            // the fewest of 2, 4, 8 blocks per cloud that hold it in registers; 8 otherwise
            int blocks = 2;
            while (blocks < 8 && N > (int64_t)blocks * 640 * (sizeof(T) == 4 ? 8 : 4)) blocks *= 2;
            ok = plan_cluster<T>(p, d, B, N, blocks);
            break;
        }
        case PCOPS_FPS_GRID: ok = plan_grid<T>(p, d, N); break;
    }
    return ok ? cudaSuccess : cudaErrorInvalidValue;
}

// The workspace of a plan: temp[B, N] when the points live in global memory, the grid's
// candidate slots. Described once; with base NULL it only counts. Returns the bytes.
template <typename T>
size_t plan_layout(const pcops_fps_cuda_plan* p, void* base, T** temp, Candidate<T>** slots) {
    pcops_carver w = pcops_carver_init(base);
    *temp = p->points_per_thread == 0 ? (T*)pcops_carve(&w, p->B * p->N, sizeof(T)) : nullptr;
    *slots = p->variant == PCOPS_FPS_GRID
                 ? (Candidate<T>*)pcops_carve(&w, 2 * p->blocks, sizeof(Candidate<T>))
                 : nullptr;
    return pcops_carver_bytes(&w);
}

template <typename T>
cudaError_t run_plan(const pcops_fps_cuda_plan* p, const T* xyz, const int64_t* lengths,
                     const int64_t* start, int64_t B, int64_t N, int64_t npoint, void* workspace,
                     int64_t* idx, T* dist2, cudaStream_t stream) {
    T* temp;
    Candidate<T>* slots;
    plan_layout<T>(p, workspace, &temp, &slots);
    if (p->workspace_bytes > 0 && workspace == nullptr) return cudaErrorInvalidValue;
    return with_points<T>(p->points_per_thread, [&](auto pts) -> cudaError_t {
        using Points = decltype(pts);
        switch (p->variant) {
            case PCOPS_FPS_SIMPLE:
            case PCOPS_FPS_WARP:
            case PCOPS_FPS_BLOCK: {
                const size_t smem =
                    (size_t)p->clouds_per_block * 2 * p->warps_per_cloud * sizeof(Candidate<T>);
                fps_group_kernel<T, Points><<<(unsigned)p->blocks, p->threads, smem, stream>>>(
                    xyz, lengths, start, B, N, npoint, temp, idx, dist2, p->warps_per_cloud,
                    p->clouds_per_block);
                return cudaGetLastError();
            }
            case PCOPS_FPS_CLUSTER: {
                cudaLaunchConfig_t config = {};
                config.gridDim = dim3((unsigned)p->blocks);
                config.blockDim = dim3(p->threads);
                config.dynamicSmemBytes = 0;
                config.stream = stream;
                cudaLaunchAttribute attribute[1];
                attribute[0].id = cudaLaunchAttributeClusterDimension;
                attribute[0].val.clusterDim.x = p->blocks_per_cloud;
                attribute[0].val.clusterDim.y = 1;
                attribute[0].val.clusterDim.z = 1;
                config.attrs = attribute;
                config.numAttrs = 1;
                return cudaLaunchKernelEx(&config, fps_cluster_kernel<T, Points>, xyz, lengths,
                                          start, B, N, npoint, temp, idx, dist2);
            }
            case PCOPS_FPS_GRID: {
                void* args[] = {(void*)&xyz, (void*)&lengths, (void*)&start, (void*)&B,
                                (void*)&N,   (void*)&npoint,  (void*)&temp,  (void*)&idx,
                                (void*)&dist2, (void*)&slots};
                return cudaLaunchCooperativeKernel((const void*)fps_grid_kernel<T, Points>,
                                                   dim3((unsigned)p->blocks), dim3(p->threads),
                                                   args, 0, stream);
            }
            default: return cudaErrorInvalidValue;
        }
    });
}

}  // namespace

extern "C" cudaError_t pcops_fps_cuda_make_plan(pcops_dtype dtype, int64_t B, int64_t N,
                                                int64_t npoint, int variant,
                                                pcops_fps_cuda_plan* plan) {
    if (!plan || B < 0 || N < 0 || N > INT_MAX || npoint < 1) return cudaErrorInvalidValue;
    if (variant < PCOPS_FPS_AUTO || variant > PCOPS_FPS_GRID || variant == PCOPS_FPS_TREE)
        return cudaErrorInvalidValue;
    pcops_fps_cuda_plan p = {};
    p.dtype = dtype;
    p.B = B;
    p.N = N;
    cudaError_t err;
    if (dtype == PCOPS_FLOAT32) err = make_plan<float>(B, N, npoint, variant, &p);
    else if (dtype == PCOPS_FLOAT64) err = make_plan<double>(B, N, npoint, variant, &p);
    else return cudaErrorInvalidValue;
    if (err != cudaSuccess) return err;
    if (p.blocks > INT_MAX) return cudaErrorInvalidValue;
    if (dtype == PCOPS_FLOAT32) {
        float* t;
        Candidate<float>* s;
        p.workspace_bytes = plan_layout<float>(&p, nullptr, &t, &s);
    } else {
        double* t;
        Candidate<double>* s;
        p.workspace_bytes = plan_layout<double>(&p, nullptr, &t, &s);
    }
    if (p.workspace_bytes == SIZE_MAX) return cudaErrorInvalidValue;
    *plan = p;
    return cudaSuccess;
}

extern "C" cudaError_t pcops_fps_cuda_run(const pcops_fps_cuda_plan* plan, pcops_dtype dtype,
                                          const void* xyz, const int64_t* lengths,
                                          const int64_t* start, int64_t B, int64_t N,
                                          int64_t npoint, void* workspace, int64_t* idx,
                                          void* dist2, cudaStream_t stream) {
    if (!plan || plan->dtype != dtype || plan->B != B || plan->N != N || npoint < 1)
        return cudaErrorInvalidValue;
    if (B == 0) return cudaSuccess;
    return pcops_dispatch_float(dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        return run_plan<T>(plan, (const T*)xyz, lengths, start, B, N, npoint, workspace, idx,
                           (T*)dist2, stream);
    });
}
