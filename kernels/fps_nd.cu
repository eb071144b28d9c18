/*
 * fps_nd.cu -- furthest point sampling in any dimension D on CUDA (kernels/pcops.h,
 * pcops_fps_nd_cuda): xyz[B,N,D] -> idx[B,npoint], dist2[B,npoint].
 *
 * The simple path for D coordinates, the bits of the CPU kernel (kernels/fps_nd.c, whose head
 * gives the algorithm and the overflow rule): a block per cloud, the temps in the workspace
 * (global memory, B * N values). A step: every thread lowers the temps of its points (n =
 * thread, thread + blockDim, ...) with the distance to the newest sample (knn_nd.h, knn_nd_l2)
 * and keeps its best (temp, index), first index on ties; a warp reduction by shuffles, then
 * the warps' bests through shared memory, reduce to the block's; ties go to the lower index,
 * so the choice is the CPU's. It wins nothing but correctness: D = 3 keeps the paths of fps/.
 */
#include <cstdint>

#include "geometry.h"
#include "knn_nd.h"
#include "knn_nd_ops.cuh"
#include "pcops.h"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxBlocks = 65535;  // a grid-stride loop covers the rest

// (v, i) beats (bv, bi): the larger temp, the lower index on ties.
template <typename T>
__device__ __forceinline__ bool better(T v, int64_t i, T bv, int64_t bi) {
    return v > bv || (v == bv && i < bi);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    fps_nd_kernel(const T* __restrict__ xyz, const int64_t* __restrict__ lengths,
                  const int64_t* __restrict__ start, int64_t B, int64_t N, int64_t D,
                  int64_t npoint, T* __restrict__ temp_all, int64_t* __restrict__ idx_all,
                  T* __restrict__ dist2_all) {
    using O = NdOps<T>;
    __shared__ T warp_v[kWarps];
    __shared__ int64_t warp_i[kWarps];
    __shared__ int64_t chosen;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t b = blockIdx.x; b < B; b += gridDim.x) {
        const T* cloud = xyz + b * N * D;
        T* temp = temp_all + b * N;
        int64_t* idx = idx_all + b * npoint;
        T* dist2 = dist2_all + b * npoint;
        const int64_t L = pcops_valid_length(lengths, b, N);
        const int64_t n_out = npoint < L ? npoint : L;
        for (int64_t j = n_out + threadIdx.x; j < npoint; j += blockDim.x) {
            idx[j] = -1;
            dist2[j] = 0;
        }
        if (n_out == 0) continue;
        for (int64_t n = threadIdx.x; n < L; n += blockDim.x) temp[n] = (T)INFINITY;
        int64_t cur = start ? pcops_positive_mod(start[b], L) : 0;
        if (threadIdx.x == 0) {
            idx[0] = cur;
            dist2[0] = 0;
        }
        __syncthreads();
        for (int64_t j = 1; j < n_out; ++j) {
            const T* c = cloud + cur * D;
            const int c_finite = O::finite(c, D);
            T best = -2;
            int64_t best_n = INT64_MAX;
            for (int64_t n = threadIdx.x; n < L; n += blockDim.x) {
                T t;
                if (n == cur) {
                    t = -1;
                } else {
                    T d = O::l2(cloud + n * D, c, D);
                    // the overflow rule (fps_nd.c): saturated, or NaN for a non-finite pair
                    if (!(d <= O::kMax))
                        d = c_finite && O::finite(cloud + n * D, D) ? O::kMax : (T)NAN;
                    t = temp[n];
                    t = d < t ? d : t;
                }
                temp[n] = t;
                if (t > best) {  // strict: this thread's points come in index order
                    best = t;
                    best_n = n;
                }
            }
            for (int off = 16; off > 0; off >>= 1) {
                const T v = __shfl_down_sync(0xffffffffu, best, off);
                const int64_t i = __shfl_down_sync(0xffffffffu, best_n, off);
                if (better(v, i, best, best_n)) {
                    best = v;
                    best_n = i;
                }
            }
            if (lane == 0) {
                warp_v[warp] = best;
                warp_i[warp] = best_n;
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                T v = warp_v[0];
                int64_t i = warp_i[0];
                for (int w = 1; w < kWarps; ++w)
                    if (better(warp_v[w], warp_i[w], v, i)) {
                        v = warp_v[w];
                        i = warp_i[w];
                    }
                chosen = i;
                idx[j] = i;
                dist2[j] = v;
            }
            __syncthreads();
            cur = chosen;
        }
        __syncthreads();  // the shared values are rewritten by the next cloud
    }
}

}  // namespace

extern "C" cudaError_t pcops_fps_nd_cuda(pcops_dtype dtype, const void* xyz,
                                         const int64_t* lengths, const int64_t* start,
                                         int64_t B, int64_t N, int64_t D, int64_t npoint,
                                         void* workspace, int64_t* idx, void* dist2,
                                         cudaStream_t stream) {
    if (B < 0 || N < 0 || D < 1 || npoint < 1 || N > INT32_MAX) return cudaErrorInvalidValue;
    if (B == 0) return cudaSuccess;
    if (!idx || !dist2 || (N > 0 && (!xyz || !workspace))) return cudaErrorInvalidValue;
    const unsigned blocks = (unsigned)(B < kMaxBlocks ? B : kMaxBlocks);
    return pcops_dispatch_float(dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        fps_nd_kernel<T><<<blocks, kThreads, 0, stream>>>((const T*)xyz, lengths, start, B, N,
                                                          D, npoint, (T*)workspace, idx,
                                                          (T*)dist2);
        return pcops_launch_tail(cudaGetLastError(), stream);
    });
}
