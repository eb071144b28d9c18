/*
 * knn/brute.cuh -- path "brute", the reference: every valid ref of the cloud against every
 * query, the best k kept in a sorted list in registers (k <= kMaxRegisterK).
 *
 * What it does: one thread owns one query. The block's threads stage the refs of their cloud
 * through shared memory, kTile points at a time, and every thread scans each tile (all lanes
 * read the same point: a broadcast). The best K (dist2, idx) pairs live in registers, sorted
 * (RegisterList, K a bucket: 1, 4, 8, 16, 32, 64); insertion is fully unrolled so the arrays are
 * indexed by compile-time constants only, and a runtime k < K fills the first K - k slots with
 * -inf. When there are too few queries to fill the GPU the refs are split into S ranges (the
 * plan's splits): each (query, range) thread writes a sorted partial list to the workspace
 * [B,S,M,k], and knn_merge_kernel feeds the S lists, in range order, through the same insertion.
 *
 * When it wins: small clouds (below the grid paths' thresholds), and few queries against many
 * refs once split over enough threads to fill the GPU (knn/plan.cuh).
 *
 * Invariants: refs are visited in index order and taken only when strictly below the current
 * k-th distance, so ties go to the lower index; range s holds lower indices than range s + 1,
 * so the merge keeps that rule and the result does not depend on S. For k > kMaxRegisterK the
 * brute force keeps its lists in heaps instead (knn/heap.cuh): a forced "brute" with such a k
 * runs as BRUTE_HEAP, one path with two selection structures (knn/plan.cuh).
 */
#pragma once

#include <climits>
#include <cstdint>

#include "common.cuh"

namespace {

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
        qx = staged_x(q[0], q[1], q[2]);
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

// ------------------------------------------------------------------------------------------
// kernel launchers

// Threads per block for a cloud of M queries: a multiple of 32, at most kThreads.
int threads_for(int64_t M) {
    const int64_t t = (M + 31) / 32 * 32;
    return (int)(t < 32 ? 32 : t > kThreads ? kThreads : t);
}

// The partial lists of a split call in the workspace: part_d [B,S,M,k] of T, then part_i
// [B,S,M,k] int (a carver with base NULL only counts).
inline void carve_partial_lists(pcops_carver* w, int64_t entries, size_t scalar_bytes,
                                void** part_d, int** part_i) {
    *part_d = pcops_carve(w, entries, scalar_bytes);
    *part_i = (int*)pcops_carve(w, entries, sizeof(int));
}

template <typename T, int K>
cudaError_t launch_registers(const pcops_knn_cuda_plan& plan, const KnnArgs<T>& a) {
    const int64_t B = plan.B, M = plan.M, N = plan.N;
    KnnParams p{};
    p.query_lengths = a.query_lengths;
    p.ref_lengths = a.ref_lengths;
    p.M = M;
    p.N = N;
    p.k = (int)plan.K;
    p.splits = (int)plan.splits;
    p.split_len = (N + p.splits - 1) / p.splits;
    const int threads = threads_for(p.M);
    p.query_blocks = (p.M + threads - 1) / threads;
    const int64_t blocks = B * p.splits * p.query_blocks;
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
    T* part_d = nullptr;
    int* part_i = nullptr;
    if (p.splits > 1) {
        pcops_carver w = pcops_carver_init(a.workspace);
        void* d = nullptr;
        carve_partial_lists(&w, B * p.splits * M * p.k, sizeof(T), &d, &part_i);
        part_d = static_cast<T*>(d);
    }
    knn_registers_kernel<T, K><<<(unsigned)blocks, threads, 0, a.stream>>>(
        a.query, a.ref, p, a.dist2, a.idx, part_d, part_i);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess || p.splits == 1) return err;
    const int64_t merge_blocks = (B * p.M + kThreads - 1) / kThreads;
    if (merge_blocks > INT_MAX) return cudaErrorInvalidValue;
    knn_merge_kernel<T, K><<<(unsigned)merge_blocks, kThreads, 0, a.stream>>>(
        p, B, part_d, part_i, a.dist2, a.idx);
    return cudaGetLastError();
}

template <>
struct KnnPath<PCOPS_KNN_BRUTE> {
    static constexpr bool kGrid = false;
    static bool takes(const KnnSizes& s) { return s.K <= kMaxRegisterK; }
    template <typename T>
    static cudaError_t launch(const pcops_knn_cuda_plan& plan, const KnnArgs<T>& a) {
        return with_register_bucket(plan.K, [&](auto bucket) {
            return launch_registers<T, decltype(bucket)::value>(plan, a);
        });
    }
};

}  // namespace
