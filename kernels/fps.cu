/*
 * fps.cu -- furthest point sampling on CUDA.
 *
 * B = batch, N = points per cloud, L = valid points of a cloud (lengths[b] clamped to [0, N]),
 * npoint = samples. xyz[B,N,3] -> idx[B,npoint] (int64), dist2[B,npoint].
 *
 * Same algorithm and arithmetic as fps.c (temp distance buffer starting at +inf, chosen points
 * set to -1, d = (dx*dx + dy*dy) + dz*dz without FMA contraction, ties to the lower index), so
 * both choose bitwise the same indices.
 *
 * Work distribution: one thread block per cloud. The samples are inherently serial; inside one
 * step the block's threads split the cloud's points (thread t owns points t, t + THREADS, ...),
 * lower their temp with the distance to the newest sample, and keep their own best
 * (temp, index). A cub::BlockReduce over those pairs (ties to the lower index) finds the next
 * sample; thread 0 broadcasts it through shared memory.
 *  - fps_registers_kernel: for N <= THREADS * PPT the owned points' coordinates and temp live
 *    in registers (PPT = points per thread, a template parameter so the arrays are indexed
 *    with constants only): the loop reads no memory but the new sample's coordinates.
 *  - fps_global_kernel: any N; temp lives in the caller's workspace [B, N] and the
 *    coordinates are read from xyz (L2-resident for clouds up to millions of points).
 *  - fps_cluster_kernel (Hopper and newer): one block per cloud leaves a large single cloud on
 *    one SM of 132 -- the peers' design, and why they take seconds on 200k points. Here a
 *    thread-block cluster of CLUSTER_BLOCKS blocks shares a cloud: each block owns a slice of the
 *    points (temp in the workspace, coordinates from L2) and reduces its own candidate; after one
 *    cluster barrier per step, warp 0 of every block reads all the blocks' candidates from their
 *    shared memory (distributed shared memory) and picks the same winner. The candidate slots
 *    are double-buffered by step parity, so one cluster barrier per step is enough.
 */
#include <cooperative_groups.h>
#include <cub/block/block_reduce.cuh>

#include <climits>
#include <cstdint>

#include "common.h"
#include "pcops.h"

namespace {

template <typename T>
struct Candidate {
    T value;
    int index;
};

// The larger value wins; equal values go to the lower index.
struct TakeFarther {
    template <typename T>
    __device__ __forceinline__ Candidate<T> operator()(const Candidate<T>& a,
                                                       const Candidate<T>& b) const {
        return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
    }
};

template <typename T>
__device__ __forceinline__ T squared_distance(T x, T y, T z, T cx, T cy, T cz) {
    T dx = x - cx, dy = y - cy, dz = z - cz;
    return dx * dx + dy * dy + dz * dz;  // built with -fmad=false: no contraction
}

// Writes -1 / 0 to the slots [n_out, npoint) of one row.
template <typename T>
__device__ void pad_row(int64_t* idx, T* dist2, int64_t n_out, int64_t npoint) {
    for (int64_t j = n_out + threadIdx.x; j < npoint; j += blockDim.x) {
        idx[j] = -1;
        dist2[j] = T(0);
    }
}

// ------------------------------------------------------------------------------------------
// CUDA kernels

template <typename T, int THREADS, int PPT>
__global__ void __launch_bounds__(THREADS)
fps_registers_kernel(const T* __restrict__ xyz, const int64_t* __restrict__ lengths,
                     const int64_t* __restrict__ start, int64_t N, int64_t npoint,
                     int64_t* __restrict__ idx, T* __restrict__ dist2) {
    using BlockReduce = cub::BlockReduce<Candidate<T>, THREADS>;
    __shared__ typename BlockReduce::TempStorage reduce_storage;
    __shared__ int s_next;

    const int64_t b = blockIdx.x;
    const T* cloud = xyz + b * N * 3;
    int64_t* out_idx = idx + b * npoint;
    T* out_dist2 = dist2 + b * npoint;
    const int L = (int)pcops_valid_length(lengths, b, N);
    const int64_t n_out = npoint < L ? npoint : L;
    pad_row(out_idx, out_dist2, n_out, npoint);
    if (n_out == 0) return;

    T px[PPT], py[PPT], pz[PPT], temp[PPT];
#pragma unroll
    for (int p = 0; p < PPT; ++p) {
        int n = threadIdx.x + p * THREADS;
        bool valid = n < L;
        px[p] = valid ? cloud[3 * n + 0] : T(0);
        py[p] = valid ? cloud[3 * n + 1] : T(0);
        pz[p] = valid ? cloud[3 * n + 2] : T(0);
        temp[p] = valid ? T(INFINITY) : T(-INFINITY);  // padding slots never win
    }
    int cur = start ? (int)pcops_positive_mod(start[b], L) : 0;
    if (threadIdx.x == 0) {
        out_idx[0] = cur;
        out_dist2[0] = T(0);
    }
    for (int64_t j = 1; j < n_out; ++j) {
        const T cx = cloud[3 * cur + 0], cy = cloud[3 * cur + 1], cz = cloud[3 * cur + 2];
        Candidate<T> best = {T(-INFINITY), INT_MAX};
#pragma unroll
        for (int p = 0; p < PPT; ++p) {
            int n = threadIdx.x + p * THREADS;
            if (n == cur) temp[p] = T(-1);
            T d = squared_distance(px[p], py[p], pz[p], cx, cy, cz);
            T t = d < temp[p] ? d : temp[p];  // a NaN distance leaves temp unchanged
            temp[p] = t;
            if (t > best.value) best = {t, n};  // p ascending: the first maximum is kept
        }
        Candidate<T> winner = BlockReduce(reduce_storage).Reduce(best, TakeFarther());
        if (threadIdx.x == 0) {
            s_next = winner.index;
            out_idx[j] = winner.index;
            out_dist2[j] = winner.value;
        }
        __syncthreads();  // s_next is visible; reduce_storage may be reused
        cur = s_next;
    }
}

template <typename T, int THREADS>
__global__ void __launch_bounds__(THREADS)
fps_global_kernel(const T* __restrict__ xyz, const int64_t* __restrict__ lengths,
                  const int64_t* __restrict__ start, int64_t N, int64_t npoint,
                  T* __restrict__ workspace, int64_t* __restrict__ idx, T* __restrict__ dist2) {
    using BlockReduce = cub::BlockReduce<Candidate<T>, THREADS>;
    __shared__ typename BlockReduce::TempStorage reduce_storage;
    __shared__ int s_next;

    const int64_t b = blockIdx.x;
    const T* cloud = xyz + b * N * 3;
    T* temp = workspace + b * N;
    int64_t* out_idx = idx + b * npoint;
    T* out_dist2 = dist2 + b * npoint;
    const int L = (int)pcops_valid_length(lengths, b, N);
    const int64_t n_out = npoint < L ? npoint : L;
    pad_row(out_idx, out_dist2, n_out, npoint);
    if (n_out == 0) return;

    for (int n = threadIdx.x; n < L; n += THREADS) temp[n] = T(INFINITY);
    int cur = start ? (int)pcops_positive_mod(start[b], L) : 0;
    if (threadIdx.x == 0) {
        out_idx[0] = cur;
        out_dist2[0] = T(0);
    }
    // Each thread only ever touches its own temp entries, so no barrier is needed between
    // the initialisation above and the loop.
    for (int64_t j = 1; j < n_out; ++j) {
        const T cx = cloud[3 * cur + 0], cy = cloud[3 * cur + 1], cz = cloud[3 * cur + 2];
        Candidate<T> best = {T(-INFINITY), INT_MAX};
        for (int n = threadIdx.x; n < L; n += THREADS) {
            T t = temp[n];
            if (n == cur) t = T(-1);
            T d = squared_distance(cloud[3 * n + 0], cloud[3 * n + 1], cloud[3 * n + 2], cx, cy,
                                   cz);
            t = d < t ? d : t;
            temp[n] = t;
            if (t > best.value) best = {t, n};
        }
        Candidate<T> winner = BlockReduce(reduce_storage).Reduce(best, TakeFarther());
        if (threadIdx.x == 0) {
            s_next = winner.index;
            out_idx[j] = winner.index;
            out_dist2[j] = winner.value;
        }
        __syncthreads();
        cur = s_next;
    }
}

constexpr int CLUSTER_BLOCKS = 8;      // blocks per cloud (8 is the portable cluster size)
constexpr int CLUSTER_THREADS = 1024;  // threads per block

template <typename T>
__global__ void __launch_bounds__(CLUSTER_THREADS)
fps_cluster_kernel(const T* __restrict__ xyz, const int64_t* __restrict__ lengths,
                   const int64_t* __restrict__ start, int64_t N, int64_t npoint,
                   T* __restrict__ workspace, int64_t* __restrict__ idx, T* __restrict__ dist2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    using BlockReduce = cub::BlockReduce<Candidate<T>, CLUSTER_THREADS>;
    __shared__ typename BlockReduce::TempStorage reduce_storage;
    __shared__ Candidate<T> s_block_best[2];  // this block's candidate, by step parity
    __shared__ int s_next;

    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    const int64_t b = blockIdx.x / CLUSTER_BLOCKS;
    const T* cloud = xyz + b * N * 3;
    T* temp = workspace + b * N;
    int64_t* out_idx = idx + b * npoint;
    T* out_dist2 = dist2 + b * npoint;
    const int L = (int)pcops_valid_length(lengths, b, N);
    const int64_t n_out = npoint < L ? npoint : L;
    if (rank == 0) pad_row(out_idx, out_dist2, n_out, npoint);
    if (n_out == 0) return;  // the whole cluster returns here: no shared memory was shared

    // This block's slice of the cloud: [lo, hi). Thread t owns lo + t, lo + t + THREADS, ...
    const int chunk = (L + CLUSTER_BLOCKS - 1) / CLUSTER_BLOCKS;
    const int lo = min(L, rank * chunk), hi = min(L, lo + chunk);
    for (int n = lo + threadIdx.x; n < hi; n += CLUSTER_THREADS) temp[n] = T(INFINITY);
    int cur = start ? (int)pcops_positive_mod(start[b], L) : 0;
    if (rank == 0 && threadIdx.x == 0) {
        out_idx[0] = cur;
        out_dist2[0] = T(0);
    }
    for (int64_t j = 1; j < n_out; ++j) {
        const int parity = (int)(j & 1);
        const T cx = cloud[3 * cur + 0], cy = cloud[3 * cur + 1], cz = cloud[3 * cur + 2];
        Candidate<T> best = {T(-INFINITY), INT_MAX};
        for (int n = lo + threadIdx.x; n < hi; n += CLUSTER_THREADS) {
            T t = temp[n];
            if (n == cur) t = T(-1);
            T d = squared_distance(cloud[3 * n + 0], cloud[3 * n + 1], cloud[3 * n + 2], cx, cy,
                                   cz);
            t = d < t ? d : t;
            temp[n] = t;
            if (t > best.value) best = {t, n};
        }
        Candidate<T> block_best = BlockReduce(reduce_storage).Reduce(best, TakeFarther());
        if (threadIdx.x == 0) s_block_best[parity] = block_best;
        cluster.sync();  // every block's candidate for step j is visible cluster-wide
        if (threadIdx.x < 32) {
            const int lane = threadIdx.x;
            Candidate<T> c = {T(-INFINITY), INT_MAX};
            if (lane < CLUSTER_BLOCKS) c = *cluster.map_shared_rank(&s_block_best[parity], lane);
#pragma unroll
            for (int offset = 16; offset > 0; offset /= 2) {
                Candidate<T> other = {__shfl_xor_sync(0xffffffffu, c.value, offset),
                                      __shfl_xor_sync(0xffffffffu, c.index, offset)};
                c = TakeFarther()(c, other);
            }
            if (lane == 0) {
                s_next = c.index;
                if (rank == 0) {
                    out_idx[j] = c.index;
                    out_dist2[j] = c.value;
                }
            }
        }
        __syncthreads();  // s_next is visible; reduce_storage may be reused
        cur = s_next;
    }
    cluster.sync();  // no block may exit while another can still read its shared memory
#endif
}

// ------------------------------------------------------------------------------------------
// kernel launchers

// Whether fps_cluster_kernel<T> can run on the current device: the device has thread-block
// clusters (compute capability 9.0 or newer) AND the kernel it would run was built from sm_90
// (or newer) code. The kernel's body only exists for __CUDA_ARCH__ >= 900, so a build without
// sm_90 code (TORCH_CUDA_ARCH_LIST=8.0+PTX, say, JIT-compiled by the driver for an H100) holds
// an empty cluster kernel that must never be launched: it would leave idx unwritten.
template <typename T>
bool cluster_kernel_usable() {
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
        return false;
    if (major < 9) return false;
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, fps_cluster_kernel<T>) != cudaSuccess) {
        (void)cudaGetLastError();  // not an error of this call: the block kernel runs instead
        return false;
    }
    return attr.ptxVersion >= 90;  // the virtual architecture the kernel was compiled from
}

template <typename T>
cudaError_t launch_fps_cluster(const T* xyz, const int64_t* lengths, const int64_t* start,
                               int64_t B, int64_t N, int64_t npoint, T* workspace, int64_t* idx,
                               T* dist2, cudaStream_t stream) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3((unsigned)(B * CLUSTER_BLOCKS));
    config.blockDim = dim3(CLUSTER_THREADS);
    config.dynamicSmemBytes = 0;
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = CLUSTER_BLOCKS;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, fps_cluster_kernel<T>, xyz, lengths, start, N, npoint,
                              workspace, idx, dist2);
}

// variant: 0 = choose by size, 1 = one block per cloud, 2 = a cluster per cloud (sm_90+).
template <typename T>
cudaError_t launch_fps(const T* xyz, const int64_t* lengths, const int64_t* start, int64_t B,
                       int64_t N, int64_t npoint, T* workspace, int64_t* idx, T* dist2,
                       int variant, cudaStream_t stream) {
    const bool registers_fit = N <= 512 * (sizeof(T) == 4 ? 16 : 8);
    const bool cluster = (variant == 2 || (variant == 0 && !registers_fit)) &&
                         B <= INT_MAX / CLUSTER_BLOCKS && cluster_kernel_usable<T>();
    if (cluster)
        return launch_fps_cluster(xyz, lengths, start, B, N, npoint, workspace, idx, dist2,
                                  stream);
    const dim3 grid((unsigned)B);
#define PCOPS_FPS_REGISTERS(THREADS, PPT)                                                     \
    fps_registers_kernel<T, THREADS, PPT>                                                     \
        <<<grid, THREADS, 0, stream>>>(xyz, lengths, start, N, npoint, idx, dist2)
    if (N <= 128 * 4) PCOPS_FPS_REGISTERS(128, 4);
    else if (N <= 128 * 8) PCOPS_FPS_REGISTERS(128, 8);
    else if (N <= 256 * 8) PCOPS_FPS_REGISTERS(256, 8);
    else if (N <= 512 * 8) PCOPS_FPS_REGISTERS(512, 8);
    else if (N <= 512 * 16 && sizeof(T) == 4) PCOPS_FPS_REGISTERS(512, 16);  // doubles would spill
    else
        fps_global_kernel<T, 1024>
            <<<grid, 1024, 0, stream>>>(xyz, lengths, start, N, npoint, workspace, idx, dist2);
#undef PCOPS_FPS_REGISTERS
    return cudaGetLastError();
}

}  // namespace

extern "C" size_t pcops_fps_cuda_workspace_bytes(pcops_dtype dtype, int64_t B, int64_t N) {
    if (B <= 0 || N <= 0) return 0;
    return (size_t)B * (size_t)N * pcops_dtype_size(dtype);  // temp[B, N]
}

extern "C" cudaError_t pcops_fps_cuda_variant(pcops_dtype dtype, const void* xyz,
                                              const int64_t* lengths, const int64_t* start,
                                              int64_t B, int64_t N, int64_t npoint,
                                              void* workspace, int64_t* idx, void* dist2,
                                              int variant, cudaStream_t stream) {
    // Indices inside a cloud are int; the grid has one block per cloud.
    if (B < 0 || N < 0 || N > INT_MAX || B > INT_MAX || npoint < 1) return cudaErrorInvalidValue;
    if (B == 0) return cudaSuccess;
    cudaError_t err;
    switch (dtype) {
        case PCOPS_FLOAT32:
            err = launch_fps((const float*)xyz, lengths, start, B, N, npoint, (float*)workspace,
                             idx, (float*)dist2, variant, stream);
            break;
        case PCOPS_FLOAT64:
            err = launch_fps((const double*)xyz, lengths, start, B, N, npoint,
                             (double*)workspace, idx, (double*)dist2, variant, stream);
            break;
        default:
            return cudaErrorInvalidValue;
    }
#ifdef PCOPS_DEBUG_SYNC
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
#endif
    return err;
}

extern "C" cudaError_t pcops_fps_cuda(pcops_dtype dtype, const void* xyz, const int64_t* lengths,
                                      const int64_t* start, int64_t B, int64_t N,
                                      int64_t npoint, void* workspace, int64_t* idx,
                                      void* dist2, cudaStream_t stream) {
    return pcops_fps_cuda_variant(dtype, xyz, lengths, start, B, N, npoint, workspace, idx,
                                  dist2, 0, stream);
}
