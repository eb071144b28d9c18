/*
 * pcops.h -- the C API of the pcops kernels. No torch headers anywhere in kernels/.
 *
 * Shape letters (as in ../DESIGN):
 *   B batch, N reference points, M query points / samples, D coordinate dims,
 *   C feature channels, K neighbours (kNN), S neighbours (ball query / group).
 *
 * Conventions for every function below:
 *   - Arrays are dense, row-major (C-contiguous) in the shapes given; the caller
 *     (bindings/) makes them so. Every size is int64_t and element offsets are
 *     computed in int64_t, so element counts past 2**31 are fine.
 *   - Coordinates are float32 or float64 (`pcops_dtype`); float16/bfloat16 inputs
 *     are converted to float32 by the caller ("half types compute in float32").
 *   - Squared distances are dx*dx + dy*dy + dz*dz, evaluated left to right, with no
 *     FMA contraction (kernels/geometry.h: explicitly rounded operations, whatever the
 *     compiler flags), so the CPU and the CUDA code choose bitwise the same indices.
 *   - Index outputs are int64; -1 marks an empty slot. Ties go to the lower index.
 *   - Optional inputs (lengths, start, groups) may be NULL.
 *   - Value ranges of index inputs (lengths in [0, N], start in [0, lengths[b]),
 *     idx in [-1, N)) are the caller's to validate. The kernels never read or
 *     write out of bounds whatever the values: lengths are clamped to [0, N],
 *     start is taken modulo lengths[b], out-of-range gather indices read as -1.
 *   - Scratch memory is passed in by the caller; pcops_<op>_workspace_bytes()
 *     says how much. No function here allocates.
 *   - CPU functions return a pcops_status and parallelise with OpenMP. They compute in IEEE
 *     arithmetic (denormals kept) whatever flush-to-zero / denormals-are-zero mode the calling
 *     thread has, on every thread of their team (kernels/cpu.h), as the CUDA kernels do.
 *     CUDA launchers take a stream (no default: forgetting it fails to compile),
 *     launch asynchronously, never synchronise the host, and return
 *     cudaGetLastError() (cudaErrorInvalidValue for bad sizes or dtypes).
 *     Define PCOPS_DEBUG_SYNC to synchronise the stream after every launch, so
 *     that an asynchronous fault is reported by the launcher that caused it.
 */
#ifndef PCOPS_H
#define PCOPS_H

#include <stddef.h>
#include <stdint.h>
#if !defined(__cplusplus)
#include <stdbool.h>
#endif

#if defined(__CUDACC__) || defined(PCOPS_WITH_CUDA)
#include <cuda_runtime_api.h>
#define PCOPS_HAVE_CUDA_API 1
#endif

#include "paths.h"

#ifdef __cplusplus
#define PCOPS_RESTRICT __restrict__
extern "C" {
#else
#define PCOPS_RESTRICT restrict
#endif

typedef enum pcops_dtype {
    PCOPS_FLOAT32 = 0,
    PCOPS_FLOAT64 = 1,
    PCOPS_FLOAT16 = 2,  /* only where a function says so (group) */
    PCOPS_BFLOAT16 = 3, /* only where a function says so (group) */
} pcops_dtype;

/* The element type of an index input (group, group_backward, interpolate, neighbor_dist2):
 * int64, or int32 (what pointnet2_ops-style callers hold), read as is, without a converted
 * copy. */
typedef enum pcops_index_dtype {
    PCOPS_INDEX_INT64 = 0,
    PCOPS_INDEX_INT32 = 1,
} pcops_index_dtype;

typedef enum pcops_status {
    PCOPS_SUCCESS = 0,
    PCOPS_ERROR_INVALID_VALUE = 1, /* a negative size, k < 1, a NULL required pointer */
    PCOPS_ERROR_UNSUPPORTED_DTYPE = 2,
} pcops_status;

/* Human-readable name of a status, for error messages. */
const char* pcops_status_string(pcops_status status);

/* Bytes of one element of `dtype` (0 for an unknown value). */
size_t pcops_dtype_size(pcops_dtype dtype);

/* The path table of an op with several paths: "furthest_point_sample", "knn", "ball_query" or
 * "circle_nms" (kernels/paths.h). Returns the rows, ids ascending from 0 (AUTO), and their
 * number in *count; NULL (and *count 0) for any other name. */
const pcops_path_info* pcops_path_table(const char* op, int* count);

/* ------------------------------------------------------------------------------------------
 * Furthest point sampling (kernels/fps.c, kernels/fps.cu)
 *
 *   xyz[B,N,3], lengths[B]?, start[B]? -> idx[B,npoint] (int64), dist2[B,npoint] (dtype)
 *
 * Greedy FPS with a temp distance buffer temp[B,N] (min squared distance from each point to
 * the chosen set, starting at +inf; chosen points are set negative so they are never chosen
 * again, also when points repeat). Sample 0 is start[b] mod L (0 when start is NULL), where
 * L = min(max(lengths[b], 0), N) (N when lengths is NULL); sample j is the point with the
 * largest temp, ties to the lower index. dist2[b,j] is that largest temp when sample j was
 * chosen (0 for sample 0): the coverage radius curve. Slots j >= min(npoint, L) get idx -1
 * and dist2 0. dtype: FLOAT32 or FLOAT64. Squared distances that overflow between finite
 * points saturate at FLT_MAX / DBL_MAX (geometry.h), so temps and dist2 of a cloud of finite
 * points are finite from sample 1 on; a point with a non-finite coordinate keeps temp +inf.
 * ---------------------------------------------------------------------------------------- */

/* The FPS paths: kernels/fps_paths.h (the table), kernels/README.md (what each does and when
 * AUTO takes it). Every path returns the same bits; AUTO chooses by size (and device). Tests and
 * benchmarks force one through the *_path entry points. A path that does not exist on the
 * device, or cannot take the sizes, is an error (PCOPS_ERROR_INVALID_VALUE /
 * cudaErrorInvalidValue), never a silent substitute. */
typedef enum pcops_fps_path { PCOPS_FPS_PATHS(PCOPS_PATH_ENUM_FPS) PCOPS_FPS_PATH_END } pcops_fps_path;

/* Workspace of the CPU paths (any path). */
size_t pcops_fps_workspace_bytes(pcops_dtype dtype, int64_t B, int64_t N);

pcops_status pcops_fps_cpu(pcops_dtype dtype, const void* xyz, const int64_t* lengths,
                           const int64_t* start, int64_t B, int64_t N, int64_t npoint,
                           void* workspace, int64_t* idx, void* dist2);
/* The same with a forced path: AUTO, SIMPLE or TREE (pcops_fps_path). */
pcops_status pcops_fps_cpu_path(pcops_dtype dtype, const void* xyz, const int64_t* lengths,
                                   const int64_t* start, int64_t B, int64_t N, int64_t npoint,
                                   void* workspace, int64_t* idx, void* dist2, int path);

/* ------------------------------------------------------------------------------------------
 * k nearest neighbours (kernels/knn.c, kernels/knn.cu)
 *
 *   query[B,M,3], ref[B,N,3], query_lengths[B]?, ref_lengths[B]?
 *     -> dist2[B,M,K] (dtype), idx[B,M,K] (int64)
 *
 * For each valid query (m < query_lengths[b]) the K nearest valid refs (n < ref_lengths[b]),
 * sorted by (dist2, idx) ascending. Slots past the number of valid refs, and every slot of an
 * invalid query, hold idx -1 and dist2 +inf. Two points with finite coordinates have a
 * finite squared distance: an overflow saturates at FLT_MAX / DBL_MAX (geometry.h), so such
 * refs are neighbours, tied at the maximum in index order. A ref with a non-finite coordinate
 * (squared distance +inf or NaN) is never a neighbour. Ties go to the
 * lower index: the result is exactly the K smallest keys (dist2, idx), so the CPU and CUDA
 * return the same indices. dtype: FLOAT32 or FLOAT64. No cap on K.
 * ---------------------------------------------------------------------------------------- */
pcops_status pcops_knn_cpu(pcops_dtype dtype, const void* query, const void* ref,
                           const int64_t* query_lengths, const int64_t* ref_lengths, int64_t B,
                           int64_t M, int64_t N, int64_t K, void* dist2, int64_t* idx);

/* The kNN paths: kernels/knn_paths.h (the table), kernels/README.md (what each does and when
 * AUTO takes it). Every path returns the same result, bit for bit; tests and benchmarks force
 * one, AUTO chooses by size. A forced path that does not run on the device, does not take the
 * dtype or cannot take the sizes is an error, never a silent substitute. */
typedef enum pcops_knn_path { PCOPS_KNN_PATHS(PCOPS_PATH_ENUM_KNN) PCOPS_KNN_PATH_END } pcops_knn_path;

/* kNN with a chosen path (CPU: AUTO, BRUTE, GRID, GRID_BASELINE); pcops_knn_cpu is BRUTE. The
 * workspace (aligned to 256 bytes) is pcops_knn_cpu_workspace_bytes(...) of the same
 * arguments; 0 bytes (NULL allowed) for BRUTE and wherever AUTO picks it. */
size_t pcops_knn_cpu_workspace_bytes(pcops_dtype dtype, int64_t B, int64_t M, int64_t N,
                                     int64_t K, pcops_knn_path path);
pcops_status pcops_knn_cpu_path(pcops_dtype dtype, const void* query, const void* ref,
                                   const int64_t* query_lengths, const int64_t* ref_lengths,
                                   int64_t B, int64_t M, int64_t N, int64_t K,
                                   pcops_knn_path path, void* workspace, void* dist2,
                                   int64_t* idx);

/* ------------------------------------------------------------------------------------------
 * k nearest neighbours in any dimension (kernels/knn_nd.c, kernels/knn_nd.cu)
 *
 *   query[B,M,D], ref[B,N,D] (contiguous), query_lengths[B]?, ref_lengths[B]?
 *     -> dist[B,M,K] (dtype), idx[B,M,K] (int64)
 *
 * pcops_knn's contract for D >= 1 coordinates and a metric: the K smallest keys (dist, idx)
 * among the valid refs whose distance is below +inf, sorted, ties to the lower index, +inf /
 * -1 past them. The distance of a pair is computed in one fixed order (kernels/README.md,
 * "kNN in any dimension"), the same bits on the CPU and CUDA:
 *   L2:     sum over d of (a_d - b_d)^2, sequentially from d = 0, each product and sum rounded
 *           on its own (no FMA); for D = 3 the bits of pcops_dist2 (geometry.h);
 *   L1:     sum over d of |a_d - b_d|, sequentially;
 *   COSINE: max(0, 1 - dot / (sqrt(|a|^2) * sqrt(|b|^2))), the three sums sequential, each
 *           operation rounded; 1 when either norm is 0.
 * geometry.h's overflow rule holds for every metric: a pair of finite points never gets +inf
 * (a distance that overflows, or a NaN cosine, is FLT_MAX / DBL_MAX), a point with a
 * non-finite coordinate is never a neighbour (knn_nd.h).
 * pcops.knn takes these kernels for D != 3 and for metrics other than L2 (the 3-D L2 search
 * keeps the paths of pcops_knn_cpu_path / pcops_knn_cuda_run). Paths (pcops_knn_path): BRUTE
 * (every input), BRUTE_BLOCKED (CPU, float32, L2; knn_nd.c), TC (CUDA, the tensor-core
 * shortlist for L2 in feature space, below); AUTO lets the plan choose, a forced path that
 * cannot take the inputs is PCOPS_ERROR_INVALID_VALUE (CUDA: cudaErrorInvalidValue).
 * ---------------------------------------------------------------------------------------- */
typedef enum pcops_knn_metric {
    PCOPS_KNN_L2 = 0,
    PCOPS_KNN_L1 = 1,
    PCOPS_KNN_COSINE = 2
} pcops_knn_metric;

pcops_status pcops_knn_nd_cpu(pcops_dtype dtype, const void* query, const void* ref,
                              const int64_t* query_lengths, const int64_t* ref_lengths,
                              int64_t B, int64_t M, int64_t N, int64_t D, int64_t K,
                              pcops_knn_metric metric, pcops_knn_path path, void* dist,
                              int64_t* idx);

/* ------------------------------------------------------------------------------------------
 * FPS and ball query in any dimension (kernels/fps_nd.c, fps_nd.cu, ball_query_nd.c,
 * ball_query_nd.cu)
 *
 *   FPS:        xyz[B,N,D], lengths[B]?, start[B]? -> idx[B,npoint] (int64), dist2[B,npoint]
 *   ball query: query[B,M,D], ref[B,N,D], lengths? -> idx[B,M,S] (int64), count[B,M] (int64),
 *               dist2[B,M,S]?
 * The contracts of pcops_fps_cpu and pcops_ball_query_cpu for D >= 1 coordinates (contiguous,
 * a point's D coordinates adjacent). The squared distance of a pair is the sum over d = 0 ..
 * D-1 in order from +0, each product and sum rounded on its own (knn_nd.h, knn_nd_l2): for
 * D = 3 the bits of pcops_dist2, so these kernels choose what the 3-D paths choose. The
 * overflow rule of geometry.h holds (a finite pair's distance saturates at the type's max, a
 * non-finite point's temp stays +inf in FPS and is never in a ball).
 * One path each (the simple one); pcops takes them for D != 3.
 * pcops_ball_query_nd_cpu with dist2 == NULL: pcops_ball_query's layout (empty slots repeat
 * the first neighbour); with dist2: ball_query_dist2's (PyTorch3D's: empty slots idx -1 and
 * dist2 0, the found slots' squared distances).
 * FPS's workspace: pcops_fps_nd_workspace_bytes (the same on both devices).
 * ---------------------------------------------------------------------------------------- */
size_t pcops_fps_nd_workspace_bytes(pcops_dtype dtype, int64_t B, int64_t N);
pcops_status pcops_fps_nd_cpu(pcops_dtype dtype, const void* xyz, const int64_t* lengths,
                              const int64_t* start, int64_t B, int64_t N, int64_t D,
                              int64_t npoint, void* workspace, int64_t* idx, void* dist2);
pcops_status pcops_ball_query_nd_cpu(pcops_dtype dtype, const void* query, const void* ref,
                                     const int64_t* query_lengths, const int64_t* ref_lengths,
                                     int64_t B, int64_t M, int64_t N, int64_t D, double radius2,
                                     int64_t S, int64_t* idx, int64_t* count, void* dist2);

/* ------------------------------------------------------------------------------------------
 * Ball query (kernels/ball_query.c, kernels/ball_query.cu)
 *
 *   query[B,M,3], ref[B,N,3], lengths? -> idx[B,M,S] (int64), count[B,M] (int64)
 *
 * The first S valid refs in index order with squared distance < radius2 (compared in dtype:
 * (T)radius2; an overflow between finite points saturates at FLT_MAX / DBL_MAX, geometry.h,
 * so it is inside only when (T)radius2 itself is +inf; a non-finite ref never is). Empty
 * slots repeat the first neighbour found; a query with no neighbour (or an invalid query) gets
 * -1 everywhere and count 0. count is the number found, capped at S.
 * dtype: FLOAT32 or FLOAT64.
 * ---------------------------------------------------------------------------------------- */
pcops_status pcops_ball_query_cpu(pcops_dtype dtype, const void* query, const void* ref,
                                  const int64_t* query_lengths, const int64_t* ref_lengths,
                                  int64_t B, int64_t M, int64_t N, double radius2, int64_t S,
                                  int64_t* idx, int64_t* count);

/* The ball-query paths: kernels/ball_query_paths.h, kernels/README.md; the same rules as kNN's. */
typedef enum pcops_ball_query_path {
    PCOPS_BALL_QUERY_PATHS(PCOPS_PATH_ENUM_BALL_QUERY) PCOPS_BALL_QUERY_PATH_END
} pcops_ball_query_path;

/* Ball query with a chosen path (CPU: AUTO, BRUTE, GRID; pcops_ball_query_cpu is BRUTE);
 * workspace as for kNN. */
size_t pcops_ball_query_cpu_workspace_bytes(pcops_dtype dtype, int64_t B, int64_t M, int64_t N,
                                            double radius2, int64_t S,
                                            pcops_ball_query_path path);
pcops_status pcops_ball_query_cpu_path(pcops_dtype dtype, const void* query, const void* ref,
                                          const int64_t* query_lengths,
                                          const int64_t* ref_lengths, int64_t B, int64_t M,
                                          int64_t N, double radius2, int64_t S,
                                          pcops_ball_query_path path, void* workspace,
                                          int64_t* idx, int64_t* count);

/* ------------------------------------------------------------------------------------------
 * Group (kernels/group.c, kernels/group.cu)
 *
 * Forward:  features[B,N,C], idx[B,M,S] -> out[B,M,S,C],  out[b,m,s,:] = features[b,idx,:]
 *           (zeros where idx is -1 or out of range). Any dtype: the forward copies elements
 *           of pcops_dtype_size(dtype) bytes.
 * Backward: grad_out[B,M,S,C], idx[B,M,S] -> grad_features[B,N,C],
 *           grad_features[b,n,:] = sum of grad_out[b,m,s,:] over the (m,s) with idx[b,m,s]==n,
 *           added in ascending (m,s) order starting from 0 -- a fixed order, so the result is
 *           the same bits on every run and on CPU and CUDA. No floating-point atomics.
 *           All four dtypes; half types accumulate in float32 and are rounded once at the
 *           end, to nearest even. grad_features has the dtype of grad_out, on the CPU and on
 *           CUDA. Indices outside [0, N) add nothing. Scratch: on the CPU, for half types
 *           only, pcops_group_backward_cpu_workspace_bytes(dtype, B, N, C) bytes (the float32
 *           sums; 0, and NULL is fine, for float32/float64); on CUDA,
 *           pcops_group_backward_cuda_workspace_bytes(B, N, M, S) bytes (sort keys and
 *           positions of the B*M*S slots, B*N+1 segment offsets, cub's radix-sort storage).
 * idx is int64 or int32 (idx_dtype), the same rule for the forward and the backward.
 * ---------------------------------------------------------------------------------------- */
pcops_status pcops_group_cpu(pcops_dtype dtype, const void* features, const void* idx,
                             pcops_index_dtype idx_dtype, int64_t B, int64_t N, int64_t C,
                             int64_t M, int64_t S, void* out);

size_t pcops_group_backward_cpu_workspace_bytes(pcops_dtype dtype, int64_t B, int64_t N,
                                              int64_t C);
pcops_status pcops_group_backward_cpu(pcops_dtype dtype, const void* grad_out,
                                      const void* idx, pcops_index_dtype idx_dtype, int64_t B,
                                      int64_t N, int64_t C, int64_t M, int64_t S, void* workspace,
                                      void* grad_features);

/* ------------------------------------------------------------------------------------------
 * Circle NMS (kernels/circle_nms.c, kernels/circle_nms.cu)
 *
 *   centers[N,D] (D >= 2, only x and y are used), scores[N] (score_dtype: FLOAT32 or FLOAT64),
 *   groups[N]? -> keep_mask[N] (bool, in original index order), keep_idx[N] (int64, kept
 *   indices in visiting order, the first *num_kept valid, the rest -1), num_kept[1] (int64).
 *
 * Greedy: visit boxes by descending score (equal scores: lower index first; NaN scores first,
 * as torch.sort(descending=True) ranks them; -0.0 equals +0.0); keep a box unless an already
 * kept box of the same group lies within squared xy distance < radius2 (compared in dtype:
 * d = dx*dx + dy*dy < (T)radius2). groups NULL: one group. dtype: FLOAT32 or FLOAT64. The
 * visiting order is computed inside (kernels/circle_nms.h has its key). keep_mask or keep_idx
 * may be NULL (not written); every element of the outputs given is written.
 *
 * CPU: one thread; a stable radix sort of the score keys, then the boxes sorted by group and y
 * and cut into rows less than a radius tall, each row sorted by x, so that a kept box tests
 * only its band of x in its row and the two next to it: O(N) sorts, a few binary searches and
 * about a dozen distance tests per box whatever the layout; workspace O(N).
 * CUDA: see pcops_circle_nms_cuda_path below; no host synchronisation (*num_kept is
 * written on the device, once: by the grid and block paths before keep_mask / keep_idx, by the
 * flow path as soon as every block has counted its kept boxes, so a host polling it in mapped
 * memory learns the size early; the outputs are complete when the launch is, in stream order).
 * N <= PCOPS_CIRCLE_NMS_CUDA_MAX.
 * ---------------------------------------------------------------------------------------- */
/* The circle-NMS paths: kernels/circle_nms_paths.h (the table), kernels/README.md. */
typedef enum pcops_circle_nms_path {
    PCOPS_CIRCLE_NMS_PATHS(PCOPS_PATH_ENUM_CIRCLE_NMS) PCOPS_CIRCLE_NMS_PATH_END
} pcops_circle_nms_path;

size_t pcops_circle_nms_workspace_bytes(pcops_dtype dtype, int64_t N);

pcops_status pcops_circle_nms_cpu(pcops_dtype dtype, const void* centers, int64_t D,
                                  pcops_dtype score_dtype, const void* scores,
                                  const int64_t* groups, int64_t N, double radius2,
                                  void* workspace, bool* keep_mask, int64_t* keep_idx,
                                  int64_t* num_kept);

/* ------------------------------------------------------------------------------------------
 * Interpolate (kernels/interpolate.c, kernels/interpolate.cu): PointNet++ feature propagation
 *
 *   features[B,N,C], idx[B,M,K] (int64 or int32: idx_dtype), weight[B,M,K] -> out[B,M,C],
 *   out[b,m,c] = sum over k of weight[b,m,k] * features[b, idx[b,m,k], c]
 *
 * The products are added in ascending k starting from 0, without FMA contraction, so the CPU
 * and CUDA give the same bits. Slots with an index outside [0, N) (-1) add nothing.
 * dtype: FLOAT32 or FLOAT64 (features and weight share it). The backward is composed by the
 * caller from group / group_backward (deterministic).
 * ---------------------------------------------------------------------------------------- */
pcops_status pcops_interpolate_cpu(pcops_dtype dtype, const void* features, const void* idx,
                                   pcops_index_dtype idx_dtype, const void* weight, int64_t B,
                                   int64_t N, int64_t C, int64_t M, int64_t K, void* out);

/* ------------------------------------------------------------------------------------------
 * Neighbour distances (kernels/neighbor_dist2.c, kernels/neighbor_dist2.cu)
 *
 *   query[B,M,3], ref[B,N,3], idx[B,M,S] (int64 or int32: idx_dtype) -> dist2[B,M,S],
 *   dist2[b,m,s] = |query[b,m] - ref[b, idx[b,m,s]]|^2, 0 where idx lies outside [0, N)
 *
 * The distance of the searches (geometry.h's pcops_dist2, with its overflow rule: an overflow
 * between finite points is FLT_MAX / DBL_MAX), so a kNN's or ball query's neighbours get their
 * search distances bit for bit. dtype: FLOAT32 or FLOAT64 (query, ref
 * and dist2 share it). The backward is composed by the caller from group / group_backward.
 * ---------------------------------------------------------------------------------------- */
pcops_status pcops_neighbor_dist2_cpu(pcops_dtype dtype, const void* query, const void* ref,
                                      const void* idx, pcops_index_dtype idx_dtype, int64_t B,
                                      int64_t M, int64_t N, int64_t S, void* dist2);
/* The same for a ball query's int64 idx[B,M,S] and count[B,M] (ball_query_dist2): slots
 * s >= count[b,m] are emptied, idx[b,m,s] = -1 (written in place) and dist2 0 -- PyTorch3D's
 * padding of its ball query; the others as above. */
pcops_status pcops_neighbor_dist2_count_cpu(pcops_dtype dtype, const void* query, const void* ref,
                                            int64_t* idx, const int64_t* count, int64_t B,
                                            int64_t M, int64_t N, int64_t S, void* dist2);

/* ------------------------------------------------------------------------------------------
 * pointnet2_ops's three_nn layout of a kNN result (kernels/three_nn_pointnet2.c,
 * kernels/three_nn_pointnet2.cu): the conversion half of the three_nn_pointnet2 op, after a
 * kNN with k = 3.
 *
 *   dist2[n] (dtype), idx[n] int64 -> dist[n] (dtype), idx32[n] int32
 *
 * dist[i] = sqrt(dist2[i]), correctly rounded (sqrtf / sqrt on the CPU, __fsqrt_rn /
 * __dsqrt_rn on CUDA: the same bits); idx32[i] = idx[i] as int32, 0 where idx[i] < 0 (a kNN's
 * empty slot, whose dist2 +inf gives dist +inf: pointnet2_ops's padding). idx values must fit
 * in int32 (a kNN's do: N <= 2**31 - 1). dist may be dist2 (converted in place); idx32 must
 * not overlap idx. dtype: FLOAT32 or FLOAT64.
 * ---------------------------------------------------------------------------------------- */
pcops_status pcops_three_nn_pointnet2_cpu(pcops_dtype dtype, const void* dist2,
                                          const int64_t* idx, int64_t n, void* dist,
                                          int32_t* idx32);

/* ------------------------------------------------------------------------------------------
 * Neighbour edges (kernels/neighbor_edges.c, kernels/neighbor_edges.cu)
 *
 *   idx[B,M,S] int64, count[B,M]? -> edges[2,E] int64: an edge per slot (b,m,s) with
 *   0 <= idx[b,m,s] < N and, when count is given, s < count[b,m], in (b,m,s) order:
 *   edges[0,e] = row_offset[b] + m (b*M + m without row_offset),
 *   edges[1,e] = col_offset[b] + idx[b,m,s] (b*N + idx without col_offset).
 *
 * The COO form of a kNN's or ball query's neighbours (torch_cluster's edge_index). E depends on
 * the data, so two calls around one read of it: _count writes ends[B*M], ends[r] = the number
 * of edges of the rows r' <= r (row r = b*M + m), E = ends[B*M - 1]; the caller allocates
 * edges [2, E] and _write fills it. count, row_offset, col_offset may be NULL.
 * ---------------------------------------------------------------------------------------- */
pcops_status pcops_neighbor_edges_count_cpu(const int64_t* idx, const int64_t* count, int64_t B,
                                            int64_t M, int64_t N, int64_t S, int64_t* ends);
pcops_status pcops_neighbor_edges_write_cpu(const int64_t* idx, const int64_t* count,
                                            const int64_t* row_offset, const int64_t* col_offset,
                                            int64_t B, int64_t M, int64_t N, int64_t S,
                                            const int64_t* ends, int64_t* edges);

/* ------------------------------------------------------------------------------------------
 * FPS layout (kernels/fps_layout.c, kernels/fps_layout.cu): what torch_cluster's fps over a
 * batch vector needs before its one host synchronisation, in one call.
 *
 *   batch[N] int64 -> stats[PCOPS_FPS_LAYOUT_STATS], left[N], slot[N] int64:
 *   stats: PROBLEMS the number of steps down (batch[i] < batch[i-1]) plus 1 if batch[0] < 0
 *          (0 for a valid vector), FIRST / LAST batch[0] / batch[N-1], LARGEST L the largest
 *          cloud, SAMPLED E = sum_b k_b, SAMPLES_LARGEST K = k(L), where a cloud b of n_b
 *          points takes k_b = ceil(n_b * ratio) samples rounded in `dtype` as torch_cluster
 *          does (kernels/fps_layout.h), none when 0 <= batch_size <= b;
 *   left[i]: the first point of point i's cloud; slot[i] = b*K + rank (rank = i - left[i]) if
 *          rank < k_b (point i is the rank-th sample of its cloud b), else -1.
 * With PROBLEMS > 0 only stats FIRST / LAST / PROBLEMS are defined; the other outputs are
 * unspecified (nothing is read or written out of range).
 * N = 0: all stats 0.
 * ---------------------------------------------------------------------------------------- */
enum {
    PCOPS_FPS_LAYOUT_PROBLEMS = 0,
    PCOPS_FPS_LAYOUT_FIRST = 1,
    PCOPS_FPS_LAYOUT_LAST = 2,
    PCOPS_FPS_LAYOUT_LARGEST = 3,
    PCOPS_FPS_LAYOUT_SAMPLED = 4,
    PCOPS_FPS_LAYOUT_SAMPLES_LARGEST = 5,
    PCOPS_FPS_LAYOUT_STATS = 6
};
pcops_status pcops_fps_layout_cpu(const int64_t* batch, int64_t N, double ratio,
                                  pcops_dtype dtype, int64_t batch_size, int64_t* stats,
                                  int64_t* left, int64_t* slot);

#ifdef PCOPS_HAVE_CUDA_API
/* ------------------------------------------------------------------------------------------
 * CUDA launchers: same arguments and semantics as the CPU functions above, all pointers on
 * the device, plus the stream to launch on. Workspace sizes may differ from the CPU's: use
 * the _cuda_workspace_bytes functions.
 * ---------------------------------------------------------------------------------------- */
/* FPS on CUDA goes through a launch plan: pcops_fps_cuda_make_plan chooses the path and its
 * shape once, from the sizes, the dtype and the current device (path: pcops_fps_path,
 * AUTO to choose by size), and returns it with the workspace size; pcops_fps_cuda_run launches
 * exactly that plan. A forced path that cannot take the sizes (points that do not fit the
 * registers, no clusters on the device, a grid that is not co-resident) or any
 * N > 2**31 - 1 returns cudaErrorInvalidValue. Every plan returns the same bits. */
typedef struct pcops_fps_cuda_plan {
    int path;               /* the path: SIMPLE, WARP, BLOCK, BLOCK_PRUNED, CLUSTER, GRID,
                               BUCKET, BUCKET_GROUPS, BUCKET_ROUNDS or BUCKET_ROUNDS_CLUSTER
                               (never AUTO) */
    int threads;            /* threads per block */
    int points_per_thread;  /* register slots per thread; 0: temp lives in the workspace;
                               BUCKET, BUCKET_GROUPS, BUCKET_ROUNDS*: points per lane of a
                               bucket (a bucket is 32 times that) */
    int bucket_slots;       /* BUCKET: buckets each thread keeps (box and candidate);
                               BUCKET_GROUPS, BUCKET_ROUNDS*: buckets a lane (its group, 1, 2,
                               4 or 8) */
    int warps_per_cloud;    /* WARP / BLOCK / BLOCK_PRUNED: warps sharing one cloud */
    int clouds_per_block;   /* WARP / BLOCK: clouds of one block */
    int blocks_per_cloud;   /* CLUSTER, BUCKET_ROUNDS_CLUSTER: the cluster size; GRID: the
                               blocks of the grid; BUCKET_ROUNDS: 1 */
    int64_t blocks;         /* blocks launched */
    pcops_dtype dtype;
    int64_t B, N;
    size_t workspace_bytes; /* bytes of device workspace pcops_fps_cuda_run needs */
    size_t smem_bytes;      /* BLOCK_PRUNED, BUCKET*: shared memory a block takes, static and
                               dynamic, within the device's opt-in limit (the plan refuses
                               more); 0 for the other paths (a few KiB at most) */
} pcops_fps_cuda_plan;

cudaError_t pcops_fps_cuda_make_plan(pcops_dtype dtype, int64_t B, int64_t N, int64_t npoint,
                                     int path, pcops_fps_cuda_plan* plan);
/* dtype, B and N must be the plan's. */
cudaError_t pcops_fps_cuda_run(const pcops_fps_cuda_plan* plan, pcops_dtype dtype,
                               const void* xyz, const int64_t* lengths, const int64_t* start,
                               int64_t B, int64_t N, int64_t npoint, void* workspace,
                               int64_t* idx, void* dist2, cudaStream_t stream);

/* kNN on CUDA: M, N and K at most INT_MAX (cudaErrorInvalidValue otherwise). The workspace
 * holds the partial lists of queries whose refs are split over several threads (few queries,
 * many refs); its size (0 for most calls) depends on the current device's SM count. */
size_t pcops_knn_cuda_workspace_bytes(pcops_dtype dtype, int64_t B, int64_t M, int64_t N,
                                      int64_t K);
/* The launch plan of a kNN call: made once from the sizes, the current device and a path
 * (AUTO: by size); says what runs and how much workspace it needs (allocate
 * plan.workspace_bytes, then run the plan). pcops_knn_cuda_workspace_bytes / pcops_knn_cuda
 * are the same with AUTO. No host synchronisation: the GRID path sizes its cells from N and k
 * and computes boxes and cell sizes on the device. */
typedef struct pcops_knn_cuda_plan {
    pcops_dtype dtype;
    int64_t B, M, N, K;
    pcops_knn_path path;          /* what runs (never AUTO) */
    int64_t splits;               /* BRUTE: ref ranges per query */
    int64_t cells;                /* GRID: cell budget per cloud */
    int64_t small_build;          /* GRID: 1 = one block a cloud builds its grid (small clouds) */
    size_t workspace_bytes;
    int device, sms, smem_optin;
} pcops_knn_cuda_plan;
cudaError_t pcops_knn_cuda_plan_make(pcops_dtype dtype, int64_t B, int64_t M, int64_t N,
                                     int64_t K, pcops_knn_path path,
                                     pcops_knn_cuda_plan* plan);
cudaError_t pcops_knn_cuda_run(const pcops_knn_cuda_plan* plan, const void* query,
                               const void* ref, const int64_t* query_lengths,
                               const int64_t* ref_lengths, void* workspace, void* dist2,
                               int64_t* idx, cudaStream_t stream);
cudaError_t pcops_knn_cuda(pcops_dtype dtype, const void* query, const void* ref,
                           const int64_t* query_lengths, const int64_t* ref_lengths, int64_t B,
                           int64_t M, int64_t N, int64_t K, void* workspace, void* dist2,
                           int64_t* idx, cudaStream_t stream);

/* kNN in any dimension on CUDA (the contract above pcops_knn_nd_cpu): M, N, K at most INT_MAX,
 * D at least 1. Two paths (kernels/knn_nd.cu): BRUTE, the reference (no workspace), and TC,
 * the tensor-core shortlist re-ranked exactly (L2, float32, 16 <= D <= 65536, K <= 64, sm_80+;
 * the same bits). The plan is made from the sizes, the current device and a path (AUTO: the
 * tuning table's choice; a forced path that cannot run: cudaErrorInvalidValue); allocate
 * plan.workspace_bytes, then run it. No host synchronisation. */
typedef struct pcops_knn_nd_cuda_plan {
    pcops_dtype dtype;
    int64_t B, M, N, D, K;
    pcops_knn_metric metric;
    pcops_knn_path path;    /* what runs: BRUTE or TC (never AUTO) */
    int64_t capacity;       /* TC: shortlist entries a query */
    size_t workspace_bytes; /* device workspace pcops_knn_nd_cuda_run needs */
} pcops_knn_nd_cuda_plan;
cudaError_t pcops_knn_nd_cuda_plan_make(pcops_dtype dtype, int64_t B, int64_t M, int64_t N,
                                        int64_t D, int64_t K, pcops_knn_metric metric,
                                        pcops_knn_path path, pcops_knn_nd_cuda_plan* plan);
cudaError_t pcops_knn_nd_cuda_run(const pcops_knn_nd_cuda_plan* plan, const void* query,
                                  const void* ref, const int64_t* query_lengths,
                                  const int64_t* ref_lengths, void* workspace, void* dist,
                                  int64_t* idx, cudaStream_t stream);

/* FPS and ball query in any dimension on CUDA (the contracts above pcops_fps_nd_cpu): N, M
 * at most INT_MAX; FPS takes start modulo lengths[b] (unchecked values); no host
 * synchronisation. */
cudaError_t pcops_fps_nd_cuda(pcops_dtype dtype, const void* xyz, const int64_t* lengths,
                              const int64_t* start, int64_t B, int64_t N, int64_t D,
                              int64_t npoint, void* workspace, int64_t* idx, void* dist2,
                              cudaStream_t stream);
cudaError_t pcops_ball_query_nd_cuda(pcops_dtype dtype, const void* query, const void* ref,
                                     const int64_t* query_lengths, const int64_t* ref_lengths,
                                     int64_t B, int64_t M, int64_t N, int64_t D, double radius2,
                                     int64_t S, int64_t* idx, int64_t* count, void* dist2,
                                     cudaStream_t stream);

cudaError_t pcops_ball_query_cuda(pcops_dtype dtype, const void* query, const void* ref,
                                  const int64_t* query_lengths, const int64_t* ref_lengths,
                                  int64_t B, int64_t M, int64_t N, double radius2, int64_t S,
                                  int64_t* idx, int64_t* count, cudaStream_t stream);
/* Ball query with a plan (pcops_ball_query_cuda is BRUTE, no workspace): made once from the
 * sizes and a path (AUTO: by size); allocate plan.workspace_bytes and run it. No host
 * synchronisation (the grid's cells come from N; boxes and cell sizes from the device). */
typedef struct pcops_ball_query_cuda_plan {
    pcops_dtype dtype;
    int64_t B, M, N, S;
    double radius2;
    pcops_ball_query_path path;   /* what runs: BRUTE, BRUTE_SPLIT, SPLIT_SORTED or GRID */
    int64_t cells;                /* GRID: cell budget per cloud */
    int64_t warps;                /* BRUTE_SPLIT, SPLIT_SORTED: warps a block (ranges of the refs) */
    int64_t order_bits;           /* SPLIT_SORTED: bits per axis of the queries' spatial order */
    size_t workspace_bytes;
} pcops_ball_query_cuda_plan;
cudaError_t pcops_ball_query_cuda_plan_make(pcops_dtype dtype, int64_t B, int64_t M, int64_t N,
                                            double radius2, int64_t S,
                                            pcops_ball_query_path path,
                                            pcops_ball_query_cuda_plan* plan);
cudaError_t pcops_ball_query_cuda_run(const pcops_ball_query_cuda_plan* plan, const void* query,
                                      const void* ref, const int64_t* query_lengths,
                                      const int64_t* ref_lengths, void* workspace, int64_t* idx,
                                      int64_t* count, cudaStream_t stream);

cudaError_t pcops_group_cuda(pcops_dtype dtype, const void* features, const void* idx,
                             pcops_index_dtype idx_dtype, int64_t B, int64_t N, int64_t C,
                             int64_t M, int64_t S, void* out, cudaStream_t stream);

size_t pcops_group_backward_cuda_workspace_bytes(int64_t B, int64_t N, int64_t M, int64_t S);
cudaError_t pcops_group_backward_cuda(pcops_dtype dtype, const void* grad_out,
                                      const void* idx, pcops_index_dtype idx_dtype, int64_t B,
                                      int64_t N, int64_t C, int64_t M, int64_t S, void* workspace,
                                      void* grad_features, cudaStream_t stream);

/* Circle NMS on CUDA through `path` (pcops_circle_nms_path; kernels/circle_nms/plan.cuh):
 *   AUTO (0): what pcops_circle_nms_cuda does: FLOW up to 4096 boxes (on sm_80 / sm_90), GRID
 *     above;
 *   GRID: any N <= PCOPS_CIRCLE_NMS_CUDA_MAX; two cub radix sorts (score, then bucket of a
 *     hashed grid of cells a radius wide), then rounds in which a few boxes of each cell are
 *     kept when no earlier neighbour is undecided and the boxes kept remove their later
 *     neighbours, an in-order finish for what the rounds leave (boxes on a line visited along it:
 *     64 boxes a step); about the work of uniform boxes whatever the layout, a workspace of
 *     about 120 bytes per box;
 *   BLOCK: N <= PCOPS_CIRCLE_NMS_CUDA_BLOCK_MAX; one thread block, one launch, no workspace:
 *     the score sort in registers, a grid by counting sort, the greedy by one warp per 64-box
 *     row block over lists of each block's earlier neighbours (a scan of the kept boxes'
 *     neighbourhoods where the lists do not fit in shared memory);
 *   FLOW: N <= PCOPS_CIRCLE_NMS_CUDA_FLOW_MAX; one cooperative launch of ceil(N / 32) blocks,
 *     each testing its 32 boxes against the earlier ones and deciding them as the states of
 *     their earlier neighbours are published by the other blocks; a workspace of about 4.4
 *     bytes per box; BLOCK where its blocks cannot all be resident.
 * Every path returns the same bits. cudaErrorInvalidValue for a path that cannot take N (or
 * does not run on CUDA: SWEEP). num_kept may be NULL too (circle_nms_mask needs only the
 * mask). */
#define PCOPS_CIRCLE_NMS_CUDA_BLOCK_MAX 4096
#define PCOPS_CIRCLE_NMS_CUDA_FLOW_MAX 4096
#define PCOPS_CIRCLE_NMS_CUDA_MAX ((int64_t)65535 * 64) /* the grid path's int32 positions */
size_t pcops_circle_nms_cuda_workspace_bytes(pcops_dtype dtype, pcops_dtype score_dtype,
                                             int64_t N, int path);
cudaError_t pcops_circle_nms_cuda_path(pcops_dtype dtype, const void* centers, int64_t D,
                                          pcops_dtype score_dtype, const void* scores,
                                          const int64_t* groups, int64_t N, double radius2,
                                          void* workspace, bool* keep_mask, int64_t* keep_idx,
                                          int64_t* num_kept, int path, cudaStream_t stream);
cudaError_t pcops_circle_nms_cuda(pcops_dtype dtype, const void* centers, int64_t D,
                                  pcops_dtype score_dtype, const void* scores,
                                  const int64_t* groups, int64_t N, double radius2,
                                  void* workspace, bool* keep_mask, int64_t* keep_idx,
                                  int64_t* num_kept, cudaStream_t stream);
/* Interpolate on CUDA (see pcops_interpolate_cpu). */
cudaError_t pcops_interpolate_cuda(pcops_dtype dtype, const void* features, const void* idx,
                                   pcops_index_dtype idx_dtype, const void* weight, int64_t B,
                                   int64_t N, int64_t C, int64_t M, int64_t K, void* out,
                                   cudaStream_t stream);
/* The half-output cap of the overflow rule (dist_cap.cu): every value of values[0, n) above
 * top and below +inf becomes top (+inf and NaN stay), in place, on `stream`. */
cudaError_t pcops_dist_cap_cuda(float* values, int64_t n, float top, cudaStream_t stream);
/* Neighbour distances on CUDA (see pcops_neighbor_dist2_cpu). */
cudaError_t pcops_neighbor_dist2_cuda(pcops_dtype dtype, const void* query, const void* ref,
                                      const void* idx, pcops_index_dtype idx_dtype, int64_t B,
                                      int64_t M, int64_t N, int64_t S, void* dist2,
                                      cudaStream_t stream);
cudaError_t pcops_neighbor_dist2_count_cuda(pcops_dtype dtype, const void* query, const void* ref,
                                            int64_t* idx, const int64_t* count, int64_t B,
                                            int64_t M, int64_t N, int64_t S, void* dist2,
                                            cudaStream_t stream);
/* kNN to pointnet2_ops's three_nn layout on CUDA (see pcops_three_nn_pointnet2_cpu). */
cudaError_t pcops_three_nn_pointnet2_cuda(pcops_dtype dtype, const void* dist2,
                                          const int64_t* idx, int64_t n, void* dist,
                                          int32_t* idx32, cudaStream_t stream);
/* Neighbour edges on CUDA (see pcops_neighbor_edges_count_cpu): _count also takes a workspace
 * of pcops_neighbor_edges_cuda_workspace_bytes(B, M) bytes (B*M at most 2**31 - 1 rows); _write
 * takes E, read by the caller from ends[B*M - 1] after _count (its one host synchronisation). */
size_t pcops_neighbor_edges_cuda_workspace_bytes(int64_t B, int64_t M);
cudaError_t pcops_neighbor_edges_count_cuda(const int64_t* idx, const int64_t* count, int64_t B,
                                            int64_t M, int64_t N, int64_t S, void* workspace,
                                            int64_t* ends, cudaStream_t stream);
cudaError_t pcops_neighbor_edges_write_cuda(const int64_t* idx, const int64_t* count,
                                            const int64_t* row_offset, const int64_t* col_offset,
                                            int64_t B, int64_t M, int64_t N, int64_t S,
                                            const int64_t* ends, int64_t E, int64_t* edges,
                                            cudaStream_t stream);
/* FPS layout on CUDA (see pcops_fps_layout_cpu): N at most 2**31 - 1; stats is device
 * memory, read by the caller (its one host synchronisation). */
cudaError_t pcops_fps_layout_cuda(const int64_t* batch, int64_t N, double ratio,
                                  pcops_dtype dtype, int64_t batch_size, int64_t* stats,
                                  int64_t* left, int64_t* slot, cudaStream_t stream);
#endif /* PCOPS_HAVE_CUDA_API */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PCOPS_H */
