/*
 * knn_nd.cu -- k nearest neighbours in any dimension D on CUDA (kernels/pcops.h,
 * pcops_knn_nd_cuda_plan_make / pcops_knn_nd_cuda_run): query[B,M,D], ref[B,N,D] ->
 * dist[B,M,K], idx[B,M,K] (int64), for the metrics L2 (squared), L1 and COSINE.
 *
 * The simple reference of the dimension-free kNN: a thread per query, every valid ref of its
 * cloud in index order, each distance summed over d = 0 .. D-1 in order with the step
 * functions of kernels/knn_nd.h (the CPU kernel's, kernels/knn_nd.c: the same bits). The
 * query's selection list lives in its output rows in global memory, as on the CPU: a sorted
 * list while at most KNN_ND_SORTED_MAX neighbours are kept, geometry.h's max-heap above,
 * heapsorted at the end; a ref enters only when strictly below the current K-th distance, so
 * ruled-out refs (+inf) never enter and ties go to the lower index. Distances follow
 * geometry.h's overflow rule as on the CPU (knn_nd.h, knn_nd_ruled). It is the reference, and
 * the fallback of the second path:
 *
 * tc (knn_nd/tc.cuh): for L2 in feature space (float32, D >= 16, k <= 64, sm_80+), a shortlist
 * of candidates from approximate distances on the tensor cores under a proven error bound,
 * re-ranked with these exact distances; queries whose shortlist overflows are handed back to
 * the brute force (knn_nd_kernel over the tc path's counts). The same bits as the brute force.
 *
 * The plan (pcops_knn_nd_cuda_plan_make) takes a forced path if it can run (else refuses), and
 * for AUTO the tc path where the tuning table (kKnnNdTuning) says so.
 */
#include <cstdint>

#include "geometry.h"
#include "knn_nd.h"
#include "knn_nd/tc.cuh"
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

// A thread per (cloud, query), grid-stride; with `only`, just the queries t with
// only[t] > only_above (those the tc path hands back).
template <typename T>
__global__ void knn_nd_kernel(const T* __restrict__ query, const T* __restrict__ ref,
                              const int64_t* __restrict__ query_lengths,
                              const int64_t* __restrict__ ref_lengths, int64_t B, int64_t M,
                              int64_t N, int64_t D, int64_t K, pcops_knn_metric metric,
                              const int* __restrict__ only, int64_t only_above,
                              T* __restrict__ dist, int64_t* __restrict__ idx) {
    using S = NdOps<T>;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < B * M;
         t += (int64_t)gridDim.x * blockDim.x) {
        if (only != nullptr && only[t] <= only_above) continue;  // another path's query
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

// ------------------------------------------------------------------------------------------
// The plan: the brute force, or the tensor-core shortlist (knn_nd/tc.cuh) where it may run and
// the tuning row asks for it.

// AUTO's thresholds, a row per architecture: a device takes the newest row at or below its
// compute capability, older GPUs the oldest.
struct KnnNdTuning {
    int sm;            // the architecture of the row: major * 10 + minor
    int64_t tc_min_d;  // python benchmarks/tune.py knn: tc from this D (0: off until measured)
};

constexpr KnnNdTuning kKnnNdTuning[] = {
    // sm, tc_min_d (python benchmarks/tune.py knn; sm_80 not measured yet: off)
    {80, 0},
    {90, 16},  // from the path's least D: faster than the brute force at every D measured
};

const KnnNdTuning& knn_nd_tuning(int sm) {
    const KnnNdTuning* row = &kKnnNdTuning[0];
    for (const KnnNdTuning& r : kKnnNdTuning)
        if (r.sm <= sm) row = &r;
    return *row;
}

// Whether the tc path can run: L2, float32, kTcMinD <= D <= kTcMaxD, K <= kTcMaxK, sm_80+.
bool tc_takes(pcops_dtype dtype, int64_t D, int64_t K, pcops_knn_metric metric, int sm) {
    return dtype == PCOPS_FLOAT32 && metric == PCOPS_KNN_L2 && D >= kTcMinD && D <= kTcMaxD &&
           K <= kTcMaxK && sm >= 80;
}

cudaError_t device_sm(int* sm) {
    int dev = 0, major = 0, minor = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    *sm = major * 10 + minor;
    return err;
}

}  // namespace

extern "C" cudaError_t pcops_knn_nd_cuda_plan_make(pcops_dtype dtype, int64_t B, int64_t M,
                                                   int64_t N, int64_t D, int64_t K,
                                                   pcops_knn_metric metric, pcops_knn_path path,
                                                   pcops_knn_nd_cuda_plan* plan) {
    if (!plan) return cudaErrorInvalidValue;
    if (B < 0 || M < 0 || N < 0 || D < 1 || K < 1 || M > INT32_MAX || N > INT32_MAX ||
        K > INT32_MAX)
        return cudaErrorInvalidValue;
    if (metric != PCOPS_KNN_L2 && metric != PCOPS_KNN_L1 && metric != PCOPS_KNN_COSINE)
        return cudaErrorInvalidValue;
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return cudaErrorInvalidValue;
    int sm = 0;
    const cudaError_t err = device_sm(&sm);
    if (err != cudaSuccess) return err;
    const bool tc = tc_takes(dtype, D, K, metric, sm);
    pcops_knn_path chosen;
    if (path == PCOPS_KNN_AUTO) {
        const int64_t min_d = knn_nd_tuning(sm).tc_min_d;
        chosen = tc && min_d > 0 && D >= min_d ? PCOPS_KNN_TC : PCOPS_KNN_BRUTE;
    } else if (path == PCOPS_KNN_BRUTE || (path == PCOPS_KNN_TC && tc)) {
        chosen = path;
    } else {
        return cudaErrorInvalidValue;  // a forced path that cannot take these inputs
    }
    plan->dtype = dtype;
    plan->B = B;
    plan->M = M;
    plan->N = N;
    plan->D = D;
    plan->K = K;
    plan->metric = metric;
    plan->path = chosen;
    plan->capacity = chosen == PCOPS_KNN_TC ? tc_capacity(K) : 0;
    plan->workspace_bytes = chosen == PCOPS_KNN_TC ? tc_workspace_bytes(B, M, N, K) : 0;
    return cudaSuccess;
}

extern "C" cudaError_t pcops_knn_nd_cuda_run(const pcops_knn_nd_cuda_plan* plan,
                                             const void* query, const void* ref,
                                             const int64_t* query_lengths,
                                             const int64_t* ref_lengths, void* workspace,
                                             void* dist, int64_t* idx, cudaStream_t stream) {
    if (!plan) return cudaErrorInvalidValue;
    const int64_t B = plan->B, M = plan->M, N = plan->N, D = plan->D, K = plan->K;
    if (B == 0 || M == 0) return cudaSuccess;
    if (!query || !dist || !idx || (N > 0 && !ref)) return cudaErrorInvalidValue;
    if (plan->workspace_bytes > 0 && !workspace) return cudaErrorInvalidValue;
    const int64_t needed = (B * M + kThreads - 1) / kThreads;
    const unsigned blocks = (unsigned)(needed < kMaxBlocks ? needed : kMaxBlocks);
    const int* only = nullptr;
    if (plan->path == PCOPS_KNN_TC) {
        const cudaError_t err =
            launch_tc((const float*)query, (const float*)ref, query_lengths, ref_lengths, B, M,
                      N, D, K, workspace, (float*)dist, idx, &only, stream);
        if (err != cudaSuccess) return pcops_launch_tail(err, stream);
    }
    // the brute force: every query, or (after tc) the queries it handed back
    return pcops_dispatch_float(plan->dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        knn_nd_kernel<T><<<blocks, kThreads, 0, stream>>>(
            (const T*)query, (const T*)ref, query_lengths, ref_lengths, B, M, N, D, K,
            plan->metric, only, plan->capacity, (T*)dist, idx);
        return cudaGetLastError();
    });
}
