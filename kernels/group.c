/*
 * group.c -- group (gather neighbour features) and its deterministic backward, on the CPU.
 *
 * B = batch, N = points per cloud, C = channels, M = groups (queries), S = neighbours per
 * group. Forward: features[B,N,C], idx[B,M,S] -> out[B,M,S,C], out[b,m,s,:] =
 * features[b, idx[b,m,s], :], zeros where idx is -1 (or anything outside [0, N)).
 * Backward: grad_out[B,M,S,C], idx[B,M,S] -> grad_features[B,N,C] in grad_out's dtype, the
 * sum of the rows grad_out[b,m,s,:] with idx[b,m,s] == n, added in ascending (m,s) order
 * starting from 0, in float32 for float32/float16/bfloat16 and float64 for float64. Half-type
 * rows are converted to float32 as they are added, into float32 sums in the caller's workspace
 * (no float32 copy of grad_out is made), which are then rounded once to the half type, to
 * nearest even -- what the CUDA kernel does, so both return the same bits.
 *
 * Forward work sharing: OpenMP over the B*M rows of S slots; each slot is one copy of C
 * elements (the forward only moves bytes, so one routine serves every dtype by element size).
 * Small calls (GROUP_PARALLEL_MIN_*) run on one thread, forward and backward.
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

#include "cpu.h"
#include "pcops.h"

/* Channels per backward task: 256 floats = 1 KiB of each row. */
#define GROUP_CHANNEL_CHUNK 256
/* Below this many bytes copied (forward) or elements added (backward) a call runs on one
 * thread: waking the OpenMP team costs more than the work. */
#define GROUP_PARALLEL_MIN_BYTES 262144.0
#define GROUP_PARALLEL_MIN_ELEMENTS 65536.0

static int group_max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* idx[i] of an int64 or int32 index array (the type is loop-invariant: a predicted branch). */
static inline int64_t group_index(const void* idx, int idx32, int64_t i) {
    return idx32 ? (int64_t)((const int32_t*)idx)[i] : ((const int64_t*)idx)[i];
}

/* Copies rows of row_bytes for one (b, m): S slots. Typed copies for the element sizes we
 * have, so small rows (C = 3) are a few moves instead of a call to memcpy. */
#define GROUP_COPY_ROWS(ELEM)                                                                  \
    do {                                                                                       \
        const ELEM* PCOPS_RESTRICT src = (const ELEM*)src_b;                                   \
        ELEM* PCOPS_RESTRICT dst = (ELEM*)dst_r;                                               \
        for (int64_t s = 0; s < S; ++s) {                                                      \
            const int64_t n = group_index(idx, idx32, r * S + s);                                                              \
            ELEM* d = dst + s * C;                                                             \
            if (n >= 0 && n < N) {                                                             \
                const ELEM* from = src + n * C;                                                \
                for (int64_t c = 0; c < C; ++c) d[c] = from[c];                                \
            } else {                                                                           \
                for (int64_t c = 0; c < C; ++c) d[c] = 0;                                      \
            }                                                                                  \
        }                                                                                      \
    } while (0)

static void group_forward(const void* features, const void* idx, int idx32, int64_t B,
                          int64_t N, int64_t C, int64_t M, int64_t S, size_t elem_bytes,
                          void* out) {
    const int64_t rows = B * M;
    const int parallel =
        (double)rows * (double)S * (double)C * (double)elem_bytes >= GROUP_PARALLEL_MIN_BYTES;
#pragma omp parallel if (parallel)
    {
        const pcops_fpmode fpmode = pcops_fpmode_ieee(); /* cpu.h */
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t b = r / M;
            const char* src_b = (const char*)features + (size_t)(b * N) * (size_t)C * elem_bytes;
            char* dst_r = (char*)out + (size_t)(r * S) * (size_t)C * elem_bytes;
            switch (elem_bytes) {
                case 2: GROUP_COPY_ROWS(uint16_t); break;
                case 4: GROUP_COPY_ROWS(uint32_t); break;
                default: GROUP_COPY_ROWS(uint64_t); break;
            }
        }
        pcops_fpmode_restore(fpmode);
    }
}
#undef GROUP_COPY_ROWS

/* Half types are read as raw 16-bit patterns and converted exactly to float32. */
static inline float group_bf16_to_float(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float group_f16_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu;
    const uint32_t mantissa = h & 0x3ffu;
    /* normal: rebias the exponent (15 -> 127); inf and NaN: all-ones exponent, same payload;
     * subnormal (and zero): mantissa * 2**-24, exact in float32. */
    const uint32_t normal = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    const uint32_t special = sign | 0x7f800000u | (mantissa << 13);
    const float small = (float)mantissa * 5.9604644775390625e-08f; /* 2**-24 */
    uint32_t small_bits;
    memcpy(&small_bits, &small, sizeof small_bits);
    small_bits |= sign;
    /* selected with masks rather than branches, so the loops that call this vectorise */
    const uint32_t is_special = 0u - (uint32_t)(exponent == 0x1fu);
    const uint32_t is_small = 0u - (uint32_t)(exponent == 0u);
    const uint32_t bits =
        (special & is_special) | (small_bits & is_small) | (normal & ~(is_special | is_small));
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* float32 -> float16 / bfloat16, rounded to nearest even (as __float2half_rn and
 * __float2bfloat16_rn on the device); NaN stays a quiet NaN, overflow goes to inf. */
static uint16_t group_float_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu); /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u;            /* >= 65520 (or inf): inf */
    if (a >= 0x38800000u)                                   /* normal: drop 13 bits, even */
        return sign | (uint16_t)((a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13);
    /* subnormal or zero: |f| * 2**24 rounded to an integer (exact scaling; the add and
     * subtract of 2**23 round to nearest even in the default rounding mode) */
    float m;
    memcpy(&m, &a, sizeof m);
    const float scaled = m * 16777216.0f;
    const float rounded = (scaled + 8388608.0f) - 8388608.0f;
    return sign | (uint16_t)rounded;
}

static uint16_t group_float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u; /* NaN: torch's canonical one */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* One instantiation per dtype: SRC (grad_out's element), T (the sum), LOAD (SRC -> T, exact),
 * FN (the name suffix); group_cpu.inc #undefs them. */
#define SRC float
#define T float
#define LOAD(x) (x)
#define FN(name) name##_f32
#include "group_cpu.inc"
#define SRC double
#define T double
#define LOAD(x) (x)
#define FN(name) name##_f64
#include "group_cpu.inc"
#define SRC uint16_t
#define T float
#define LOAD(x) group_f16_to_float(x)
#define FN(name) name##_f16
#include "group_cpu.inc"
#define SRC uint16_t
#define T float
#define LOAD(x) group_bf16_to_float(x)
#define FN(name) name##_bf16
#include "group_cpu.inc"

pcops_status pcops_group_cpu(pcops_dtype dtype, const void* features, const void* idx,
                             pcops_index_dtype idx_dtype, int64_t B, int64_t N, int64_t C,
                             int64_t M, int64_t S, void* out) {
    if (B < 0 || N < 0 || C < 0 || M < 0 || S < 0) return PCOPS_ERROR_INVALID_VALUE;
    const size_t elem_bytes = pcops_dtype_size(dtype);
    if (elem_bytes == 0) return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    if (idx_dtype != PCOPS_INDEX_INT64 && idx_dtype != PCOPS_INDEX_INT32)
        return PCOPS_ERROR_INVALID_VALUE;
    if (B == 0 || M == 0 || S == 0 || C == 0) return PCOPS_SUCCESS;
    if (!idx || !out || (N > 0 && !features)) return PCOPS_ERROR_INVALID_VALUE;
    group_forward(features, idx, idx_dtype == PCOPS_INDEX_INT32, B, N, C, M, S, elem_bytes, out);
    return PCOPS_SUCCESS;
}

size_t pcops_group_backward_cpu_workspace_bytes(pcops_dtype dtype, int64_t B, int64_t N,
                                              int64_t C) {
    if (dtype != PCOPS_FLOAT16 && dtype != PCOPS_BFLOAT16) return 0;
    pcops_carver w = pcops_carver_init(NULL);
    pcops_carve(&w, B > 0 && N > 0 && C > 0 ? B * N * C : 0, sizeof(float));
    return pcops_carver_bytes(&w);
}

/* The float32 sums of a half-type backward, rounded once into grad_features. */
static void group_round_sums(const float* sums, int64_t count, int bf16, uint16_t* out) {
    const int parallel = (double)count >= GROUP_PARALLEL_MIN_ELEMENTS;
#pragma omp parallel if (parallel)
    {
        const pcops_fpmode fpmode = pcops_fpmode_ieee(); /* cpu.h */
#pragma omp for schedule(static)
        for (int64_t i = 0; i < count; ++i)
            out[i] = bf16 ? group_float_to_bf16(sums[i]) : group_float_to_f16(sums[i]);
        pcops_fpmode_restore(fpmode);
    }
}

pcops_status pcops_group_backward_cpu(pcops_dtype dtype, const void* grad_out,
                                      const void* idx, pcops_index_dtype idx_dtype, int64_t B,
                                      int64_t N, int64_t C, int64_t M, int64_t S,
                                      void* workspace, void* grad_features) {
    if (B < 0 || N < 0 || C < 0 || M < 0 || S < 0) return PCOPS_ERROR_INVALID_VALUE;
    if (pcops_dtype_size(dtype) == 0) return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    if (idx_dtype != PCOPS_INDEX_INT64 && idx_dtype != PCOPS_INDEX_INT32)
        return PCOPS_ERROR_INVALID_VALUE;
    const int idx32 = idx_dtype == PCOPS_INDEX_INT32;
    if (B == 0 || N == 0 || C == 0) return PCOPS_SUCCESS;
    if (!grad_features || (M > 0 && S > 0 && (!grad_out || !idx))) return PCOPS_ERROR_INVALID_VALUE;
    const int half = dtype == PCOPS_FLOAT16 || dtype == PCOPS_BFLOAT16;
    if (half && !workspace) return PCOPS_ERROR_INVALID_VALUE;
    switch (dtype) {
        case PCOPS_FLOAT32:
            group_backward_f32((const float*)grad_out, idx, idx32, B, N, C, M, S, (float*)grad_features);
            break;
        case PCOPS_FLOAT64:
            group_backward_f64((const double*)grad_out, idx, idx32, B, N, C, M, S,
                               (double*)grad_features);
            break;
        case PCOPS_FLOAT16:
            group_backward_f16((const uint16_t*)grad_out, idx, idx32, B, N, C, M, S, (float*)workspace);
            break;
        case PCOPS_BFLOAT16:
            group_backward_bf16((const uint16_t*)grad_out, idx, idx32, B, N, C, M, S, (float*)workspace);
            break;
    }
    if (half)
        group_round_sums((const float*)workspace, B * N * C, dtype == PCOPS_BFLOAT16,
                         (uint16_t*)grad_features);
    return PCOPS_SUCCESS;
}
