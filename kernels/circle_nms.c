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
 * box of its group whose squared xy distance to it is < radius2 -- with a sweep-line filter, so
 * that a kept box tests its neighbourhood instead of all N boxes:
 *   1. the boxes are sorted by group, then along the axis (x or y) over which the centres
 *      spread more, with a stable LSD radix sort on the bits of the coordinate;
 *   2. for a kept box at u0 on that axis, every box it can remove lies in the interval of its
 *      group's run where fl(fl(u - u0)**2) < r2: the full test adds fl(dv*dv) >= 0 to that
 *      term, and rounding is monotone, so fl(du*du + dv*dv) < r2 implies fl(du*du) < r2; and
 *      fl(u - u0)**2 only grows as u moves away from u0, so the set is an interval around the
 *      box. A galloping search out from the box finds it; a vectorised loop applies the exact
 *      test to it.
 * Removing boxes already visited is harmless (their fate is decided), so the loop needs no
 * check of visiting order. Cost O(N) for the sorts plus the kept boxes' intervals, at worst
 * (all boxes in one narrow strip) O(K * N), vectorised. One thread: the work per kept box is
 * far too small to share, and barriers cost more than it on a loaded machine.
 *
 * Boxes with a non-finite x or y are within the radius of nothing (their distances are inf or
 * NaN), so they are left out of the sort: they are kept when visited and remove nothing.
 *
 * Distances: pcops_dist2_xy (geometry.h) of (u[j], v[j]) and (u0, v0), in T, compared
 * d < (T)radius2. IEEE addition commutes, so with u = y this is bitwise the dx*dx + dy*dy of
 * circle_nms.cu, and CPU and CUDA keep exactly the same boxes.
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

/* The workspace, as both dtypes use it. */
typedef struct NmsCpuWorkspace {
    void* us;          /* [N] T: the sort axis coordinate, in sorted order */
    void* vs;          /* [N] T: the other coordinate, in sorted order */
    int64_t* gs;       /* [N] groups in sorted order */
    int64_t* rank;     /* [N] position of the visiting order -> index in sorted order, or -1 */
    uint64_t* key;     /* [N] sort keys, and scratch of the same size */
    uint64_t* tmp_key; /* [N] */
    int64_t* pos;      /* [N] visiting positions being sorted, and scratch */
    int64_t* tmp_pos;  /* [N] */
    uint8_t* removed;  /* [N] in sorted order */
    int64_t* order;    /* [N] the visiting order (box indices) */
    size_t bytes;
} NmsCpuWorkspace;

/* The one layout (geometry.h carving): base NULL only counts. */
static NmsCpuWorkspace nms_carve(void* base, size_t elem, int64_t N) {
    pcops_carver c = pcops_carver_init(base);
    NmsCpuWorkspace w;
    w.us = pcops_carve(&c, N, elem);
    w.vs = pcops_carve(&c, N, elem);
    w.gs = (int64_t*)pcops_carve(&c, N, sizeof(int64_t));
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
