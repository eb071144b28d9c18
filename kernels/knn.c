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
 * The grid path (pcops_knn_cpu_path with GRID, or AUTO on large clouds; knn_cpu.inc,
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

#include "cpu.h"
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
 * row holds more refs than this (fewer: scanning them costs less than the narrowing).
 * python benchmarks/tune.py knn --device cpu: the grid rows, one build per value. */
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
 * branch (an insertion loop mispredicts its exit on most keys). Returns 1 when the list is full
 * after it (h[cap - 1] is the threshold). The grid path uses it while cap <=
 * KNN_GRID_SORTED_MAX, where it beats the heap (no heapsort at the end). */
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

/* The grid path's float32 list of up to 16 packed keys, held in registers (GCC vector
 * extensions), ascending; free slots hold KNN_V_EMPTY. Keys are below 2**63 (a dist2 of +0 ..
 * +inf, never NaN, in the top 32 bits), so signed compares order them. An insertion is
 * h[i] = max(h[i - 1], min(h[i], key)) (h[-1] = 0) for all 16 slots at once: the same list as
 * knn_sorted_keep_u64, without the stores and reloads of a list in memory. Two builds of the
 * grid path: four vectors of four (AVX2 / SSE2 clones), and two of eight for CPUs with AVX-512
 * (x86-64-v4), chosen at run time (knn_wide_list; the path "grid_baseline" forces the first
 * build, so that tests reach it on any CPU). The vectors never cross a call (the functions that
 * take one by pointer are inlined), so GCC's ABI note (-Wpsabi) does not apply. */
#if defined(__GNUC__) && !defined(__clang__)
#define KNN_VLIST 1
#pragma GCC diagnostic ignored "-Wpsabi"
typedef int64_t knn_v4 __attribute__((vector_size(32)));
typedef int64_t knn_v8 __attribute__((vector_size(64)));
#define KNN_V_EMPTY INT64_MAX

/* One vector of slots h after inserting k (broadcast), given s = the slots shifted up by one:
 * max(s, min(h, k)) with masks (no function takes a vector by value). */
#define KNN_VKEEP_STEP(V, h, s, k)                                                             \
    do {                                                                                       \
        const V below_ = (h) < (k);                                                            \
        const V low_ = ((h) & below_) | ((k) & ~below_);                                       \
        const V above_ = (s) > low_;                                                           \
        (h) = ((s) & above_) | (low_ & ~above_);                                               \
    } while (0)

/* h[0..3]: the 16 slots; key below the largest when the list is full. */
static inline __attribute__((always_inline)) void knn_vkeep16_v4(knn_v4* h, int64_t key) {
    const knn_v4 zero = {0, 0, 0, 0};
    const knn_v4 k = zero + key;
    const knn_v4 rot = {3, 0, 1, 2}; /* lane i <- lane i - 1, lane 0 <- lane 3 */
    const knn_v4 r0 = __builtin_shuffle(h[0], rot), r1 = __builtin_shuffle(h[1], rot);
    const knn_v4 r2 = __builtin_shuffle(h[2], rot), r3 = __builtin_shuffle(h[3], rot);
    const knn_v4 first = {-1, 0, 0, 0};
    /* the slots shifted up by one: lane 0 from the previous vector's lane 3 (0 for slot 0) */
    const knn_v4 s0 = r0 & ~first;
    const knn_v4 s1 = (r1 & ~first) | (r0 & first);
    const knn_v4 s2 = (r2 & ~first) | (r1 & first);
    const knn_v4 s3 = (r3 & ~first) | (r2 & first);
    KNN_VKEEP_STEP(knn_v4, h[0], s0, k);
    KNN_VKEEP_STEP(knn_v4, h[1], s1, k);
    KNN_VKEEP_STEP(knn_v4, h[2], s2, k);
    KNN_VKEEP_STEP(knn_v4, h[3], s3, k);
}

/* h[0..1]: the same 16 slots in two vectors of eight. */
static inline __attribute__((always_inline)) void knn_vkeep16_v8(knn_v8* h, int64_t key) {
    const knn_v8 zero = {0, 0, 0, 0, 0, 0, 0, 0};
    const knn_v8 k = zero + key;
    const knn_v8 s0 = __builtin_shuffle(h[0], zero, (knn_v8){8, 0, 1, 2, 3, 4, 5, 6});
    const knn_v8 s1 = __builtin_shuffle(h[1], h[0], (knn_v8){15, 0, 1, 2, 3, 4, 5, 6});
    KNN_VKEEP_STEP(knn_v8, h[0], s0, k);
    KNN_VKEEP_STEP(knn_v8, h[1], s1, k);
}
#else
#define KNN_VLIST 0
#endif

/* Whether the CPU runs the eight-lane build of the grid path: x86-64-v4 (AVX-512 F, VL, BW,
 * DQ, CD), with GCC. */
#if KNN_VLIST && defined(__x86_64__)
#define KNN_WIDE 1
static int knn_wide_list(void) {
    static int wide = -1; /* -1: not asked yet; callers may race, on the same answer */
    int w = __atomic_load_n(&wide, __ATOMIC_RELAXED);
    if (w < 0) {
        __builtin_cpu_init();
        w = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512cd");
        __atomic_store_n(&wide, w, __ATOMIC_RELAXED);
    }
    return w;
}
#else
#define KNN_WIDE 0
#endif

/* Each instantiation of knn_cpu.inc: T, TI, FN(name), KNN_PACKED (float32 packed keys), KNN_VW
 * (the register list's vector width: 0 none, 4, 8) and KNN_GRID_ONLY (the grid path alone). */
#define T float
#define TI int32_t
#define KNN_PACKED 1
#define KNN_VW (KNN_VLIST ? 4 : 0)
#define KNN_VT knn_v4
#define KNN_VKEEP knn_vkeep16_v4
#define KNN_GRID_ONLY 0
#define FN(name) name##_f32
#include "grid_cpu.inc"
#include "knn_cpu.inc"
#undef FN
#undef KNN_VW
#undef KNN_VT
#undef KNN_VKEEP
#undef KNN_GRID_ONLY

#if KNN_WIDE
#define KNN_VW 8
#define KNN_VT knn_v8
#define KNN_VKEEP knn_vkeep16_v8
#define KNN_GRID_ONLY 1
#define FN(name) name##_f32w
/* the scalar helpers of the type are the float32 ones */
#define knn_below_mask_f32w knn_below_mask_f32
#define knn_next_up_f32w knn_next_up_f32
#define pcops_dist2_f32w pcops_dist2_f32
#define pcops_prune_limit_f32w pcops_prune_limit_f32
#define pcops_dist2_sat_f32w pcops_dist2_sat_f32
#define pcops_staged_x_f32w pcops_staged_x_f32
#include "grid_cpu.inc"
#include "knn_cpu.inc"
#undef knn_below_mask_f32w
#undef knn_next_up_f32w
#undef pcops_dist2_f32w
#undef pcops_prune_limit_f32w
#undef pcops_dist2_sat_f32w
#undef pcops_staged_x_f32w
#undef FN
#undef KNN_VW
#undef KNN_VT
#undef KNN_VKEEP
#undef KNN_GRID_ONLY
#endif
#undef T
#undef TI
#undef KNN_PACKED

#define T double
#define TI int64_t
#define KNN_PACKED 0
#define KNN_VW 0
#define KNN_GRID_ONLY 0
#define FN(name) name##_f64
#include "grid_cpu.inc"
#include "knn_cpu.inc"
#undef T
#undef TI
#undef FN
#undef KNN_PACKED
#undef KNN_VW
#undef KNN_GRID_ONLY

/* The CPU plan. Eligibility: the brute force takes every input; the grid paths (GRID, and
 * GRID_BASELINE, the grid's AVX2 / SSE2 build even on an AVX-512 CPU) need cloud indices that
 * fit int32. Preference (AUTO): the grid for clouds of at least KNN_GRID_MIN_N refs with
 * k * KNN_GRID_N_PER_K <= N, the brute force below. The thresholds and the grid's cells, each
 * re-measured by the command on its line (one build per value for the cells): */
#define KNN_GRID_MIN_N 512      /* python benchmarks/tune.py knn --device cpu: grid from N */
#define KNN_GRID_N_PER_K 8      /* python benchmarks/tune.py knn --device cpu: k * this <= N */
#define KNN_GRID_K_PER_CELL 4   /* python benchmarks/tune.py knn --device cpu: refs a cell */
#define KNN_GRID_BASE_CELLS 1.0 /* python benchmarks/tune.py knn --device cpu: cells a ref */

/* The grid path's cells per cloud: KNN_GRID_BASE_CELLS cells per max(1, K / KNN_GRID_K_PER_CELL)
 * refs over the box, refined up to PCOPS_GRID_OCCUPANCY_SPARE times more where most of the box
 * is empty (kernels/grid_cpu.inc). */
static int64_t knn_grid_budget(int64_t N, int64_t K) {
    const int64_t per_cell = K / KNN_GRID_K_PER_CELL > 1 ? K / KNN_GRID_K_PER_CELL : 1;
    return pcops_grid_budget(N, KNN_GRID_BASE_CELLS * PCOPS_GRID_OCCUPANCY_SPARE / (double)per_cell);
}

/* The path that runs for a requested one (*path: BRUTE, GRID or GRID_BASELINE): AUTO by size;
 * a forced path that is not a CPU path or cannot take the sizes is PCOPS_ERROR_INVALID_VALUE,
 * never a substitute. */
static pcops_status knn_cpu_plan(int64_t M, int64_t N, int64_t K, pcops_knn_path requested,
                                 pcops_knn_path* path) {
    const int grid_takes = N <= INT32_MAX - 1 && M <= INT32_MAX - 1;
    switch (requested) {
        case PCOPS_KNN_AUTO:
            *path = grid_takes && N >= KNN_GRID_MIN_N && K * KNN_GRID_N_PER_K <= N
                        ? PCOPS_KNN_GRID
                        : PCOPS_KNN_BRUTE;
            return PCOPS_SUCCESS;
        case PCOPS_KNN_BRUTE:
            *path = PCOPS_KNN_BRUTE;
            return PCOPS_SUCCESS;
        case PCOPS_KNN_GRID:
        case PCOPS_KNN_GRID_BASELINE:
            *path = requested;
            return grid_takes ? PCOPS_SUCCESS : PCOPS_ERROR_INVALID_VALUE;
        default:
            return PCOPS_ERROR_INVALID_VALUE;
    }
}

/* Bytes of the grid path's workspace: the grids and the query order, carved by knn_cpu.inc's
 * knn_grid_batch with the same pcops_grid_carve (kernels/grid.h). */
static size_t knn_grid_workspace(pcops_dtype dtype, int64_t B, int64_t M, int64_t N, int64_t K) {
    pcops_grid_scratch s;
    pcops_carver w = pcops_carver_init(NULL);
    pcops_grid_carve(&w, B, M, N, knn_grid_budget(N, K), pcops_dtype_size(dtype), &s);
    return pcops_carver_bytes(&w);
}

size_t pcops_knn_cpu_workspace_bytes(pcops_dtype dtype, int64_t B, int64_t M, int64_t N,
                                     int64_t K, pcops_knn_path requested) {
    pcops_knn_path path;
    if (B <= 0 || M <= 0 || N < 0 || K < 1) return 0;
    if (knn_cpu_plan(M, N, K, requested, &path) != PCOPS_SUCCESS || path == PCOPS_KNN_BRUTE)
        return 0;
    return knn_grid_workspace(dtype, B, M, N, K);
}

pcops_status pcops_knn_cpu_path(pcops_dtype dtype, const void* query, const void* ref,
                                   const int64_t* query_lengths, const int64_t* ref_lengths,
                                   int64_t B, int64_t M, int64_t N, int64_t K,
                                   pcops_knn_path requested, void* workspace, void* dist2,
                                   int64_t* idx) {
    pcops_knn_path path;
    const pcops_status planned = knn_cpu_plan(M, N, K, requested, &path);
    if (planned != PCOPS_SUCCESS) return planned;
    if (path == PCOPS_KNN_BRUTE || B <= 0 || M <= 0 || K < 1)
        return pcops_knn_cpu(dtype, query, ref, query_lengths, ref_lengths, B, M, N, K, dist2,
                             idx);
    if (N < 0) return PCOPS_ERROR_INVALID_VALUE;
    if (!query || !dist2 || !idx || !workspace || (N > 0 && !ref))
        return PCOPS_ERROR_INVALID_VALUE;
    const int64_t budget = knn_grid_budget(N, K);
    switch (dtype) {
        case PCOPS_FLOAT32:
#if KNN_WIDE
            if (path != PCOPS_KNN_GRID_BASELINE && knn_wide_list()) {
                knn_grid_batch_f32w((const float*)query, (const float*)ref, query_lengths,
                                    ref_lengths, B, M, N, K, budget, workspace, (float*)dist2,
                                    idx);
                return PCOPS_SUCCESS;
            }
#endif
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
