/*
 * fps_nd.c -- furthest point sampling in any dimension D on the CPU (kernels/pcops.h,
 * pcops_fps_nd_cpu): xyz[B,N,D] -> idx[B,npoint], dist2[B,npoint]; the CUDA kernel of
 * kernels/fps_nd.cu returns the same bits.
 *
 * The simple path of fps.c for D coordinates: a temp distance per point (+inf at the start,
 * -1 once chosen); a step lowers every temp with the squared distance to the newest sample
 * (knn_nd.h, knn_nd_l2: coordinate order, no FMA) and takes the first point of the largest
 * temp. The distance of a point to itself is 0, never below its -1, so a chosen point is never
 * chosen again (unique indices also for duplicate points).
 *
 * The overflow rule (geometry.h), as the 3-D paths apply it: a distance between finite points
 * that overflows is the type's max; a pair with a non-finite point gives no distance, so such a
 * point's temp stays +inf (it is taken early, as by the 3-D paths, with dist2 +inf) and a
 * non-finite sample lowers nothing. The points' coordinates are looked at only when a sum is
 * not <= max (a finite pair's sum is never NaN: its terms are >= 0). The 3-D paths lower the
 * finite points' temps to the max at the first finite sample and then take the raw distance:
 * min(raw, max) is the saturated distance, so the temps, the choices and dist2 agree bit for
 * bit with this form (tests/test_fps_nd.py pins the two together at D = 3).
 *
 * Work sharing: one cloud per OpenMP thread (schedule(dynamic) over the batch), each in IEEE
 * mode (cpu.h).
 */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "knn_nd.h"
#include "pcops.h"

#define PCOPS_CPU_TEMPLATE "fps_nd_cpu.inc"
#include "float_types_cpu.inc"

/* The workspace: the temps of every cloud, B * N values of the dtype (CPU and CUDA). */
size_t pcops_fps_nd_workspace_bytes(pcops_dtype dtype, int64_t B, int64_t N) {
    if (B <= 0 || N <= 0) return 0;
    pcops_carver w = pcops_carver_init(NULL);
    pcops_carve(&w, B * N, dtype == PCOPS_FLOAT64 ? sizeof(double) : sizeof(float));
    return pcops_carver_bytes(&w);
}

pcops_status pcops_fps_nd_cpu(pcops_dtype dtype, const void* xyz, const int64_t* lengths,
                              const int64_t* start, int64_t B, int64_t N, int64_t D,
                              int64_t npoint, void* workspace, int64_t* idx, void* dist2) {
    if (B < 0 || N < 0 || D < 1 || npoint < 1) return PCOPS_ERROR_INVALID_VALUE;
    if (B == 0) return PCOPS_SUCCESS;
    if (!idx || !dist2 || (N > 0 && (!xyz || !workspace))) return PCOPS_ERROR_INVALID_VALUE;
    switch (dtype) {
        case PCOPS_FLOAT32:
            fps_nd_batch_f32((const float*)xyz, lengths, start, B, N, D, npoint,
                             (float*)workspace, idx, (float*)dist2);
            return PCOPS_SUCCESS;
        case PCOPS_FLOAT64:
            fps_nd_batch_f64((const double*)xyz, lengths, start, B, N, D, npoint,
                             (double*)workspace, idx, (double*)dist2);
            return PCOPS_SUCCESS;
        default:
            return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    }
}
