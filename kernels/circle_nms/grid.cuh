/*
 * circle_nms/grid.cuh -- the grid path (PCOPS_CIRCLE_NMS_GRID, any N up to
 * PCOPS_CIRCLE_NMS_CUDA_MAX): the boxes in a hashed grid of cells a radius wide, the greedy
 * decided in rounds in which a few boxes of every cell are put forward and the boxes kept
 * remove their neighbours. Words (position, pred): common.cuh.
 *
 * When it wins: large N (AUTO takes it above the plan's flow_max_boxes, plan.cuh): its work is
 * O(N) sorts plus, per box, the few cells around it, where the flow and block paths test all
 * N**2 / 2 pairs. Its cost follows N, not the layout: the cells are sized from the radius
 * alone (not from the extent of the boxes) and hashed, so a line, a far-out box or clusters far
 * apart leave every cell a radius wide; and a box is read by the few boxes of its cells put
 * forward in a round and by few kept boxes, so a pile of boxes within one radius costs about
 * what as many spread boxes cost.
 *
 * What it does (kernels in launch order):
 *   a. nms_score_keys_kernel + cub::DeviceRadixSort::SortPairs (stable: ties keep the lower
 *      index first) -> order (int32, position -> box);
 *   b. nms_grid_gather_kernel: centres (and groups) into visiting order; the bounding box of
 *      the finite centres by atomics (its low corner is the origin of the cells);
 *   c. nms_grid_keys_kernel: cells of width radius * (1 + 2**-10) on each axis (wider only
 *      where an axis would need more than 2**30 of them: grid_cells_of), cell (cx, cy) of group
 *      g in bucket hash(cx, cy, g) of B = 2**k >= 2N buckets; a cub sort by bucket (stable:
 *      positions ascend within a bucket), non-finite centres after every bucket;
 *   d. nms_grid_cells_kernel: the boxes in bucket order and bucket_begin[] (a binary search per
 *      bucket);
 *   e. nms_grid_init_kernel: every finite box undecided, every non-finite one kept (it is within
 *      the radius of nothing); each bucket's cursor at its first box;
 *   f. nms_grid_decide_kernel (grid_decide): rounds of two phases, a barrier after each (one
 *      cooperative launch, grid-wide barriers; one block where that cannot run):
 *        evaluate: each undecided box among the first kGridWindow of its bucket from the cursor
 *          scans the boxes of its 9 neighbour buckets, from each cursor up to its own position:
 *          the first undecided pred makes it wait, a kept pred removes it, and with neither it
 *          is kept (a thread's scan reads up to kGridScanBudget boxes; the boxes of longer
 *          ones are listed, and after a barrier each is scanned again by a warp,
 *          kGridWarpChunks * 32 boxes a step);
 *        pull and advance: every undecided box reads the first kGridWindow boxes of its 9
 *          buckets from their cursors (where this round's kept boxes are) and is removed by a
 *          kept pred; then, by the same thread (a pull writes only its own box's state, so
 *          the box's state is final for the round), each box still undecided bids for its
 *          bucket's next cursor (each cursor moves to its first undecided box) and is counted;
 *      until none is left, or after kGridMaxRounds rounds, or a round deciding fewer than
 *      kGridMinProgress boxes; block 0 then finishes in visiting order (grid_finish): the next
 *      64 undecided boxes, their preds among them, resolved in order, each kept one removing
 *      its later neighbours;
 *   g. nms_grid_count_kernel, nms_grid_scan_kernel, nms_grid_output_kernel: the kept boxes per
 *      64 positions, their prefix (num_kept first), keep_mask and keep_idx.
 * Invariants:
 *   - two boxes within the radius lie in the same or adjacent cells (grid_cells_of: the width's
 *     margin covers the rounding of the cell coordinates), so in each other's 9 buckets; a
 *     bucket may hold other cells (hash collisions) and other groups, which the group and
 *     distance tests skip;
 *   - positions ascend within a bucket, so a scan stops at its own position, and the boxes of a
 *     bucket before its cursor are all decided;
 *   - every state is written once, and only as a fact of the greedy: kept when every pred is
 *     removed (the scan reads each pred from the cursors on; the ones before are decided, and a
 *     kept one would have removed the box in the pull of its round), removed when a pred is
 *     kept. A state read while another thread writes it is undecided or final, and either is a
 *     true fact (undecided only delays), so the answer does not depend on the timing;
 *   - a box kept in a round is among the first kGridWindow boxes of its bucket from that
 *     round's cursor, so the pull of the round finds it from every later neighbour;
 *   - the earliest undecided box is first in its bucket and has no undecided pred, so every
 *     round decides a box and the rounds end.
 * Work: a round costs the put-forward boxes' scans (at most 9 buckets up to their position,
 * most ending at the first undecided pred; where a dense pile lies just beyond the radius of a
 * box, or many removed boxes precede it, a scan passes thousands of boxes, which a warp reads
 * 128 at a time), 9 * kGridWindow reads per undecided box (pull) and
 * one per box (cursors): O(N). Random scores take tens of rounds; a chain of preds along the
 * visiting order (boxes on a line visited along it) decides a box or two a round, and the
 * finish takes it 64 at a time. Workspace O(N) (grid_layout), L2-resident at the sizes that
 * matter. The decisions (grid_decide, grid_finish) are __host__ __device__, so that
 * lab/grid_nms_host.cu can run them on the CPU.
 */
#pragma once

#include <cooperative_groups.h>
#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"

namespace {

constexpr int kGridThreads = 256;          // every kernel's block size
constexpr int kGridWindow = 8;             // boxes of a bucket put forward (pulled from) a round
constexpr int kGridMaxRounds = 64;         // rounds at most before the finish
constexpr uint32_t kGridMinProgress = 64;  // a round deciding fewer boxes ends the rounds
constexpr int64_t kGridScanBudget = 32;    // boxes a thread's evaluate scan reads before a warp's
constexpr int kGridScanBatch = 4;          // boxes an evaluate scan loads at once
constexpr int kGridFinishRows = 64;        // undecided boxes the finish resolves at once
constexpr int kGridFinishScan = 8;         // positions a thread of the finish reads a step
constexpr double kGridAxisCells = 1073741824.0;  // 2**30: cell coordinates per axis at most
constexpr uint8_t kUndecided = 0, kKept = 1, kRemoved = 2;  // box states

// ------------------------------------------------------------------------------------------
// Cells and buckets

// The cells: the origin (the finite centres' minimum), 1 / the cell width on each axis, and
// the bucket mask (B - 1).
struct GridCells {
    double x0, y0, inv_x, inv_y;
    uint32_t mask;
};

// Cells of width sqrt(r2 + tiny) * (1 + 2**-10) on each axis (tiny: the least positive value of
// the compute dtype), wider where an axis would need more than 2**30 of them. Two boxes within
// the radius lie in the same or adjacent cells: fl(fl(dx)**2 + fl(dy)**2) < r2 implies
// fl(fl(dx)**2) < r2 (rounding is monotone), so dx**2 < (r2 + tiny / 2) * (1 + 2**-22) (the
// rounding of a square, relative, or absolute below the normal range), and |dx| is below the
// width by more than 2**-11 of it; the coordinate (v - v0) * inv of grid_axis, below 2**30 + 1,
// is off by less than 2**-21 in double, so coordinates less than a width apart have floors at
// most 1 apart. r2 negative or NaN: nothing is within the radius, any cells do; inf: one cell
// (inv 0). A pure function of its arguments.
__host__ __device__ inline GridCells grid_cells_of(double lo_x, double lo_y, double hi_x,
                                                   double hi_y, double r2, double tiny,
                                                   uint32_t mask) {
    GridCells c;
    c.mask = mask;
    c.x0 = lo_x <= hi_x ? lo_x : 0.0;  // lo > hi: nothing finite
    c.y0 = lo_y <= hi_y ? lo_y : 0.0;
    double w = sqrt(r2 + tiny) * (1.0 + 1.0 / 1024.0);
    if (!(w > 0.0)) w = 1.0;
    const double ex = lo_x <= hi_x ? hi_x - lo_x : 0.0, ey = lo_y <= hi_y ? hi_y - lo_y : 0.0;
    const double wx = w > ex / kGridAxisCells ? w : ex / kGridAxisCells;
    const double wy = w > ey / kGridAxisCells ? w : ey / kGridAxisCells;
    c.inv_x = wx < INFINITY ? 1.0 / wx : 0.0;
    c.inv_y = wy < INFINITY ? 1.0 / wy : 0.0;
    return c;
}

// The cell coordinate of v on one axis: floor((v - v0) * inv), in [0, 2**30].
__host__ __device__ inline int32_t grid_axis(double v, double v0, double inv) {
    const double u = inv > 0.0 ? (v - v0) * inv : 0.0;
    if (!(u > 0.0)) return 0;
    return u < kGridAxisCells ? (int32_t)u : (int32_t)kGridAxisCells;
}

// The bucket of cell (cx, cy) of group g.
__host__ __device__ inline uint32_t grid_bucket(int32_t cx, int32_t cy, int64_t g, uint32_t mask) {
    uint64_t h = (uint64_t)(uint32_t)cx * 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t)(uint32_t)cy * 0xC2B2AE3D27D4EB4Full;
    h ^= (uint64_t)g * 0x165667B19E3779F9ull;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    return (uint32_t)h & mask;
}

// The distinct buckets of the 3 x 3 cells around the cell of (x, y), group g; returns how many.
__host__ __device__ inline int grid_stencil(const GridCells& c, double x, double y, int64_t g,
                                            uint32_t* out) {
    const int32_t cx = grid_axis(x, c.x0, c.inv_x), cy = grid_axis(y, c.y0, c.inv_y);
    int n = 0;
    for (int dy = -1; dy <= 1; ++dy)
        for (int dx = -1; dx <= 1; ++dx) {
            const uint32_t b = grid_bucket(cx + dx, cy + dy, g, c.mask);
            bool seen = false;
            for (int i = 0; i < n; ++i) seen = seen || out[i] == b;
            if (!seen) out[n++] = b;
        }
    return n;
}

__host__ __device__ inline float grid_dist2(float ax, float ay, float bx, float by) {
    return pcops_dist2_xy_f32(ax, ay, bx, by);
}
__host__ __device__ inline double grid_dist2(double ax, double ay, double bx, double by) {
    return pcops_dist2_xy_f64(ax, ay, bx, by);
}

// ------------------------------------------------------------------------------------------
// The decisions (host and device)

// What the decisions read and write.
template <typename T>
struct GridView {
    const int32_t* spos;          // [N] the position of the box at each bucket-order index
    const uint32_t* skey;         // [N] its bucket (B for a non-finite centre, after all)
    const T* sx;                  // [N] its centre
    const T* sy;
    const int64_t* sg;            // [N] its group (NULL: one group)
    const int32_t* bucket_begin;  // [B + 1] the first bucket-order index of each bucket
    const T* xs;                  // [N] centres by position (the finish)
    const T* ys;
    const int64_t* gs;            // [N] groups by position (NULL: one group)
    const GridCells* cells;
    uint8_t* state;               // [N] kUndecided / kKept / kRemoved by position
    int32_t* cursor[2];           // [B] each: the cursors of a round and of the next one
    uint32_t* count;              // [5] undecided boxes after a round (three rounds in turn),
                                  // then the long scans of a round (two rounds in turn)
    int64_t N;
    T r2;
    int32_t* longs;               // [N] the boxes whose scan ran out of budget in a round (device)
};

__host__ __device__ inline uint8_t grid_state(const uint8_t* state, int32_t p) {
    return *(const volatile uint8_t*)(state + p);  // written by other threads meanwhile
}

// Whether box t (bucket order) is a pred of the box at position p, (x, y), group g (t's
// position < p is the caller's).
template <typename T>
__host__ __device__ inline bool grid_near(const GridView<T>& v, int32_t t, T x, T y, int64_t g) {
    return (!v.sg || v.sg[t] == g) && grid_dist2(v.sx[t], v.sy[t], x, y) < v.r2;
}

// A box as the decisions see it: its centre, group and the buckets of its 3 x 3 cells.
template <typename T>
struct GridBox {
    T x, y;
    int64_t g;
    uint32_t nb[9];
    int n;
};

template <typename T>
__host__ __device__ inline GridBox<T> grid_box(const GridCells& c, T x, T y, int64_t g) {
    GridBox<T> b;
    b.x = x;
    b.y = y;
    b.g = g;
    b.n = grid_stencil(c, (double)x, (double)y, g, b.nb);
    return b;
}

// Evaluate, for the box at bucket-order index s: kept, removed, or left undecided (waiting).
// The scan reads at most `budget` boxes; past that it returns false having decided nothing, and
// the caller runs the scan again in full (grid_evaluate_warp on the device: a pile of boxes in
// a neighbour cell, all more than a radius away or removed, is read 128 at a time by a warp
// instead of one at a time by a thread). True when the box was done (or is not put forward).
// A bucket is read kGridScanBatch boxes a step: their positions, centres and states are loaded
// together (a step costs about one memory round trip, not one per box) and then taken in order.
template <typename T>
__host__ __device__ inline bool grid_evaluate(const GridView<T>& v, const GridCells& c,
                                              int64_t s, const int32_t* cur, int64_t budget) {
    const int32_t p = v.spos[s];
    if (v.state[p] != kUndecided || s >= (int64_t)cur[v.skey[s]] + kGridWindow) return true;
    const GridBox<T> b = grid_box(c, v.sx[s], v.sy[s], v.sg ? v.sg[s] : 0);
    for (int i = 0; i < b.n; ++i) {
        const int32_t end = v.bucket_begin[b.nb[i] + 1];
        bool bucket_done = false;
        for (int32_t t = cur[b.nb[i]]; t < end && !bucket_done; t += kGridScanBatch) {
            int32_t q[kGridScanBatch];
            bool near[kGridScanBatch];
            uint8_t st[kGridScanBatch];
#pragma unroll
            for (int j = 0; j < kGridScanBatch; ++j) q[j] = t + j < end ? v.spos[t + j] : p;
#pragma unroll
            for (int j = 0; j < kGridScanBatch; ++j)
                near[j] = q[j] < p && grid_near(v, t + j, b.x, b.y, b.g);
#pragma unroll
            for (int j = 0; j < kGridScanBatch; ++j)
                st[j] = near[j] ? grid_state(v.state, q[j]) : kRemoved;
            for (int j = 0; j < kGridScanBatch; ++j) {
                if (--budget < 0) return false;
                if (q[j] >= p) {  // positions ascend within a bucket (past its end: q = p)
                    bucket_done = true;
                    break;
                }
                if (st[j] == kRemoved) continue;  // or not near
                if (st[j] == kKept) v.state[p] = kRemoved;
                return true;  // a kept pred removes it; an undecided one makes it wait
            }
        }
    }
    v.state[p] = kKept;
    return true;
}

#if defined(__CUDACC__)
constexpr int kGridWarpChunks = 4;  // 32-box chunks a warp step reads (their loads overlap)

// grid_evaluate of box s (put forward, undecided) by the 32 lanes of a warp together, without a
// budget: each step reads the next kGridWarpChunks * 32 boxes of a bucket, and the first pred
// that is near and not removed decides, as in the thread's scan. (Any such pred is a true
// reason: a kept one removes the box, an undecided one makes it wait; the first is taken so
// that both scans agree.)
template <typename T>
__device__ inline void grid_evaluate_warp(const GridView<T>& v, const GridCells& c, int64_t s,
                                          const int32_t* cur, int lane) {
    const int32_t p = v.spos[s];
    const GridBox<T> b = grid_box(c, v.sx[s], v.sy[s], v.sg ? v.sg[s] : 0);
    for (int i = 0; i < b.n; ++i) {
        const int32_t end = v.bucket_begin[b.nb[i] + 1];
        bool bucket_done = false;
        for (int32_t t0 = cur[b.nb[i]]; t0 < end && !bucket_done; t0 += 32 * kGridWarpChunks) {
            bool stop[kGridWarpChunks], hit[kGridWarpChunks];
            uint8_t st[kGridWarpChunks];
#pragma unroll
            for (int j = 0; j < kGridWarpChunks; ++j) {
                const int32_t t = t0 + 32 * j + lane;
                stop[j] = true;
                hit[j] = false;
                st[j] = kRemoved;
                if (t < end) {
                    const int32_t q = v.spos[t];
                    stop[j] = q >= p;
                    if (!stop[j] && grid_near(v, t, b.x, b.y, b.g)) {
                        st[j] = grid_state(v.state, q);
                        hit[j] = st[j] != kRemoved;
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < kGridWarpChunks; ++j) {
                const uint32_t stops = __ballot_sync(0xffffffffu, stop[j]);
                uint32_t hits = __ballot_sync(0xffffffffu, hit[j]);
                if (stops) hits &= (stops & (0u - stops)) - 1u;  // the hits before the first stop
                if (hits) {
                    const int first =
                        __shfl_sync(0xffffffffu, (int)st[j], __ffs(hits) - 1);
                    if (lane == 0 && first == kKept) v.state[p] = kRemoved;
                    return;
                }
                if (stops) {
                    bucket_done = true;
                    break;
                }
            }
        }
    }
    if (lane == 0) v.state[p] = kKept;
}
#endif

// Pull, for the box at bucket-order index s: removed if a kept pred is among the first
// kGridWindow boxes of one of its buckets. The buckets' cursors and ends are loaded first, then
// each window's positions together and their states together (a few round trips a bucket, not
// a few a box).
template <typename T>
__host__ __device__ inline void grid_pull(const GridView<T>& v, const GridCells& c, int64_t s,
                                          const int32_t* cur) {
    const int32_t p = v.spos[s];
    if (v.state[p] != kUndecided) return;
    const GridBox<T> b = grid_box(c, v.sx[s], v.sy[s], v.sg ? v.sg[s] : 0);
    int32_t first[9], end[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) {
        first[i] = i < b.n ? cur[b.nb[i]] : 0;
        end[i] = i < b.n ? v.bucket_begin[b.nb[i] + 1] : 0;
    }
    for (int i = 0; i < b.n; ++i) {
        const int32_t t0 = first[i];
        int32_t q[kGridWindow];
        uint8_t st[kGridWindow];
#pragma unroll
        for (int j = 0; j < kGridWindow; ++j) q[j] = t0 + j < end[i] ? v.spos[t0 + j] : p;
#pragma unroll
        for (int j = 0; j < kGridWindow; ++j)  // positions ascend: no pred from the first q >= p
            st[j] = q[j] < p ? v.state[q[j]] : kRemoved;
        for (int j = 0; j < kGridWindow; ++j)
            if (st[j] == kKept && grid_near(v, t0 + j, b.x, b.y, b.g)) {
                v.state[p] = kRemoved;
                return;
            }
    }
}

// Whether the box at bucket-order index s is undecided at or past its bucket's cursor (it
// then bids for the bucket's next cursor and counts as left).
template <typename T>
__host__ __device__ inline bool grid_open(const GridView<T>& v, int64_t s, const int32_t* cur) {
    return s >= (int64_t)cur[v.skey[s]] && v.state[v.spos[s]] == kUndecided;
}

// The first bucket-order index in [lo, hi) whose position is >= p (positions ascend).
__host__ __device__ inline int32_t grid_lower_bound(const int32_t* spos, int32_t lo, int32_t hi,
                                                    int32_t p) {
    while (lo < hi) {
        const int32_t m = lo + (hi - lo) / 2;
        if (spos[m] < p) lo = m + 1; else hi = m;
    }
    return lo;
}

// Shared state of the finish (one block).
struct GridFinishShared {
    int32_t pos[kGridFinishRows];    // the window: undecided positions, ascending
    uint64_t word[kGridFinishRows];  // bit j of word[i]: window box j is a pred of box i
    uint8_t flag[kGridThreads];      // undecided bits of a chunk, kGridFinishScan per thread
    int n;                           // boxes in the window
    int64_t from;                    // the next position to look at
    uint64_t kept;                   // kept boxes of the window
};

// The finish by one block (threads tid of nthreads; X: its barriers): the undecided boxes in
// visiting order, kGridFinishRows at a time. Everything before the window is decided and every
// kept box so far has removed its later neighbours (pull or push), so a window box's preds
// that matter are in the window; resolved in order by thread 0; the kept ones then push.
#pragma nv_exec_check_disable
template <typename T, typename X>
__host__ __device__ void grid_finish(const GridView<T>& v, const GridCells& c, GridFinishShared& sh,
                                     int tid, int nthreads, X& x_) {
    if (tid == 0) sh.from = 0;
    x_.sync();
    for (;;) {
        // the window: the next undecided positions, by chunks of kGridFinishScan positions per
        // thread (a bit each), so that long decided stretches pass quickly
        if (tid == 0) sh.n = 0;
        x_.sync();
        while (sh.n < kGridFinishRows && sh.from < v.N) {
            const int64_t base = sh.from, p0 = base + (int64_t)tid * kGridFinishScan;
            uint32_t bits = 0;
            for (int i = 0; i < kGridFinishScan; ++i)
                bits |= (uint32_t)(p0 + i < v.N && v.state[p0 + i] == kUndecided) << i;
            if (tid < kGridThreads) sh.flag[tid] = (uint8_t)bits;
            const bool any = x_.sync_or(bits != 0);  // barrier: flags written, sh.from read
            if (tid == 0) {
                int64_t next = base + (int64_t)nthreads * kGridFinishScan;
                for (int t = 0; any && t < nthreads && next > base; ++t) {
                    for (uint32_t m = sh.flag[t]; m; m &= m - 1) {
                        int i = 0;
                        while (!((m >> i) & 1)) ++i;
                        const int64_t p = base + (int64_t)t * kGridFinishScan + i;
                        sh.pos[sh.n++] = (int32_t)p;
                        if (sh.n == kGridFinishRows) {
                            next = base;  // ends both loops; set below
                            sh.from = p + 1;
                            break;
                        }
                    }
                }
                if (next > base) sh.from = next;
            }
            x_.sync();
        }
        const int n = sh.n;
        if (n == 0) return;
        x_.note_window(n);
        // the preds of each window box among the window: undecided boxes after the window's
        // first position and before its own
        for (int j = tid; j < n; j += nthreads) {
            const int32_t p = sh.pos[j];
            const GridBox<T> b = grid_box(c, v.xs[p], v.ys[p], v.gs ? v.gs[p] : 0);
            uint64_t word = 0;
            for (int i = 0; i < b.n; ++i) {
                const int32_t end = v.bucket_begin[b.nb[i] + 1];
                for (int32_t t = grid_lower_bound(v.spos, v.bucket_begin[b.nb[i]], end, sh.pos[0]);
                     t < end && v.spos[t] < p; ++t) {
                    const int32_t q = v.spos[t];
                    if (v.state[q] != kUndecided || !grid_near(v, t, b.x, b.y, b.g)) continue;
                    int lo = 0, hi = j;  // q is a window box before j
                    while (lo < hi) {
                        const int m = (lo + hi) / 2;
                        if (sh.pos[m] < q) lo = m + 1; else hi = m;
                    }
                    word |= uint64_t(1) << lo;
                }
            }
            sh.word[j] = word;
        }
        x_.sync();
        if (tid == 0) {
            uint64_t kept = 0;
            for (int j = 0; j < n; ++j) {
                const bool keep = !(sh.word[j] & kept);
                v.state[sh.pos[j]] = keep ? kKept : kRemoved;
                if (keep) kept |= uint64_t(1) << j;
            }
            sh.kept = kept;
        }
        x_.sync();
        // the kept ones remove their undecided neighbours after the window
        const int32_t last = sh.pos[n - 1];
        for (uint64_t m = sh.kept; m; m &= m - 1) {
            int j = 0;
            while (!((m >> j) & 1)) ++j;
            const GridBox<T> b = grid_box(c, v.xs[sh.pos[j]], v.ys[sh.pos[j]],
                                          v.gs ? v.gs[sh.pos[j]] : 0);
            for (int i = 0; i < b.n; ++i) {
                const int32_t end = v.bucket_begin[b.nb[i] + 1];
                const int32_t t0 = grid_lower_bound(v.spos, v.bucket_begin[b.nb[i]], end, last + 1);
                for (int32_t t = t0 + tid; t < end; t += nthreads) {
                    const int32_t q = v.spos[t];
                    if (v.state[q] == kUndecided && grid_near(v, t, b.x, b.y, b.g))
                        v.state[q] = kRemoved;
                }
            }
        }
        x_.sync();
    }
}

// The rounds, then the finish (by X's block 0), over the Nf finite boxes (bucket order
// [0, Nf)). X provides: evaluate(...) (the evaluate phase of a share), barrier() (all of the
// decision's threads), pull_open(...) (the pull and advance of a share, counting), lead()
// (whether this block finishes), the finish block's tid / nthreads / sync / sync_or, and
// note_round / note_window (statistics for lab/grid_nms_host.cu; nothing on the device).
#pragma nv_exec_check_disable
template <typename T, typename X>
__host__ __device__ void grid_decide(const GridView<T>& v, GridFinishShared& sh, X& x_) {
    const GridCells c = *v.cells;
    const int64_t Nf = v.bucket_begin[c.mask + 1];
    uint32_t before = (uint32_t)Nf;  // undecided boxes before the round
    for (int round = 0;; ++round) {
        const int32_t* cur = v.cursor[round & 1];
        int32_t* next = v.cursor[(round + 1) & 1];
        uint32_t* left = v.count + round % 3;
        if (x_.first()) v.count[(round + 1) % 3] = 0;  // last read two barriers ago
        x_.evaluate(v, c, Nf, cur, round, [&](int64_t s) {
            const uint32_t b = v.skey[s];
            if (s == 0 || v.skey[s - 1] != b) next[b] = v.bucket_begin[b + 1];  // no bid yet
            return grid_evaluate(v, c, s, cur, kGridScanBudget);
        });
        x_.barrier();
        x_.pull_open(v, c, Nf, cur, next, left);
        x_.barrier();
        const uint32_t now = *(const volatile uint32_t*)left;
        x_.note_round(round, now);
        if (now == 0) return;
        if (round + 1 >= kGridMaxRounds || before - now < kGridMinProgress) break;
        before = now;
    }
    if (x_.lead()) grid_finish(v, c, sh, x_.tid(), x_.nthreads(), x_);
}

// ------------------------------------------------------------------------------------------
// CUDA kernels

// Score keys and their box indices; with bbox, also the empty bounding box that
// nms_grid_gather_kernel then fills (bbox[0..3]: ordered bits of min x, min y, max x, max y).
template <typename S>
__global__ void __launch_bounds__(kGridThreads)
nms_score_keys_kernel(const S* __restrict__ scores, int64_t N, uint64_t* __restrict__ keys,
                      int32_t* __restrict__ pos, unsigned long long* __restrict__ bbox) {
    if (bbox && blockIdx.x == 0 && threadIdx.x < 4)
        bbox[threadIdx.x] = threadIdx.x < 2 ? ~0ull : 0ull;  // min above, max below everything
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += stride) {
        keys[i] = score_key(scores[i]);
        pos[i] = (int32_t)i;
    }
}

// Order-preserving uint64 of a finite double (for atomicMin / atomicMax).
__device__ __forceinline__ unsigned long long ordered_bits(double v) {
    const unsigned long long b = (unsigned long long)__double_as_longlong(v);
    return (b >> 63) ? ~b : (b | 0x8000000000000000ull);
}
__device__ __forceinline__ double from_ordered_bits(unsigned long long k) {
    const unsigned long long b = (k >> 63) ? (k & 0x7fffffffffffffffull) : ~k;
    return __longlong_as_double((long long)b);
}

// Centres (and groups) into visiting order; the finite bounding box.
template <typename T>
__global__ void __launch_bounds__(kGridThreads)
nms_grid_gather_kernel(const T* __restrict__ centers, int64_t D, const int32_t* __restrict__ order,
                       const int64_t* __restrict__ groups, int64_t N, T* __restrict__ xs,
                       T* __restrict__ ys, int64_t* __restrict__ gs,
                       unsigned long long* __restrict__ bbox) {
    Box2 box = Box2::empty();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < N; p += stride) {
        const int64_t o = order[p];  // a permutation of [0, N) (the sorted positions)
        const T x = centers[o * D + 0], y = centers[o * D + 1];
        xs[p] = x;
        ys[p] = y;
        if (gs) gs[p] = groups[o];
        box.add(x, y);
    }
    box.warp_reduce_of<T>();
    if ((threadIdx.x & 31) == 0 && box.lo_x <= box.hi_x) {  // this warp saw a finite centre
        atomicMin(&bbox[0], ordered_bits(box.lo_x));
        atomicMin(&bbox[1], ordered_bits(box.lo_y));
        atomicMax(&bbox[2], ordered_bits(box.hi_x));
        atomicMax(&bbox[3], ordered_bits(box.hi_y));
    }
}

// The bucket of every position (B = mask + 1 for a non-finite centre); the cells for the
// later kernels.
template <typename T>
__global__ void __launch_bounds__(kGridThreads)
nms_grid_keys_kernel(const T* __restrict__ xs, const T* __restrict__ ys,
                     const int64_t* __restrict__ gs, int64_t N,
                     const unsigned long long* __restrict__ bbox, T r2, uint32_t mask,
                     GridCells* __restrict__ cells, uint32_t* __restrict__ ckey,
                     int32_t* __restrict__ cpos) {
    const bool any = bbox[0] != ~0ull;
    const GridCells c = grid_cells_of(any ? from_ordered_bits(bbox[0]) : 0.0,
                                      any ? from_ordered_bits(bbox[1]) : 0.0,
                                      any ? from_ordered_bits(bbox[2]) : 0.0,
                                      any ? from_ordered_bits(bbox[3]) : 0.0, (double)r2,
                                      sizeof(T) == 4 ? 0x1p-149 : 0x1p-1074, mask);
    if (blockIdx.x == 0 && threadIdx.x == 0) *cells = c;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < N; p += stride) {
        const T x = xs[p], y = ys[p];
        uint32_t k = mask + 1;
        if (finite_xy(x, y))
            k = grid_bucket(grid_axis((double)x, c.x0, c.inv_x),
                            grid_axis((double)y, c.y0, c.inv_y), gs ? gs[p] : 0, mask);
        ckey[p] = k;
        cpos[p] = (int32_t)p;
    }
}

// The boxes in bucket order (sx, sy, sg), and bucket_begin[b] (b in [0, B]): the first
// bucket-order index whose bucket is >= b (a binary search each, so that a pile of boxes in one
// bucket leaves no long run of empty buckets to one thread).
template <typename T>
__global__ void __launch_bounds__(kGridThreads)
nms_grid_cells_kernel(const uint32_t* __restrict__ skey, const int32_t* __restrict__ spos,
                      int64_t N, int64_t B, const T* __restrict__ xs, const T* __restrict__ ys,
                      const int64_t* __restrict__ gs, int32_t* __restrict__ bucket_begin,
                      T* __restrict__ sx, T* __restrict__ sy, int64_t* __restrict__ sg) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i <= (N > B ? N : B);
         i += stride) {
        if (i < N) {
            const int32_t p = spos[i];
            sx[i] = xs[p];
            sy[i] = ys[p];
            if (sg) sg[i] = gs[p];
        }
        if (i <= B) {
            int64_t lo = 0, hi = N;
            while (lo < hi) {
                const int64_t m = lo + (hi - lo) / 2;
                if (skey[m] < (uint64_t)i) lo = m + 1; else hi = m;
            }
            bucket_begin[i] = (int32_t)lo;
        }
    }
}

// The states before the rounds (finite boxes undecided, the others kept), the cursors of the
// first two rounds at the first box of each bucket, the counters zero.
template <typename T>
__global__ void __launch_bounds__(kGridThreads)
nms_grid_init_kernel(const T* __restrict__ xs, const T* __restrict__ ys, int64_t N, int64_t B,
                     const int32_t* __restrict__ bucket_begin, uint8_t* __restrict__ state,
                     int32_t* __restrict__ cur0, int32_t* __restrict__ cur1,
                     uint32_t* __restrict__ count) {
    const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = first; p < N; p += stride)
        state[p] = finite_xy(xs[p], ys[p]) ? kUndecided : kKept;
    for (int64_t b = first; b < B; b += stride) cur0[b] = cur1[b] = bucket_begin[b];
    if (first < 5) count[first] = 0;
}

// The device side of grid_decide: the threads of the whole grid (a cooperative launch) or of
// one block.
template <bool kGridSync>
struct GridExec {
    int64_t gtid, gthreads;

    __device__ GridExec()
        : gtid((int64_t)blockIdx.x * blockDim.x + threadIdx.x),
          gthreads((int64_t)gridDim.x * blockDim.x) {}
    __device__ bool first() const { return gtid == 0; }
    // The evaluate phase of `round`: f(s) per box (its budgeted scan); the boxes whose scan ran
    // out of budget go to a list, and after a barrier each is scanned again by one warp (a
    // dense bucket's few put-forward boxes by different warps, at the same time).
    template <typename T, typename F>
    __device__ void evaluate(const GridView<T>& v, const GridCells& c, int64_t n,
                             const int32_t* cur, int round, F&& f) {
        uint32_t* nlong = v.count + 3 + (round & 1);
        if (gtid == 0) v.count[3 + ((round + 1) & 1)] = 0;  // last read a round ago
        for (int64_t s = gtid; s < n; s += gthreads)
            if (!f(s)) v.longs[atomicAdd(nlong, 1u)] = (int32_t)s;
        barrier();
        const uint32_t m = *(const volatile uint32_t*)nlong;
        const int lane = threadIdx.x & 31;
        for (int64_t i = gtid >> 5; i < (int64_t)m; i += gthreads >> 5)  // warp-uniform
            grid_evaluate_warp(v, c, v.longs[i], cur, lane);
    }
    __device__ void barrier() {
        if constexpr (kGridSync)
            cooperative_groups::this_grid().sync();
        else
            __syncthreads();
    }
    // The pull of each box, then the advance: a bid of each box still open for its bucket's
    // next cursor (one atomicMin per bucket and warp) and the count of the open boxes (one
    // atomicAdd per warp). Warps step together (gthreads is a multiple of 32), so every ballot
    // has all 32 lanes.
    template <typename T>
    __device__ void pull_open(const GridView<T>& v, const GridCells& c, int64_t n,
                              const int32_t* cur, int32_t* next, uint32_t* left) {
        const int lane = threadIdx.x & 31;
        for (int64_t base = gtid - lane; base < n; base += gthreads) {
            const int64_t s = base + lane;
            if (s < n) grid_pull(v, c, s, cur);
            const bool open = s < n && grid_open(v, s, cur);
            const uint32_t opened = __ballot_sync(0xffffffffu, open);
            if (!opened) continue;
            if (lane == 0) atomicAdd(left, (uint32_t)__popc(opened));
            const uint32_t b = s < n ? v.skey[s] : 0xffffffffu;
            const uint32_t same = __match_any_sync(0xffffffffu, b);
            if (open && !(opened & same & ((1u << lane) - 1))) atomicMin(next + b, (int32_t)s);
        }
    }
    __device__ bool lead() const { return blockIdx.x == 0; }
    __device__ int tid() const { return threadIdx.x; }
    __device__ int nthreads() const { return blockDim.x; }
    __device__ void sync() { __syncthreads(); }
    __device__ bool sync_or(bool b) { return __syncthreads_or(b) != 0; }
    __device__ void note_round(int, uint32_t) {}
    __device__ void note_window(int) {}
};

// The rounds and the finish (grid_decide): a cooperative launch of blocks that are all resident
// (kGridSync), or one block.
template <typename T, bool kGridSync>
__global__ void __launch_bounds__(kGridThreads) nms_grid_decide_kernel(GridView<T> v) {
    __shared__ GridFinishShared sh;
    GridExec<kGridSync> x;
    grid_decide(v, sh, x);
}

// Kept boxes per 64 positions: a warp a word of 64 positions (two ballots).
__global__ void __launch_bounds__(kGridThreads)
nms_grid_count_kernel(const uint8_t* __restrict__ state, int64_t N, int64_t C,
                      uint32_t* __restrict__ kept) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t rb = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; rb < C; rb += warps) {
        const int64_t p = rb * kBoxesPerWord + lane;
        const uint32_t lo = __ballot_sync(0xffffffffu, p < N && state[p] == kKept);
        const uint32_t hi = __ballot_sync(0xffffffffu, p + 32 < N && state[p + 32] == kKept);
        if (lane == 0) kept[rb] = __popc(lo) + __popc(hi);
    }
}

// One block: the kept boxes before each 64 positions (in place) and in all (num_kept, *total).
__global__ void __launch_bounds__(1024)
nms_grid_scan_kernel(uint32_t* __restrict__ kept, int64_t C, uint32_t* __restrict__ total,
                     int64_t* __restrict__ num_kept) {
    __shared__ uint32_t s_warp[33];
    const uint32_t t = block_scan(kept, (int)C, s_warp);
    if (threadIdx.x == 0) {
        if (num_kept) *num_kept = t;  // first: a host may be polling it
        *total = t;
    }
}

// keep_mask by box, keep_idx in visiting order, -1 past the kept ones: a warp a word of 64
// positions, each kept box's slot its word's `before` plus the kept boxes ahead of it in the
// word (ballots).
__global__ void __launch_bounds__(kGridThreads)
nms_grid_output_kernel(const uint8_t* __restrict__ state, const int32_t* __restrict__ order,
                       int64_t N, const uint32_t* __restrict__ before,
                       const uint32_t* __restrict__ total, bool* __restrict__ keep_mask,
                       int64_t* __restrict__ keep_idx) {
    const int64_t C = (N + kBoxesPerWord - 1) / kBoxesPerWord;
    const int lane = threadIdx.x & 31;
    const uint32_t ahead = (1u << lane) - 1;  // the lanes below this one
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int64_t rb = first >> 5; rb < C; rb += stride >> 5) {
        const int64_t p = rb * kBoxesPerWord + lane, q = p + 32;
        const bool kp = p < N && state[p] == kKept, kq = q < N && state[q] == kKept;
        const uint32_t lo = __ballot_sync(0xffffffffu, kp);
        const uint32_t hi = __ballot_sync(0xffffffffu, kq);
        const int64_t k = before[rb];
        if (p < N) {
            const int32_t box = order[p];
            if (keep_mask) keep_mask[box] = kp;
            if (keep_idx && kp) keep_idx[k + __popc(lo & ahead)] = box;
        }
        if (q < N) {
            const int32_t box = order[q];
            if (keep_mask) keep_mask[box] = kq;
            if (keep_idx && kq) keep_idx[k + __popc(lo) + __popc(hi & ahead)] = box;
        }
    }
    if (keep_idx)
        for (int64_t p = (int64_t)*total + first; p < N; p += stride) keep_idx[p] = -1;
}

// ------------------------------------------------------------------------------------------
// launcher

int score_end_bit(pcops_dtype score_dtype) { return score_dtype == PCOPS_FLOAT64 ? 64 : 32; }

// cub's temp bytes for the sort by score (size only: no launch, the temp pointer is NULL).
size_t score_sort_bytes(pcops_dtype score_dtype, int64_t N, cudaStream_t stream) {
    size_t bytes = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, bytes, (const uint64_t*)nullptr, (uint64_t*)nullptr,
                                    (const int32_t*)nullptr, (int32_t*)nullptr, (int)N, 0,
                                    score_end_bit(score_dtype), stream);
    return bytes;
}

// B: a power of two >= 2N, at least 1024.
int64_t grid_buckets(int64_t N) {
    int64_t B = 1024;
    while (B < 2 * N) B *= 2;
    return B;
}

// Grid path workspace; one layout for the size query (base NULL) and the launcher.
struct GridWorkspace {
    uint64_t *keys_in, *keys_out;
    int32_t *pos_in, *order;
    void* cub_temp;
    size_t cub_bytes;
    void *xs, *ys;  // [N] dtype, visiting order
    int64_t* gs;
    unsigned long long* bbox;  // [4]
    GridCells* cells;
    uint32_t *ckey, *skey;
    int32_t *cpos, *spos, *bucket_begin;
    void *sx, *sy;  // [N] dtype, bucket order
    int64_t* sg;
    uint8_t* state;          // [N]
    int32_t* cursor[2];      // [B]
    uint32_t* count;         // [5]
    int32_t* longs;          // [N]
    uint32_t* kept;          // [C] kept boxes per 64 positions, then before them
    uint32_t* total;         // [1]
    int key_bits;            // bits of the bucket keys
    size_t bytes;
};

GridWorkspace grid_layout(void* base, size_t elem, pcops_dtype score_dtype, int64_t N,
                          cudaStream_t stream) {
    GridWorkspace w;
    const int64_t B = grid_buckets(N), C = (N + kBoxesPerWord - 1) / kBoxesPerWord;
    w.key_bits = 1;
    while ((int64_t(1) << w.key_bits) <= B) ++w.key_bits;  // keys <= B
    // cub's temp serves both sorts (size only: no launch, the temp pointer is NULL)
    const size_t score_bytes = score_sort_bytes(score_dtype, N, stream);
    size_t key_bytes = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, key_bytes, (const uint32_t*)nullptr,
                                    (uint32_t*)nullptr, (const int32_t*)nullptr,
                                    (int32_t*)nullptr, (int)N, 0, w.key_bits, stream);
    w.cub_bytes = score_bytes > key_bytes ? score_bytes : key_bytes;
    pcops_carver c = pcops_carver_init(base);
    w.keys_in = (uint64_t*)pcops_carve(&c, N, sizeof(uint64_t));
    w.keys_out = (uint64_t*)pcops_carve(&c, N, sizeof(uint64_t));
    w.pos_in = (int32_t*)pcops_carve(&c, N, sizeof(int32_t));
    w.order = (int32_t*)pcops_carve(&c, N, sizeof(int32_t));
    w.cub_temp = pcops_carve(&c, (int64_t)w.cub_bytes, 1);
    w.xs = pcops_carve(&c, N, elem);
    w.ys = pcops_carve(&c, N, elem);
    w.gs = (int64_t*)pcops_carve(&c, N, sizeof(int64_t));
    w.bbox = (unsigned long long*)pcops_carve(&c, 4, sizeof(unsigned long long));
    w.cells = (GridCells*)pcops_carve(&c, 1, sizeof(GridCells));
    w.ckey = (uint32_t*)pcops_carve(&c, N, sizeof(uint32_t));
    w.skey = (uint32_t*)pcops_carve(&c, N, sizeof(uint32_t));
    w.cpos = (int32_t*)pcops_carve(&c, N, sizeof(int32_t));
    w.spos = (int32_t*)pcops_carve(&c, N, sizeof(int32_t));
    w.bucket_begin = (int32_t*)pcops_carve(&c, B + 1, sizeof(int32_t));
    w.sx = pcops_carve(&c, N, elem);
    w.sy = pcops_carve(&c, N, elem);
    w.sg = (int64_t*)pcops_carve(&c, N, sizeof(int64_t));
    w.state = (uint8_t*)pcops_carve(&c, N, sizeof(uint8_t));
    w.cursor[0] = (int32_t*)pcops_carve(&c, B, sizeof(int32_t));
    w.cursor[1] = (int32_t*)pcops_carve(&c, B, sizeof(int32_t));
    w.count = (uint32_t*)pcops_carve(&c, 5, sizeof(uint32_t));
    w.longs = (int32_t*)pcops_carve(&c, N, sizeof(int32_t));
    w.kept = (uint32_t*)pcops_carve(&c, C, sizeof(uint32_t));
    w.total = (uint32_t*)pcops_carve(&c, 1, sizeof(uint32_t));
    w.bytes = pcops_carver_bytes(&c);
    return w;
}

// The decide kernel's resident blocks (no dynamic shared memory).
template <typename T>
cudaError_t grid_decide_attributes(int* blocks) {
    static SmemOptIn cache;
    int bytes = 0;
    return opt_into_shared(nms_grid_decide_kernel<T, true>, kGridThreads, cache, &bytes, blocks,
                           false);
}

unsigned grid_blocks(int64_t n) {
    const int64_t b = (n + kGridThreads - 1) / kGridThreads;
    return (unsigned)(b < 1 ? 1 : (b < 8192 ? b : 8192));
}

// The grid path for N in [1, PCOPS_CIRCLE_NMS_CUDA_MAX] boxes with the workspace of grid_layout.
template <typename T, typename S>
cudaError_t launch_grid(const T* centers, int64_t D, pcops_dtype score_dtype, const S* scores,
                        const int64_t* groups, int64_t N, double radius2, void* workspace,
                        bool* keep_mask, int64_t* keep_idx, int64_t* num_kept,
                        cudaStream_t stream) {
    int max_blocks = 0;
    cudaError_t err = grid_decide_attributes<T>(&max_blocks);
    if (err != cudaSuccess) return err;
    const int64_t B = grid_buckets(N), C = (N + kBoxesPerWord - 1) / kBoxesPerWord;
    GridWorkspace w = grid_layout(workspace, sizeof(T), score_dtype, N, stream);
    const T r2 = (T)radius2;  // rounded as the CPU rounds it
    T *xs = (T*)w.xs, *ys = (T*)w.ys, *sx = (T*)w.sx, *sy = (T*)w.sy;
    int64_t* gs = groups ? w.gs : nullptr;
    int64_t* sg = groups ? w.sg : nullptr;
    const unsigned blocks = grid_blocks(N);

    nms_score_keys_kernel<S><<<blocks, kGridThreads, 0, stream>>>(scores, N, w.keys_in,
                                                                  w.pos_in, w.bbox);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    // stable: equal keys keep the index order of pos_in, so ties go to the lower index
    err = cub::DeviceRadixSort::SortPairs(w.cub_temp, w.cub_bytes, w.keys_in, w.keys_out,
                                          w.pos_in, w.order, (int)N, 0,
                                          score_end_bit(score_dtype), stream);
    if (err != cudaSuccess) return err;
    nms_grid_gather_kernel<T><<<blocks, kGridThreads, 0, stream>>>(
        centers, D, w.order, groups, N, xs, ys, gs, w.bbox);
    nms_grid_keys_kernel<T><<<blocks, kGridThreads, 0, stream>>>(
        xs, ys, gs, N, w.bbox, r2, (uint32_t)(B - 1), w.cells, w.ckey, w.cpos);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    // stable: positions ascend within a bucket
    err = cub::DeviceRadixSort::SortPairs(w.cub_temp, w.cub_bytes, w.ckey, w.skey, w.cpos,
                                          w.spos, (int)N, 0, w.key_bits, stream);
    if (err != cudaSuccess) return err;
    nms_grid_cells_kernel<T><<<grid_blocks((N > B ? N : B) + 1), kGridThreads, 0, stream>>>(
        w.skey, w.spos, N, B, xs, ys, gs, w.bucket_begin, sx, sy, sg);
    nms_grid_init_kernel<T><<<grid_blocks(N > B ? N : B), kGridThreads, 0, stream>>>(
        xs, ys, N, B, w.bucket_begin, w.state, w.cursor[0], w.cursor[1], w.count);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;

    GridView<T> v{w.spos, w.skey, sx, sy, sg, w.bucket_begin, xs, ys, gs, w.cells, w.state,
                  {w.cursor[0], w.cursor[1]}, w.count, N, r2, w.longs};
    bool ran = false;
    if (max_blocks > 0) {
        const int64_t want = (N + kGridThreads - 1) / kGridThreads;
        const unsigned coop = (unsigned)(want < max_blocks ? want : max_blocks);
        void* args[] = {(void*)&v};
        err = launch_cooperative((const void*)nms_grid_decide_kernel<T, true>, coop, kGridThreads,
                                 args, 0, stream, &ran);
        if (err != cudaSuccess) return err;
    }
    if (!ran) nms_grid_decide_kernel<T, false><<<1, kGridThreads, 0, stream>>>(v);

    nms_grid_count_kernel<<<grid_blocks(C * 32), kGridThreads, 0, stream>>>(w.state, N, C, w.kept);
    nms_grid_scan_kernel<<<1, 1024, 0, stream>>>(w.kept, C, w.total, num_kept);
    nms_grid_output_kernel<<<grid_blocks(C * 32), kGridThreads, 0, stream>>>(
        w.state, w.order, N, w.kept, w.total, keep_mask, keep_idx);
    return cudaGetLastError();
}

}  // namespace
