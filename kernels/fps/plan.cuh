/*
 * fps/plan.cuh -- the CUDA FPS plan: which path runs for given sizes on the current device, in
 * which shape, and with which workspace (kernels/fps.cu's pcops_fps_cuda_make_plan).
 *
 * Two questions, kept apart (as PyTorch3D's kNN keeps KnnCheckVersion from ChooseVersion):
 *   - eligibility, plan_path: may this path run these sizes here, and in which shape? Each
 *     path's plan function (in its own file) answers: registers, shared memory (static and
 *     dynamic, against the device's opt-in limit), clusters in the device and in the build,
 *     co-residency, int-sized counts. A forced path asks only this.
 *   - preference, preferred_path: which path AUTO wants for (dtype, B, N, npoint) on this
 *     device. A pure function of the sizes, the device's compute capability and SM count, and
 *     the tuning row of its architecture (kTunings below). It only names a path whose dtype,
 *     size limits and clusters the inputs meet; plan_path checks the rest.
 * AUTO plans its preferred path. If that path cannot run, BLOCK_PRUNED falls back to the path
 * AUTO prefers without it (BLOCK within the registers' reach, else a bucket path: e.g. a cloud
 * whose copy in shared memory a GPU of less than 227 KiB a block cannot hold),
 * BUCKET_ROUNDS_CLUSTER to BUCKET_ROUNDS (when one block can take the cloud: e.g. a build
 * without sm_90 code), BUCKET_ROUNDS and BUCKET_GROUPS to BUCKET (more buckets than the device's
 * shared memory holds), anything else to SIMPLE, which runs any size.
 *
 * What AUTO takes, smallest clouds first (float32 / float64 where they differ):
 *   WARP                   N <= warp_max_points (128 / 512): a warp or two a cloud.
 *   BLOCK                  N <= block_max_points (1024 / 2047): a block a cloud.
 *   BLOCK_PRUNED           up to the points a block holds in registers (8192 / 4096); float up
 *                          to 12288 too (points in shared memory) when npoint <
 *                          pruned_shared_max_samples.
 *   BUCKET_ROUNDS_CLUSTER  float, sm_90+, N >= rounds_cluster_min_points, B * 8 <= SMs, N <=
 *                          8 blocks' buckets of 256 points (2**23, or less where a block's
 *                          shared memory holds fewer than 4096 buckets: 99 KiB on sm_120).
 *   BUCKET_ROUNDS          float, N <= 2**20 (a block's buckets), npoint >= rounds_min_samples;
 *   BUCKET_GROUPS          the same with fewer samples.
 *   BUCKET                 the rest with B * N <= 2**31 - 1 (the sort's int count), except a
 *                          single cloud of more than bucket_single_cloud_max_points;
 *   CLUSTER                then, sm_90+, when the cloud fits 8 blocks' registers or B * 8 >=
 *                          SMs;
 *   GRID                   otherwise.
 */
#pragma once

#include "bucket_rounds.cuh"
#include "cluster.cuh"
#include "grid.cuh"
#include "group.cuh"
#include "pruned.cuh"

namespace {

// ------------------------------------------------------------------------------------------
// tuning: AUTO's thresholds, a row per architecture

// Each threshold sits between two paths that can both take the inputs around it.
// `python benchmarks/tune.py fps` times every path on sizes each side of each threshold (the
// rows named below) and marks the sizes where AUTO's path is not the fastest.
struct Tuning {
    int arch;  // compute capability x 10 of the GPUs the row is for (newer: up to the next row)
    // python benchmarks/tune.py fps: rows 64x128->64, 64x129->64 float32
    int64_t warp_max_points_f32;  // WARP up to here, BLOCK above
    // python benchmarks/tune.py fps: rows 32x512->256, 32x513->256 float64
    int64_t warp_max_points_f64;  // the same, float64
    // python benchmarks/tune.py fps: rows 32x1024->512, 32x1025->512 float32
    int64_t block_max_points_f32;  // BLOCK up to here, BLOCK_PRUNED above
    // python benchmarks/tune.py fps: rows 16x2047->1000, 16x2048->1000 float64
    int64_t block_max_points_f64;  // the same, float64
    // python benchmarks/tune.py fps: rows 6x12288->2047, 6x12288->2048 float32
    int64_t pruned_shared_max_samples;  // float32 past the registers: BLOCK_PRUNED below this
    // python benchmarks/tune.py fps: rows 4x32767->2048, 4x32768->2048 float32
    int64_t rounds_cluster_min_points;  // float32: BUCKET_ROUNDS_CLUSTER from here
    // python benchmarks/tune.py fps: rows 8x16384->2047, 8x16384->2048 float32
    int64_t rounds_min_samples;  // float32 buckets: BUCKET_ROUNDS from here, GROUPS below
    // python benchmarks/tune.py fps: rows 1x120000->16384, 1x200000->20000 float64
    int64_t bucket_single_cloud_max_points;  // one cloud (B == 1) past here: GRID, not BUCKET
};

// The rows, oldest first: a GPU takes the newest row not newer than itself; one older than
// every row takes the oldest. The sm_80 row holds the sm_90 numbers until it is re-measured on
// an A100.
constexpr Tuning kTunings[] = {
    // arch  warp_max  f64   block_max  f64  pruned_smp  rcluster_min  rounds_smp  single_max
    {80,     128,      512,  1024,      2047, 2048,      32768,        2048,       150000},
    {90,     128,      512,  1024,      2047, 2048,      32768,        2048,       150000},
};

// AUTO's cluster size (CLUSTER, BUCKET_ROUNDS_CLUSTER): the largest portable one.
constexpr int64_t kAutoClusterBlocks = 8;

inline const Tuning& tuning_for(const Device& d) {
    const Tuning* t = &kTunings[0];
    for (const Tuning& row : kTunings)
        if (d.major * 10 >= row.arch) t = &row;
    return *t;
}

// ------------------------------------------------------------------------------------------
// preference

// The path AUTO prefers (see the table at the top of this file); with `pruned` false, the one it
// prefers to BLOCK_PRUNED.
template <typename T>
int preferred_path(const Tuning& t, const Device& d, int64_t B, int64_t N, int64_t npoint,
                   bool pruned = true) {
    constexpr bool f64 = sizeof(T) == 8;
    const bool int_items = B * N <= INT_MAX;      // the bucket paths' sort counts items in an int
    const bool float_buckets = !f64 && int_items;  // the grouped bucket paths are float only
    const bool clusters = d.major >= 9;
    if (N <= (f64 ? t.warp_max_points_f64 : t.warp_max_points_f32)) return PCOPS_FPS_WARP;
    if (N <= (f64 ? t.block_max_points_f64 : t.block_max_points_f32)) return PCOPS_FPS_BLOCK;
    if (N <= block_max_points<T>()) return pruned ? PCOPS_FPS_BLOCK_PRUNED : PCOPS_FPS_BLOCK;
    if (pruned && float_buckets && N <= kPrunedMaxFloat && npoint < t.pruned_shared_max_samples)
        return PCOPS_FPS_BLOCK_PRUNED;
    if (float_buckets && clusters && N >= t.rounds_cluster_min_points &&
        B * kAutoClusterBlocks <= d.sms &&
        N <= kAutoClusterBlocks * rounds_block_max_buckets(d) * 32 * 8)
        return PCOPS_FPS_BUCKET_ROUNDS_CLUSTER;
    if (float_buckets && N <= kGroupedBlockMaxPoints)
        return npoint >= t.rounds_min_samples ? PCOPS_FPS_BUCKET_ROUNDS : PCOPS_FPS_BUCKET_GROUPS;
    if (int_items && !(B == 1 && N > t.bucket_single_cloud_max_points)) return PCOPS_FPS_BUCKET;
    if (clusters && (N <= kAutoClusterBlocks * block_max_points<T>() ||
                     B * kAutoClusterBlocks >= d.sms))
        return PCOPS_FPS_CLUSTER;
    return PCOPS_FPS_GRID;
}

// ------------------------------------------------------------------------------------------
// eligibility

// Fills the shape of `path` for clouds of N points, B of them, on device d; false when the path
// cannot take them there. cluster_blocks: CLUSTER's cluster size.
template <typename T>
bool plan_path(pcops_fps_cuda_plan* p, const Device& d, int64_t B, int64_t N, int path,
               int cluster_blocks) {
    switch (path) {
        case PCOPS_FPS_SIMPLE:
        case PCOPS_FPS_WARP:
        case PCOPS_FPS_BLOCK: return plan_group<T>(p, B, N, path);
        case PCOPS_FPS_BLOCK_PRUNED: return plan_pruned<T>(p, d, B, N);
        case PCOPS_FPS_CLUSTER: return plan_cluster<T>(p, d, B, N, cluster_blocks);
        case PCOPS_FPS_GRID: return plan_grid<T>(p, d, N);
        case PCOPS_FPS_BUCKET: return plan_bucket<T>(p, d, B, N);
        case PCOPS_FPS_BUCKET_GROUPS: return plan_bucket_groups<T>(p, d, B, N);
        case PCOPS_FPS_BUCKET_ROUNDS:
        case PCOPS_FPS_BUCKET_ROUNDS_CLUSTER: return plan_bucket_rounds<T>(p, d, B, N, path);
        default: return false;
    }
}

// ------------------------------------------------------------------------------------------
// the plan

// The plan of `path` (AUTO: AUTO's choice) on the current device; p's path and shape.
template <typename T>
cudaError_t make_plan(int64_t B, int64_t N, int64_t npoint, int path, pcops_fps_cuda_plan* p) {
    Device d;
    cudaError_t err = current_device(&d);
    if (err != cudaSuccess) return err;
    if (path != PCOPS_FPS_AUTO) {
        p->path = path;
        return plan_path<T>(p, d, B, N, path, cluster_blocks_for<T>(N)) ? cudaSuccess
                                                                        : cudaErrorInvalidValue;
    }
    const Tuning& t = tuning_for(d);
    int preferred = preferred_path<T>(t, d, B, N, npoint);
    pcops_fps_cuda_plan q = *p;
    q.path = preferred;
    bool ok = plan_path<T>(&q, d, B, N, preferred, (int)kAutoClusterBlocks);
    if (!ok && preferred == PCOPS_FPS_BLOCK_PRUNED) {
        q = *p;
        q.path = preferred = preferred_path<T>(t, d, B, N, npoint, false);
        ok = plan_path<T>(&q, d, B, N, q.path, (int)kAutoClusterBlocks);
    }
    if (!ok && preferred == PCOPS_FPS_BUCKET_ROUNDS_CLUSTER && N <= kGroupedBlockMaxPoints) {
        q = *p;
        q.path = preferred = PCOPS_FPS_BUCKET_ROUNDS;  // e.g. a build without sm_90 code
        ok = plan_path<T>(&q, d, B, N, q.path, 0);
    }
    if (!ok && (preferred == PCOPS_FPS_BUCKET_ROUNDS || preferred == PCOPS_FPS_BUCKET_GROUPS)) {
        q = *p;
        q.path = PCOPS_FPS_BUCKET;  // more buckets than the device's shared memory holds
        ok = plan_path<T>(&q, d, B, N, q.path, 0);
    }
    if (!ok) {  // e.g. no clusters on this device: the reference path takes any size
        q = *p;
        q.path = PCOPS_FPS_SIMPLE;
        ok = plan_path<T>(&q, d, B, N, q.path, 0);
    }
    *p = q;
    return ok ? cudaSuccess : cudaErrorInvalidValue;
}

// The workspace of a plan, described once: with base NULL plan_layout only counts (and returns
// the bytes), with the caller's base it places the pieces.
template <typename T>
struct Scratch {
    T* temp;              // [B, N] temps when the points live in global memory (and the buckets')
    Candidate<T>* slots;  // GRID: the blocks' candidates, by step parity
    BucketSort<T> sort;   // the bucket paths: the Morton sort (kernels/fps/bucket.cuh)
};

inline bool is_bucket_path(int path) {
    return path == PCOPS_FPS_BUCKET || path == PCOPS_FPS_BUCKET_GROUPS ||
           path == PCOPS_FPS_BUCKET_ROUNDS || path == PCOPS_FPS_BUCKET_ROUNDS_CLUSTER;
}

template <typename T>
size_t plan_layout(const pcops_fps_cuda_plan* p, void* base, Scratch<T>* s) {
    *s = {};
    pcops_carver w = pcops_carver_init(base);
    const int64_t items = p->B * p->N;
    const bool bucket = is_bucket_path(p->path);
    if (p->points_per_thread == 0 || bucket) s->temp = (T*)pcops_carve(&w, items, sizeof(T));
    if (p->path == PCOPS_FPS_GRID)
        s->slots = (Candidate<T>*)pcops_carve(&w, 2 * p->blocks, sizeof(Candidate<T>));
    if (bucket) carve_bucket_sort<T>(&w, p->B, items, &s->sort);
    return pcops_carver_bytes(&w);
}

}  // namespace
