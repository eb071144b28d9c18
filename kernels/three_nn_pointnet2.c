/*
 * three_nn_pointnet2.c -- a kNN result in pointnet2_ops's three_nn layout, on the CPU: the
 * second half of the three_nn_pointnet2 op (the first is the kNN itself, kernels/knn.c).
 *
 *   dist2[n] (dtype), idx[n] int64 -> dist[n] = sqrt(dist2[n]) (dtype),
 *                                     idx32[n] = idx[n] as int32, 0 where idx[n] is -1
 *
 * sqrtf / sqrt are correctly rounded (IEEE 754; no -ffast-math anywhere in the build), as are
 * __fsqrt_rn / __dsqrt_rn in three_nn_pointnet2.cu, so the CPU and CUDA give the same bits. An
 * empty slot of the kNN (+inf, -1) becomes (+inf, 0), pointnet2_ops's padding. dist may be dist2
 * (in place); idx32 must not overlap idx.
 *
 * Work sharing: OpenMP over the elements; small calls run on one thread.
 */
#include <math.h>

#include "cpu.h"
#include "pcops.h"

/* Below this many elements a call runs on one thread. */
#define THREE_NN_PARALLEL_MIN 65536

#define THREE_NN_CONVERT(T, SQRT)                                               \
    do {                                                                        \
        const T* d2 = (const T*)dist2;                                          \
        T* d = (T*)dist;                                                        \
        const int parallel = n >= THREE_NN_PARALLEL_MIN;                        \
        _Pragma("omp parallel for schedule(static) if (parallel)")              \
        for (int64_t i = 0; i < n; ++i) {                                       \
            const int64_t j = idx[i];                                           \
            d[i] = SQRT(d2[i]);                                                 \
            idx32[i] = j < 0 ? 0 : (int32_t)j;                                  \
        }                                                                       \
    } while (0)

pcops_status pcops_three_nn_pointnet2_cpu(pcops_dtype dtype, const void* dist2,
                                          const int64_t* idx, int64_t n, void* dist,
                                          int32_t* idx32) {
    if (n < 0) return PCOPS_ERROR_INVALID_VALUE;
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    if (n == 0) return PCOPS_SUCCESS;
    if (!dist2 || !idx || !dist || !idx32) return PCOPS_ERROR_INVALID_VALUE;
    const pcops_fpmode fpmode = pcops_fpmode_ieee(); /* cpu.h */
    if (dtype == PCOPS_FLOAT32)
        THREE_NN_CONVERT(float, sqrtf);
    else
        THREE_NN_CONVERT(double, sqrt);
    pcops_fpmode_restore(fpmode);
    return PCOPS_SUCCESS;
}
