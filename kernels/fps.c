/*
 * fps.c -- furthest point sampling on the CPU.
 *
 * B = batch, N = points per cloud, npoint = samples. xyz[B,N,3] -> idx[B,npoint], dist2[B,npoint].
 *
 * Algorithm (PointNet++, Qi et al. 2017, the "temp distance buffer" form): keep for every
 * point its squared distance to the nearest chosen sample (temp, +inf at the start); after each
 * choice, lower temp with the distances to the new sample and take the point with the largest
 * temp next. Chosen points get temp = -1, so they are never chosen again, even when the cloud
 * has duplicate points and every remaining temp is 0.
 *
 * Two paths, forced through pcops_fps_cpu_path, chosen by size otherwise (fps_tree_pays);
 * both return the same bits (fps_cpu.inc):
 *  - SIMPLE: every step is one vectorised update + max pass over structure-of-arrays copies of
 *    x, y, z; the max is tracked on the float's bit pattern as an integer (non-negative floats
 *    order like their bits; the chosen points' -1 sorts below them), which the compiler
 *    vectorises without fast-math. The pass runs in chunks, remembering the first chunk that
 *    holds the maximum, so finding the first index of the maximum rescans one chunk only.
 *  - TREE: a KD tree over the cloud; a step only visits the boxes the new sample can change
 *    (QuickFPS). Wins on large clouds with many samples (FPS_TREE_MIN_* below).
 * Work sharing: one cloud per OpenMP thread (schedule(dynamic) over the batch).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu.h"
#include "pcops.h"

/* Points per chunk of the update + max pass (simple path). */
#define FPS_CHUNK 512
/* Most points in a leaf of the KD tree (tree path; leaves hold 128-256 points): a leaf's
 * update is one vectorised pass, and fewer, longer passes cost less than more box tests.
 * python benchmarks/bench_fps.py --device cpu times the tree path (build with -DFPS_LEAF=n). */
#ifndef FPS_LEAF
#define FPS_LEAF 256
#endif

/* AUTO's choice on the CPU (fps_tree_pays in fps_cpu.inc): the tree for clouds of at least
 * FPS_TREE_MIN_POINTS valid points when at least FPS_TREE_MIN_SAMPLES samples, or
 * FPS_TREE_MIN_WORK point-samples (L * npoint), are asked; the simple path otherwise. The tree
 * costs about a pass over the cloud to build, then a fraction of a pass a step: it pays over
 * long runs on large clouds. */
/* python benchmarks/tune.py fps --device cpu: rows 1x2047->1000, 1x2048->1000 */
#define FPS_TREE_MIN_POINTS 2048
/* python benchmarks/tune.py fps --device cpu: rows 1x4096->999, 1x4096->1000 */
#define FPS_TREE_MIN_SAMPLES 1000
/* python benchmarks/tune.py fps --device cpu: rows 1x100000->399, 1x100000->400 */
#define FPS_TREE_MIN_WORK 4e7

#define T float
#define TI int32_t
#define FN(name) name##_f32
#define FPS_DIST2 pcops_dist2_f32
#define FPS_KEY_GREATER pcops_key_greater_f32
#include "fps_cpu.inc"
#undef T
#undef TI
#undef FN
#undef FPS_DIST2
#undef FPS_KEY_GREATER

#define T double
#define TI int64_t
#define FN(name) name##_f64
#define FPS_DIST2 pcops_dist2_f64
#define FPS_KEY_GREATER pcops_key_greater_f64
#include "fps_cpu.inc"
#undef T
#undef TI
#undef FN
#undef FPS_DIST2
#undef FPS_KEY_GREATER

size_t pcops_fps_workspace_bytes(pcops_dtype dtype, int64_t B, int64_t N) {
    if (B <= 0 || N <= 0) return 0;
    size_t per_cloud = dtype == PCOPS_FLOAT64 ? fps_cloud_bytes_f64(N) : fps_cloud_bytes_f32(N);
    if (per_cloud > SIZE_MAX / (size_t)B) return SIZE_MAX;
    return (size_t)B * per_cloud;
}

pcops_status pcops_fps_cpu_path(pcops_dtype dtype, const void* xyz, const int64_t* lengths,
                                   const int64_t* start, int64_t B, int64_t N, int64_t npoint,
                                   void* workspace, int64_t* idx, void* dist2, int variant) {
    if (B < 0 || N < 0 || npoint < 1) return PCOPS_ERROR_INVALID_VALUE;
    if (variant != PCOPS_FPS_AUTO && variant != PCOPS_FPS_SIMPLE && variant != PCOPS_FPS_TREE)
        return PCOPS_ERROR_INVALID_VALUE;
    if (B == 0) return PCOPS_SUCCESS;
    if (!idx || !dist2 || (N > 0 && (!xyz || !workspace))) return PCOPS_ERROR_INVALID_VALUE;
    switch (dtype) {
        case PCOPS_FLOAT32:
            fps_batch_f32((const float*)xyz, lengths, start, B, N, npoint, (char*)workspace,
                          variant, idx, (float*)dist2);
            return PCOPS_SUCCESS;
        case PCOPS_FLOAT64:
            fps_batch_f64((const double*)xyz, lengths, start, B, N, npoint, (char*)workspace,
                          variant, idx, (double*)dist2);
            return PCOPS_SUCCESS;
        default:
            return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    }
}

pcops_status pcops_fps_cpu(pcops_dtype dtype, const void* xyz, const int64_t* lengths,
                           const int64_t* start, int64_t B, int64_t N, int64_t npoint,
                           void* workspace, int64_t* idx, void* dist2) {
    return pcops_fps_cpu_path(dtype, xyz, lengths, start, B, N, npoint, workspace, idx, dist2,
                                 PCOPS_FPS_AUTO);
}
