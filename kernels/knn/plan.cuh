/*
 * knn/plan.cuh -- the kNN plan: from the sizes, the dtype and the device, the path that runs
 * and its launch shape (ref splits, grid cells, the build, the workspace), before anything is
 * launched. kernels/knn.cu includes it after the path headers (their KnnPath::takes).
 *
 * Two questions, in this order:
 *  1. eligibility -- may a path run these inputs: its own bounds (KnnPath<P>::takes: dtype, k
 *     and N limits) and, for the grid paths, whether the grid's keys b * C + cell and the
 *     binned items fit int32 (grid_fits, with the grid path's cell budget: the largest any grid
 *     path uses);
 *  2. preference -- which eligible path AUTO takes (prefer), from the thresholds of the tuning
 *     table below.
 * A forced path is checked against 1 only, and refused (cudaErrorInvalidValue) when it cannot
 * run; AUTO never substitutes for it. Two rows of knn_paths.h name a form of another path:
 * "brute" with k > kMaxRegisterK runs as BRUTE_HEAP (the brute force is one path with two
 * selection structures: register lists, then heaps), and "grid_baseline" is GRID built by the
 * general multi-kernel build (grid/build_counting.cuh) even where the one-block build
 * (grid/build_small.cuh) applies -- the build AUTO takes for larger clouds, forcible on small
 * ones so that tests and tune.py reach it.
 */
#pragma once

#include <climits>
#include <cstdint>

#include "../grid.h"
#include "../grid/build_small.cuh"
#include "../knn_paths.h"
#include "brute.cuh"
#include "common.cuh"
#include "grid.cuh"

namespace {

// ------------------------------------------------------------------------------------------
// The tuning table: AUTO's thresholds and the launch shapes, a row per architecture. The row
// of a device is the newest at or below its compute capability; older GPUs take the oldest.
// The sm_80 row holds the sm_90 numbers until it is measured on its own.

struct KnnTuning {
    int sm;                          // the architecture of the row: major * 10 + minor
    int64_t warp_select_min_k;       // python benchmarks/tune.py knn: warp select from this k
    int64_t grid_select_min_k;       // python benchmarks/tune.py knn: grid select from this k
    int64_t grid_min_n;              // python benchmarks/tune.py knn: grid paths from N refs
    int64_t grid_n_per_k;            // python benchmarks/tune.py knn: grid paths: k * this <= N
    int64_t grid_max_k;              // python benchmarks/tune.py knn: the grid path up to this k
    int64_t grid_batch_min_k;        // python benchmarks/tune.py knn: grid_batch from this k
    int64_t grid_batch_max_k;        // python benchmarks/tune.py knn: grid_batch up to this k
    double grid_cell_refs;           // python benchmarks/tune.py knn: grid: refs a cell, at least
    double grid_cell_k_per_ref;      // python benchmarks/tune.py knn: grid: refs a cell >= k / this
    double select_cell_refs;         // python benchmarks/tune.py knn: grid select: refs a cell, min
    double select_cell_k_per_ref;    // python benchmarks/tune.py knn: grid select: >= k / this
    int64_t split_threads_per_sm;    // python benchmarks/tune.py knn: brute splits: threads an SM
    int64_t split_min_len;           // python benchmarks/tune.py knn: brute splits: refs, at least
    int64_t split_len_per_k;         // python benchmarks/tune.py knn: brute splits: refs >= k*this
    int64_t max_splits;              // python benchmarks/tune.py knn: brute splits a query, at most
};

constexpr KnnTuning kKnnTuning[] = {
    // sm, warp_select_min_k, grid_select_min_k, grid_min_n, grid_n_per_k, grid_max_k,
    // grid_batch_min_k, grid_batch_max_k, grid_cell_refs, grid_cell_k_per_ref, select_cell_refs,
    // select_cell_k_per_ref, split_threads_per_sm, split_min_len, split_len_per_k, max_splits
    {80, 16, 64, 1024, 8, 64, 5, 16, 3.5, 8.0, 16.0, 4.0, 1024, 256, 8, 64},
    {90, 16, 64, 1024, 8, 64, 5, 16, 3.5, 8.0, 16.0, 4.0, 1024, 256, 8, 64},
};

const KnnTuning& knn_tuning(int sm) {
    const KnnTuning* row = &kKnnTuning[0];
    for (const KnnTuning& r : kKnnTuning)
        if (r.sm <= sm) row = &r;
    return *row;
}

// ------------------------------------------------------------------------------------------
// The device, the shapes

// The device the launch will run on: its SM count, shared-memory limit per block and
// architecture.
struct DeviceInfo {
    int device = 0;
    int sms = 1;
    int smem_optin = 48 * 1024;
    int sm = 0;  // major * 10 + minor
};

cudaError_t device_info(DeviceInfo* info) {
    cudaError_t err = cudaGetDevice(&info->device);
    if (err != cudaSuccess) return err;
    const int dev = info->device;
    err = cudaDeviceGetAttribute(&info->sms, cudaDevAttrMultiProcessorCount, dev);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&info->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (err != cudaSuccess) return err;
    int major = 0, minor = 0;
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    info->sm = major * 10 + minor;
    return err;
}

// Cells per cloud of the grid path (and grid_batch): about max(grid_cell_refs,
// k / grid_cell_k_per_ref) refs a cell.
int64_t grid_cells(int64_t N, int64_t K, const KnnTuning& t) {
    const double per = (double)K / t.grid_cell_k_per_ref;
    return pcops_grid_budget(N, 1.0 / (per > t.grid_cell_refs ? per : t.grid_cell_refs));
}

// Cells per cloud of the grid select: longer runs of refs (a warp's 32 lanes take a run at
// once), max(select_cell_refs, k / select_cell_k_per_ref) refs a cell.
int64_t grid_select_cells(int64_t N, int64_t K, const KnnTuning& t) {
    const double per = (double)K / t.select_cell_k_per_ref > t.select_cell_refs
                           ? (double)K / t.select_cell_k_per_ref
                           : t.select_cell_refs;
    return pcops_grid_budget(N, 1.0 / per);
}

// Ref ranges per query of the brute force: enough (query, range) threads to fill the GPU when
// there are few queries, each range at least max(split_min_len, split_len_per_k * k) refs long,
// so that scanning a range stays the larger part of the work (a merge inserts up to k entries
// per range).
int64_t choose_splits(int64_t B, int64_t M, int64_t N, int64_t K, int sms, const KnnTuning& t) {
    const int64_t target_threads = (int64_t)sms * t.split_threads_per_sm;
    const int64_t queries = B * M;
    if (queries <= 0 || queries >= target_threads / 2) return 1;
    int64_t s = (target_threads + queries - 1) / queries;
    const int64_t min_len = t.split_len_per_k * K;
    const int64_t by_len = N / (min_len > t.split_min_len ? min_len : t.split_min_len);
    if (s > by_len) s = by_len;
    if (s > t.max_splits) s = t.max_splits;
    return s < 1 ? 1 : s;
}

// ------------------------------------------------------------------------------------------
// Eligibility, then preference

// Whether the grids of a call fit the build's int32 keys (b * C + cell over both halves of
// the counting build) and item positions.
bool grid_fits(const KnnSizes& s, int64_t cells) {
    return 2 * s.B * cells + 1 < INT_MAX && s.B * s.N + s.B * s.M < INT_MAX;
}

// Whether `path` can run the inputs (a row of knn_paths.h that runs as itself).
bool path_takes(pcops_knn_path path, const KnnSizes& s, bool fits) {
    switch (path) {
#define PCOPS_KNN_TAKES(NAME, id, name, devices, dtypes)                                     \
    case PCOPS_KNN_##NAME:                                                                   \
        return KnnPath<PCOPS_KNN_##NAME>::takes(s) && (!KnnPath<PCOPS_KNN_##NAME>::kGrid || fits);
        PCOPS_KNN_PATHS(PCOPS_KNN_TAKES)
#undef PCOPS_KNN_TAKES
        default:
            return false;
    }
}

bool path_on_grid(pcops_knn_path path) {
    switch (path) {
#define PCOPS_KNN_ON_GRID(NAME, id, name, devices, dtypes) \
    case PCOPS_KNN_##NAME:                                 \
        return KnnPath<PCOPS_KNN_##NAME>::kGrid;
        PCOPS_KNN_PATHS(PCOPS_KNN_ON_GRID)
#undef PCOPS_KNN_ON_GRID
        default:
            return false;
    }
}

// AUTO: the fastest eligible path, by the table's thresholds.
//  - small float32 clouds, k from warp_select_min_k: the warp select (its cost barely grows
//    with k);
//  - float32 grids with long lists (k from grid_select_min_k, N >= grid_n_per_k * k): the grid
//    select;
//  - clouds of at least grid_min_n refs with k <= grid_max_k and N >= grid_n_per_k * k: the
//    grid, with batched insertion for float32 and k in [grid_batch_min_k, grid_batch_max_k];
//  - everything else: the brute force (its heap form beyond the register lists).
pcops_knn_path prefer(const KnnSizes& s, const KnnTuning& t, bool fits) {
    const int64_t K = s.K, N = s.N;
    if (path_takes(PCOPS_KNN_WARP_SELECT, s, fits) && K >= t.warp_select_min_k)
        return PCOPS_KNN_WARP_SELECT;
    if (path_takes(PCOPS_KNN_GRID_SELECT, s, fits) && K >= t.grid_select_min_k &&
        t.grid_n_per_k * K <= N)
        return PCOPS_KNN_GRID_SELECT;
    if (path_takes(PCOPS_KNN_GRID, s, fits) && K <= t.grid_max_k && t.grid_n_per_k * K <= N &&
        N >= t.grid_min_n) {
        if (path_takes(PCOPS_KNN_GRID_BATCH, s, fits) && K >= t.grid_batch_min_k &&
            K <= t.grid_batch_max_k)
            return PCOPS_KNN_GRID_BATCH;
        return PCOPS_KNN_GRID;
    }
    return K <= kMaxRegisterK ? PCOPS_KNN_BRUTE : PCOPS_KNN_BRUTE_HEAP;
}

// ------------------------------------------------------------------------------------------
// The plan

cudaError_t make_plan(pcops_dtype dtype, int64_t B, int64_t M, int64_t N, int64_t K,
                      pcops_knn_path requested, pcops_knn_cuda_plan* plan) {
    if (!plan) return cudaErrorInvalidValue;
    *plan = pcops_knn_cuda_plan{};
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return cudaErrorInvalidValue;
    if (B < 0 || M < 0 || N < 0 || K < 1 || M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return cudaErrorInvalidValue;
    DeviceInfo info;
    const cudaError_t err = device_info(&info);
    if (err != cudaSuccess) return err;
    const KnnTuning& t = knn_tuning(info.sm);
    const KnnSizes s{dtype, B, M, N, K};
    const int64_t cells = grid_cells(N, K, t);
    const bool fits = grid_fits(s, cells);

    pcops_knn_path path = requested;
    if (path == PCOPS_KNN_AUTO)
        path = prefer(s, t, fits);
    else if (path == PCOPS_KNN_BRUTE && K > kMaxRegisterK)
        path = PCOPS_KNN_BRUTE_HEAP;  // the brute force's heap form
    else if (path == PCOPS_KNN_GRID_BASELINE)
        path = PCOPS_KNN_GRID;  // with the general build (below)
    if (!path_takes(path, s, fits)) return cudaErrorInvalidValue;  // never a substitute

    plan->dtype = dtype;
    plan->B = B;
    plan->M = M;
    plan->N = N;
    plan->K = K;
    plan->device = info.device;
    plan->sms = info.sms;
    plan->smem_optin = info.smem_optin;
    plan->path = path;
    plan->splits = 1;
    if (B == 0 || M == 0) return cudaSuccess;
    pcops_carver w = pcops_carver_init(nullptr);  // counts the workspace
    if (path_on_grid(path)) {
        plan->cells = path == PCOPS_KNN_GRID_SELECT ? grid_select_cells(N, K, t) : cells;
        plan->small_build = pcops_grid_cuda::small_build_ok(N, M, plan->cells) &&
                            requested != PCOPS_KNN_GRID_BASELINE;
        if (dtype == PCOPS_FLOAT32) {
            pcops_grid_cuda::CountScratch<float> scratch;
            carve_grid<float>(&w, *plan, &scratch);
        } else {
            pcops_grid_cuda::CountScratch<double> scratch;
            carve_grid<double>(&w, *plan, &scratch);
        }
    } else if (path == PCOPS_KNN_BRUTE) {
        plan->splits = choose_splits(B, M, N, K, info.sms, t);
        if (plan->splits > 1) {
            void* part_d;
            int* part_i;
            carve_partial_lists(&w, B * plan->splits * M * K, dtype == PCOPS_FLOAT64 ? 8 : 4,
                                &part_d, &part_i);
        }
    }
    plan->workspace_bytes = pcops_carver_bytes(&w);
    return cudaSuccess;
}

}  // namespace
