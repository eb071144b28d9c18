/*
 * ball_query/common.cuh -- what the CUDA ball-query paths share (kernels/ball_query.cu includes
 * it before them).
 *
 * B = batch, M = queries, N = reference points, S = nsample.
 * query[B,M,3], ref[B,N,3] -> idx[B,M,S] (int64), count[B,M] (int64).
 *
 * Every path returns the CPU's result (kernels/ball_query.c), bit for bit: the first S valid
 * refs in index order with d = pcops_dist2(ref, query) < (T)radius2 (geometry.h: no FMA
 * contraction; NaN is never in range), empty slots repeating the first neighbour, -1
 * everywhere (count 0) for a query with no neighbour and for an invalid query. Here: the
 * distance, the block shape of the warp-per-query kernels, and the interface every path
 * implements (BallQueryPath).
 */
#pragma once

#include <cstdint>

#include <cmath>

#include "../geometry.h"
#include "../grid/common.cuh"
#include "../pcops.h"

namespace {

using pcops_grid_cuda::Point4;  // x, y, z and the point's index in w:
using pcops_grid_cuda::index_as;  // the index into w
using pcops_grid_cuda::point_id;  // and back

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;  // also the tile length in refs
constexpr unsigned kFullMask = 0xffffffffu;

// geometry.h's squared distance (a - b, the CPU's bits), by type.
__device__ __forceinline__ float dist2(float ax, float ay, float az, float bx, float by, float bz) {
    return pcops_dist2_f32(ax, ay, az, bx, by, bz);
}
__device__ __forceinline__ double dist2(double ax, double ay, double az, double bx, double by,
                                        double bz) {
    return pcops_dist2_f64(ax, ay, az, bx, by, bz);
}

// A point's x as the searches stage it where they load it (geometry.h's overflow rule): NaN
// when a coordinate is not finite, so that every distance to it is NaN, never inside.
__device__ __forceinline__ float staged_x(float x, float y, float z) {
    return pcops_staged_x_f32(x, y, z);
}
__device__ __forceinline__ double staged_x(double x, double y, double z) {
    return pcops_staged_x_f64(x, y, z);
}

// The largest distance inside a ball of squared radius r2 (>= +0 or +inf): for a finite r2,
// d < r2 is d <= ball_limit(r2) (the value below r2; -1 below +0), and the raw distance decides
// as the saturated one would. For r2 = +inf (radius**2 overflowed) it is +inf, so that every
// distance but NaN is inside: with the points staged, exactly the finite points, also those
// whose distance overflowed (saturated, geometry.h). No distance is saturated on the way.
// Computed by the launchers and passed to the kernels (a kernel argument costs no register).
template <typename T>
T ball_limit(T r2) {
    return r2 == T(INFINITY) ? r2 : r2 > T(0) ? std::nextafter(r2, T(0)) : T(-1);
}

// ------------------------------------------------------------------------------------------
// The interface of a path

// The inputs a plan is made for.
struct BallQuerySizes {
    pcops_dtype dtype;
    int64_t B, M, N, S;
};

// The buffers of a launch (the plan holds the sizes and the radius).
template <typename T>
struct BallQueryArgs {
    const T* query;
    const T* ref;
    const int64_t* query_lengths;
    const int64_t* ref_lengths;
    void* workspace;
    int64_t* idx;
    int64_t* count;
    cudaStream_t stream;
};

// Each path (kernels/ball_query/<path>.cuh) specialises BallQueryPath for its row of
// kernels/ball_query_paths.h:
//   static constexpr bool kGrid     whether it walks a grid (the plan then sizes the grid, and
//                                    checks that its keys fit int32);
//   static bool takes(const BallQuerySizes&)  whether it can run these inputs (S bounds, index
//                                    widths): eligibility; which eligible path is fastest is
//                                    ball_query/plan.cuh's preference;
//   template <typename T>
//   static cudaError_t launch(const pcops_ball_query_cuda_plan&, const BallQueryArgs<T>&)
// AUTO keeps this primary template (the plan chooses; it never runs as such).
template <pcops_ball_query_path P>
struct BallQueryPath {
    static constexpr bool kGrid = false;
    static bool takes(const BallQuerySizes&) { return false; }
    template <typename T>
    static cudaError_t launch(const pcops_ball_query_cuda_plan&, const BallQueryArgs<T>&) {
        return cudaErrorInvalidValue;
    }
};

}  // namespace
