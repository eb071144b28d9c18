/*
 * ball_query_nd.cu -- ball query in any dimension D on CUDA (kernels/pcops.h,
 * pcops_ball_query_nd_cuda): query[B,M,D], ref[B,N,D] -> idx[B,M,S], count[B,M] and, in
 * ball_query_dist2's layout, dist2[B,M,S].
 *
 * The simple path for D coordinates, the bits of the CPU kernel (kernels/ball_query_nd.c, whose
 * head gives the rule): a thread per query scans its cloud's valid refs in index order and
 * keeps the first S with distance (knn_nd.h, knn_nd_l2, the overflow rule of knn_nd_ruled)
 * < (T)radius2. It wins nothing but correctness: D = 3 keeps the paths of ball_query/.
 */
#include <cstdint>

#include "geometry.h"
#include "knn_nd.h"
#include "knn_nd_ops.cuh"
#include "pcops.h"

namespace {

constexpr int kThreads = 128;
constexpr int64_t kMaxBlocks = 65535;  // a grid-stride loop covers the rest

// A thread per (cloud, query), grid-stride. dist2 NULL: pcops_ball_query's layout (empty slots
// repeat the first neighbour); else ball_query_dist2's (empty slots -1 / 0).
template <typename T>
__global__ void ball_query_nd_kernel(const T* __restrict__ query, const T* __restrict__ ref,
                                     const int64_t* __restrict__ query_lengths,
                                     const int64_t* __restrict__ ref_lengths, int64_t B,
                                     int64_t M, int64_t N, int64_t D, T r2, int64_t S,
                                     int64_t* __restrict__ idx, int64_t* __restrict__ count,
                                     T* __restrict__ dist2) {
    using O = NdOps<T>;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < B * M;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = t / M, m = t % M;
        int64_t* out = idx + t * S;
        T* dist = dist2 ? dist2 + t * S : nullptr;
        int64_t found = 0;
        if (m < pcops_valid_length(query_lengths, b, M)) {
            const T* q = query + t * D;
            const T* cloud = ref + b * N * D;
            const int64_t L = pcops_valid_length(ref_lengths, b, N);
            const int q_finite = O::finite(q, D);
            for (int64_t n = 0; n < L && found < S; ++n) {
                const T* r = cloud + n * D;
                T d = O::l2(q, r, D);
                if (!(d <= O::kMax)) d = O::ruled(d, q_finite && O::finite(r, D));
                if (!(d < r2)) continue;  // NaN and +inf never inside
                if (dist) dist[found] = d;
                out[found++] = n;
            }
        }
        const int64_t fill = (dist == nullptr && found > 0) ? out[0] : -1;
        for (int64_t s = found; s < S; ++s) {
            out[s] = fill;
            if (dist) dist[s] = 0;
        }
        count[t] = found;
    }
}

}  // namespace

extern "C" cudaError_t pcops_ball_query_nd_cuda(pcops_dtype dtype, const void* query,
                                                const void* ref, const int64_t* query_lengths,
                                                const int64_t* ref_lengths, int64_t B, int64_t M,
                                                int64_t N, int64_t D, double radius2, int64_t S,
                                                int64_t* idx, int64_t* count, void* dist2,
                                                cudaStream_t stream) {
    if (B < 0 || M < 0 || N < 0 || D < 1 || S < 1 || M > INT32_MAX || N > INT32_MAX)
        return cudaErrorInvalidValue;
    if (B == 0 || M == 0) return cudaSuccess;
    if (!query || !idx || !count || (N > 0 && !ref)) return cudaErrorInvalidValue;
    const int64_t needed = (B * M + kThreads - 1) / kThreads;
    const unsigned blocks = (unsigned)(needed < kMaxBlocks ? needed : kMaxBlocks);
    return pcops_dispatch_float(dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        ball_query_nd_kernel<T><<<blocks, kThreads, 0, stream>>>(
            (const T*)query, (const T*)ref, query_lengths, ref_lengths, B, M, N, D, (T)radius2,
            S, idx, count, (T*)dist2);
        return pcops_launch_tail(cudaGetLastError(), stream);
    });
}
