/*
 * circle_nms.c -- greedy centre-distance NMS (circle NMS) on the CPU.
 *
 * N = boxes, D = coordinate dims of a centre (only x and y are used).
 * centers[N,D], order[N] (visiting order), groups[N]? -> keep_mask[N], keep_idx[N], num_kept.
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
 * Distances: du = u[j] - u0, d = du*du + dv*dv in T, no FMA contraction (-ffp-contract=off),
 * compared d < (T)radius2. IEEE addition commutes, so with u = y this is bitwise the
 * dx*dx + dy*dy of circle_nms.cu, and CPU and CUDA keep exactly the same boxes.
 */
#include <math.h>
#include <string.h>

#include "common.h"
#include "pcops.h"

/* Workspace regions start on 64-byte boundaries (cache lines). */
static size_t nms_align(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

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
    size_t bytes;
} NmsCpuWorkspace;

static NmsCpuWorkspace nms_carve(void* base, size_t elem, int64_t N) {
    /* integer arithmetic: the size query passes base = NULL */
    const size_t n = (size_t)N;
    const uintptr_t p = (uintptr_t)base;
    NmsCpuWorkspace w;
    size_t off = 0;
#define NMS_TAKE(field, type, count)     \
    w.field = (type*)(p + off);          \
    off += nms_align((count) * sizeof(type))
    NMS_TAKE(us, char, n * elem);
    NMS_TAKE(vs, char, n * elem);
    NMS_TAKE(gs, int64_t, n);
    NMS_TAKE(rank, int64_t, n);
    NMS_TAKE(key, uint64_t, n);
    NMS_TAKE(tmp_key, uint64_t, n);
    NMS_TAKE(pos, int64_t, n);
    NMS_TAKE(tmp_pos, int64_t, n);
    NMS_TAKE(removed, uint8_t, n);
#undef NMS_TAKE
    w.bytes = off;
    return w;
}

#define T float
#define FN(name) name##_f32
#include "circle_nms_cpu.inc"
#undef T
#undef FN

#define T double
#define FN(name) name##_f64
#include "circle_nms_cpu.inc"
#undef T
#undef FN

size_t pcops_circle_nms_workspace_bytes(pcops_dtype dtype, int64_t N) {
    const size_t elem = pcops_dtype_size(dtype);
    if (N <= 0 || elem == 0) return 0;
    return nms_carve(NULL, elem, N).bytes;
}

pcops_status pcops_circle_nms_cpu(pcops_dtype dtype, const void* centers, int64_t D,
                                  const int64_t* order, const int64_t* groups, int64_t N,
                                  double radius2, void* workspace, bool* keep_mask,
                                  int64_t* keep_idx, int64_t* num_kept) {
    if (N < 0 || D < 2 || !num_kept) return PCOPS_ERROR_INVALID_VALUE;
    if (N > 0 && (!centers || !order || !workspace || !keep_mask || !keep_idx))
        return PCOPS_ERROR_INVALID_VALUE;
    switch (dtype) {
        case PCOPS_FLOAT32:
            *num_kept = circle_nms_f32((const float*)centers, D, order, groups, N, (float)radius2,
                                       nms_carve(workspace, sizeof(float), N), keep_mask, keep_idx);
            return PCOPS_SUCCESS;
        case PCOPS_FLOAT64:
            *num_kept = circle_nms_f64((const double*)centers, D, order, groups, N, radius2,
                                       nms_carve(workspace, sizeof(double), N), keep_mask,
                                       keep_idx);
            return PCOPS_SUCCESS;
        default:
            return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    }
}
