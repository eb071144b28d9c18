/*
 * knn.c -- k nearest neighbours on the CPU.
 *
 * B = batch, M = queries per cloud, N = reference points per cloud, K = neighbours.
 * query[B,M,3], ref[B,N,3] -> dist2[B,M,K], idx[B,M,K] (int64).
 *
 * Brute force, written to vectorise. The refs of a cloud are visited in tiles of KNN_TILE
 * points; a tile is copied once into structure-of-arrays form (x[], y[], z[] on the stack) and
 * then serves a block of up to KNN_QBLOCK queries: for each query one vectorised loop writes
 * the tile's squared distances into a small buffer, an SSE2 compare + movemask marks the
 * candidates below the query's current K-th distance, 16 at a time, and only those are
 * inserted. The selection list of a query lives in its own output rows (dist2[b,m,:],
 * idx[b,m,:]), so the function needs no workspace:
 *  - float32: a max-heap of packed 64-bit keys (dist2 bits << 32 | idx) in the idx row, one
 *    integer compare per node; heapsorted and unpacked at the end (measured faster than a
 *    sorted list at every k);
 *  - float64: a sorted list with insertion while at most KNN_SORTED_MAX neighbours are kept, a
 *    max-heap on (dist2, idx) above that, heapsorted at the end.
 * The heaps and the sorted list are kernels/geometry.h's (pcops_heap_*, pcops_sorted_insert_*),
 * the ones the CUDA kernels use.
 * All keep exactly the K smallest keys (dist2, idx) among the valid refs whose distance is
 * below +inf, as the CUDA kernels do, so both return the same indices. Refs are visited in
 * index order and a ref is only taken when its distance is strictly below the current K-th,
 * so a later ref never displaces an equal earlier one (ties to the lower index).
 *
 * Work sharing: OpenMP over (cloud, block of queries) pairs, schedule(dynamic).
 *
 * The grid path (pcops_knn_cpu_variant with GRID, or AUTO on large clouds; knn_cpu.inc,
 * grid_cpu.inc, grid.h): the refs of each cloud are binned into a uniform grid, the queries
 * are visited in cell order, and each query walks the cells in rings of growing distance (the
 * block of cells [c - 1, c + 1] first), skipping planes and rows whose conservative lower bound
 * is strictly above its k-th distance, scanning each row as one run of the cells within that
 * distance (their refs are contiguous; 16 distances per SSE2 mask, as the brute force), and
 * stopping when the k-th distance is strictly below the bound of every unvisited cell. Before
 * its list is full a query prunes with a seed bound: its largest distance to the previous
 * query's neighbours. Candidates enter the lists by full key compare (float32: packed keys,
 * kept sorted up to KNN_GRID_SORTED_MAX, a heap above): the result is the brute force's, bit
 * for bit.
 */
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "common.h"
#include "grid.h"
#include "pcops.h"

/* Refs per tile: the SoA copy and the distance buffer of a tile stay in L1. */
#define KNN_TILE 512
/* Queries that share one SoA copy of a tile. */
#define KNN_QBLOCK 32
/* Distances per candidate mask (KNN_CHUNK bits). */
#define KNN_CHUNK 16
/* float64: kept neighbours up to which a sorted list with insertion is used; a heap above. */
#define KNN_SORTED_MAX 96
/* Grid path, float32: kept neighbours up to which a sorted list of packed keys is used; a heap
 * above. */
#define KNN_GRID_SORTED_MAX 64
/* Grid path: a row of cells is narrowed to the cells within the current bound only when the
 * row holds more refs than this (fewer: scanning them costs less than the narrowing; measured
 * on this machine, k = 16, one thread, against narrowing every row: uniform 100k 96 -> 82 ms,
 * 4 x 4096 14.5 -> 12.3, KITTI 77.5 -> 74; skipping it in rings 1-2 alone lost on KITTI). */
#define KNN_GRID_NARROW_MIN 32
/* Bytes of selection lists (the output rows of the queries of a block) meant to stay in L2. */
#define KNN_LIST_BYTES (128 * 1024)

/* Queries per block: KNN_QBLOCK, fewer when the selection lists of a block would not stay in
 * cache (KNN_LIST_BYTES; large k), and halved (down to 4) while there are too few blocks to
 * keep every thread busy (one small cloud, few queries). */
static int64_t knn_query_block(int64_t B, int64_t M, int64_t cap, size_t entry_bytes) {
#ifdef _OPENMP
    const int64_t threads = omp_get_max_threads();
#else
    const int64_t threads = 1;
#endif
    int64_t qblock = KNN_QBLOCK;
    while (qblock > 1 && (size_t)(qblock * cap) * entry_bytes > KNN_LIST_BYTES) qblock /= 2;
    while (qblock > 4 && B * ((M + qblock - 1) / qblock) < 4 * threads) qblock /= 2;
    return qblock;
}

/* knn_below_mask_SUF(d, thr): bit j of the result is set when d[j] < thr, for the KNN_CHUNK = 16
 * distances d[0, 16) (a NaN is never below). SSE2 (the x86-64 baseline; VEX-encoded in the
 * AVX2 clones): four (float32) or eight (float64) compares and movemasks per chunk; X is the
 * intrinsics' suffix, ps or pd. */
#if defined(__SSE2__)
#include <emmintrin.h>
#define KNN_DEFINE_BELOW_MASK(SUF, T, VEC, X)                                                  \
    static inline uint32_t knn_below_mask_##SUF(const T* d, T thr) {                          \
        const VEC t = _mm_set1_##X(thr);                                                       \
        uint32_t mask = 0;                                                                     \
        for (int j = 0; j < KNN_CHUNK; j += (int)(sizeof(VEC) / sizeof(T)))                    \
            mask |= (uint32_t)_mm_movemask_##X(_mm_cmplt_##X(_mm_loadu_##X(d + j), t)) << j;   \
        return mask;                                                                           \
    }
#else
#define KNN_DEFINE_BELOW_MASK(SUF, T, VEC, X)                                                  \
    static inline uint32_t knn_below_mask_##SUF(const T* d, T thr) {                          \
        uint32_t mask = 0;                                                                     \
        for (int j = 0; j < KNN_CHUNK; ++j) mask |= (uint32_t)(d[j] < thr) << j;               \
        return mask;                                                                           \
    }
#endif
KNN_DEFINE_BELOW_MASK(f32, float, __m128, ps)
KNN_DEFINE_BELOW_MASK(f64, double, __m128d, pd)
#undef KNN_DEFINE_BELOW_MASK

/* knn_next_up_SUF(th): the next value above th >= +0 (+inf stays +inf), so that d < it <=> d <= th
 * for finite th (nextafter(th, +inf) without the call: the bits of a non-negative float count
 * up like its values). */
static inline float knn_next_up_f32(float th) {
    uint32_t u;
    memcpy(&u, &th, sizeof u);
    u += u < 0x7f800000u; /* +inf stays */
    memcpy(&th, &u, sizeof u);
    return th;
}
static inline double knn_next_up_f64(double th) {
    uint64_t u;
    memcpy(&u, &th, sizeof u);
    u += u < 0x7ff0000000000000u;
    memcpy(&th, &u, sizeof u);
    return th;
}

/* Helpers of the hot loops, inlined into each target clone (PCOPS_CPU_CLONES) of their caller. */
#if defined(__GNUC__)
#define KNN_INLINE static inline __attribute__((always_inline))
#else
#define KNN_INLINE static inline
#endif

/* Index of the lowest set bit of a non-zero mask. */
static inline int knn_lowest_bit(uint32_t mask) {
#if defined(__GNUC__)
    return __builtin_ctz(mask);
#else
    int j = 0;
    while (!(mask & 1u)) {
        mask >>= 1;
        ++j;
    }
    return j;
#endif
}

/* float32 heaps keep each entry as one packed 64-bit key (geometry.h, pcops_key_pack_f32):
 * distances here are >= +0 and finite, so the integer order of the keys is the (dist2, idx)
 * order. One load and one integer compare per heap node instead of two of each and a tie
 * test, and the child choice compiles to a conditional move. The keys live in the query's idx
 * row (int64), sorted and unpacked at the end. */
static inline void knn_packed_finish(uint64_t* h, int64_t count, float* dist) {
    pcops_heap_sort_u64(h, 1, count);
    pcops_key_unpack_f32(h, 1, count, dist, (int64_t*)h);
}

/* A short list of packed keys kept sorted ascending, h[0, cap), the slots past *count holding
 * UINT64_MAX (set before the first key): takes key < h[cap - 1] (which then drops out; while
 * the list fills that is a sentinel, and every real key is below it). Every slot takes the
 * larger of its left neighbour and min(itself, key), from the end down: no data-dependent
 * branch (the insertion loop it replaces mispredicted its exit on most keys: ~35 % of a k = 16
 * grid query, perf on this machine; 5-8 % faster whole queries). Returns 1 when the list is full
 * after it (h[cap - 1] is the threshold). The grid path uses it while cap <=
 * KNN_GRID_SORTED_MAX: measured faster than the heap there (no heapsort at the end). */
static inline int knn_sorted_keep_u64(uint64_t* h, int64_t cap, int64_t* count, uint64_t key) {
    for (int64_t i = cap - 1; i > 0; --i) {
        const uint64_t left = h[i - 1], here = h[i];
        const uint64_t low = here < key ? here : key;
        h[i] = left > low ? left : low;
    }
    h[0] = h[0] < key ? h[0] : key;
    *count += *count < cap;
    return *count == cap;
}

#define T float
#define TI int32_t
#define KNN_PACKED 1
#define FN(name) name##_f32
#include "grid_cpu.inc"
#include "knn_cpu.inc"
#undef T
#undef TI
#undef FN
#undef KNN_PACKED

#define T double
#define TI int64_t
#define KNN_PACKED 0
#define FN(name) name##_f64
#include "grid_cpu.inc"
#include "knn_cpu.inc"
#undef T
#undef TI
#undef FN
#undef KNN_PACKED

/* The grid path's cells per cloud: KNN_GRID_BASE_CELLS cells per max(1, K / KNN_GRID_K_PER_CELL)
 * refs over the box, refined up to PCOPS_GRID_OCCUPANCY_SPARE times more where most of the box
 * is empty (kernels/grid_cpu.inc). Measured on this machine with the block-first search and
 * the seed bound (kernels/knn_cpu.inc; one thread, k = 16, min of 8 runs, 0.25 to 2 tried):
 * 1 is best on uniform B=4 N=4096 and N=100000 (2 was 5-10% slower, 0.5 10-20%); KITTI is
 * within noise (+-7%) from 0.5 to 1.5. */
#define KNN_GRID_K_PER_CELL 4
#define KNN_GRID_BASE_CELLS 1.0
/* The selector's grid threshold: clouds of at least this many refs, k at most N / 8. */
#define KNN_GRID_MIN_N 512

static int64_t knn_grid_budget(int64_t N, int64_t K) {
    const int64_t per_cell = K / KNN_GRID_K_PER_CELL > 1 ? K / KNN_GRID_K_PER_CELL : 1;
    return pcops_grid_budget(N, KNN_GRID_BASE_CELLS * PCOPS_GRID_OCCUPANCY_SPARE / (double)per_cell);
}

/* The variant that runs: AUTO chooses by size; the grid needs indices that fit int32. */
static pcops_search_variant knn_cpu_resolve(int64_t M, int64_t N, int64_t K,
                                            pcops_search_variant variant) {
    if (N > INT32_MAX - 1 || M > INT32_MAX - 1) return PCOPS_SEARCH_BRUTE;
    if (variant == PCOPS_SEARCH_GRID) return PCOPS_SEARCH_GRID;
    if (variant != PCOPS_SEARCH_AUTO) return PCOPS_SEARCH_BRUTE;
    return N >= KNN_GRID_MIN_N && K * 8 <= N ? PCOPS_SEARCH_GRID : PCOPS_SEARCH_BRUTE;
}

size_t pcops_knn_cpu_workspace_bytes(pcops_dtype dtype, int64_t B, int64_t M, int64_t N,
                                     int64_t K, pcops_search_variant variant) {
    if (B <= 0 || M <= 0 || N < 0 || K < 1) return 0;
    if (knn_cpu_resolve(M, N, K, variant) != PCOPS_SEARCH_GRID) return 0;
    const int64_t budget = knn_grid_budget(N, K);
    /* the grids, then the query order (kernels/knn_cpu.inc, knn_grid_batch) */
    return pcops_grid_carve(NULL, B, N, budget, pcops_dtype_size(dtype), NULL) +
           (size_t)(2 * B * M + B * (budget + 2)) * sizeof(int32_t);
}

pcops_status pcops_knn_cpu_variant(pcops_dtype dtype, const void* query, const void* ref,
                                   const int64_t* query_lengths, const int64_t* ref_lengths,
                                   int64_t B, int64_t M, int64_t N, int64_t K,
                                   pcops_search_variant variant, void* workspace, void* dist2,
                                   int64_t* idx) {
    if (knn_cpu_resolve(M, N, K, variant) != PCOPS_SEARCH_GRID || B <= 0 || M <= 0 || K < 1)
        return pcops_knn_cpu(dtype, query, ref, query_lengths, ref_lengths, B, M, N, K, dist2,
                             idx);
    if (N < 0) return PCOPS_ERROR_INVALID_VALUE;
    if (!query || !dist2 || !idx || !workspace || (N > 0 && !ref))
        return PCOPS_ERROR_INVALID_VALUE;
    const int64_t budget = knn_grid_budget(N, K);
    switch (dtype) {
        case PCOPS_FLOAT32:
            knn_grid_batch_f32((const float*)query, (const float*)ref, query_lengths,
                               ref_lengths, B, M, N, K, budget, workspace, (float*)dist2, idx);
            return PCOPS_SUCCESS;
        case PCOPS_FLOAT64:
            knn_grid_batch_f64((const double*)query, (const double*)ref, query_lengths,
                               ref_lengths, B, M, N, K, budget, workspace, (double*)dist2, idx);
            return PCOPS_SUCCESS;
        default:
            return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    }
}

pcops_status pcops_knn_cpu(pcops_dtype dtype, const void* query, const void* ref,
                           const int64_t* query_lengths, const int64_t* ref_lengths, int64_t B,
                           int64_t M, int64_t N, int64_t K, void* dist2, int64_t* idx) {
    if (B < 0 || M < 0 || N < 0 || K < 1) return PCOPS_ERROR_INVALID_VALUE;
    if (B == 0 || M == 0) return PCOPS_SUCCESS;
    if (!query || !dist2 || !idx || (N > 0 && !ref)) return PCOPS_ERROR_INVALID_VALUE;
    switch (dtype) {
        case PCOPS_FLOAT32:
            knn_batch_f32((const float*)query, (const float*)ref, query_lengths, ref_lengths, B,
                          M, N, K, (float*)dist2, idx);
            return PCOPS_SUCCESS;
        case PCOPS_FLOAT64:
            knn_batch_f64((const double*)query, (const double*)ref, query_lengths, ref_lengths,
                          B, M, N, K, (double*)dist2, idx);
            return PCOPS_SUCCESS;
        default:
            return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    }
}
