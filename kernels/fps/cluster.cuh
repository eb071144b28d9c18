/*
 * fps/cluster.cuh -- CLUSTER (sm_90+): a thread-block cluster of 2, 4 or 8 blocks per cloud.
 *
 * gridDim.x = B * cluster size; block `rank` of a cluster owns the slice [rank * chunk,
 * (rank + 1) * chunk) of its cloud, in registers (RegisterPoints) or, for slices too large for
 * them, with its temps in the workspace (GlobalPoints). A step: each block reduces its slice's
 * candidate (group_farthest) and publishes it in its shared memory (block_slot, by step
 * parity); one cluster barrier; every warp reads the cluster's candidates through distributed
 * shared memory and takes the farthest, so every block knows the sample without a trip through
 * global memory.
 *
 * When it wins: AUTO takes it only for what the bucket paths cannot take (B * N > 2**31 - 1:
 * their sort counts items in an int) on a GPU with clusters, when the cloud fits the registers
 * of a cluster of 8 blocks or the batch fills the GPU with clusters of 8; GRID otherwise.
 *
 * Invariants: a cluster returns or runs as a whole (its rows share lengths[b]); no block exits
 * while another may still read its shared memory (the final cluster.sync). The kernel's body
 * exists only in sm_90+ code, so the plan checks that the build has it (cluster_kernel_usable).
 */
#pragma once

#include "common.cuh"

namespace {

// ------------------------------------------------------------------------------------------
// kernel

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
    const CloudRow<T> row(xyz, lengths, b, N, npoint, idx, dist2);
    if (rank == 0) pad_row(row.idx, row.dist2, row.n_out, npoint, threadIdx.x, blockDim.x);
    if (row.n_out == 0) return;  // the whole cluster returns here: no shared memory was shared

    const int chunk = (int)(((int64_t)row.L + blocks - 1) / blocks);
    const int lo = (int)min((int64_t)row.L, (int64_t)rank * chunk);
    const int hi = (int)min((int64_t)row.L, (int64_t)lo + chunk);
    Points pts;
    pts.load(row.cloud, workspace ? workspace + b * N : nullptr, lo + threadIdx.x, hi, blockDim.x);
    int cur = start ? (int)pcops_positive_mod(start[b], row.L) : 0;
    if (rank == 0 && threadIdx.x == 0) {
        row.idx[0] = cur;
        row.dist2[0] = T(0);
    }
    for (int64_t j = 1; j < row.n_out; ++j) {
        const int parity = (int)(j & 1);
        T cx, cy, cz;
        load_point(row.cloud, cur, cx, cy, cz);
        Candidate<T> c = pts.step(cur, cx, cy, cz);
        c = group_farthest(c, warp_slots, parity, warps, w, 0);
        if (threadIdx.x == 0) block_slot[parity] = c;
        cluster.sync();  // every block's candidate of step j is visible cluster-wide
        c = lane < blocks ? *cluster.map_shared_rank(&block_slot[parity], lane) : no_candidate<T>();
        c = warp_farthest(c);
        if (rank == 0 && threadIdx.x == 0) {
            row.idx[j] = c.index;
            row.dist2[j] = c.value;
        }
        cur = c.index;
    }
    cluster.sync();  // no block may exit while another can still read its shared memory
#endif
}

// ------------------------------------------------------------------------------------------
// launcher

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

// The cluster size a forced CLUSTER takes: the fewest of 2, 4, 8 blocks per cloud that hold it
// in registers; 8 otherwise. (AUTO asks for 8.)
template <typename T>
int cluster_blocks_for(int64_t N) {
    int blocks = 2;
    while (blocks < 8 && N > (int64_t)blocks * 640 * (sizeof(T) == 4 ? 8 : 4)) blocks *= 2;
    return blocks;
}

// Shape of a CLUSTER plan of `blocks` blocks per cloud: false without clusters (device or
// build), for B > INT_MAX / 8, or when no cluster of that shape fits the device.
template <typename T>
bool plan_cluster(pcops_fps_cuda_plan* p, const Device& d, int64_t B, int64_t N, int blocks) {
    if (d.major < 9 || B > INT_MAX / 8) return false;
    const int64_t Np = N > 0 ? N : 1;
    plan_slice<T>(p, (Np + blocks - 1) / blocks, 4);
    p->blocks_per_cloud = blocks;
    p->blocks = B * blocks;
    // the kernel was built for clusters, and a cluster of this shape fits the device
    int clusters = 0;
    cudaError_t err = with_points<T>(p->points_per_thread, [&](auto pts) -> cudaError_t {
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
cudaError_t launch_cluster(const pcops_fps_cuda_plan* p, const T* xyz, const int64_t* lengths,
                           const int64_t* start, int64_t B, int64_t N, int64_t npoint, T* temp,
                           int64_t* idx, T* dist2, cudaStream_t stream) {
    return with_points<T>(p->points_per_thread, [&](auto pts) -> cudaError_t {
        using Points = decltype(pts);
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
        return cudaLaunchKernelEx(&config, fps_cluster_kernel<T, Points>, xyz, lengths, start, B,
                                  N, npoint, temp, idx, dist2);
    });
}

}  // namespace
