/*
 * knn_nd.cu -- k nearest neighbours in any dimension D on CUDA (kernels/pcops.h,
 * pcops_knn_nd_cuda): query[B,M,D], ref[B,N,D] -> dist[B,M,K], idx[B,M,K] (int64), for the
 * metrics L2 (squared), L1 and COSINE.
 *
 * The simple reference of the dimension-free kNN: a thread per query, every valid ref of its
 * cloud in index order, each distance summed over d = 0 .. D-1 in order with the step
 * functions of kernels/knn_nd.h (the CPU kernel's, kernels/knn_nd.c: the same bits). The
 * query's selection list lives in its output rows in global memory, as on the CPU: a sorted
 * list while at most KNN_ND_SORTED_MAX neighbours are kept, geometry.h's max-heap above,
 * heapsorted at the end; a ref enters only when strictly below the current K-th distance, so
 * ruled-out refs (+inf) never enter and ties go to the lower index. Distances follow
 * geometry.h's overflow rule as on the CPU (knn_nd.h, knn_nd_ruled). It wins nothing but correctness: the
 * fast path for feature spaces (a tensor-core shortlist re-ranked with these distances) is
 * planned in kernels/README.md, "kNN in any dimension".
 */
#include <cstdint>

#include "geometry.h"
#include "knn_nd.h"
#include "knn_nd_ops.cuh"
#include "pcops.h"

namespace {

// Kept neighbours up to which a sorted list with insertion is used; a heap above (knn_nd.c's).
constexpr int64_t KNN_ND_SORTED_MAX = 32;
constexpr int kThreads = 128;
constexpr int64_t kMaxBlocks = 65535;  // a grid-stride loop covers the rest

// The distance of query q to ref r (D coordinates each) under `metric`; qn: the query's |a|^2
// (COSINE only).
template <typename T>
__device__ __forceinline__ T nd_distance(const T* __restrict__ q, const T* __restrict__ r,
                                         int64_t D, pcops_knn_metric metric, T qn) {
    using S = NdOps<T>;
    T acc = 0;
    if (metric == PCOPS_KNN_L2) {
        for (int64_t d = 0; d < D; ++d) acc = S::l2(acc, q[d], r[d]);
        return acc;
    }
    if (metric == PCOPS_KNN_L1) {
        for (int64_t d = 0; d < D; ++d) acc = S::l1(acc, q[d], r[d]);
        return acc;
    }
    T rn = 0;
    for (int64_t d = 0; d < D; ++d) {
        acc = S::dot(acc, q[d], r[d]);
        rn = S::dot(rn, r[d], r[d]);
    }
    return S::cosine(acc, qn, rn);
}

// A thread per (cloud, query), grid-stride.
template <typename T>
__global__ void knn_nd_kernel(const T* __restrict__ query, const T* __restrict__ ref,
                              const int64_t* __restrict__ query_lengths,
                              const int64_t* __restrict__ ref_lengths, int64_t B, int64_t M,
                              int64_t N, int64_t D, int64_t K, pcops_knn_metric metric,
                              T* __restrict__ dist, int64_t* __restrict__ idx) {
    using S = NdOps<T>;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < B * M;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = t / M, m = t % M;
        T* qd = dist + t * K;
        int64_t* qi = idx + t * K;
        for (int64_t s = 0; s < K; ++s) {
            qd[s] = (T)INFINITY;
            qi[s] = -1;
        }
        const int64_t L = pcops_valid_length(ref_lengths, b, N);
        const int64_t cap = K < L ? K : L;
        if (m >= pcops_valid_length(query_lengths, b, M) || cap == 0) continue;
        const T* q = query + t * D;
        const T* cloud = ref + b * N * D;
        const int q_finite = S::finite(q, D);
        T qn = 0;
        if (metric == PCOPS_KNN_COSINE)
            for (int64_t d = 0; d < D; ++d) qn = S::dot(qn, q[d], q[d]);
        const bool use_heap = cap > KNN_ND_SORTED_MAX;
        int64_t count = 0;
        T th = (T)INFINITY;
        for (int64_t n = 0; n < L; ++n) {
            const T* r = cloud + n * D;
            T dn = nd_distance<T>(q, r, D, metric, qn);
            // the overflow rule (knn_nd.h): the points' finiteness only where it can matter
            if (metric == PCOPS_KNN_COSINE || !S::within(dn))
                dn = S::ruled(dn, q_finite && S::finite(r, D));
            if (!(dn < th)) continue;  // +inf (empty, or a point that is not finite)
            if (!use_heap) {
                S::sorted_insert(qd, qi, cap, dn, n);
                th = qd[cap - 1];
            } else if (S::heap_keep(qd, qi, cap, &count, dn, n)) {
                th = qd[0];
            }
        }
        if (use_heap) S::heap_sort(qd, qi, count);
    }
}

}  // namespace

extern "C" cudaError_t pcops_knn_nd_cuda(pcops_dtype dtype, const void* query, const void* ref,
                                         const int64_t* query_lengths,
                                         const int64_t* ref_lengths, int64_t B, int64_t M,
                                         int64_t N, int64_t D, int64_t K,
                                         pcops_knn_metric metric, void* dist, int64_t* idx,
                                         cudaStream_t stream) {
    if (B < 0 || M < 0 || N < 0 || D < 1 || K < 1 || M > INT32_MAX || N > INT32_MAX ||
        K > INT32_MAX)
        return cudaErrorInvalidValue;
    if (metric != PCOPS_KNN_L2 && metric != PCOPS_KNN_L1 && metric != PCOPS_KNN_COSINE)
        return cudaErrorInvalidValue;
    if (B == 0 || M == 0) return cudaSuccess;
    if (!query || !dist || !idx || (N > 0 && !ref)) return cudaErrorInvalidValue;
    const int64_t needed = (B * M + kThreads - 1) / kThreads;
    const unsigned blocks = (unsigned)(needed < kMaxBlocks ? needed : kMaxBlocks);
    return pcops_dispatch_float(dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        knn_nd_kernel<T><<<blocks, kThreads, 0, stream>>>(
            (const T*)query, (const T*)ref, query_lengths, ref_lengths, B, M, N, D, K, metric,
            (T*)dist, idx);
        return pcops_launch_tail(cudaGetLastError(), stream);
    });
}
