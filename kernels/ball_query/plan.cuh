/*
 * ball_query/plan.cuh -- the ball-query plan: from the sizes, the dtype and the device, the path
 * that runs and its launch shape (warps a block of the split kernels, the query order's bits,
 * grid cells, the workspace), before anything is launched. kernels/ball_query.cu includes it
 * after the path headers (their BallQueryPath::takes).
 *
 * Two questions, in this order:
 *  1. eligibility -- may a path run these inputs: its own bounds (BallQueryPath<P>::takes: the
 *     split kernels' S <= 64 and int32 indices) and, for the grid, whether its keys
 *     b * C + cell and the binned items fit int32 (grid_fits);
 *  2. preference -- which eligible path AUTO takes (prefer), from the thresholds of the tuning
 *     table below.
 * A forced path is checked against 1 only, and refused (cudaErrorInvalidValue) when it cannot
 * run; AUTO never substitutes for it.
 */
#pragma once

#include <climits>
#include <cstdint>

#include "../ball_query_paths.h"
#include "../grid.h"
#include "common.cuh"
#include "grid.cuh"
#include "split.cuh"

namespace {

// ------------------------------------------------------------------------------------------
// The tuning table: AUTO's thresholds and the launch shapes, a row per architecture. The row
// of a device is the newest at or below its compute capability; older GPUs take the oldest.
// The sm_80 row holds the sm_90 numbers until it is measured on its own.

struct BallQueryTuning {
    int sm;                      // the architecture of the row: major * 10 + minor
    double split_max_pairs;      // python benchmarks/tune.py ball_query: split paths to B*M*N pairs
    double sorted_min_pairs;     // python benchmarks/tune.py ball_query: split_sorted from B*M*N
    int64_t long_range_refs;     // python benchmarks/tune.py ball_query: split warp range, at most
    int64_t long_range_groups;   // python benchmarks/tune.py ball_query:   unless this many groups
    int64_t grid_min_n;          // python benchmarks/tune.py ball_query: else the grid from N refs
    int64_t split_wide_min_n;    // python benchmarks/tune.py ball_query: split: 8 warps from N refs
    int split_narrow_warps;      // python benchmarks/tune.py ball_query: split: warps below that
    double grid_cells_per_ref;   // python benchmarks/tune.py ball_query: grid cell budget / N
};

constexpr BallQueryTuning kBallQueryTuning[] = {
    // sm, split_max_pairs, sorted_min_pairs, long_range_refs, long_range_groups, grid_min_n,
    // split_wide_min_n, split_narrow_warps, grid_cells_per_ref
    {80, 2e9, 3e7, 40960, 264, 16384, 8192, 4, 1.0},
    {90, 2e9, 3e7, 40960, 264, 16384, 8192, 4, 1.0},
};

const BallQueryTuning& ball_query_tuning(int sm) {
    const BallQueryTuning* row = &kBallQueryTuning[0];
    for (const BallQueryTuning& r : kBallQueryTuning)
        if (r.sm <= sm) row = &r;
    return *row;
}

// The architecture of the current device: major * 10 + minor.
cudaError_t device_sm(int* sm) {
    int dev = 0, major = 0, minor = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    *sm = major * 10 + minor;
    return err;
}

// Warps a block of the split kernels gets: split_narrow_warps below split_wide_min_n refs, else
// kSplitMaxWarps (more ranges of a large cloud), as many as fit in kSplitSmemBytes, and no more
// than ranges of 4 chunks (128 refs) need.
template <typename T>
int split_warps(int64_t N, int64_t S, const BallQueryTuning& t) {
    int w = N >= t.split_wide_min_n ? kSplitMaxWarps : t.split_narrow_warps;
    while (w > 1 && split_smem_bytes<T>(w, S) > kSplitSmemBytes) --w;
    const int64_t by_n = (N + 127) / 128;
    if (by_n < w) w = (int)(by_n < 1 ? 1 : by_n);
    return w < 1 ? 1 : w;
}

// ------------------------------------------------------------------------------------------
// Eligibility, then preference

// Whether the grids of a call fit the builds' int32 keys (b * C + cell over both halves of the
// query order's counting sort) and item positions.
bool grid_fits(const BallQuerySizes& s, int64_t cells) {
    return 2 * s.B * cells + 1 < INT_MAX && s.B * s.N < INT_MAX && s.B * s.M < INT_MAX;
}

// Whether `path` can run the inputs.
bool path_takes(pcops_ball_query_path path, const BallQuerySizes& s, bool fits) {
    switch (path) {
#define PCOPS_BALL_QUERY_TAKES(NAME, id, name, devices, dtypes)                     \
    case PCOPS_BALL_QUERY_##NAME:                                                   \
        return BallQueryPath<PCOPS_BALL_QUERY_##NAME>::takes(s) &&                  \
               (!BallQueryPath<PCOPS_BALL_QUERY_##NAME>::kGrid || fits);
        PCOPS_BALL_QUERY_PATHS(PCOPS_BALL_QUERY_TAKES)
#undef PCOPS_BALL_QUERY_TAKES
        default:
            return false;
    }
}

// AUTO: the fastest eligible path, by the table's thresholds.
//  - up to split_max_pairs pairs B * M * N: the split kernels, on sorted queries from
//    sorted_min_pairs (below, the order's launch costs more than its box filter saves) -- unless
//    a warp's range would pass long_range_refs refs with fewer than long_range_groups groups of
//    32 queries to keep the GPU busy (a long chain of loads a warp);
//  - else from grid_min_n refs: the grid (where its keys overflow int32: the split kernel,
//    else the brute force);
//  - else the split kernel on sorted queries, or the brute force where S > 64.
pcops_ball_query_path prefer(const BallQuerySizes& s, const BallQueryTuning& t, bool fits,
                             int warps) {
    const double pairs = (double)s.B * (double)s.M * (double)s.N;
    const bool split = path_takes(PCOPS_BALL_QUERY_BRUTE_SPLIT, s, fits);
    const bool few_groups =
        s.N > t.long_range_refs * (int64_t)warps && s.B * ((s.M + 31) / 32) < t.long_range_groups;
    if (split && pairs <= t.split_max_pairs && !few_groups)
        return pairs >= t.sorted_min_pairs ? PCOPS_BALL_QUERY_SPLIT_SORTED
                                           : PCOPS_BALL_QUERY_BRUTE_SPLIT;
    if (s.N >= t.grid_min_n) {
        if (path_takes(PCOPS_BALL_QUERY_GRID, s, fits)) return PCOPS_BALL_QUERY_GRID;
        return split ? PCOPS_BALL_QUERY_BRUTE_SPLIT : PCOPS_BALL_QUERY_BRUTE;
    }
    return split ? PCOPS_BALL_QUERY_SPLIT_SORTED : PCOPS_BALL_QUERY_BRUTE;
}

// ------------------------------------------------------------------------------------------
// The plan

cudaError_t make_plan(pcops_dtype dtype, int64_t B, int64_t M, int64_t N, double radius2,
                      int64_t S, pcops_ball_query_path requested,
                      pcops_ball_query_cuda_plan* plan) {
    if (!plan) return cudaErrorInvalidValue;
    *plan = pcops_ball_query_cuda_plan{};
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return cudaErrorInvalidValue;
    if (B < 0 || M < 0 || N < 0 || S < 1) return cudaErrorInvalidValue;
    int sm = 0;
    const cudaError_t err = device_sm(&sm);
    if (err != cudaSuccess) return err;
    const BallQueryTuning& t = ball_query_tuning(sm);
    const BallQuerySizes s{dtype, B, M, N, S};
    const int64_t cells = pcops_grid_budget(N, t.grid_cells_per_ref);
    const bool fits = grid_fits(s, cells);
    const int warps = dtype == PCOPS_FLOAT32 ? split_warps<float>(N, S, t)
                                             : split_warps<double>(N, S, t);

    const pcops_ball_query_path path =
        requested == PCOPS_BALL_QUERY_AUTO ? prefer(s, t, fits, warps) : requested;
    if (!path_takes(path, s, fits)) return cudaErrorInvalidValue;  // never a substitute

    plan->dtype = dtype;
    plan->B = B;
    plan->M = M;
    plan->N = N;
    plan->S = S;
    plan->radius2 = radius2;
    plan->path = path;
    pcops_carver w = pcops_carver_init(nullptr);  // counts the workspace
    if (path == PCOPS_BALL_QUERY_BRUTE_SPLIT || path == PCOPS_BALL_QUERY_SPLIT_SORTED)
        plan->warps = warps;
    if (path == PCOPS_BALL_QUERY_SPLIT_SORTED && B > 0 && M > 0) {
        plan->order_bits = order_bits_for(M);
        int32_t *order, *keys;
        carve_order(&w, B, M, &order, &keys);
    }
    if (path == PCOPS_BALL_QUERY_GRID && B > 0 && M > 0) {
        plan->cells = cells;
        if (dtype == PCOPS_FLOAT32) {
            pcops_grid_cuda::SortedScratch<float> g;
            pcops_grid_cuda::CountScratch<float> o;
            carve_ball_grid<float>(&w, B, M, N, cells, &g, &o);
        } else {
            pcops_grid_cuda::SortedScratch<double> g;
            pcops_grid_cuda::CountScratch<double> o;
            carve_ball_grid<double>(&w, B, M, N, cells, &g, &o);
        }
    }
    plan->workspace_bytes = pcops_carver_bytes(&w);
    return cudaSuccess;
}

}  // namespace
