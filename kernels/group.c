/*
 * group.c -- group (gather neighbour features) and its deterministic backward, on the CPU.
 *
 * B = batch, N = points per cloud, C = channels, M = groups (queries), S = neighbours per
 * group. Forward: features[B,N,C], idx[B,M,S] -> out[B,M,S,C], out[b,m,s,:] =
 * features[b, idx[b,m,s], :], zeros where idx is -1 (or anything outside [0, N)).
 * Backward: grad_out[B,M,S,C], idx[B,M,S] -> grad_features[B,N,C], the sum of the rows
 * grad_out[b,m,s,:] with idx[b,m,s] == n, added in ascending (m,s) order starting from 0.
 *
 * Forward work sharing: OpenMP over the B*M rows of S slots; each slot is one copy of C
 * elements (the forward only moves bytes, so one routine serves every dtype by element size).
 *
 * Backward work sharing, without atomics and with a summation order that does not depend on
 * the number of threads: grad_features is cut into disjoint tasks (batch b, a range of points
 * [n0, n1), a range of channels [c0, c1)). A task zeroes its slice, then walks the (m,s) of
 * batch b in ascending order and adds the rows whose idx falls in [n0, n1) into the slice: a
 * vectorised loop over the channels. Every element of grad_features belongs to exactly one
 * task, and its additions happen in ascending (m,s) order, so the bits are the same for any
 * thread count and equal to the CUDA kernel's (kernels/group.cu). Point ranges are cut only
 * when there are fewer (batch, channel range) tasks than threads; each such task rereads the
 * batch's idx, a small price next to the rows it adds.
 */
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "common.h"
#include "pcops.h"

/* Channels per backward task: 256 floats = 1 KiB of each row. */
#define GROUP_CHANNEL_CHUNK 256

static int group_max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Copies rows of row_bytes for one (b, m): S slots. Typed copies for the element sizes we
 * have, so small rows (C = 3) are a few moves instead of a call to memcpy. */
#define GROUP_COPY_ROWS(ELEM)                                                                  \
    do {                                                                                       \
        const ELEM* PCOPS_RESTRICT src = (const ELEM*)src_b;                                   \
        ELEM* PCOPS_RESTRICT dst = (ELEM*)dst_r;                                               \
        for (int64_t s = 0; s < S; ++s) {                                                      \
            int64_t n = idx_r[s];                                                              \
            ELEM* d = dst + s * C;                                                             \
            if (n >= 0 && n < N) {                                                             \
                const ELEM* from = src + n * C;                                                \
                for (int64_t c = 0; c < C; ++c) d[c] = from[c];                                \
            } else {                                                                           \
                for (int64_t c = 0; c < C; ++c) d[c] = 0;                                      \
            }                                                                                  \
        }                                                                                      \
    } while (0)

static void group_forward(const void* features, const int64_t* idx, int64_t B, int64_t N,
                          int64_t C, int64_t M, int64_t S, size_t elem_bytes, void* out) {
    const int64_t rows = B * M;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t b = r / M;
        const char* src_b = (const char*)features + (size_t)(b * N) * (size_t)C * elem_bytes;
        char* dst_r = (char*)out + (size_t)(r * S) * (size_t)C * elem_bytes;
        const int64_t* idx_r = idx + r * S;
        switch (elem_bytes) {
            case 2: GROUP_COPY_ROWS(uint16_t); break;
            case 4: GROUP_COPY_ROWS(uint32_t); break;
            default: GROUP_COPY_ROWS(uint64_t); break;
        }
    }
}
#undef GROUP_COPY_ROWS

#define T float
#define FN(name) name##_f32
#include "group_cpu.inc"
#undef T
#undef FN

#define T double
#define FN(name) name##_f64
#include "group_cpu.inc"
#undef T
#undef FN

pcops_status pcops_group_cpu(pcops_dtype dtype, const void* features, const int64_t* idx,
                             int64_t B, int64_t N, int64_t C, int64_t M, int64_t S, void* out) {
    if (B < 0 || N < 0 || C < 0 || M < 0 || S < 0) return PCOPS_ERROR_INVALID_VALUE;
    const size_t elem_bytes = pcops_dtype_size(dtype);
    if (elem_bytes == 0) return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    if (B == 0 || M == 0 || S == 0 || C == 0) return PCOPS_SUCCESS;
    if (!idx || !out || (N > 0 && !features)) return PCOPS_ERROR_INVALID_VALUE;
    group_forward(features, idx, B, N, C, M, S, elem_bytes, out);
    return PCOPS_SUCCESS;
}

pcops_status pcops_group_backward_cpu(pcops_dtype dtype, const void* grad_out,
                                      const int64_t* idx, int64_t B, int64_t N, int64_t C,
                                      int64_t M, int64_t S, void* grad_features) {
    if (B < 0 || N < 0 || C < 0 || M < 0 || S < 0) return PCOPS_ERROR_INVALID_VALUE;
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    if (B == 0 || N == 0 || C == 0) return PCOPS_SUCCESS;
    if (!grad_features || (M > 0 && S > 0 && (!grad_out || !idx))) return PCOPS_ERROR_INVALID_VALUE;
    if (dtype == PCOPS_FLOAT32)
        group_backward_f32((const float*)grad_out, idx, B, N, C, M, S, (float*)grad_features);
    else
        group_backward_f64((const double*)grad_out, idx, B, N, C, M, S, (double*)grad_features);
    return PCOPS_SUCCESS;
}
