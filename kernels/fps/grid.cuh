/*
 * fps/grid.cuh -- GRID: a cooperative launch of about one block per SM works on one cloud at a
 * time (cloud 0, then 1, ...).
 *
 * Block r owns the slice [r * chunk, (r + 1) * chunk) of the cloud (registers, or temps in the
 * workspace for slices too large for them). A step: each block reduces its slice's candidate
 * and writes it to the workspace (slots: 2 * gridDim.x candidates, by step parity; the parity
 * runs on across clouds); one grid barrier; warp 0 of every block reads all the candidates
 * (ld.cg: they are L2's, not a stale L1 line) and the block broadcasts the winner through
 * shared memory.
 *
 * When it wins: AUTO takes it for what neither the bucket paths nor clusters take -- a single
 * huge cloud past the grouped bucket paths (double, or float past 2**20 points) with more
 * points than bucket_single_cloud_max_points (kernels/fps/plan.cuh: one block's buckets are
 * then too slow, and the whole GPU works on the one cloud), or B * N > 2**31 - 1 where
 * clusters do not fit or do not exist.
 *
 * Invariants: every block is co-resident (the plan checks occupancy; cudaLaunchCooperativeKernel
 * refuses otherwise); each cloud's rows are written by block 0 only.
 */
#pragma once

#include <algorithm>

#include "common.cuh"

namespace {

// ------------------------------------------------------------------------------------------
// kernel

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
        const CloudRow<T> row(xyz, lengths, b, N, npoint, idx, dist2);
        if (rank == 0) pad_row(row.idx, row.dist2, row.n_out, npoint, threadIdx.x, blockDim.x);
        if (row.n_out == 0) continue;
        const int chunk = (int)(((int64_t)row.L + blocks - 1) / blocks);
        const int lo = (int)min((int64_t)row.L, (int64_t)rank * chunk);
        const int hi = (int)min((int64_t)row.L, (int64_t)lo + chunk);
        Points pts;
        pts.load(row.cloud, workspace ? workspace + b * N : nullptr, lo + threadIdx.x, hi,
                 blockDim.x);
        int cur = start ? (int)pcops_positive_mod(start[b], row.L) : 0;
        if (rank == 0 && threadIdx.x == 0) {
            row.idx[0] = cur;
            row.dist2[0] = T(0);
        }
        for (int64_t j = 1; j < row.n_out; ++j, ++steps) {
            const int parity = (int)(steps & 1);
            T cx, cy, cz;
            load_point(row.cloud, cur, cx, cy, cz);
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
                row.idx[j] = c.index;
                row.dist2[j] = c.value;
            }
            cur = c.index;
        }
    }
}

// ------------------------------------------------------------------------------------------
// launcher

// Shape of a GRID plan: one block per 1024 points up to one per SM; false without cooperative
// launches or when that many blocks cannot be co-resident.
template <typename T>
bool plan_grid(pcops_fps_cuda_plan* p, const Device& d, int64_t N) {
    if (!d.cooperative) return false;
    const int64_t Np = N > 0 ? N : 1;
    // blocks: about one per SM, fewer when the cloud is small (each block >= 1024 points)
    int blocks = (int)std::min<int64_t>(d.sms, (Np + 1023) / 1024);
    if (blocks < 1) blocks = 1;
    plan_slice<T>(p, (Np + blocks - 1) / blocks, 2);
    const int ppt = p->points_per_thread;
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
cudaError_t launch_grid(const pcops_fps_cuda_plan* p, const T* xyz, const int64_t* lengths,
                        const int64_t* start, int64_t B, int64_t N, int64_t npoint, T* temp,
                        Candidate<T>* slots, int64_t* idx, T* dist2, cudaStream_t stream) {
    return with_points<T>(p->points_per_thread, [&](auto pts) -> cudaError_t {
        using Points = decltype(pts);
        void* args[] = {(void*)&xyz, (void*)&lengths, (void*)&start, (void*)&B,
                        (void*)&N,   (void*)&npoint,  (void*)&temp,  (void*)&idx,
                        (void*)&dist2, (void*)&slots};
        return cudaLaunchCooperativeKernel((const void*)fps_grid_kernel<T, Points>,
                                           dim3((unsigned)p->blocks), dim3(p->threads), args, 0,
                                           stream);
    });
}

}  // namespace
