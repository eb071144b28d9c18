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
 * All keep exactly the K smallest keys (dist2, idx) among the valid refs whose distance is
 * below +inf, as the CUDA kernels do, so both return the same indices. Refs are visited in
 * index order and a ref is only taken when its distance is strictly below the current K-th,
 * so a later ref never displaces an equal earlier one (ties to the lower index).
 *
 * Work sharing: OpenMP over (cloud, block of queries) pairs, schedule(dynamic).
 *
 * The grid path (pcops_knn_cpu_variant with GRID, or AUTO on large clouds; knn_cpu.inc,
 * grid_cpu.inc, grid.h): the refs of each cloud are binned into a uniform grid, the queries
 * are visited in cell order, and each query walks the cells in rings of growing distance,
 * skipping rows and cells whose conservative lower bound is strictly above its k-th distance
 * and stopping when the k-th distance is strictly below the bound of every unvisited cell.
 * Candidates enter the same lists by full key compare: the result is the brute force's, bit
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
/* Grid path: distances computed per chunk of a cell's refs. */
#define KNN_GRID_CHUNK 32
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

/* Bit j of the result is set when d[j] < thr, for the KNN_CHUNK = 16 distances d[0, 16) (a
 * NaN is never below). SSE2 (the x86-64 baseline; VEX-encoded in the AVX2 clones): four or
 * eight compares and movemasks per chunk. */
#if defined(__SSE2__)
#include <emmintrin.h>
static inline uint32_t knn_below_mask_f32(const float* d, float thr) {
    const __m128 t = _mm_set1_ps(thr);
    uint32_t mask = 0;
    for (int j = 0; j < KNN_CHUNK; j += 4)
        mask |= (uint32_t)_mm_movemask_ps(_mm_cmplt_ps(_mm_loadu_ps(d + j), t)) << j;
    return mask;
}
static inline uint32_t knn_below_mask_f64(const double* d, double thr) {
    const __m128d t = _mm_set1_pd(thr);
    uint32_t mask = 0;
    for (int j = 0; j < KNN_CHUNK; j += 2)
        mask |= (uint32_t)_mm_movemask_pd(_mm_cmplt_pd(_mm_loadu_pd(d + j), t)) << j;
    return mask;
}
#else
static inline uint32_t knn_below_mask_f32(const float* d, float thr) {
    uint32_t mask = 0;
    for (int j = 0; j < KNN_CHUNK; ++j) mask |= (uint32_t)(d[j] < thr) << j;
    return mask;
}
static inline uint32_t knn_below_mask_f64(const double* d, double thr) {
    uint32_t mask = 0;
    for (int j = 0; j < KNN_CHUNK; ++j) mask |= (uint32_t)(d[j] < thr) << j;
    return mask;
}
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

/* float32 heaps of large k keep each entry as one packed 64-bit key, (bits of dist2) << 32 |
 * idx: distances here are >= +0 and finite, and such floats order like their bit patterns, so
 * the integer order of the keys is the (dist2, idx) order. One load and one integer compare
 * per heap node instead of two of each and a tie test, and the child choice compiles to a
 * conditional move. The keys live in the query's idx row (int64), unpacked at the end. */
static inline uint64_t knn_pack(float d, int64_t n) {
    uint32_t bits;
    memcpy(&bits, &d, sizeof bits);
    return (uint64_t)bits << 32 | (uint64_t)n;
}

static inline float knn_key_dist(uint64_t key) {
    const uint32_t bits = (uint32_t)(key >> 32);
    float d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

/* Max-heap of `count` packed keys: puts `key` into the hole at position i and sifts it down. */
static inline void knn_packed_sift_down(uint64_t* PCOPS_RESTRICT h, int64_t count, int64_t i,
                                        uint64_t key) {
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= count) break;
        uint64_t kc = h[c];
        if (c + 1 < count) {
            const uint64_t kr = h[c + 1];
            const int right = kr > kc;
            kc = right ? kr : kc;
            c += right;
        }
        if (kc <= key) break;
        h[i] = kc;
        i = c;
    }
    h[i] = key;
}

static inline void knn_packed_push(uint64_t* PCOPS_RESTRICT h, int64_t count, uint64_t key) {
    int64_t i = count;
    while (i > 0) {
        const int64_t p = (i - 1) / 2;
        if (h[p] >= key) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = key;
}

/* Heapsort of the packed heap [0, count), then unpacks it into dist[0, count), idx (= h). */
static void knn_packed_sort_unpack(uint64_t* PCOPS_RESTRICT h, int64_t count, float* dist) {
    for (int64_t end = count - 1; end > 0; --end) {
        const uint64_t key = h[end];
        h[end] = h[0];
        knn_packed_sift_down(h, end, 0, key);
    }
    for (int64_t j = 0; j < count; ++j) {
        const uint64_t key = h[j];
        dist[j] = knn_key_dist(key);
        h[j] = key & 0xffffffffu; /* the index, as a non-negative int64 */
    }
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
 * is empty (kernels/grid_cpu.inc). Measured on this machine (lab driver, one thread, k = 16):
 * uniform B=4 N=4096 and N=100000 and the KITTI scan are within noise of their best from 1 to
 * 3 base cells per 4 refs; 2 is best on KITTI. */
#define KNN_GRID_K_PER_CELL 4
#define KNN_GRID_BASE_CELLS 2.0
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
