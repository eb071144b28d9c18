/*
 * fps_layout.cu -- the layout of a sorted batch vector that torch_cluster's fps needs, on
 * CUDA. Same contract as fps_layout.c (pcops.h, "FPS layout"):
 *
 *   batch[N] int64 (sorted cloud ids) -> stats[6], left[N], slot[N] int64.
 *
 * Three steps on the stream, no host work between them:
 *   cudaMemsetAsync: stats = 0;
 *   layout_kernel:   per point i, its cloud's bounds by two binary searches of batch[i]
 *                    (torch.searchsorted's left and right), left[i], its rank, whether it is
 *                    sampled (slot[i] = rank or -1 for now), and per warp the sums / maxima of
 *                    the steps down, the samples and the cloud sizes, added into stats with
 *                    atomics (the first and last ids by the threads of points 0 and N-1);
 *   slot_kernel:     K = k(L) from stats, slot[i] += batch[i] * K where sampled (thread 0 also
 *                    stores K).
 * Threads: grid-stride over the points, 256 per block.
 */
#include <climits>

#include <cuda_runtime.h>

#include "fps_layout.h"

namespace {

constexpr int kThreads = 256;

// The first index in [0, N) whose id is not below v (right: above v), or N.
__device__ __forceinline__ int64_t bound(const int64_t* __restrict__ batch, int64_t N, int64_t v,
                                         bool right) {
    int64_t lo = 0, hi = N;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        const int64_t m = batch[mid];
        if (m < v || (right && m == v))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

__global__ void layout_kernel(const int64_t* __restrict__ batch, int64_t N, double ratio,
                              pcops_dtype dtype, int64_t batch_size, int64_t* __restrict__ stats,
                              int64_t* __restrict__ left, int64_t* __restrict__ slot) {
    long long problems = 0, sampled = 0, largest = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += stride) {
        const int64_t b = batch[i];
        const int64_t l = bound(batch, N, b, false), r = bound(batch, N, b, true);
        const int64_t n = r - l, rank = i - l;
        const int64_t k =
            batch_size >= 0 && b >= batch_size ? 0 : pcops_fps_samples(n, ratio, dtype);
        // (in an unsorted vector the searches may miss point i: rank < 0 is not sampled)
        const bool kept = rank >= 0 && rank < k;
        left[i] = l;
        slot[i] = kept ? rank : -1;
        problems += i > 0 ? b < batch[i - 1] : b < 0;
        sampled += kept;
        largest = n > largest ? n : largest;
        if (i == 0) stats[PCOPS_FPS_LAYOUT_FIRST] = b;
        if (i == N - 1) stats[PCOPS_FPS_LAYOUT_LAST] = b;
    }
    // every thread of the block gets here (no early exit): the shuffles see all 32 lanes
    for (int d = 16; d > 0; d /= 2) {
        problems += __shfl_down_sync(0xffffffffu, problems, d);
        sampled += __shfl_down_sync(0xffffffffu, sampled, d);
        const long long other = __shfl_down_sync(0xffffffffu, largest, d);
        largest = other > largest ? other : largest;
    }
    if ((threadIdx.x & 31) == 0) {
        if (problems)
            atomicAdd((unsigned long long*)&stats[PCOPS_FPS_LAYOUT_PROBLEMS],
                      (unsigned long long)problems);
        if (sampled)
            atomicAdd((unsigned long long*)&stats[PCOPS_FPS_LAYOUT_SAMPLED],
                      (unsigned long long)sampled);
        if (largest) atomicMax((long long*)&stats[PCOPS_FPS_LAYOUT_LARGEST], largest);
    }
}

__global__ void slot_kernel(const int64_t* __restrict__ batch, int64_t N, double ratio,
                            pcops_dtype dtype, int64_t* __restrict__ stats,
                            int64_t* __restrict__ slot) {
    const int64_t K = pcops_fps_samples(stats[PCOPS_FPS_LAYOUT_LARGEST], ratio, dtype);
    const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (first == 0) stats[PCOPS_FPS_LAYOUT_SAMPLES_LARGEST] = K;
    for (int64_t i = first; i < N; i += (int64_t)gridDim.x * blockDim.x)
        if (slot[i] >= 0) slot[i] += batch[i] * K;
}

}  // namespace

cudaError_t pcops_fps_layout_cuda(const int64_t* batch, int64_t N, double ratio,
                                  pcops_dtype dtype, int64_t batch_size, int64_t* stats,
                                  int64_t* left, int64_t* slot, cudaStream_t stream) {
    if (N < 0 || N > INT_MAX || !stats) return cudaErrorInvalidValue;
    cudaError_t err =
        cudaMemsetAsync(stats, 0, PCOPS_FPS_LAYOUT_STATS * sizeof(int64_t), stream);
    if (err != cudaSuccess || N == 0) return err;
    if (!batch || !left || !slot) return cudaErrorInvalidValue;
    const unsigned blocks = pcops_grid_stride_blocks(N, kThreads);
    layout_kernel<<<blocks, kThreads, 0, stream>>>(batch, N, ratio, dtype, batch_size, stats,
                                                   left, slot);
    slot_kernel<<<blocks, kThreads, 0, stream>>>(batch, N, ratio, dtype, stats, slot);
    return pcops_launch_tail(cudaGetLastError(), stream);
}
