/*
 * interpolate.c -- weighted gather (PointNet++ feature propagation), on the CPU.
 *
 * B = batch, N = known points per cloud, C = channels, M = unknown (target) points,
 * K = neighbours per target (3 for PointNet++'s three_interpolate).
 *
 *   features[B,N,C], idx[B,M,K] (int64 or int32), weight[B,M,K] -> out[B,M,C],
 *   out[b,m,c] = sum over k = 0..K-1 of weight[b,m,k] * features[b, idx[b,m,k], c]
 *
 * The sum starts from 0 and adds the K products in ascending k, each product rounded once and
 * then added (no FMA contraction: geometry.h's rounded operations), exactly as the CUDA kernel
 * (interpolate.cu) does, so CPU and CUDA give the same bits. A slot whose index lies outside
 * [0, N) (-1: no neighbour) adds nothing, whatever its weight.
 *
 * Work sharing: OpenMP over the B*M output rows; each row reads K feature rows of C elements
 * (contiguous, vectorised over c). Small calls run on one thread.
 */
#include "cpu.h"
#include "pcops.h"

/* Below this many multiply-adds a call runs on one thread. */
#define INTERPOLATE_PARALLEL_MIN 65536.0

#define INTERPOLATE_ROWS(T, SUF)                                                                  \
    do {                                                                                       \
        const T* PCOPS_RESTRICT f = (const T*)features;                                        \
        const T* PCOPS_RESTRICT w = (const T*)weight;                                          \
        T* PCOPS_RESTRICT o = (T*)out;                                                         \
        const int parallel = (double)B * (double)M * (double)K * (double)C >=                  \
                             INTERPOLATE_PARALLEL_MIN;                                         \
        _Pragma("omp parallel for schedule(static) if (parallel)")                             \
        for (int64_t r = 0; r < B * M; ++r) {                                                  \
            const int64_t b = r / M;                                                           \
            const T* PCOPS_RESTRICT fb = f + b * N * C;                                        \
            T* PCOPS_RESTRICT dst = o + r * C;                                                 \
            for (int64_t c = 0; c < C; ++c) dst[c] = (T)0;                                     \
            for (int64_t k = 0; k < K; ++k) {                                                  \
                const int64_t n = idx32 ? (int64_t)((const int32_t*)idx)[r * K + k]             \
                                        : ((const int64_t*)idx)[r * K + k];                    \
                if (n < 0 || n >= N) continue;                                                 \
                const T wk = w[r * K + k];                                                     \
                const T* PCOPS_RESTRICT src = fb + n * C;                                      \
                for (int64_t c = 0; c < C; ++c) {                                              \
                    dst[c] = pcops_add_##SUF(dst[c], pcops_mul_##SUF(wk, src[c]));             \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    } while (0)

pcops_status pcops_interpolate_cpu(pcops_dtype dtype, const void* features, const void* idx,
                                   pcops_index_dtype idx_dtype, const void* weight, int64_t B,
                                   int64_t N, int64_t C, int64_t M, int64_t K, void* out) {
    if (B < 0 || N < 0 || C < 0 || M < 0 || K < 0) return PCOPS_ERROR_INVALID_VALUE;
    if (idx_dtype != PCOPS_INDEX_INT64 && idx_dtype != PCOPS_INDEX_INT32)
        return PCOPS_ERROR_INVALID_VALUE;
    /* int32 (pointnet2_ops's) or int64, read as is; the type is loop-invariant */
    const int idx32 = idx_dtype == PCOPS_INDEX_INT32;
    if (B * M * C == 0) return PCOPS_SUCCESS;
    if (!out || (K > 0 && (!idx || !weight)) || (N > 0 && !features))
        return PCOPS_ERROR_INVALID_VALUE;
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    const pcops_fpmode fpmode = pcops_fpmode_ieee(); /* cpu.h */
    if (dtype == PCOPS_FLOAT32)
        INTERPOLATE_ROWS(float, f32);
    else
        INTERPOLATE_ROWS(double, f64);
    pcops_fpmode_restore(fpmode);
    return PCOPS_SUCCESS;
}
