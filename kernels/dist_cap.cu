/*
 * dist_cap.cu -- the overflow rule's last step for float16 / bfloat16 distance outputs, on
 * CUDA: the ops compute half inputs in float32, and a finite float32 distance above the half
 * type's largest finite value would round to +inf, which means an empty slot (geometry.h). The
 * bindings cap such values at that largest value just before the cast; +inf (empty) and NaN
 * stay. One elementwise pass over the float32 result, in place.
 */
#include <cuda_runtime.h>

#include "pcops.h"

namespace {

__global__ void dist_cap_kernel(float* __restrict__ values, int64_t n, float top) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = values[i];
        if (v > top && v < INFINITY) values[i] = top;
    }
}

}  // namespace

extern "C" cudaError_t pcops_dist_cap_cuda(float* values, int64_t n, float top,
                                           cudaStream_t stream) {
    if (n < 0 || (n > 0 && !values)) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    const int64_t threads = 256, want = (n + threads - 1) / threads;
    const unsigned blocks = (unsigned)(want < 4096 ? want : 4096);
    dist_cap_kernel<<<blocks, (unsigned)threads, 0, stream>>>(values, n, top);
    return cudaGetLastError();
}
