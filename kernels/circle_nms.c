/*
 * circle_nms.c -- greedy centre-distance NMS (circle NMS) on the CPU.
 *
 * N = boxes, D = coordinate dims of a centre (only x and y are used).
 * centers[N,D], order[N] (visiting order), groups[N]? -> keep_mask[N], keep_idx[N], num_kept.
 *
 * Algorithm: the textbook greedy loop -- visit the boxes in `order`; a box not yet removed is
 * kept and removes every later box of its group whose squared xy distance to it is < radius2 --
 * organised in blocks of NMS_BLOCK positions of the visiting order, so that the work can be
 * shared between threads without changing the result:
 *   1. gather the centres (and groups) into visiting order, structure-of-arrays, so that the
 *      inner loops read consecutive memory and vectorise;
 *   2. for each block: resolve its boxes one after the other (a kept box removes the later
 *      boxes of the same block), then let the block's kept boxes remove every box after the
 *      block, in one pass that the OpenMP threads split by ranges of positions.
 * "Removed" only ever goes from 0 to 1 (an OR), so the order in which the threads do step 2
 * does not matter: the result is the greedy one, on any number of threads. Cost O(K * N) for K
 * kept boxes, vectorised over the later boxes.
 *
 * Distances: dx = x[j] - x[i] (its sign does not matter: a - b is exactly -(b - a)),
 * d = dx*dx + dy*dy, compared d < (T)radius2, no FMA contraction: the same arithmetic as
 * circle_nms.cu, so CPU and CUDA keep exactly the same boxes.
 */
#include <string.h>

#include "common.h"
#include "pcops.h"

/* Positions of the visiting order resolved sequentially before one parallel suppression pass. */
#define NMS_BLOCK 256
/* Later positions per task of the parallel suppression pass. */
#define NMS_CHUNK 2048
/* Below this many boxes the loop runs on one thread: a parallel region costs more than it saves. */
#define NMS_PARALLEL_MIN 4096

/* Byte offset of each workspace region, rounded up to 64 bytes (a cache line). */
static size_t nms_align(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

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
    size_t t = pcops_dtype_size(dtype);
    if (N <= 0 || t == 0) return 0;
    /* x[N], y[N] (dtype), group[N] (int64), removed[N] (bytes), all in visiting order */
    size_t n = (size_t)N;
    return 2 * nms_align(n * t) + nms_align(n * sizeof(int64_t)) + nms_align(n);
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
                                       workspace, keep_mask, keep_idx);
            return PCOPS_SUCCESS;
        case PCOPS_FLOAT64:
            *num_kept = circle_nms_f64((const double*)centers, D, order, groups, N, radius2,
                                       workspace, keep_mask, keep_idx);
            return PCOPS_SUCCESS;
        default:
            return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    }
}
