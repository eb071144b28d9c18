/*
 * circle_nms.c -- greedy centre-distance NMS (circle NMS) on the CPU.
 *
 * N = boxes, D = coordinate dims of a centre (only x and y are used).
 * centers[N,D], scores[N], groups[N]? -> keep_mask[N], keep_idx[N], num_kept.
 *
 * The visiting order: a stable LSD radix sort of the score keys of circle_nms.h (descending
 * score, NaN first, ties to the lower index), the same order as the CUDA kernels'.
 *
 * The greedy loop -- visit the boxes in `order`; a box not yet removed is kept and removes every
 * box of its group whose squared xy distance to it is < radius2 -- over rows, so that a kept box
 * tests a window of about 2 x 3 radii around it, whatever the layout:
 *   1. "band": for numbers u, u0 on one axis, fl(fl(u - u0)**2) < r2. A box within the radius
 *      of (x0, y0) is in the band of x0 in x and of y0 in y: the distance adds fl(dy*dy) >= 0 to
 *      fl(dx*dx) (and the other way round), rounding is monotone, so fl(dx*dx + dy*dy) < r2
 *      implies fl(dx*dx) < r2. fl(u - u0)**2 only grows as u moves away from u0, so on a sorted
 *      axis a band is an interval;
 *   2. rows: the boxes sorted by group, then by y (stable LSD radix sorts on the bits of the
 *      coordinate), are cut into rows: a row starts at a box of another group or at the first
 *      box whose y is not in the band of the y of the row's first box. Then no box of row k is
 *      within the radius of a box of row k + 2 or later: for y1 in row k and y2 in row k + 2,
 *      y2 - y1 > y(start of k + 2) - y(start of k + 1) (the first is < the start of k + 1, or it
 *      would be out of the band of k as that start is), so by monotone rounding y2 is not in
 *      the band of y1. Rows hold any number of boxes, and a line of boxes along any direction
 *      cuts into rows as well as a plane does;
 *   3. each row, a run of the (group, y) order, sorted by x in place (insertion sort when short,
 *      a radix sort otherwise: cache-local, no scatter over the whole array);
 *   4. a kept box tests the band of its x in its own row and in the rows before and after it
 *      (same group; each skipped when its nearest y is out of the band), found by galloping
 *      out from the box (its row) or from a binary search (the others); a vectorised loop
 *      applies the exact test to the window.
 * Removing boxes already visited is harmless (their fate is decided), so the loop needs no
 * check of visiting order. Cost: O(N) for the sorts and the rows, a search per row and kept
 * box, and the kept boxes' windows: a window is at most 2 x ~3 radii, and the kept boxes of a
 * group are more than a radius apart, so a box lies in the windows of a bounded number of
 * them (kept boxes in a 2 x 4 radii rectangle around it: at most about 20); boxes in one spot cost one window (the first box removes the rest). One
 * thread: the work per kept box is far too small to share.
 *
 * Boxes with a non-finite x or y are within the radius of nothing (their distances are inf or
 * NaN), so they are left out of the rows: they are kept when visited and remove nothing.
 *
 * Distances: pcops_dist2_xy (geometry.h) of (x[j], y[j]) and (x0, y0), in T, compared
 * d < (T)radius2, as circle_nms.cu computes them, so CPU and CUDA keep exactly the same boxes.
 */
#include <math.h>
#include <string.h>

#include "circle_nms.h"
#include "cpu.h"
#include "pcops.h"

/* Sorts pos[0, M) by key[0, M) ascending, stably: an LSD radix sort over the low `bytes` bytes
 * of the keys, 8 bits per pass, skipping the passes whose digit is the same for every key.
 * tmp_key and tmp_pos are scratch of M entries; the sorted positions end up in *pos_out (pos or
 * tmp_pos). */
static void nms_radix_sort(uint64_t* key, int64_t* pos, uint64_t* tmp_key, int64_t* tmp_pos,
                           int64_t M, int bytes, int64_t** pos_out) {
    for (int shift = 0; shift < 8 * bytes; shift += 8) {
        int64_t start[257];
        memset(start, 0, sizeof start);
        for (int64_t i = 0; i < M; ++i) ++start[((key[i] >> shift) & 255) + 1];
        int one_digit = 0;
        for (int d = 1; d <= 256; ++d) one_digit |= start[d] == M;
        if (one_digit) continue;
        for (int d = 1; d <= 256; ++d) start[d] += start[d - 1];
        for (int64_t i = 0; i < M; ++i) {
            int64_t dst = start[(key[i] >> shift) & 255]++;
            tmp_key[dst] = key[i];
            tmp_pos[dst] = pos[i];
        }
        uint64_t* k = key;
        key = tmp_key;
        tmp_key = k;
        int64_t* p = pos;
        pos = tmp_pos;
        tmp_pos = p;
    }
    *pos_out = pos;
}

/* Sorts the indices first, first + 1, ..., first + n - 1 by key[0, n) ascending (key is permuted
 * along); returns the sorted indices (in pos or tmp_pos, n entries each; tmp_key is scratch):
 * insertion sort for short runs, the radix sort above for longer ones. */
static const int64_t* nms_sort_run(uint64_t* key, int64_t* pos, uint64_t* tmp_key,
                                   int64_t* tmp_pos, int64_t n, int bytes, int64_t first) {
    for (int64_t j = 0; j < n; ++j) pos[j] = first + j;
    if (n > 48) {
        int64_t* out = pos;
        nms_radix_sort(key, pos, tmp_key, tmp_pos, n, bytes, &out);
        return out;
    }
    for (int64_t j = 1; j < n; ++j) {
        const uint64_t k = key[j];
        const int64_t p = pos[j];
        int64_t h = j;
        for (; h > 0 && key[h - 1] > k; --h) {
            key[h] = key[h - 1];
            pos[h] = pos[h - 1];
        }
        key[h] = k;
        pos[h] = p;
    }
    return pos;
}

/* Unsigned keys that order like the values: finite floats (negatives reversed below the
 * positives; -0.0 just below +0.0) and int64 groups. */
static uint64_t nms_key_f32(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return (b & 0x80000000u) ? (uint64_t)~b : (uint64_t)(b | 0x80000000u);
}
static uint64_t nms_key_f64(double v) {
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return (b & 0x8000000000000000ull) ? ~b : (b | 0x8000000000000000ull);
}
static uint64_t nms_key_group(int64_t g) { return (uint64_t)g ^ 0x8000000000000000ull; }

/* The workspace, as both dtypes use it (M <= N boxes in rows, R <= M rows). */
typedef struct NmsCpuWorkspace {
    void* xs;          /* [N] T: x of the boxes in rows, each row sorted by x (first: x of
                        * the m-th box that can meet another, in visiting order) */
    void* ys;          /* [N] T: their y */
    void* tx;          /* [N] T: x of the boxes in (group, y) order */
    void* ty;          /* [N] T: their y */
    int64_t* mpos;     /* [N] the visiting position of the m-th box in visiting order */
    void* row_ylo;     /* [N] T: the smallest y of row r (the y of its first box) */
    void* row_yhi;     /* [N] T: the largest */
    int64_t* row_start; /* [N + 1] the boxes of row r: [row_start[r], row_start[r + 1]) */
    int64_t* row_g;    /* [N] the group of row r */
    int64_t* yrow;     /* [N] the row of the i-th box in (group, y) order, the same as the
                        * row of the box at index i in rows */
    int64_t* ypos;     /* [N] the visiting position of the i-th box in (group, y) order */
    int64_t* rank;     /* [N] position of the visiting order -> index in rows, or -1 */
    uint64_t* key;     /* [N] sort keys, and scratch of the same size */
    uint64_t* tmp_key; /* [N] */
    int64_t* pos;      /* [N] positions being sorted, and scratch */
    int64_t* tmp_pos;  /* [N] */
    uint8_t* removed;  /* [N] by index in rows */
    int64_t* order;    /* [N] the visiting order (box indices) */
    size_t bytes;
} NmsCpuWorkspace;

/* The one layout (geometry.h carving): base NULL only counts. */
static NmsCpuWorkspace nms_carve(void* base, size_t elem, int64_t N) {
    pcops_carver c = pcops_carver_init(base);
    NmsCpuWorkspace w;
    w.xs = pcops_carve(&c, N, elem);
    w.ys = pcops_carve(&c, N, elem);
    w.tx = pcops_carve(&c, N, elem);
    w.ty = pcops_carve(&c, N, elem);
    w.mpos = (int64_t*)pcops_carve(&c, N, sizeof(int64_t));
    w.row_ylo = pcops_carve(&c, N, elem);
    w.row_yhi = pcops_carve(&c, N, elem);
    w.row_start = (int64_t*)pcops_carve(&c, N + 1, sizeof(int64_t));
    w.row_g = (int64_t*)pcops_carve(&c, N, sizeof(int64_t));
    w.yrow = (int64_t*)pcops_carve(&c, N, sizeof(int64_t));
    w.ypos = (int64_t*)pcops_carve(&c, N, sizeof(int64_t));
    w.rank = (int64_t*)pcops_carve(&c, N, sizeof(int64_t));
    w.key = (uint64_t*)pcops_carve(&c, N, sizeof(uint64_t));
    w.tmp_key = (uint64_t*)pcops_carve(&c, N, sizeof(uint64_t));
    w.pos = (int64_t*)pcops_carve(&c, N, sizeof(int64_t));
    w.tmp_pos = (int64_t*)pcops_carve(&c, N, sizeof(int64_t));
    w.removed = (uint8_t*)pcops_carve(&c, N, sizeof(uint8_t));
    w.order = (int64_t*)pcops_carve(&c, N, sizeof(int64_t));
    w.bytes = pcops_carver_bytes(&c);
    return w;
}

/* The visiting order into w.order: ascending score key, stably (ties to the lower index). */
static void nms_visiting_order(pcops_dtype score_dtype, const void* scores, int64_t N,
                               NmsCpuWorkspace w) {
    int bytes;
    if (score_dtype == PCOPS_FLOAT32) {
        const float* s = (const float*)scores;
        for (int64_t i = 0; i < N; ++i) w.key[i] = pcops_nms_score_key_f32(s[i]);
        bytes = 4;
    } else {
        const double* s = (const double*)scores;
        for (int64_t i = 0; i < N; ++i) w.key[i] = pcops_nms_score_key_f64(s[i]);
        bytes = 8;
    }
    for (int64_t i = 0; i < N; ++i) w.pos[i] = i;
    int64_t* sorted = w.pos;
    nms_radix_sort(w.key, w.pos, w.tmp_key, w.tmp_pos, N, bytes, &sorted);
    memcpy(w.order, sorted, (size_t)N * sizeof(int64_t));
}

#define T float
#define FN(name) name##_f32
#define NMS_DIST2 pcops_dist2_xy_f32
#include "circle_nms_cpu.inc"
#undef T
#undef FN
#undef NMS_DIST2

#define T double
#define FN(name) name##_f64
#define NMS_DIST2 pcops_dist2_xy_f64
#include "circle_nms_cpu.inc"
#undef T
#undef FN
#undef NMS_DIST2

size_t pcops_circle_nms_workspace_bytes(pcops_dtype dtype, int64_t N) {
    const size_t elem = pcops_dtype_size(dtype);
    if (N <= 0 || elem == 0) return 0;
    return nms_carve(NULL, elem, N).bytes;
}

pcops_status pcops_circle_nms_cpu(pcops_dtype dtype, const void* centers, int64_t D,
                                  pcops_dtype score_dtype, const void* scores,
                                  const int64_t* groups, int64_t N, double radius2,
                                  void* workspace, bool* keep_mask, int64_t* keep_idx,
                                  int64_t* num_kept) {
    if (N < 0 || D < 2 || !num_kept) return PCOPS_ERROR_INVALID_VALUE;
    if (N > 0 && (!centers || !scores || !workspace)) return PCOPS_ERROR_INVALID_VALUE;
    if (score_dtype != PCOPS_FLOAT32 && score_dtype != PCOPS_FLOAT64)
        return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    const NmsCpuWorkspace w = nms_carve(workspace, pcops_dtype_size(dtype), N);
    const pcops_fpmode fpmode = pcops_fpmode_ieee(); /* cpu.h */
    if (N > 0) nms_visiting_order(score_dtype, scores, N, w);
    if (dtype == PCOPS_FLOAT32)
        *num_kept = circle_nms_f32((const float*)centers, D, w.order, groups, N, (float)radius2,
                                   w, keep_mask, keep_idx);
    else
        *num_kept = circle_nms_f64((const double*)centers, D, w.order, groups, N, radius2, w,
                                   keep_mask, keep_idx);
    pcops_fpmode_restore(fpmode);
    return PCOPS_SUCCESS;
}
