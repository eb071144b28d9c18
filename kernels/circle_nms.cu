/*
 * circle_nms.cu -- greedy centre-distance NMS (circle NMS) on CUDA, with no host synchronisation.
 *
 * N = boxes, D = coordinate dims of a centre (only x and y are used); "position" = place in the
 * visiting order (descending score, NaN first, ties to the lower index: the key of
 * circle_nms.h, the CPU's order). centers[N,D], scores[N], groups[N]? -> keep_mask[N] (bool),
 * keep_idx[N] (int64), num_kept[1].
 *
 * Same semantics and arithmetic as circle_nms.c: box j (later) is removed by a kept box i
 * (earlier) of its group when pcops_dist2_xy (geometry.h: dx*dx + dy*dy, every operation
 * rounded on its own) < (T)radius2. CPU and CUDA therefore keep exactly the same boxes.
 *
 * Six paths; the launch plan (nms_plan, from N alone) takes 6, the dataflow path, up to
 * kFlowMaxBoxes boxes (4 where its cooperative launch cannot run), and 3 above; tests and
 * benchmarks force any of them through `variant` (pcops.h). Path 4, the block path v2, path 5,
 * the pair-tile path, and path 6 are described in their sections below (what they change and
 * why); 1, 2, 4 and 5 are no longer chosen by size (6 is faster on every input measured: kept
 * for comparison and as 6's fallback).
 *
 * 1. Block path, N <= kBlockMaxBoxes: ONE launch of ONE thread block (nms_block_kernel),
 *    everything in shared memory, no workspace:
 *      a. score keys (circle_nms.h) with their box index, bitonic-sorted: the visiting order;
 *      b. centres (and groups) gathered into visiting order; the bounding box of the finite
 *         centres; a grid over it (make_grid) whose cells are at least the radius wide (at
 *         most kBlockMaxCells cells: wider cells for spread-out scenes), so two boxes within
 *         the radius lie in the same or adjacent cells. Non-finite centres are within the
 *         radius of nothing (their distances are NaN or inf) and stay out of the grid;
 *      c. positions bitonic-sorted by cell, and each cell's run [start, end) found;
 *      d. for every position p, from the 3x3 cells around it: diag[p], the bits of the later
 *         positions of p's own 64-position row block within the radius (same group), and
 *         far[p], whether any later position of a later row block is;
 *      e. the greedy scan, row block by row block (64 positions): warp 0 resolves the block
 *         (a box is kept unless its removed bit is set or a kept earlier box of the block has
 *         it in its diag word; only rows with a nonzero diag word are visited), then every
 *         thread takes (kept row with far set, cell) pairs and sets the removed bits of the
 *         later boxes within the radius (atomicOr on a shared bitset). Two barriers per block.
 *    Cost: two bitonic sorts of next_pow2(N) keys, the 3x3-cell candidates of every box once,
 *    and those of the kept boxes with a far neighbour once more; ceil(N/64) sequential steps.
 *
 * 3. Grid path, any N up to PCOPS_CIRCLE_NMS_CUDA_MAX: the boxes sorted into a grid in the
 *    workspace (O(N), L2-resident at the sizes that matter) by the whole GPU, the greedy
 *    decided by rounds (see "Rounds" below):
 *      nms_score_keys_kernel + cub::DeviceRadixSort::SortPairs (stable) -> order (int32);
 *      nms_grid_gather_kernel (centres into visiting order, the bounding box by atomics);
 *      nms_grid_keys_kernel (the grid, cell keys) + a cub sort by cell (spatial order);
 *      nms_grid_cells_kernel (cell_begin[], boxes in spatial order); nms_grid_neighbours_kernel
 *      (per position: the three runs of spatial indices covering its 3x3 cells, inpred (its
 *      preds in its own row block, a bit each), the far preds in up to kGridPredSlots slots,
 *      whether it has a pred at all); then three rounds on the whole GPU
 *      (nms_grid_round_kernel, a warp per row block; above 4096 boxes) and
 *      nms_grid_rounds_kernel, one block: rounds until few row blocks are left, those in
 *      order by one warp, then the outputs.
 *    Cost: two radix sorts and O(N * neighbourhood) tests spread over the GPU, then a few
 *    rounds over the undecided boxes (uniform scenes of 16384 / 65536 boxes: 0.26 / 0.72 ms
 *    in all on the H100, against 0.53 / 2.0 for the earlier scan of ceil(N/64) sequential
 *    row-block steps).
 *
 * 2. Bitmask path (the previous large path, kept for comparison; forced only):
 *      a. score keys + cub sort -> order, as in 3;
 *      b. nms_gather_kernel: centres (and groups) into visiting order, structure of arrays;
 *         keep_mask false / keep_idx -1 everywhere;
 *      c. nms_mask_kernel: the suppression bitmask mask[N][C] (C = ceil(N/64)) of 64-bit words:
 *         bit t of mask[i][cb] is set when position j = cb*64 + t > i is in i's group and
 *         within the radius; the upper triangle only (blocks with cb < rb return at once);
 *      d. nms_scan_kernel: the greedy pass over the mask by ONE thread block: per row block,
 *         thread 0 resolves its 64 boxes from the diagonal words (prefetched during the
 *         previous block), the kept ones are written out, and the kept rows' words are ORed
 *         into removed[cb] for every later column block. Two barriers per row block.
 *    Workspace: about N**2 / 8 bytes (the mask) plus O(N).
 *
 * Workspaces are carved with geometry.h's one alignment (mask_layout, grid_layout); the block
 * kernel's shared memory is carved by block_smem (16-byte pieces), on the host for its size.
 */
#include <cooperative_groups.h>
#include <cub/device/device_radix_sort.cuh>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "circle_nms.h"
#include "geometry.h"
#include "pcops.h"

namespace {

namespace cg = cooperative_groups;

// OR of v over the warp, in every lane: one redux on sm_80+, five shuffles before.
__device__ __forceinline__ uint32_t warp_or(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_or_sync(0xffffffffu, v);
#else
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v |= __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
#endif
}

constexpr int kBoxesPerWord = 64;  // positions per row / column block = bits of a mask word

// Sum of v over the warp, in every lane.
__device__ __forceinline__ int warp_sum(int v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_add_sync(0xffffffffu, v);
#else
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
#endif
}

// OR of a 64-bit v over the warp, in every lane.
__device__ __forceinline__ uint64_t warp_or64(uint64_t v) {
    return (uint64_t)warp_or((uint32_t)v) | ((uint64_t)warp_or((uint32_t)(v >> 32)) << 32);
}

__device__ __forceinline__ uint64_t ballot64(bool a, bool b) {
    return (uint64_t)__ballot_sync(0xffffffffu, a) | ((uint64_t)__ballot_sync(0xffffffffu, b) << 32);
}

// ------------------------------------------------------------------------------------------
// Rounds: the greedy decided in parallel (the grid path; the block path v2 in list mode, and the
// pair-tile path after it, apply the same rule as a dataflow without rounds: v2_decide_dataflow).
//
// Box p is kept iff none of its preds (earlier positions of its group within the radius) is
// kept. That is a rule on facts: p is removed as soon as one pred is known kept, kept as soon
// as every pred is known removed, and every decision so made is the greedy's. A round applies
// the rule to every undecided box at once, reading the states of the round before (two
// buffers, one barrier a round); random scenes need a handful of rounds (uniform 1000 to 65536
// boxes of the peer benchmark: 3 to 10 rounds instead of N/64 sequential row-block steps).
//
// State of a row block (64 positions): kept bits and removed bits (positions past N count as
// removed); a position in neither is undecided. Inside a row block the preds are the in-block
// pred words (bit t of inpred[r] is set when position base + t < r is a pred of r), one per
// row, so a lane tests its rows against the block's kept / undecided bits and a ballot
// gathers the answers; the preds in earlier row blocks ("far") come in as two masks, far_hit
// (rows with a kept far pred) and far_wait (rows with an undecided one).
//
// Rounds stop when few row blocks are left undecided or a round decides little (a long chain
// of preds, e.g. boxes on a line visited along it, would need a round per box); a single warp
// then resolves the undecided row blocks in order, each one when every earlier one is final:
// the block path's in-order greedy. The answer is the same bits whichever way a box is
// decided.

constexpr int kRoundSteps = 8;    // in-block rule applications per row block and round
constexpr int kMaxRounds = 48;    // rounds at most (a cap: the in-order pass finishes anyway)
constexpr int kRoundMinDecided = 64;  // a round deciding fewer rows ends the rounds
constexpr int kRoundMinOpen = 2;      // so does having at most this many undecided row blocks

// Applies the rule inside one row block up to `steps` times (until nothing changes), using
// far_hit / far_wait for the far preds. Called by a whole warp with uniform kept / removed; lane
// l holds pa = inpred[row l], pb = inpred[row 32 + l] of the block (four ballots a step).
__device__ __forceinline__ void rounds_block_steps(uint64_t pa, uint64_t pb, uint64_t far_hit,
                                                   uint64_t far_wait, uint64_t& kept,
                                                   uint64_t& removed, int steps) {
    for (int it = 0; it < steps; ++it) {
        const uint64_t und = ~(kept | removed);
        if (!und) return;
        const uint64_t hit_in = ballot64((pa & kept) != 0, (pb & kept) != 0);
        const uint64_t wait_in = ballot64((pa & und) != 0, (pb & und) != 0);
        const uint64_t gone = und & (far_hit | hit_in);
        const uint64_t keep = und & ~gone & ~far_wait & ~wait_in;
        if (!(gone | keep)) return;
        kept |= keep;
        removed |= gone;
    }
}

// The row block resolved in visiting order once every earlier row block is final: rem holds
// the rows already removed and those with a kept far pred. A row not in rem without in-block
// preds is kept; the rows with some are taken in order, each kept unless one of its in-block
// preds is (every earlier row is settled by then). Returns the final removed bits (kept =
// ~rem). Called by a whole warp (uniform rem); the pred words come from the lanes by shuffles.
__device__ __forceinline__ uint64_t rounds_block_in_order(uint64_t pa, uint64_t pb,
                                                          uint64_t rem) {
    uint64_t todo = ballot64(pa != 0, pb != 0) & ~rem;
    uint64_t kept = ~rem & ~todo;
    for (; todo; todo &= todo - 1) {
        const int t = __ffsll((long long)todo) - 1;
        const uint64_t p = __shfl_sync(0xffffffffu, t < 32 ? pa : pb, t & 31);
        if (p & kept)
            rem |= uint64_t(1) << t;
        else
            kept |= uint64_t(1) << t;
    }
    return rem;
}

// Rows of a row block past N (all 64 when base >= N).
__device__ __forceinline__ uint64_t rows_past_n(int64_t base, int64_t N) {
    const int64_t left = N - base;
    return left >= kBoxesPerWord ? 0 : (left <= 0 ? ~uint64_t(0) : ~uint64_t(0) << left);
}

// Block path.
constexpr int kBlockMaxBoxes = PCOPS_CIRCLE_NMS_CUDA_BLOCK_MAX;
constexpr int kBlockMaxCells = 8192;   // cell runs are uint16: N <= 4096 fits
constexpr int kBlockMaxThreads = 1024;

// Bitmask path.
constexpr int kKeyThreads = 256;
constexpr int kGatherThreads = 256;
constexpr int kScanThreads = 256;
constexpr int kOrBatch = 16;  // kept rows whose mask words a scan thread loads at once
constexpr int64_t kScanSharedWords = 4096;  // removed[] lives in shared memory up to this C (32 KB)
constexpr int64_t kMaxBlocks = 65535;       // C limit: gridDim.y of the mask kernel

__device__ __forceinline__ float dist2_xy(float ax, float ay, float bx, float by) {
    return pcops_dist2_xy_f32(ax, ay, bx, by);
}
__device__ __forceinline__ double dist2_xy(double ax, double ay, double bx, double by) {
    return pcops_dist2_xy_f64(ax, ay, bx, by);
}
__device__ __forceinline__ uint64_t score_key(float s) { return pcops_nms_score_key_f32(s); }
__device__ __forceinline__ uint64_t score_key(double s) { return pcops_nms_score_key_f64(s); }

// ------------------------------------------------------------------------------------------
// Block path

// Sorts (key[i], idx[i]), i < P, ascending by key then idx; P a power of two (or 1). Called by
// every thread of the block (barriers inside, in uniform control flow); the caller has a
// barrier between its writes of key/idx and the call. Each compare-exchange pair (i, i ^ j) is
// handled by the one thread that owns i, the lower of the two.
__device__ void block_bitonic_sort(uint64_t* key, int32_t* idx, int P) {
    for (int k = 2; k <= P; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < P; i += blockDim.x) {
                const int l = i ^ j;
                if (l > i) {
                    const uint64_t ka = key[i], kb = key[l];
                    const int32_t ia = idx[i], ib = idx[l];
                    const bool a_after_b = ka > kb || (ka == kb && ia > ib);
                    const bool ascending = (i & k) == 0;
                    if (a_after_b == ascending) {
                        key[i] = kb;
                        key[l] = ka;
                        idx[i] = ib;
                        idx[l] = ia;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// The grid of the block path: cell (cx, cy) of a finite centre, cx in [0, gx), cy in [0, gy).
struct BlockGrid {
    double x0, y0, inv;  // origin (the finite centres' minimum) and 1 / cell width
    int gx, gy;
};

// Cell coordinate along one axis: floor((v - v0) * inv) clamped to [0, g). The clamp is
// monotone, so boxes in adjacent unclamped cells stay in the same or adjacent cells.
__device__ __forceinline__ int grid_coord(double v, double v0, double inv, int g) {
    const double c = floor((v - v0) * inv);
    if (!(c > 0.0)) return 0;  // also NaN (not reached: only finite centres get a cell)
    return c < (double)(g - 1) ? (int)c : g - 1;
}

// The grid over the finite centres' bounding box [lo, hi]: cells at least cell_min wide
// (radius * (1 + 2**-10); 0 when radius2 rounds to 0: nothing is within it, any grid will do;
// inf: one cell), at least 1/4000 of the longer side, then 1.25x wider until at most max_cells
// cells (inv = 1 / width shrinks by 0.8: one division in all; its rounding is far inside the
// 2**-10 margin). One cell when nothing is finite or the extent overflows. A pure function of
// its arguments: every thread that calls it gets the same grid.
__device__ BlockGrid make_grid(double lo_x, double lo_y, double hi_x, double hi_y,
                               double cell_min, int max_cells) {
    BlockGrid gr;
    gr.x0 = lo_x;
    gr.y0 = lo_y;
    gr.inv = 0.0;
    gr.gx = 1;
    gr.gy = 1;
    const double ex = hi_x - lo_x, ey = hi_y - lo_y;  // -inf when nothing is finite
    double cell = cell_min > 0.0 ? cell_min : 0.0;
    const double side = ex > ey ? ex : ey;
    if (cell < side / 4000.0) cell = side / 4000.0;
    if (ex >= 0.0 && ey >= 0.0 && ex < INFINITY && ey < INFINITY && cell > 0.0 &&
        cell < INFINITY) {
        // the largest coordinate grid_coord gives is floor(ex * inv): gx = that + 1
        for (double inv = 1.0 / cell;; inv *= 0.8) {
            const double nx = floor(ex * inv) + 1.0, ny = floor(ey * inv) + 1.0;
            if (nx * ny <= (double)max_cells) {
                gr.gx = (int)nx;
                gr.gy = (int)ny;
                gr.inv = inv;
                break;
            }
        }
    }
    return gr;
}

template <typename T>
__device__ __forceinline__ bool finite_xy(T x, T y) {
    return isfinite(x) && isfinite(y);
}

// The bounding box of the finite centres: one per thread, then per warp (both grids, the
// block kernel's and the grid path's, take their cells from it). lo > hi: no finite centre.
struct Box2 {
    double lo_x, lo_y, hi_x, hi_y;

    __device__ __forceinline__ static Box2 empty() {
        return {INFINITY, INFINITY, -INFINITY, -INFINITY};
    }
    __device__ __forceinline__ void merge(const Box2& o) {
        lo_x = fmin(lo_x, o.lo_x);
        lo_y = fmin(lo_y, o.lo_y);
        hi_x = fmax(hi_x, o.hi_x);
        hi_y = fmax(hi_y, o.hi_y);
    }
    template <typename T>
    __device__ __forceinline__ void add(T x, T y) {
        if (finite_xy(x, y)) merge({(double)x, (double)y, (double)x, (double)y});
    }
    // Every lane ends with the box of its warp (all 32 lanes take part).
    __device__ __forceinline__ void warp_reduce() {
        const unsigned all = 0xffffffffu;
        for (int off = 16; off > 0; off >>= 1)
            merge({__shfl_xor_sync(all, lo_x, off), __shfl_xor_sync(all, lo_y, off),
                   __shfl_xor_sync(all, hi_x, off), __shfl_xor_sync(all, hi_y, off)});
    }
    // The same for a box of float centres (every bound a float or +-inf, so exact as float):
    // on sm_80+ four integer reductions on the bounds' order-preserving bits instead of twenty
    // shuffles of doubles.
    template <typename T>
    __device__ __forceinline__ void warp_reduce_of() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        if constexpr (sizeof(T) == 4) {
            const unsigned all = 0xffffffffu;
            auto key = [](double v) {
                const uint32_t u = __float_as_uint((float)v);
                return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
            };
            auto value = [](uint32_t k) {
                return (double)__uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
            };
            lo_x = value(__reduce_min_sync(all, key(lo_x)));
            lo_y = value(__reduce_min_sync(all, key(lo_y)));
            hi_x = value(__reduce_max_sync(all, key(hi_x)));
            hi_y = value(__reduce_max_sync(all, key(hi_y)));
            return;
        }
#endif
        warp_reduce();
    }
};

// Shared memory of the block kernel for N boxes, P = next power of two >= N (at least 1);
// one carving for the size computed on the host and the pointers on the device.
template <typename T>
struct BlockSmem {
    uint64_t* key;      // [P] sort keys; after the sorts: diag[N] (the diagonal words)
    int32_t* idx;       // [P] sort payload: box index by position, then position by cell order
    int32_t* order;     // [N] box index by position
    T* x;               // [N] centres by position
    T* y;               // [N]
    int64_t* g;         // [N] groups by position (when groups are given)
    uint16_t* cstart;   // [kBlockMaxCells] cell runs in cell order
    uint16_t* cend;     // [kBlockMaxCells]
    uint32_t* removed;  // [2 C] a bit per position
    uint32_t* far;      // [2 C] a bit per position
    size_t bytes;
};

// Carves consecutive pieces of shared memory (or counts them, base NULL) in 16-byte steps, so
// every type stays aligned; geometry.h's pcops_carver rounds to 256 bytes, too coarse for a
// block's shared memory. off: the bytes taken so far.
struct SmemCarver {
    char* base;
    size_t off;
    __host__ __device__ explicit SmemCarver(void* b) : base((char*)b), off(0) {}
    __host__ __device__ char* take(size_t bytes) {
        char* q = base + off;
        off += (bytes + 15) & ~(size_t)15;
        return q;
    }
};

template <typename T>
__host__ __device__ BlockSmem<T> block_smem(void* base, int N, int P, bool with_groups) {
    const int C = (N + kBoxesPerWord - 1) / kBoxesPerWord;
    SmemCarver c(base);
    BlockSmem<T> s;
    auto take = [&](size_t bytes) { return c.take(bytes); };
    s.key = (uint64_t*)take((size_t)P * sizeof(uint64_t));
    s.idx = (int32_t*)take((size_t)P * sizeof(int32_t));
    s.order = (int32_t*)take((size_t)N * sizeof(int32_t));
    s.x = (T*)take((size_t)N * sizeof(T));
    s.y = (T*)take((size_t)N * sizeof(T));
    s.g = with_groups ? (int64_t*)take((size_t)N * sizeof(int64_t)) : nullptr;
    s.cstart = (uint16_t*)take(kBlockMaxCells * sizeof(uint16_t));
    s.cend = (uint16_t*)take(kBlockMaxCells * sizeof(uint16_t));
    s.removed = (uint32_t*)take((size_t)2 * C * sizeof(uint32_t));
    s.far = (uint32_t*)take((size_t)2 * C * sizeof(uint32_t));
    s.bytes = c.off;
    return s;
}

// One block of blockDim.x threads (a multiple of 64, at most 1024), dynamic shared memory
// block_smem(...).bytes. N in [1, kBlockMaxBoxes]; P = next power of two >= N.
template <typename T, typename S>
__global__ void __launch_bounds__(kBlockMaxThreads, 1)
nms_block_kernel(const T* __restrict__ centers, int64_t D, const S* __restrict__ scores,
                 const int64_t* __restrict__ groups, int N, int P, T r2, double cell_min,
                 bool* __restrict__ keep_mask, int64_t* __restrict__ keep_idx,
                 int64_t* __restrict__ num_kept) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ uint64_t s_kept[kBlockMaxBoxes / kBoxesPerWord];  // kept bits per row block
    __shared__ Box2 s_box[32];                                   // per-warp bounding boxes
    __shared__ BlockGrid s_grid;
    __shared__ int64_t s_count;
    const BlockSmem<T> sm = block_smem<T>(smem, N, P, groups != nullptr);
    const int tid = threadIdx.x, nthreads = blockDim.x;
    const int C = (N + kBoxesPerWord - 1) / kBoxesPerWord;

    // a. the visiting order
    for (int i = tid; i < P; i += nthreads) {
        sm.key[i] = i < N ? score_key(scores[i]) : ~uint64_t(0);
        sm.idx[i] = i;
    }
    for (int w = tid; w < 2 * C; w += nthreads) {
        sm.removed[w] = 0;
        sm.far[w] = 0;
    }
    __syncthreads();
    block_bitonic_sort(sm.key, sm.idx, P);

    // b. gather into visiting order; bounding box of the finite centres
    Box2 box = Box2::empty();
    for (int p = tid; p < N; p += nthreads) {
        const int32_t o = sm.idx[p];  // a permutation of [0, N): the keys of [0, N) sort first
        const T x = centers[(int64_t)o * D + 0], y = centers[(int64_t)o * D + 1];
        sm.order[p] = o;
        sm.x[p] = x;
        sm.y[p] = y;
        if (sm.g) sm.g[p] = groups[o];
        box.add(x, y);
    }
    box.warp_reduce_of<T>();
    if ((tid & 31) == 0) s_box[tid >> 5] = box;
    __syncthreads();  // s_box written; sm.idx (score order) read for the last time
    if (tid == 0) {
        for (int w = 1; w < nthreads / 32; ++w) box.merge(s_box[w]);
        s_grid = make_grid(box.lo_x, box.lo_y, box.hi_x, box.hi_y, cell_min, kBlockMaxCells);
    }
    __syncthreads();  // s_grid published
    const BlockGrid gr = s_grid;
    const int ncells = gr.gx * gr.gy;

    // c. positions sorted by cell (non-finite centres: key ncells, after every cell)
    for (int i = tid; i < P; i += nthreads) {
        uint64_t k = ~uint64_t(0);
        if (i < N) {
            const T x = sm.x[i], y = sm.y[i];
            k = (uint64_t)ncells;
            if (finite_xy(x, y))
                k = (uint64_t)grid_coord((double)y, gr.y0, gr.inv, gr.gy) * gr.gx +
                    grid_coord((double)x, gr.x0, gr.inv, gr.gx);
        }
        sm.key[i] = k;
        sm.idx[i] = i;
    }
    for (int c = tid; c < ncells; c += nthreads) {
        sm.cstart[c] = 0;
        sm.cend[c] = 0;
    }
    __syncthreads();
    block_bitonic_sort(sm.key, sm.idx, P);
    for (int s = tid; s < N; s += nthreads) {  // each run's ends are written by one thread
        const uint64_t k = sm.key[s];
        if (k < (uint64_t)ncells) {
            if (s == 0 || sm.key[s - 1] != k) sm.cstart[k] = (uint16_t)s;
            if (s == N - 1 || sm.key[s + 1] != k) sm.cend[k] = (uint16_t)(s + 1);
        }
    }
    __syncthreads();  // the runs are complete; sm.key is free again (it becomes diag)

    // d. diag and far of every position, from the 3x3 cells around it
    uint64_t* diag = sm.key;
    for (int p = tid; p < N; p += nthreads) {
        const T xp = sm.x[p], yp = sm.y[p];
        const int64_t gp = sm.g ? sm.g[p] : 0;
        uint64_t word = 0;
        bool far = false;
        if (finite_xy(xp, yp)) {
            const int cx = grid_coord((double)xp, gr.x0, gr.inv, gr.gx);
            const int cy = grid_coord((double)yp, gr.y0, gr.inv, gr.gy);
            const int block_end = (p / kBoxesPerWord + 1) * kBoxesPerWord;
            for (int yy = (cy > 0 ? cy - 1 : 0); yy <= (cy + 1 < gr.gy ? cy + 1 : cy); ++yy) {
                for (int xx = (cx > 0 ? cx - 1 : 0); xx <= (cx + 1 < gr.gx ? cx + 1 : cx);
                     ++xx) {
                    const int c = yy * gr.gx + xx;
                    for (int s = sm.cstart[c]; s < sm.cend[c]; ++s) {
                        const int q = sm.idx[s];
                        if (q <= p) continue;
                        if (sm.g && sm.g[q] != gp) continue;
                        if (!(dist2_xy(sm.x[q], sm.y[q], xp, yp) < r2)) continue;
                        if (q < block_end)
                            word |= uint64_t(1) << (q % kBoxesPerWord);
                        else
                            far = true;
                    }
                }
            }
        }
        diag[p] = word;
        if (far) atomicOr(&sm.far[p / 32], 1u << (p % 32));
    }
    __syncthreads();

    // e. the greedy scan
    int64_t count = 0;  // warp 0: boxes kept so far
    for (int rb = 0; rb < C; ++rb) {
        const int base = rb * kBoxesPerWord;
        if (tid < 32) {  // warp 0 resolves the row block
            const int a = base + tid, b = base + 32 + tid;
            const uint64_t da = a < N ? diag[a] : 0, db = b < N ? diag[b] : 0;
            const uint64_t nonzero = (uint64_t)__ballot_sync(0xffffffffu, da != 0) |
                                     ((uint64_t)__ballot_sync(0xffffffffu, db != 0) << 32);
            uint64_t kept = 0;
            if (tid == 0) {
                uint64_t rem = (uint64_t)sm.removed[2 * rb] |
                               ((uint64_t)sm.removed[2 * rb + 1] << 32);
                if (N - base < kBoxesPerWord) rem |= ~uint64_t(0) << (N - base);  // past N
                // increasing t: bit t of rem is final when t is reached (diag words only hold
                // later positions)
                for (uint64_t todo = nonzero; todo; todo &= todo - 1) {
                    const int t = __ffsll((long long)todo) - 1;
                    if (!((rem >> t) & 1)) rem |= diag[base + t];
                }
                kept = ~rem;
                s_kept[rb] = kept;
            }
            kept = __shfl_sync(0xffffffffu, kept, 0);
            if (keep_idx) {
                if ((kept >> tid) & 1)
                    keep_idx[count + __popcll(kept & ((uint64_t(1) << tid) - 1))] = sm.order[a];
                if ((kept >> (32 + tid)) & 1)
                    keep_idx[count + __popcll(kept & ((uint64_t(1) << (32 + tid)) - 1))] =
                        sm.order[b];
            }
            count += __popcll(kept);
        }
        __syncthreads();  // s_kept[rb] published

        // kept rows with a far neighbour remove the later boxes within the radius; work items
        // (row, cell of its 3x3 neighbourhood) spread over the threads
        const uint64_t kept_far = s_kept[rb] & ((uint64_t)sm.far[2 * rb] |
                                                ((uint64_t)sm.far[2 * rb + 1] << 32));
        if (kept_far) {
            const int block_end = base + kBoxesPerWord;
            for (int item = tid; item < kBoxesPerWord * 9; item += nthreads) {
                const int t = item / 9, k = item % 9;
                if (!((kept_far >> t) & 1)) continue;
                const int p = base + t;  // < N: kept rows are
                const T xp = sm.x[p], yp = sm.y[p];  // finite: far is only set for those
                const int cx = grid_coord((double)xp, gr.x0, gr.inv, gr.gx) + k % 3 - 1;
                const int cy = grid_coord((double)yp, gr.y0, gr.inv, gr.gy) + k / 3 - 1;
                if (cx < 0 || cx >= gr.gx || cy < 0 || cy >= gr.gy) continue;
                const int64_t gp = sm.g ? sm.g[p] : 0;
                const int c = cy * gr.gx + cx;
                for (int s = sm.cstart[c]; s < sm.cend[c]; ++s) {
                    const int q = sm.idx[s];
                    if (q < block_end) continue;
                    if (sm.g && sm.g[q] != gp) continue;
                    if (dist2_xy(sm.x[q], sm.y[q], xp, yp) < r2)
                        atomicOr(&sm.removed[q / 32], 1u << (q % 32));
                }
            }
        }
        __syncthreads();  // removed bits of the later blocks final for this row block
    }

    // outputs: keep_mask by box, the tail of keep_idx, num_kept
    if (tid == 0) s_count = count;
    __syncthreads();
    const int64_t total = s_count;
    if (tid == 0 && num_kept) *num_kept = total;  // first: a host may be polling it
    if (keep_mask)
        for (int p = tid; p < N; p += nthreads)
            keep_mask[sm.order[p]] = (s_kept[p / kBoxesPerWord] >> (p % kBoxesPerWord)) & 1;
    if (keep_idx)
        for (int64_t p = total + tid; p < N; p += nthreads) keep_idx[p] = -1;
}

// ------------------------------------------------------------------------------------------
// Block path v2 (variant 4): the block path with a sort in registers, a counting sort into
// the grid and, when the pairs fit in shared memory, a scan by one warp with no block barrier.
//
// What changed from nms_block_kernel, and why (its time went to two bitonic sorts through
// shared memory, a barrier per compare stage, and two block barriers per row block):
//   a. the score sort keeps up to 4 keys per thread in registers (a thread per key up to 1024
//      keys): compare stages within a thread, across the lanes of a warp by shuffles, and only
//      stages across warps through shared memory (double-buffered: one barrier each). float32
//      scores sort one 64-bit word, key << 32 | box index (all distinct: no tie rule needed);
//   b. the grid (cells at least the radius wide, at most 16N cells, 256 to 16384) is filled by a
//      counting sort (histogram, scan, scatter: three barriers), not a sort;
//   c. one pass over the 3x3 cells around every position p (in cell order): inpred[p] (its
//      preds in its own row block, a bit each) and p's
//      earlier-block neighbours ("preds": positions q before p's row block, within the radius,
//      same group) appended as (q, p % 64) to its row block's list, each row block owning an
//      equal share of what is left of shared memory;
//   d. list mode: the rule of "Rounds" as a dataflow (v2_decide_dataflow): a warp per row
//      block, the far preds from the block's list read as the earlier row blocks publish their
//      states, the in-order greedy from the inpred words once no row waits on a far pred; no
//      block barrier (the barrier rounds it replaced: 8.7k -> 8.2k cycles at N = 1000, 20.9k ->
//      17.3k at 4096). Push mode (a list outgrew its share: dense scenes): the scan of
//      nms_block_kernel, kept rows with a far neighbour setting removed bits, two barriers per
//      row block; its work is bounded by the kept boxes' neighbourhoods.
//   e. keep_idx is written after the scan by all threads (a prefix of the kept counts of the
//      row blocks), not inside the sequential loop;
//   f. the centres and their bounding box are loaded in the pass that checks whether the
//      scores are already in visiting order (then nothing is gathered again).

constexpr int kV2Threads = 1024;  // block size: the per-box phases want every warp
constexpr int kV2MaxCells = 16384;   // cell indices are uint16
constexpr int kV2MinPool = 4;         // pred-list entries a box, at least, before cells shrink
constexpr uint16_t kV2NoCell = 0xffff;  // the cell of a non-finite centre
constexpr int kV2PushSplit = 4;         // push mode: threads per (kept row, cell row) run
constexpr int kV2LoadBatch = 4;         // boxes whose loads a thread issues at once

// Sort items: ascending order = visiting order, every item distinct.
template <typename S>
struct V2Item;

template <>
struct V2Item<float> {  // float32 score key (32 bits, circle_nms.h) << 32 | box index
    uint64_t k;
    __device__ __forceinline__ static V2Item make(float s, int i) {
        return {(score_key(s) << 32) | (uint32_t)i};
    }
    __device__ __forceinline__ static V2Item pad() { return {~uint64_t(0)}; }  // after all
    __device__ __forceinline__ int index() const { return (int)(uint32_t)k; }
    __device__ __forceinline__ bool before(const V2Item& o) const { return k < o.k; }
    __device__ __forceinline__ V2Item shfl_xor(int m) const {
        return {__shfl_xor_sync(0xffffffffu, k, m)};
    }
};

template <>
struct V2Item<double> {  // float64 score key (64 bits) and box index, compared in that order
    uint64_t k;
    int32_t i;
    __device__ __forceinline__ static V2Item make(double s, int idx) { return {score_key(s), idx}; }
    __device__ __forceinline__ static V2Item pad() { return {~uint64_t(0), 0x7fffffff}; }
    __device__ __forceinline__ int index() const { return i; }
    __device__ __forceinline__ bool before(const V2Item& o) const {
        return k < o.k || (k == o.k && i < o.i);
    }
    __device__ __forceinline__ V2Item shfl_xor(int m) const {
        return {__shfl_xor_sync(0xffffffffu, k, m), __shfl_xor_sync(0xffffffffu, i, m)};
    }
};

// Sorts the score keys of boxes [0, N) into visiting order and writes order[p] (p < N): a
// bitonic sort of P items (a power of two, 32 * E <= P <= E * blockDim.x, N <= P; pads sort
// last), E per thread in registers, held by threads [0, P / E) (whole warps; the others only
// meet the barriers): thread t holds items E*t .. E*t + E-1. Stages within a thread in
// registers, across the lanes of a warp by shuffles, across warps through shared memory
// (buf: 2 * P items, one buffer per stage in turn: one barrier per such stage). At every stage
// the pair (i, i ^ j) ends with the smaller item at the lower index when (i & k) == 0 (an
// ascending run), else the larger; both threads of a pair decide alike because no two items
// are equal (pads are, but then either choice is the same value). Called by every thread.
template <int E, typename S>
__device__ void v2_sort_scores(const S* __restrict__ scores, int N, int P, V2Item<S>* buf,
                               uint16_t* order) {
    using Item = V2Item<S>;
    const int tid = threadIdx.x;
    const bool active = tid * E < P;  // uniform over each warp: P / E is a multiple of 32
    Item v[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int i = tid * E + e;
        v[e] = i < N ? Item::make(scores[i], i) : Item::pad();
    }
    int parity = 0;
    for (int k = 2; k <= P; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            if (j < E) {  // both items in this thread; register indices spelled out
                auto exchange = [&](Item& lo, Item& hi, int i) {
                    const bool swap = ((i & k) == 0) ? hi.before(lo) : lo.before(hi);
                    if (swap) {
                        const Item t = lo;
                        lo = hi;
                        hi = t;
                    }
                };
                if constexpr (E == 2) {
                    exchange(v[0], v[1], tid * E);
                } else if constexpr (E == 4) {
                    if (j == 2) {
                        exchange(v[0], v[2], tid * E);
                        exchange(v[1], v[3], tid * E + 1);
                    } else {
                        exchange(v[0], v[1], tid * E);
                        exchange(v[2], v[3], tid * E + 2);
                    }
                }
                continue;
            }
            Item other[E];
            if (j < 32 * E) {  // the partner is lane ^ (j / E) of this warp
                if (!active) continue;
#pragma unroll
                for (int e = 0; e < E; ++e) other[e] = v[e].shfl_xor(j / E);
            } else {  // another warp: through shared memory
                Item* b = buf + parity * P;
                parity ^= 1;
                if (active) {
#pragma unroll
                    for (int e = 0; e < E; ++e) b[tid * E + e] = v[e];
                }
                __syncthreads();  // the next write to this buffer is a barrier away
                if (!active) continue;
#pragma unroll
                for (int e = 0; e < E; ++e) other[e] = b[(tid * E + e) ^ j];
            }
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const int i = tid * E + e;
                const bool want_min = ((i & j) == 0) == ((i & k) == 0);
                const bool take = want_min ? other[e].before(v[e]) : v[e].before(other[e]);
                if (take) v[e] = other[e];
            }
        }
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int p = tid * E + e;
        if (p < N) order[p] = (uint16_t)v[e].index();  // the keys of [0, N) sort first
    }
}

// Exclusive prefix sum of a[0, n) in place by the whole block; returns the total. s_warp: 33
// words of shared memory. Barriers inside (uniform control flow); a[] is final on return.
__device__ uint32_t v2_block_scan(uint32_t* a, int n, uint32_t* s_warp) {
    const int tid = threadIdx.x, lane = tid & 31, nwarps = blockDim.x / 32;
    const int per = (n + (int)blockDim.x - 1) / (int)blockDim.x;
    const int lo = min(tid * per, n), hi = min(lo + per, n);
    uint32_t sum = 0;
    for (int i = lo; i < hi; ++i) sum += a[i];
    uint32_t incl = sum;
    for (int off = 1; off < 32; off <<= 1) {
        const uint32_t o = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += o;
    }
    if (lane == 31) s_warp[tid >> 5] = incl;
    __syncthreads();
    if (tid < 32) {
        const uint32_t w = lane < nwarps ? s_warp[lane] : 0;
        uint32_t wi = w;
        for (int off = 1; off < 32; off <<= 1) {
            const uint32_t o = __shfl_up_sync(0xffffffffu, wi, off);
            if (lane >= off) wi += o;
        }
        s_warp[lane] = wi - w;
        if (lane == 31) s_warp[32] = wi;
    }
    __syncthreads();
    uint32_t run = s_warp[tid >> 5] + incl - sum;
    for (int i = lo; i < hi; ++i) {
        const uint32_t x = a[i];
        a[i] = run;
        run += x;
    }
    const uint32_t total = s_warp[32];
    __syncthreads();  // a[] final; s_warp free for the next call
    return total;
}

// A centre as one 8-byte (float) or 16-byte (double) load from the interleaved xy array.
template <typename T>
struct V2Pair {
    T x, y;
};
__device__ __forceinline__ V2Pair<float> v2_xy(const float* xy, int p) {
    const float2 v = reinterpret_cast<const float2*>(xy)[p];
    return {v.x, v.y};
}
__device__ __forceinline__ V2Pair<double> v2_xy(const double* xy, int p) {
    const double2 v = reinterpret_cast<const double2*>(xy)[p];
    return {v.x, v.y};
}

// Shared memory of the v2 kernel: order, then a region that first holds the sort's two buffers
// and then everything else, the pred pool last (to the end of the allocation). One carving for
// the host (sizes) and the device (pointers).
template <typename T>
struct V2Smem {
    uint16_t* order;     // [N] box index by position
    void* sort_buf;      // [2 P] sort items (the region below, before the sort is done)
    size_t sort_end;     // byte offset where the sort buffers end
    T* xy;               // [2 N] centres by position, x and y side by side (one load)
    int64_t* g;          // [N] groups by position (when groups are given)
    uint16_t* cell;      // [N] cell of a position (kV2NoCell: not finite)
    uint32_t* cell_end;  // [max_cells] after the counting sort: end of each cell's run
    uint16_t* by_cell;   // [N] positions in cell order, the non-finite ones last
    uint64_t* inpred;    // [N] bit t: position rb * 64 + t (< p) is a pred of p
    uint32_t* pool;      // [pool_cap] pred entries, q << 6 | t; row block rb owns
                         // [rb * block_cap, (rb + 1) * block_cap), block_cap = pool_cap / C
    size_t fixed_end;    // byte offset of the pool
    int pool_cap;

    // The carving made on the host (base NULL: the pointers are offsets), placed on the
    // block's shared memory: a few adds instead of every thread carving again.
    __device__ __forceinline__ V2Smem placed(unsigned char* base) const {
        V2Smem s = *this;
        s.order = (uint16_t*)(base + (size_t)order);
        s.sort_buf = base + (size_t)sort_buf;
        s.xy = (T*)(base + (size_t)xy);
        s.g = g ? (int64_t*)(base + (size_t)g) : nullptr;
        s.cell = (uint16_t*)(base + (size_t)cell);
        s.cell_end = (uint32_t*)(base + (size_t)cell_end);
        s.by_cell = (uint16_t*)(base + (size_t)by_cell);
        s.inpred = (uint64_t*)(base + (size_t)inpred);
        s.pool = (uint32_t*)(base + (size_t)pool);
        return s;
    }
};

template <typename T, typename S>
__host__ __device__ V2Smem<T> v2_smem(void* base, size_t bytes, int N, int P, int max_cells,
                                      bool with_groups) {
    SmemCarver c(base);
    auto take = [&](size_t bytes) { return c.take(bytes); };
    V2Smem<T> s;
    s.order = (uint16_t*)take((size_t)N * sizeof(uint16_t));
    const size_t region = c.off;
    s.sort_buf = c.base + region;
    s.sort_end = region + 2 * (size_t)P * sizeof(V2Item<S>);
    s.xy = (T*)take((size_t)2 * N * sizeof(T));
    s.g = with_groups ? (int64_t*)take((size_t)N * sizeof(int64_t)) : nullptr;
    s.cell = (uint16_t*)take((size_t)N * sizeof(uint16_t));
    s.cell_end = (uint32_t*)take((size_t)max_cells * sizeof(uint32_t));
    s.by_cell = (uint16_t*)take((size_t)N * sizeof(uint16_t));
    s.inpred = (uint64_t*)take((size_t)N * sizeof(uint64_t));
    s.fixed_end = c.off;
    s.pool = (uint32_t*)(c.base + c.off);
    s.pool_cap = bytes > c.off ? (int)((bytes - c.off) / sizeof(uint32_t)) : 0;
    return s;
}

// Calls f(q) for every position q in the 3x3 cells around position p's cell (p included).
template <typename T, typename F>
__device__ __forceinline__ void v2_for_each_near(const V2Smem<T>& sm, const BlockGrid& gr, int p,
                                                 F&& f) {
    const int c = sm.cell[p];
    if (c == kV2NoCell) return;
    const int cx = c % gr.gx, cy = c / gr.gx;
    const int x_lo = cx > 0 ? cx - 1 : 0, x_hi = cx + 1 < gr.gx ? cx + 1 : cx;
    const int y_lo = cy > 0 ? cy - 1 : 0, y_hi = cy + 1 < gr.gy ? cy + 1 : cy;
    for (int yy = y_lo; yy <= y_hi; ++yy) {
        const int c0 = yy * gr.gx + x_lo, c1 = yy * gr.gx + x_hi;
        const int e = (int)sm.cell_end[c1];
        for (int s = c0 > 0 ? (int)sm.cell_end[c0 - 1] : 0; s < e; ++s) f((int)sm.by_cell[s]);
    }
}

// Phase clock of the v2 kernel for the lab (build with -DPCOPS_NMS_PHASES: thread 0 prints the
// cycles of each phase, kept in V2Shared::clock); nothing otherwise.
#ifdef PCOPS_NMS_PHASES
#define NMS_PHASE(i) (threadIdx.x == 0 ? (void)(sh.clock[i] = clock64()) : (void)0)
#else
#define NMS_PHASE(i) ((void)0)
#endif

// The fixed shared memory of the v2 body (its kernel and the pair-tile kernel's block 0).
struct V2Shared {
    uint64_t kept[kBlockMaxBoxes / kBoxesPerWord];      // kept bits by row block
    uint32_t removed[kBlockMaxBoxes / 32];              // push mode
    uint32_t far[kBlockMaxBoxes / 32];                  // push mode: a bit per position
    Box2 box[32];
    BlockGrid grid;
    uint32_t warp[33];
    int before[kBlockMaxBoxes / kBoxesPerWord];         // kept boxes before a row block
    uint32_t fill[kBlockMaxBoxes / kBoxesPerWord];      // pred entries by row block
    uint32_t overflow;   // a row block has more pred entries than its share
    uint32_t nonfinite;  // non-finite centres placed in by_cell so far
    ulonglong2 state[2][kBlockMaxBoxes / kBoxesPerWord];  // rounds: kept, removed
    int round[2][2][32];  // rounds: per warp, rows decided and blocks left open
    int64_t count;
#ifdef PCOPS_NMS_PHASES
    long long clock[8];
#endif
};

// Phases a-d of the v2 body (see above): the visiting order, the grid, the counting sort into
// it, the in-block pred words and the far-pred lists. Returns whether the lists fit (list
// mode); the grid is left in sh.grid. Called by every thread of the block.
template <typename T, typename S>
__device__ __forceinline__ bool v2_prepare(V2Shared& sh, const V2Smem<T>& sm,
                                           const T* __restrict__ centers, int64_t D,
                                           const S* __restrict__ scores,
                                           const int64_t* __restrict__ groups, int N, int P,
                                           int items_per_thread, int max_cells, T r2,
                                           double cell_min) {
    const int tid = threadIdx.x, nthreads = blockDim.x;
    const int C = (N + kBoxesPerWord - 1) / kBoxesPerWord;
    NMS_PHASE(0);

    // a. the visiting order
    for (int w = tid; w < kBlockMaxBoxes / 32; w += nthreads) {
        sh.removed[w] = 0;
        sh.far[w] = 0;
    }
    if (tid < kBlockMaxBoxes / kBoxesPerWord) sh.fill[tid] = 0;
    if (tid == 0) {
        sh.overflow = 0;
        sh.nonfinite = 0;
    }
    // the cell counts, zeroed while the loads below are in flight (the sort, which reuses this
    // memory, zeroes them again)
    for (int c = tid; c < max_cells; c += nthreads) sm.cell_end[c] = 0;
    // scores already in visiting order (as after a top-k, and the peers' precondition): every
    // key pair in order; then the order is the identity and the sort is skipped. In the same
    // pass the centres (and groups) by box index, which is their place in the visiting order in
    // that case, and their bounding box, which does not depend on the order. A thread issues
    // the loads of up to kV2LoadBatch boxes before it uses any (one memory latency, not four).
    bool in_order = true;
    Box2 box = Box2::empty();
    for (int i0 = tid; i0 < N; i0 += kV2LoadBatch * nthreads) {
        T x[kV2LoadBatch], y[kV2LoadBatch];
        S s0[kV2LoadBatch], s1[kV2LoadBatch];
#pragma unroll
        for (int u = 0; u < kV2LoadBatch; ++u) {
            const int i = i0 + u * nthreads;
            if (i < N) {
                x[u] = centers[(int64_t)i * D + 0];
                y[u] = centers[(int64_t)i * D + 1];
                s0[u] = scores[i];
                s1[u] = i + 1 < N ? scores[i + 1] : s0[u];
            }
        }
#pragma unroll
        for (int u = 0; u < kV2LoadBatch; ++u) {
            const int i = i0 + u * nthreads;
            if (i < N) {
                in_order = in_order && score_key(s0[u]) <= score_key(s1[u]);
                sm.xy[2 * i] = x[u];
                sm.xy[2 * i + 1] = y[u];
                if (sm.g) sm.g[i] = groups[i];
                box.add(x[u], y[u]);
            }
        }
    }
    box.warp_reduce_of<T>();
    if ((tid & 31) == 0) sh.box[tid >> 5] = box;
    V2Item<S>* sort_buf = (V2Item<S>*)sm.sort_buf;
    if (__syncthreads_and(in_order)) {
        for (int p = tid; p < N; p += nthreads) sm.order[p] = (uint16_t)p;
    } else {
        // the sort's buffers overlap the centres just stored: sort, then gather again
        if (items_per_thread == 1)
            v2_sort_scores<1>(scores, N, P, sort_buf, sm.order);
        else if (items_per_thread == 2)
            v2_sort_scores<2>(scores, N, P, sort_buf, sm.order);
        else
            v2_sort_scores<4>(scores, N, P, sort_buf, sm.order);
        __syncthreads();  // order written; the sort buffers read for the last time
        for (int p0 = tid; p0 < N; p0 += kV2LoadBatch * nthreads) {
            T x[kV2LoadBatch], y[kV2LoadBatch];
#pragma unroll
            for (int u = 0; u < kV2LoadBatch; ++u) {
                const int p = p0 + u * nthreads;
                if (p < N) {
                    const int o = sm.order[p];
                    x[u] = centers[(int64_t)o * D + 0];
                    y[u] = centers[(int64_t)o * D + 1];
                }
            }
#pragma unroll
            for (int u = 0; u < kV2LoadBatch; ++u) {
                const int p = p0 + u * nthreads;
                if (p < N) {
                    sm.xy[2 * p] = x[u];
                    sm.xy[2 * p + 1] = y[u];
                    if (sm.g) sm.g[p] = groups[sm.order[p]];
                }
            }
        }
        for (int c = tid; c < max_cells; c += nthreads) sm.cell_end[c] = 0;
    }
    NMS_PHASE(1);

    // b. the grid over the bounding box
    __syncthreads();  // centres in visiting order, cell_end zero
    if (tid < 32) {
        Box2 b = tid < nthreads / 32 ? sh.box[tid] : Box2::empty();
        b.warp_reduce_of<T>();
        // cells no smaller than needed for max_cells (make_grid then grows them by 1.25x
        // steps from here; any cell of at least cell_min gives the same result)
        double cmin = cell_min;
        const double area = (b.hi_x - b.lo_x) * (b.hi_y - b.lo_y);
        if (b.lo_x <= b.hi_x && !(area <= cmin * cmin * max_cells))
            cmin = sqrt(area / max_cells);  // inf when the area overflows: one cell
        if (tid == 0) sh.grid = make_grid(b.lo_x, b.lo_y, b.hi_x, b.hi_y, cmin, max_cells);
    }
    __syncthreads();
    const BlockGrid gr = sh.grid;
    NMS_PHASE(2);

    // c. counting sort of the positions by cell
    for (int p = tid; p < N; p += nthreads) {
        const T x = sm.xy[2 * p], y = sm.xy[2 * p + 1];
        uint16_t c = kV2NoCell;
        if (finite_xy(x, y)) {
            c = (uint16_t)(grid_coord((double)y, gr.y0, gr.inv, gr.gy) * gr.gx +
                           grid_coord((double)x, gr.x0, gr.inv, gr.gx));
            atomicAdd(&sm.cell_end[c], 1u);
        }
        sm.cell[p] = c;
    }
    __syncthreads();
    const uint32_t finite = v2_block_scan(sm.cell_end, gr.gx * gr.gy, sh.warp);  // cell starts
    for (int p = tid; p < N; p += nthreads) {
        const int c = sm.cell[p];
        const uint32_t s = c != kV2NoCell ? atomicAdd(&sm.cell_end[c], 1u)
                                          : finite + atomicAdd(&sh.nonfinite, 1u);
        sm.by_cell[s] = (uint16_t)p;  // the non-finite centres after every cell's run
    }
    __syncthreads();  // cell_end[c]: the end of cell c's run (and the start of c + 1's)
    NMS_PHASE(3);

    // d. in one pass over the 3x3 cells of every position p: inpred[p] and p's preds in earlier
    //    row blocks appended to the list of p's row block (entries q << 6 | (p % 64), in no
    //    fixed order: the scan only ORs them); a row block whose list outgrows its share of the
    //    pool sets sh.overflow, and the scan then pushes instead (computing far[] first). Only
    //    earlier positions count, so a later one is dropped before its distance. The positions
    //    are taken in cell order (by_cell): the lanes of a warp read the same few cells and
    //    loop about as long.
    const int block_cap = sm.pool_cap / C;
    for (int s = tid; s < N; s += nthreads) {
        const int p = sm.by_cell[s];
        const V2Pair<T> cp = v2_xy(sm.xy, p);
        const T xp = cp.x, yp = cp.y;
        const int64_t gp = sm.g ? sm.g[p] : 0;
        const int rb = p / kBoxesPerWord, base = rb * kBoxesPerWord;
        uint32_t* list = sm.pool + (size_t)rb * block_cap;
        uint64_t word = 0;
        v2_for_each_near(sm, gr, p, [&](int q) {
            if (q >= p) return;  // p itself, later positions
            if (sm.g && sm.g[q] != gp) return;
            const V2Pair<T> cq = v2_xy(sm.xy, q);
            if (!(dist2_xy(cq.x, cq.y, xp, yp) < r2)) return;
            if (q < base) {
                const uint32_t slot = atomicAdd(&sh.fill[rb], 1u);
                if (slot < (uint32_t)block_cap)
                    list[slot] = ((uint32_t)q << 6) | (uint32_t)(p % kBoxesPerWord);
                else
                    atomicOr(&sh.overflow, 1u);
            } else {
                word |= uint64_t(1) << (q % kBoxesPerWord);
            }
        });
        sm.inpred[p] = word;
    }
    __syncthreads();
    NMS_PHASE(4);
    return sh.overflow == 0;
}

// List mode's greedy as a dataflow: warp w takes row blocks w, w + nwarps, ... in turn, and
// works on one until all its rows are decided, with no block barrier. Each pass gathers the
// states of the far preds of its undecided rows from the row blocks that own them (read as they
// are published: every published bit is a fact, kept or removed, so any mix of older and newer
// states is true); once no undecided row waits on a far pred, the in-order pass decides the
// rest of the row block (rounds_block_in_order) and the block is final; until then the rule
// (rounds_block_steps) decides what it can, the states are published, and the warp polls
// again. A row block waits only on earlier ones, and a warp finishes its row blocks in order,
// so every row block ends (by induction on its index). Boxes in a line visited along it cost
// one pass per row block after the one before is final. Called by every thread; one barrier
// at the end; sh.kept holds the kept bits after it.
template <typename T>
__device__ __forceinline__ void v2_decide_dataflow(V2Shared& sh, const V2Smem<T>& sm, int N,
                                                   int block_cap) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    const int C = (N + kBoxesPerWord - 1) / kBoxesPerWord;
    // published states: st[2 rb] kept bits, st[2 rb + 1] removed bits (rows past N removed)
    volatile unsigned long long* st = reinterpret_cast<volatile unsigned long long*>(sh.state[0]);
    for (int rb = tid; rb < C; rb += blockDim.x) {
        st[2 * rb] = 0;
        st[2 * rb + 1] = rows_past_n((int64_t)rb * kBoxesPerWord, N);
    }
    __syncthreads();
    // bits are only ever added: published by atomic ORs
    auto publish = [&](int rb, uint64_t kept, uint64_t removed) {
        atomicOr((unsigned long long*)&st[2 * rb], (unsigned long long)kept);
        atomicOr((unsigned long long*)&st[2 * rb + 1], (unsigned long long)removed);
    };
    for (int rb = warp; rb < C; rb += nwarps) {
        const int base = rb * kBoxesPerWord;
        const uint64_t pa = base + lane < N ? sm.inpred[base + lane] : 0;
        const uint64_t pb = base + 32 + lane < N ? sm.inpred[base + 32 + lane] : 0;
        const uint32_t* list = sm.pool + (size_t)rb * block_cap;
        const uint32_t n = sh.fill[rb];
        uint64_t kept = 0, removed = rows_past_n(base, N);
        for (;;) {
            const uint64_t und = ~(kept | removed);
            uint64_t hit = 0, wait = 0;
            for (uint32_t j = lane; j < n; j += 32) {
                const uint32_t entry = list[j];
                const uint32_t q = entry >> 6, t = entry & 63;
                if (!((und >> t) & 1)) continue;
                const int qb = (int)(q / kBoxesPerWord), qt = (int)(q % kBoxesPerWord);
                if ((st[2 * qb] >> qt) & 1)
                    hit |= uint64_t(1) << t;
                else if (!((st[2 * qb + 1] >> qt) & 1))
                    wait |= uint64_t(1) << t;
            }
            hit = warp_or64(hit);
            wait = warp_or64(wait);
            removed |= und & hit;  // a kept far pred
            if (!(und & ~hit & wait)) {  // no undecided row waits on a far pred: in order
                removed = rounds_block_in_order(pa, pb, removed);
                kept = ~removed;
                break;
            }
            const uint64_t known = kept | removed;
            rounds_block_steps(pa, pb, hit, wait, kept, removed, kRoundSteps);
            if (lane == 0) publish(rb, kept, removed);
            if ((kept | removed) == known) __nanosleep(64);  // waiting on earlier row blocks
        }
        if (lane == 0) publish(rb, kept, removed);
    }
    __syncthreads();
    for (int rb = tid; rb < C; rb += blockDim.x) sh.kept[rb] = st[2 * rb];
}

// Phase e of the v2 body and the outputs: the greedy from the pred words and lists (list
// mode: rounds, then the in-order pass) or the push scan (which needs the grid and cells of
// v2_prepare), then keep_mask, keep_idx and num_kept. sm.order and sm.inpred are final, and
// the lists too in list mode. Called by every thread of the block.
template <typename T>
__device__ __forceinline__ void v2_finish(V2Shared& sh, const V2Smem<T>& sm, int N,
                                          bool list_mode, T r2, bool* __restrict__ keep_mask,
                                          int64_t* __restrict__ keep_idx,
                                          int64_t* __restrict__ num_kept) {
    const int tid = threadIdx.x, nthreads = blockDim.x;
    const int C = (N + kBoxesPerWord - 1) / kBoxesPerWord;
    const int block_cap = sm.pool_cap / C;
    // e. the greedy scan
    NMS_PHASE(5);
    if (list_mode) {
        v2_decide_dataflow(sh, sm, N, block_cap);
    } else {
        const BlockGrid gr = sh.grid;
        // push mode: first far[p], whether a later row block holds a neighbour of p (the rows
        // whose kept boxes push)
        for (int s = tid; s < N; s += nthreads) {
            const int p = sm.by_cell[s];
            const V2Pair<T> cp = v2_xy(sm.xy, p);
            const int64_t gp = sm.g ? sm.g[p] : 0;
            const int block_end = (p / kBoxesPerWord + 1) * kBoxesPerWord;
            bool far = false;
            v2_for_each_near(sm, gr, p, [&](int q) {
                if (far || q < block_end || (sm.g && sm.g[q] != gp)) return;
                const V2Pair<T> cq = v2_xy(sm.xy, q);
                far = dist2_xy(cq.x, cq.y, cp.x, cp.y) < r2;
            });
            if (far) atomicOr(&sh.far[p / 32], 1u << (p % 32));
        }
        __syncthreads();
        for (int rb = 0; rb < C; ++rb) {
            const int base = rb * kBoxesPerWord;
            if (tid < 32) {  // the row block in order, by warp 0
                const int a = base + tid, b = base + 32 + tid;
                const uint64_t rem = rounds_block_in_order(
                    a < N ? sm.inpred[a] : 0, b < N ? sm.inpred[b] : 0,
                    ((uint64_t)sh.removed[2 * rb] | ((uint64_t)sh.removed[2 * rb + 1] << 32)) |
                        rows_past_n(base, N));
                if (tid == 0) sh.kept[rb] = ~rem;
            }
            __syncthreads();  // sh.kept[rb] published

            const uint64_t kept_far =
                sh.kept[rb] & ((uint64_t)sh.far[2 * rb] | ((uint64_t)sh.far[2 * rb + 1] << 32));
            if (kept_far) {
                const int block_end = base + kBoxesPerWord;
                for (int item = tid; item < kBoxesPerWord * 3 * kV2PushSplit; item += nthreads) {
                    const int t = item / (3 * kV2PushSplit);
                    if (!((kept_far >> t) & 1)) continue;
                    const int k = (item / kV2PushSplit) % 3, j = item % kV2PushSplit;
                    const int p = base + t;  // < N and finite: far is set only for those
                    const int c = sm.cell[p];
                    const int cx = c % gr.gx, yy = c / gr.gx + k - 1;
                    if (yy < 0 || yy >= gr.gy) continue;
                    const int x_lo = cx > 0 ? cx - 1 : 0, x_hi = cx + 1 < gr.gx ? cx + 1 : cx;
                    const int c0 = yy * gr.gx + x_lo, c1 = yy * gr.gx + x_hi;
                    const int e = (int)sm.cell_end[c1];
                    const V2Pair<T> cp = v2_xy(sm.xy, p);
                    const T xp = cp.x, yp = cp.y;
                    const int64_t gp = sm.g ? sm.g[p] : 0;
                    for (int s = (c0 > 0 ? (int)sm.cell_end[c0 - 1] : 0) + j; s < e;
                         s += kV2PushSplit) {
                        const int q = sm.by_cell[s];
                        if (q < block_end) continue;
                        if (sm.g && sm.g[q] != gp) continue;
                        const V2Pair<T> cq = v2_xy(sm.xy, q);
                        if (dist2_xy(cq.x, cq.y, xp, yp) < r2)
                            atomicOr(&sh.removed[q / 32], 1u << (q % 32));
                    }
                }
            }
            __syncthreads();  // removed bits of the later row blocks final for this one
        }
    }

    // outputs, by all threads: the kept boxes before row block rb (C <= 64: two per lane of
    // warp 0), then keep_mask by box, keep_idx in visiting order, -1 after, num_kept
    NMS_PHASE(6);
    __syncthreads();
    if (tid < 32) {
        const int n0 = tid < C ? __popcll(sh.kept[tid]) : 0;
        const int n1 = 32 + tid < C ? __popcll(sh.kept[32 + tid]) : 0;
        int i0 = n0, i1 = n1;  // inclusive sums over the lanes
        for (int off = 1; off < 32; off <<= 1) {
            const int o0 = __shfl_up_sync(0xffffffffu, i0, off);
            const int o1 = __shfl_up_sync(0xffffffffu, i1, off);
            if (tid >= off) {
                i0 += o0;
                i1 += o1;
            }
        }
        const int first_half = __shfl_sync(0xffffffffu, i0, 31);
        sh.before[tid] = i0 - n0;
        sh.before[32 + tid] = first_half + i1 - n1;
        if (tid == 31) sh.count = first_half + i1;
    }
    __syncthreads();
    const int64_t total = sh.count;
    if (tid == 0 && num_kept) *num_kept = total;  // first: a host may be polling it
    for (int p = tid; p < N; p += nthreads) {
        const int rb = p / kBoxesPerWord, t = p % kBoxesPerWord;
        const uint64_t kept = sh.kept[rb];
        const bool is_kept = (kept >> t) & 1;
        if (keep_mask) keep_mask[sm.order[p]] = is_kept;
        if (keep_idx && is_kept)
            keep_idx[sh.before[rb] + __popcll(kept & ((uint64_t(1) << t) - 1))] = sm.order[p];
    }
    if (keep_idx)
        for (int64_t p = total + tid; p < N; p += nthreads) keep_idx[p] = -1;
    NMS_PHASE(7);
}

// One block of blockDim.x threads (a multiple of 32, at most 1024), its dynamic shared memory
// carved as `layout` (v2_smem with base NULL, for N, P, max_cells and whether groups are given);
// N in [1, kBlockMaxBoxes]; the sort: P items, E = items_per_thread (1, 2 or 4) per thread,
// P / E <= blockDim.x (v2_sort_scores).
template <typename T, typename S>
__global__ void __launch_bounds__(kBlockMaxThreads, 1)
nms_block_v2_kernel(const T* __restrict__ centers, int64_t D, const S* __restrict__ scores,
                    const int64_t* __restrict__ groups, int N, int P, int items_per_thread,
                    int max_cells, V2Smem<T> layout, T r2, double cell_min,
                    bool* __restrict__ keep_mask,
                    int64_t* __restrict__ keep_idx, int64_t* __restrict__ num_kept) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ V2Shared sh;
    const V2Smem<T> sm = layout.placed(smem);
    const bool list_mode = v2_prepare<T, S>(sh, sm, centers, D, scores, groups, N, P,
                                            items_per_thread, max_cells, r2, cell_min);
    v2_finish<T>(sh, sm, N, list_mode, r2, keep_mask, keep_idx, num_kept);
#ifdef PCOPS_NMS_PHASES
    if (threadIdx.x == 0)
        printf("v2 N=%d threads=%d sort %d x %d cap=%d list=%d kept=%lld cycles: sort %lld grid "
               "%lld cells %lld lists %lld - %lld scan %lld out %lld total %lld\n",
               N, (int)blockDim.x, P, items_per_thread,
               sm.pool_cap / ((N + kBoxesPerWord - 1) / kBoxesPerWord), (int)list_mode,
               (long long)sh.count, sh.clock[1] - sh.clock[0], sh.clock[2] - sh.clock[1],
               sh.clock[3] - sh.clock[2], sh.clock[4] - sh.clock[3], sh.clock[5] - sh.clock[4],
               sh.clock[6] - sh.clock[5], sh.clock[7] - sh.clock[6], sh.clock[7] - sh.clock[0]);
#endif
}

// ------------------------------------------------------------------------------------------
// Pair-tile path (variant 5, N <= kTileMaxBoxes; forced only since the dataflow path): the pairs
// tested by the whole GPU, the greedy decided by one block.
//
// The v2 kernel runs on one SM while the others idle; with scores out of order half of its time
// is the sort. Here one cooperative launch of up to a block per SM:
//   a. every block checks whether the scores are already in visiting order (as v2 does);
//   b. the pairs in tiles of 32 rows (boxes i, a lane each) by 64 columns (boxes j of a chunk
//      c), a warp a tile, the tiles spread evenly over the blocks: lane i's word holds the
//      columns that are preds of i (visited before i, same group, within the radius). Only the
//      nonzero words are stored, with a 32-bit flag per tile (which lanes have one). Scores out
//      of order: every tile, and each lane also stores how many columns are visited before it
//      (its position is the sum over the chunks: no sort). Scores in order: positions are
//      indices, and only the tiles with some j < i run (a triangle, half the pairs);
//   c. one grid barrier; block 0 then places the boxes (position -> box in sm.order), collects
//      the nonzero words (the flags compacted by a block scan, then one load each) and turns
//      every pred into v2's structures: a bit of inpred[p] when it lies in p's row block, an
//      entry of the row block's far-pred list otherwise; then v2_finish (the dataflow greedy,
//      the outputs). When a list outgrows its share of shared memory (dense scenes), block 0
//      runs the whole v2 body instead (its push mode). The same bits whichever way.
// The pair tests are the brute force's, N**2 (half with ordered scores), but over every SM:
// N = 1000 is 4 tiles (8k pairs) per SM. Workspace: the flags, the words, the counts (about
// N**2 / 8 bytes at most: 0.5 MB at N = 2048). Block 0's clock on the H100 (L2 flushed,
// uniform boxes, lab/phases_circle_nms.cu), against v2's: N = 1000, scores in order, 25k
// cycles against 24k (order check 2k, tiles 4k, barrier 2.5k, ranks and flags 2.3k, scan and
// decode 4.4k, finish 10k); out of order 27k against 50k; N = 2048: 38k / 42k in order, 43k /
// 85k out of order. Everything on block 0's path is a memory or barrier latency.

constexpr int kTileMaxBoxes = PCOPS_CIRCLE_NMS_CUDA_TILE_MAX;
constexpr int kTileRows = 32;        // rows of a tile: a lane each
constexpr int kTilesPerBlock = 4;    // tiles a block takes at least (fewer blocks below that)

// The pair-tile path's workspace (global memory); one layout for the size query and the launch.
struct TileWorkspace {
    uint32_t* flags;  // [RW * C] bit l: row 32 rw + l has a nonzero word in tile (rw, c)
    uint64_t* words;  // [RW * C * 32] the pred words (only the nonzero ones are written)
    uint8_t* before;  // [N][Cs] columns of chunk c visited before box i (scores out of order;
                      // zero for c >= C)
    int Cs;           // row stride of `before`: C rounded up to 16
    size_t bytes;
};

TileWorkspace tile_layout(void* base, int64_t N) {
    const int64_t C = (N + kBoxesPerWord - 1) / kBoxesPerWord;
    const int64_t RW = (N + kTileRows - 1) / kTileRows;
    TileWorkspace w;
    w.Cs = (int)((C + 15) / 16 * 16);
    pcops_carver c = pcops_carver_init(base);
    w.flags = (uint32_t*)pcops_carve(&c, RW * C, sizeof(uint32_t));
    w.words = (uint64_t*)pcops_carve(&c, RW * C * kTileRows, sizeof(uint64_t));
    w.before = (uint8_t*)pcops_carve(&c, N * w.Cs, 1);
    w.bytes = pcops_carver_bytes(&c);
    return w;
}

// Tiles with scores in order: row warp rw takes chunks 0 .. rw / 2 (those with a column before
// some row), so row warps 2m and 2m + 1 hold m + 1 tiles each and m (m + 1) come before 2m.
int64_t triangle_tiles(int64_t RW) {
    const int64_t m = RW / 2;
    return m * (m + 1) + (RW % 2) * (m + 1);
}

// Row warp and chunk of tile t (of the triangle, or of all RW x C row-major).
__device__ __forceinline__ void tile_at(int t, bool triangle, int C, int& rw, int& c) {
    if (!triangle) {
        rw = t / C;
        c = t - rw * C;
        return;
    }
    int m = (int)((sqrtf(4.0f * (float)t + 1.0f) - 1.0f) * 0.5f);
    while (m > 0 && m * (m + 1) > t) --m;
    while ((m + 1) * (m + 2) <= t) ++m;
    const int r = t - m * (m + 1);
    rw = 2 * m + (r > m ? 1 : 0);
    c = r > m ? r - m - 1 : r;
}

// Sum of the bytes of w (each at most 64).
__device__ __forceinline__ int byte_sum(uint32_t w) {
    const uint32_t x = (w & 0x00ff00ffu) + ((w >> 8) & 0x00ff00ffu);
    return (int)((x & 0xffffu) + (x >> 16));
}

// One tile by one warp: lane l is row i = 32 rw + l, the columns are chunk c, staged in the
// warp's slice of shared memory. kOrdered: scores in visiting order (j before i iff j < i);
// kGroups: groups given.
template <bool kOrdered, bool kGroups, typename T, typename S>
__device__ __forceinline__ void tile_pairs(const T* __restrict__ centers, int64_t D,
                                           const S* __restrict__ scores,
                                           const int64_t* __restrict__ groups, int N, int C,
                                           int rw, int c, T r2, V2Pair<T>* col_xy,
                                           V2Item<S>* col_key, int64_t* col_g,
                                           const TileWorkspace& ws) {
    const int lane = threadIdx.x & 31;
    const int j0 = c * kBoxesPerWord;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int k = h * 32 + lane, j = j0 + k;
        const bool in = j < N;
        // a column past N is never a pred: NaN centre, and (unordered) a key after every key
        col_xy[k] = in ? V2Pair<T>{centers[(int64_t)j * D], centers[(int64_t)j * D + 1]}
                       : V2Pair<T>{(T)NAN, (T)NAN};
        if (!kOrdered) col_key[k] = in ? V2Item<S>::make(scores[j], j) : V2Item<S>::pad();
        if (kGroups) col_g[k] = in ? groups[j] : 0;
    }
    const int i = rw * kTileRows + lane;
    const bool row = i < N;
    T xi = 0, yi = 0;
    V2Item<S> ki = V2Item<S>::pad();
    int64_t gi = 0;
    if (row) {
        xi = centers[(int64_t)i * D];
        yi = centers[(int64_t)i * D + 1];
        if (!kOrdered) ki = V2Item<S>::make(scores[i], i);
        if (kGroups) gi = groups[i];
    }
    __syncwarp();
    uint64_t w = 0;
    int before = 0;
#pragma unroll 16
    for (int k = 0; k < kBoxesPerWord; ++k) {
        const V2Pair<T> q = col_xy[k];
        const bool prec = kOrdered ? j0 + k < i : col_key[k].before(ki);
        before += prec;
        const bool pred = prec && (!kGroups || col_g[k] == gi) &&
                          dist2_xy(q.x, q.y, xi, yi) < r2;
        w |= (uint64_t)pred << k;
    }
    __syncwarp();  // the slice is staged again for the warp's next tile
    if (!row) w = 0;
    const uint32_t flag = __ballot_sync(0xffffffffu, w != 0);
    const int tile = rw * C + c;
    if (w) ws.words[(size_t)tile * kTileRows + lane] = w;
    if (lane == 0) ws.flags[tile] = flag;
    if (!kOrdered && row) {
        uint8_t* b = ws.before + (size_t)i * ws.Cs;
        b[c] = (uint8_t)before;
        if (c == C - 1)  // the row's padding, read (and summed) by block 0's 16-byte loads
            for (int cc = C; cc < ws.Cs; ++cc) b[cc] = 0;
    }
}

#ifdef PCOPS_NMS_PHASES
__device__ unsigned long long g_tiles_first_start = ~0ull, g_tiles_last_done = 0;
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#endif

// A cooperative launch of gridDim.x blocks (at most one per SM) of blockDim.x threads, the
// dynamic shared memory of the v2 kernel (`layout`, the same N, P, items_per_thread and
// max_cells), and the workspace `ws`; ntri = triangle_tiles(RW). N in [1, kTileMaxBoxes].
template <typename T, typename S>
__global__ void __launch_bounds__(kBlockMaxThreads, 1)
nms_tiles_kernel(const T* __restrict__ centers, int64_t D, const S* __restrict__ scores,
                 const int64_t* __restrict__ groups, int N, int P, int items_per_thread,
                 int max_cells, V2Smem<T> layout, T r2, double cell_min, TileWorkspace ws,
                 int ntri, bool* __restrict__ keep_mask,
                 int64_t* __restrict__ keep_idx, int64_t* __restrict__ num_kept) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ V2Shared sh;
    const int tid = threadIdx.x, nthreads = blockDim.x;
    const int warp = tid >> 5, nwarps = nthreads >> 5;
    const int C = (N + kBoxesPerWord - 1) / kBoxesPerWord;
    const int RW = (N + kTileRows - 1) / kTileRows;
#ifdef PCOPS_NMS_PHASES
    long long ck[8] = {0};
    unsigned long long gt_start = 0, gt_sync = 0;
    if (tid == 0) {
        ck[0] = clock64();
        gt_start = global_ns();
        atomicMin(&g_tiles_first_start, gt_start);
    }
#endif

    // a. scores in visiting order? (every block alike)
    bool ok = true;
    for (int i0 = tid; i0 < N - 1; i0 += 2 * nthreads) {
        const int i1 = i0 + nthreads;
        const S a0 = scores[i0], b0 = scores[i0 + 1];
        const S a1 = i1 < N - 1 ? scores[i1] : a0, b1 = i1 < N - 1 ? scores[i1 + 1] : b0;
        ok = ok && score_key(a0) <= score_key(b0) && score_key(a1) <= score_key(b1);
    }
    const bool in_order = __syncthreads_and(ok);
#ifdef PCOPS_NMS_PHASES
    if (tid == 0) ck[1] = clock64();
#endif

    // b. this block's share of the tiles, a warp a tile
    {
        unsigned char* slice = smem + (size_t)warp * kBoxesPerWord *
                                          (sizeof(V2Pair<T>) + sizeof(V2Item<S>) + 8);
        V2Pair<T>* col_xy = (V2Pair<T>*)slice;
        V2Item<S>* col_key = (V2Item<S>*)(slice + kBoxesPerWord * sizeof(V2Pair<T>));
        int64_t* col_g = (int64_t*)(slice + kBoxesPerWord *
                                                (sizeof(V2Pair<T>) + sizeof(V2Item<S>)));
        const int ntiles = in_order ? ntri : RW * C;
        const int t0 = (int)((int64_t)ntiles * blockIdx.x / gridDim.x);
        const int t1 = (int)((int64_t)ntiles * (blockIdx.x + 1) / gridDim.x);
        for (int t = t0 + warp; t < t1; t += nwarps) {
            int rw, c;
            tile_at(t, in_order, C, rw, c);
            auto run = [&](auto ordered, auto grouped) {
                tile_pairs<decltype(ordered)::value, decltype(grouped)::value>(
                    centers, D, scores, groups, N, C, rw, c, r2, col_xy, col_key, col_g, ws);
            };
            using yes = std::true_type;
            using no = std::false_type;
            if (in_order)
                groups ? run(yes{}, yes{}) : run(yes{}, no{});
            else
                groups ? run(no{}, yes{}) : run(no{}, no{});
        }
    }

#ifdef PCOPS_NMS_PHASES
    __syncthreads();
    if (tid == 0) {
        ck[2] = clock64();
        atomicMax(&g_tiles_last_done, global_ns());
    }
#endif
    // c. block 0 decides, once every block has stored its tiles (a grid barrier: the cooperative
    //    launch keeps every block resident); the others' stores are read past L1. (Tried: each
    //    block raising an arrival flag and block 0 alone waiting on them; no faster, and the
    //    wait reads flags the launch has not written yet.)
    cg::this_grid().sync();
    if (blockIdx.x != 0) return;
#ifdef PCOPS_NMS_PHASES
    if (tid == 0) {
        ck[3] = clock64();
        gt_sync = global_ns();
    }
#endif
    const V2Smem<T> sm = layout.placed(smem);
    uint16_t* pos = sm.cell;  // box -> position (the cell array is free until v2_prepare)
    uint32_t* cnt = (uint32_t*)sm.xy;  // [F] nonzero words per tile, then their offsets
    // the collected word indices, in the cells' space (cell_end, by_cell: contiguous)
    uint32_t* list = sm.cell_end;
    const int list_cap = (int)(((size_t)max_cells * sizeof(uint32_t) +
                                (size_t)N * sizeof(uint16_t)) / sizeof(uint32_t));
    for (int p = tid; p < N; p += nthreads) sm.inpred[p] = 0;
    if (tid < kBlockMaxBoxes / kBoxesPerWord) sh.fill[tid] = 0;
    if (tid == 0) sh.overflow = 0;
    for (int i = tid; i < N; i += nthreads) {
        int r = i;
        if (!in_order) {  // the columns visited before i, summed over the chunks
            r = 0;
            const uint8_t* b = ws.before + (size_t)i * ws.Cs;
            for (int c0 = 0; c0 < C; c0 += 16) {  // the padding past C is zero
                const uint4 v = __ldcg(reinterpret_cast<const uint4*>(b + c0));
                r += byte_sum(v.x) + byte_sum(v.y) + byte_sum(v.z) + byte_sum(v.w);
            }
        }
        pos[i] = (uint16_t)r;
        sm.order[r] = (uint16_t)i;
    }
    const int F = RW * C;  // at most 2 * nthreads (the launcher checks)
    uint32_t fl[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int f = tid + k * nthreads;
        fl[k] = 0;
        if (f < F) {
            const int rw = f / C, c = f - rw * C;
            if (!in_order || c <= rw / 2) fl[k] = __ldcg(ws.flags + f);
            cnt[f] = __popc(fl[k]);
        }
    }
    __syncthreads();
#ifdef PCOPS_NMS_PHASES
    if (tid == 0) ck[4] = clock64();
#endif
    const int Z = (int)v2_block_scan(cnt, F, sh.warp);  // barriers inside; cnt: offsets
    if (Z <= list_cap) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int f = tid + k * nthreads;
            uint32_t o = f < F ? cnt[f] : 0;
            for (uint32_t m = fl[k]; m; m &= m - 1)
                list[o++] = (uint32_t)f * kTileRows + (uint32_t)(__ffs(m) - 1);
        }
    }
    __syncthreads();
    const int block_cap = sm.pool_cap / C;
    if (Z <= list_cap) {
        for (int z = tid; z < Z; z += nthreads) {
            const uint32_t e = list[z];
            const uint64_t w = __ldcg((const unsigned long long*)ws.words + e);
            const int f = (int)(e / kTileRows), rw = f / C, c = f - rw * C;
            const int p = pos[rw * kTileRows + (int)(e % kTileRows)];
            const int rb = p / kBoxesPerWord;
            uint64_t near = 0;
            for (uint64_t m = w; m; m &= m - 1) {
                const int q = pos[c * kBoxesPerWord + __ffsll((long long)m) - 1];
                if (q / kBoxesPerWord == rb) {
                    near |= uint64_t(1) << (q % kBoxesPerWord);
                } else {
                    const uint32_t slot = atomicAdd(&sh.fill[rb], 1u);
                    if (slot < (uint32_t)block_cap)
                        sm.pool[(size_t)rb * block_cap + slot] =
                            ((uint32_t)q << 6) | (uint32_t)(p % kBoxesPerWord);
                    else
                        atomicOr(&sh.overflow, 1u);
                }
            }
            if (near) atomicOr((unsigned long long*)&sm.inpred[p], (unsigned long long)near);
        }
    } else if (tid == 0) {
        sh.overflow = 1;
    }
    __syncthreads();
#ifdef PCOPS_NMS_PHASES
    if (tid == 0) ck[5] = clock64();
#endif
    bool list_mode = sh.overflow == 0;
    if (!list_mode) {  // dense: the v2 body from the inputs
        __syncthreads();  // every thread has read sh.overflow before v2_prepare clears it
        list_mode = v2_prepare<T, S>(sh, sm, centers, D, scores, groups, N, P,
                                     items_per_thread, max_cells, r2, cell_min);
    }
    v2_finish<T>(sh, sm, N, list_mode, r2, keep_mask, keep_idx, num_kept);
#ifdef PCOPS_NMS_PHASES
    if (tid == 0) {
        ck[6] = clock64();
        printf("tiles N=%d blocks=%d threads=%d ordered=%d words=%d list=%d kept=%lld | ns from "
               "the first block's start: block 0 start %llu, last tiles done %llu, sync done "
               "%llu | block 0 cycles: order check %lld, tiles %lld, sync %lld, ranks+flags "
               "%lld, scan+decode %lld, finish %lld, total %lld\n",
               N, (int)gridDim.x, nthreads, (int)in_order, Z, (int)list_mode,
               (long long)sh.count, gt_start - g_tiles_first_start,
               g_tiles_last_done - g_tiles_first_start, gt_sync - g_tiles_first_start,
               ck[1] - ck[0], ck[2] - ck[1], ck[3] - ck[2], ck[4] - ck[3], ck[5] - ck[4],
               ck[6] - ck[5], ck[6] - ck[0]);
        g_tiles_first_start = ~0ull;
        g_tiles_last_done = 0;
    }
#endif
}

// ------------------------------------------------------------------------------------------
// Dataflow path (variant 6, N <= kFlowMaxBoxes): the greedy decided where the pairs are tested.
//
// The pair-tile path tests the pairs over every SM, but then waits at a grid barrier and hands
// everything to block 0, whose gather and greedy cost as much as the tests saved (its phases
// above). Here nothing is handed over: block r owns the 32 positions 32r .. 32r + 31 (a lane
// each) and decides them itself, reading the states of their preds in earlier blocks as those
// blocks publish them. One cooperative launch of ceil(N / 32) blocks (every block resident):
//   a. every block loads all scores (as sort items), centres and groups into shared memory and
//      checks whether the scores are already in visiting order (every block alike). If they
//      are not, block r counts, for its 32 boxes (by index), the boxes visited before each:
//      that is the box's position, and it writes order[position] = box. Block r also clears
//      its state and count words. One grid barrier (the clears and `order` are then visible);
//   b. (scores out of order) the centres and groups of positions < 32 (r + 1) gathered into
//      position order through `order`;
//   c. the pairs of block r's rows (lane l: position p = 32r + l) with the columns before them,
//      in chunks of 32 columns, a warp a chunk: the in-block chunk gives each row its in-block
//      pred word (bit t: position 32r + t < p is a pred), the earlier chunks a list of nonzero
//      (chunk, word) entries per row. Only the lower triangle is tested: positions, not
//      indices, and nothing is ever sorted;
//   d. warp 0 applies the rule of "Rounds" (kept iff no pred kept) as a dataflow: each
//      undecided row walks its far entries, reading the owning block's state word (kept bits,
//      removed bits: published facts, so any mix of older and newer states is true), and
//      stops at the first undecided pred (a row with a kept pred is removed); the rows no longer
//      waiting on a far pred are then resolved in order from the in-block words, and the new
//      states are published (one atomicOr). A block waits only on earlier blocks, so every
//      block ends (induction on r). A chain of preds along the visiting order costs a global
//      round trip per block it crosses (at most ceil(N / 32) - 1) and an in-order step per row;
//   e. keep_mask per row; for keep_idx / num_kept block r publishes its kept count and sums the
//      counts of blocks < r (a look-back without chaining: every block publishes its own count);
//      the last block writes num_kept (first: a host may be polling it) and -1 past the kept
//      entries.
// Work: N**2 / 2 pair tests over ceil(N / 32) SMs, N**2 / 2 score comparisons more when the
// scores are out of order, and N loads of every input per block (L2-resident). Workspace:
// order (int32 [N]), a state word and a count per block.
constexpr int kFlowMaxBoxes = PCOPS_CIRCLE_NMS_CUDA_FLOW_MAX;
constexpr int kFlowRows = 32;       // positions a block owns: a lane each of warp 0
constexpr int kFlowThreads = 512;   // block size

// The dataflow path's workspace (global memory); one layout for the size query and the launch.
struct FlowWorkspace {
    int32_t* order;    // [N] position -> box (scores out of order)
    uint64_t* state;   // [RB] kept bits | removed bits << 32 of block r's rows (published)
    uint32_t* count;   // [RB] 1 + kept rows of block r, 0 until published
    size_t bytes;
};

FlowWorkspace flow_layout(void* base, int64_t N) {
    const int64_t RB = (N + kFlowRows - 1) / kFlowRows;
    FlowWorkspace w;
    pcops_carver c = pcops_carver_init(base);
    w.order = (int32_t*)pcops_carve(&c, N, sizeof(int32_t));
    w.state = (uint64_t*)pcops_carve(&c, RB, sizeof(uint64_t));
    w.count = (uint32_t*)pcops_carve(&c, RB, sizeof(uint32_t));
    w.bytes = pcops_carver_bytes(&c);
    return w;
}

// Shared memory of the dataflow kernel for N boxes (M = 32 * RB entries per array: the pads
// past N are set too); one carving for the host (size) and the device (pointers).
template <typename T, typename S>
struct FlowSmem {
    V2Item<S>* key;   // [M] sort items by box (a, before the grid barrier); then the storage
                      // of xyp (b, after it)
    V2Pair<T>* xy;    // [M] centres by box
    V2Pair<T>* xyp;   // [M] centres by position (xy itself when the scores are in order)
    int64_t* g;       // [M] groups by box (groups given)
    int64_t* gp;      // [M] groups by position (scores out of order)
    uint2* list;      // [32][RB] far entries of each row: (chunk, pred word)
    size_t bytes;
};

template <typename T, typename S>
__host__ __device__ FlowSmem<T, S> flow_smem(void* base, int N, bool with_groups) {
    const int RB = (N + kFlowRows - 1) / kFlowRows, M = RB * kFlowRows;
    SmemCarver c(base);
    FlowSmem<T, S> s;
    const size_t key_bytes = (size_t)M * (sizeof(V2Item<S>) > sizeof(V2Pair<T>)
                                              ? sizeof(V2Item<S>)
                                              : sizeof(V2Pair<T>));
    s.key = (V2Item<S>*)c.take(key_bytes);
    s.xy = (V2Pair<T>*)c.take((size_t)M * sizeof(V2Pair<T>));
    s.xyp = (V2Pair<T>*)s.key;
    s.g = with_groups ? (int64_t*)c.take((size_t)M * sizeof(int64_t)) : nullptr;
    s.gp = with_groups ? (int64_t*)c.take((size_t)M * sizeof(int64_t)) : nullptr;
    s.list = (uint2*)c.take((size_t)kFlowRows * RB * sizeof(uint2));
    s.bytes = c.off;
    return s;
}

__device__ __forceinline__ uint64_t load_relaxed(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ uint32_t load_relaxed(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void store_relaxed(uint32_t* p, uint32_t v) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Pred word of row (xi, yi, gi) against the 32 columns of chunk c (positions 32c + k, k < kmax).
template <bool kGroups, typename T>
__device__ __forceinline__ uint32_t flow_chunk_word(const V2Pair<T>* __restrict__ xyp,
                                                    const int64_t* __restrict__ gp, int c,
                                                    T xi, T yi, int64_t gi, T r2, int kmax) {
    uint32_t w = 0;
    const V2Pair<T>* col = xyp + c * kFlowRows;
#pragma unroll
    for (int k = 0; k < kFlowRows; ++k) {
        const V2Pair<T> q = col[k];
        const bool pred = k < kmax && (!kGroups || gp[c * kFlowRows + k] == gi) &&
                          dist2_xy(q.x, q.y, xi, yi) < r2;
        w |= (uint32_t)pred << k;
    }
    return w;
}

#ifdef PCOPS_NMS_PHASES
__device__ unsigned long long g_flow_first_start = ~0ull;
#define FLOW_CLOCK(i) (tid == 0 ? (void)(fck[i] = clock64()) : (void)0)
#else
#define FLOW_CLOCK(i) ((void)0)
#endif

// ceil(N / 32) blocks of kFlowThreads threads (a cooperative launch: all resident), dynamic
// shared memory flow_smem(N, groups).bytes. N in [1, kFlowMaxBoxes].
template <typename T, typename S>
__global__ void __launch_bounds__(kFlowThreads, 1)
nms_flow_kernel(const T* __restrict__ centers, int64_t D, const S* __restrict__ scores,
                const int64_t* __restrict__ groups, int N, T r2, FlowWorkspace ws,
                bool* __restrict__ keep_mask, int64_t* __restrict__ keep_idx,
                int64_t* __restrict__ num_kept) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ uint32_t s_rank[kFlowRows], s_nlist[kFlowRows], s_inpred[kFlowRows];
    __shared__ int32_t s_order[kFlowRows];
    const int tid = threadIdx.x, nthreads = blockDim.x, lane = tid & 31, warp = tid >> 5;
    const int nwarps = nthreads >> 5;
    const int r = blockIdx.x, RB = gridDim.x, M = RB * kFlowRows;
    const FlowSmem<T, S> sm = flow_smem<T, S>(smem, N, groups != nullptr);
#ifdef PCOPS_NMS_PHASES
    long long fck[8] = {0};
    unsigned long long gt_start = 0;
    if (tid == 0) {
        gt_start = global_ns();
        atomicMin(&g_flow_first_start, gt_start);
    }
#endif
    FLOW_CLOCK(0);

    // a. the inputs by box; in visiting order?
    if (tid < kFlowRows) {
        s_rank[tid] = 0;
        s_nlist[tid] = 0;
    }
    if (tid == 0) {
        ws.state[r] = 0;
        ws.count[r] = 0;
    }
#pragma unroll 4
    for (int k = tid; k < M; k += nthreads) {
        const bool in = k < N;
        sm.key[k] = in ? V2Item<S>::make(scores[k], k) : V2Item<S>::pad();
        sm.xy[k] = in ? V2Pair<T>{centers[(int64_t)k * D], centers[(int64_t)k * D + 1]}
                      : V2Pair<T>{(T)NAN, (T)NAN};  // past N: within the radius of nothing
        if (groups) sm.g[k] = in ? groups[k] : 0;
    }
    __syncthreads();
    FLOW_CLOCK(1);
    bool ok = true;
    for (int k = tid; k < N - 1; k += nthreads) ok = ok && sm.key[k].before(sm.key[k + 1]);
    const bool in_order = __syncthreads_and(ok);
    const int row = r * kFlowRows + lane;  // block r's box (a) or position (c, d, e) of lane
    if (!in_order) {  // position of box `row`: the boxes visited before it
        const V2Item<S> ki = row < N ? sm.key[row] : V2Item<S>::pad();
        const int j0 = (int)((int64_t)N * warp / nwarps);
        const int j1 = (int)((int64_t)N * (warp + 1) / nwarps);
        uint32_t before = 0;
        for (int j = j0; j < j1; ++j) before += sm.key[j].before(ki);
        if (row < N) atomicAdd(&s_rank[lane], before);
        __syncthreads();
        if (tid < kFlowRows && row < N) ws.order[s_rank[tid]] = row;
    }
    FLOW_CLOCK(2);
    cg::this_grid().sync();
    FLOW_CLOCK(3);

    // b. positions < 32 (r + 1) in position order (written by other blocks: read past L1)
    const V2Pair<T>* xyp = sm.xy;
    const int64_t* gp = sm.g;
    if (!in_order) {
        const int P1 = (r + 1) * kFlowRows;
        for (int k = tid; k < P1; k += nthreads) {
            const int o = k < N ? __ldcg(ws.order + k) : -1;
            sm.xyp[k] = o >= 0 ? sm.xy[o] : V2Pair<T>{(T)NAN, (T)NAN};
            if (groups) sm.gp[k] = o >= 0 ? sm.g[o] : 0;
            if (k >= r * kFlowRows) s_order[k - r * kFlowRows] = o;
        }
        __syncthreads();
        xyp = sm.xyp;
        gp = sm.gp;
    } else if (tid < kFlowRows) {
        s_order[tid] = row < N ? row : -1;
    }

    // c. the pairs of the block's rows with the earlier positions, a warp a chunk of 32
    {
        const bool valid = row < N;
        const V2Pair<T> pi = xyp[row];
        const int64_t gi = groups ? gp[row] : 0;
        for (int c = warp; c <= r; c += nwarps) {
            const int kmax = c < r ? kFlowRows : lane;  // in-block: the positions before p
            uint32_t w = groups ? flow_chunk_word<true>(xyp, gp, c, pi.x, pi.y, gi, r2, kmax)
                                : flow_chunk_word<false>(xyp, gp, c, pi.x, pi.y, gi, r2, kmax);
            if (!valid) w = 0;
            if (c == r) {
                s_inpred[lane] = w;
            } else if (w) {
                const uint32_t slot = atomicAdd(&s_nlist[lane], 1u);
                sm.list[lane * RB + slot] = make_uint2((uint32_t)c, w);
            }
        }
    }
    __syncthreads();
    if (warp != 0) return;
    FLOW_CLOCK(4);

    // d. the decisions (warp 0; lanes are rows)
    const bool valid = row < N;
    const uint32_t ip = s_inpred[lane];
    const int E = (int)s_nlist[lane];
    const uint2* L = sm.list + lane * RB;
    const uint32_t has_in = __ballot_sync(0xffffffffu, ip != 0);
    uint32_t K = 0, R = ~__ballot_sync(0xffffffffu, valid);  // rows past N: removed
    uint32_t pub = 0;  // the bits published
    int e = 0;
    uint32_t wcur = E > 0 ? L[0].y : 0;  // the preds of entry e not yet known removed
    bool hit = false;                      // a far pred is kept
    for (;;) {
        const bool open = !(((K | R) >> lane) & 1u);
        bool wait = false;
        if (open && !hit) {
            while (e < E) {
                const uint64_t st = load_relaxed(ws.state + L[e].x);
                if (wcur & (uint32_t)st) {
                    hit = true;
                    break;
                }
                wcur &= ~(uint32_t)(st >> 32);
                if (wcur) {
                    wait = true;
                    break;
                }
                if (++e < E) wcur = L[e].y;
            }
        }
        R |= __ballot_sync(0xffffffffu, open && hit);
        const uint32_t ready = ~(K | R) & ~__ballot_sync(0xffffffffu, open && wait);
        K |= ready & ~has_in;  // no pred left anywhere
        for (uint32_t m = ready & has_in; m; m &= m - 1) {  // in order: earlier rows first
            const int t = __ffs(m) - 1;
            const uint32_t it = __shfl_sync(0xffffffffu, ip, t);
            if (it & K)
                R |= 1u << t;
            else if (!(it & ~(K | R)))
                K |= 1u << t;
        }
        if ((K | R) != pub) {
            if (lane == 0)
                atomicOr((unsigned long long*)(ws.state + r),
                         (unsigned long long)K | ((unsigned long long)R << 32));
            pub = K | R;
        }
        if (pub == 0xffffffffu) break;
    }

    // e. outputs
    FLOW_CLOCK(5);
    const int box = s_order[lane];
    const bool kept = (K >> lane) & 1u;
    if (keep_mask && valid) keep_mask[box] = kept;
    if (!keep_idx && !num_kept) return;
    const int n = __popc(K);
    if (lane == 0) store_relaxed(ws.count + r, (uint32_t)n + 1u);
    int before = 0;
    for (int c = lane; c < r; c += 32) {
        uint32_t v;
        while ((v = load_relaxed(ws.count + c)) == 0) {
        }
        before += (int)v - 1;
    }
    before = warp_sum(before);
    const int64_t total = before + n;
    if (r == RB - 1 && lane == 0 && num_kept) *num_kept = total;  // first: a host may poll it
    if (keep_idx) {
        if (kept) keep_idx[before + __popc(K & ((1u << lane) - 1u))] = box;
        if (r == RB - 1)
            for (int64_t p = total + lane; p < N; p += 32) keep_idx[p] = -1;
    }
#ifdef PCOPS_NMS_PHASES
    FLOW_CLOCK(6);
    if (tid == 0 && r == RB - 1) {
        printf("flow N=%d blocks=%d ordered=%d kept=%lld | last block: start %llu ns after the "
               "first, end %llu ns | cycles: loads %lld, order check (+ranks) %lld, grid sync "
               "%lld, pairs %lld, decisions %lld, outputs %lld, total %lld\n",
               N, RB, (int)in_order, (long long)total, gt_start - g_flow_first_start,
               global_ns() - g_flow_first_start, fck[1] - fck[0], fck[2] - fck[1],
               fck[3] - fck[2], fck[4] - fck[3], fck[5] - fck[4], fck[6] - fck[5],
               fck[6] - fck[0]);
        g_flow_first_start = ~0ull;
    }
#endif
}
#undef FLOW_CLOCK

// ------------------------------------------------------------------------------------------
// Bitmask path

// Score keys and their box indices; with bbox (grid path), also the empty bounding box that
// nms_grid_gather_kernel then fills (bbox[0..3]: ordered bits of min x, min y, max x, max y).
template <typename S>
__global__ void __launch_bounds__(kKeyThreads)
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

template <typename T>
__global__ void __launch_bounds__(kGatherThreads)
nms_gather_kernel(const T* __restrict__ centers, int64_t D, const int32_t* __restrict__ order,
                  const int64_t* __restrict__ groups, int64_t N, T* __restrict__ xs,
                  T* __restrict__ ys, int64_t* __restrict__ gs, bool* __restrict__ keep_mask,
                  int64_t* __restrict__ keep_idx) {
    // keep_mask / keep_idx may be NULL (not wanted by the caller).
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < N; p += stride) {
        const int64_t o = order[p];
        T x = T(0), y = T(0);
        int64_t g = 0;
        if (o >= 0 && o < N) {  // else the scan never keeps position p (see nms_scan_kernel)
            x = centers[o * D + 0];
            y = centers[o * D + 1];
            if (groups) g = groups[o];
        }
        xs[p] = x;
        ys[p] = y;
        if (gs) gs[p] = g;
        if (keep_mask) keep_mask[p] = false;
        if (keep_idx) keep_idx[p] = -1;
    }
}

// grid (C, C), 64 threads: block (cb, rb) writes mask[rb*64 + t][cb] for its rows t, if cb >= rb.
template <typename T>
__global__ void __launch_bounds__(kBoxesPerWord)
nms_mask_kernel(const T* __restrict__ xs, const T* __restrict__ ys,
                const int64_t* __restrict__ gs, int64_t N, int64_t C, T r2,
                uint64_t* __restrict__ mask) {
    const int64_t cb = blockIdx.x;
    const int64_t rb = blockIdx.y;
    if (cb < rb) return;  // lower triangle: nothing to do (uniform over the block)

    __shared__ T s_x[kBoxesPerWord];
    __shared__ T s_y[kBoxesPerWord];
    __shared__ int64_t s_g[kBoxesPerWord];
    const int t = threadIdx.x;
    const int64_t col0 = cb * kBoxesPerWord;
    const int64_t row0 = rb * kBoxesPerWord;
    const int cols = (int)(N - col0 < kBoxesPerWord ? N - col0 : kBoxesPerWord);
    const int rows = (int)(N - row0 < kBoxesPerWord ? N - row0 : kBoxesPerWord);
    if (t < cols) {
        s_x[t] = xs[col0 + t];
        s_y[t] = ys[col0 + t];
        if (gs) s_g[t] = gs[col0 + t];
    }
    __syncthreads();  // the only barrier: threads past `rows` may leave after it
    if (t >= rows) return;

    const int64_t i = row0 + t;
    const T xi = xs[i], yi = ys[i];
    const int64_t gi = gs ? gs[i] : 0;
    // On the diagonal block only the later positions count; entries [0, cols) of s_* are set.
    uint64_t word = 0;
    for (int c = (cb == rb) ? t + 1 : 0; c < cols; ++c) {
        const T d = dist2_xy(s_x[c], s_y[c], xi, yi);
        const bool hit = d < r2 && (gs == nullptr || s_g[c] == gi);
        word |= (uint64_t)hit << c;
    }
    mask[i * C + cb] = word;
}

// Position rb*64 + t of the visiting order: its box index (-1 past N) and its diagonal word.
__device__ __forceinline__ void load_row(const uint64_t* __restrict__ mask,
                                         const int32_t* __restrict__ order, int64_t N,
                                         int64_t C, int64_t rb, int t, int64_t& box,
                                         uint64_t& diag) {
    const int64_t row = rb * kBoxesPerWord + t;
    box = -1;
    diag = 0;
    if (row < N) {
        box = order[row];
        diag = mask[row * C + rb];
    }
}

// Called by threads 0..63 (warps 0 and 1, whole): publishes the diagonal words of a row block
// and, as two 32-bit ballots, which of its rows can never be kept (past N, or an order entry
// outside [0, N)).
__device__ __forceinline__ void stage_row(int t, int64_t box, uint64_t diag, int64_t N,
                                          uint64_t* s_diag, unsigned* s_unkeepable) {
    const unsigned bits = __ballot_sync(0xffffffffu, !(box >= 0 && box < N));
    s_diag[t] = diag;
    if ((t & 31) == 0) s_unkeepable[t >> 5] = bits;
}

// One block of kScanThreads threads; dynamic shared memory C words unless removed_global is
// given (then removed[] lives there).
__global__ void __launch_bounds__(kScanThreads, 1)
nms_scan_kernel(const uint64_t* __restrict__ mask, const int32_t* __restrict__ order, int64_t N,
                int64_t C, uint64_t* removed_global, bool* __restrict__ keep_mask,
                int64_t* __restrict__ keep_idx, int64_t* __restrict__ num_kept) {
    extern __shared__ uint64_t s_removed[];
    __shared__ uint64_t s_diag[kBoxesPerWord];
    __shared__ unsigned s_unkeepable[2];
    __shared__ uint64_t s_kept;
    uint64_t* removed = removed_global ? removed_global : s_removed;
    const int tid = threadIdx.x;

    for (int64_t c = tid; c < C; c += kScanThreads) removed[c] = 0;
    int64_t box = -1;       // threads 0..63: the box at position rb*64 + tid
    int64_t next_box = -1;  // ... and at (rb + 1)*64 + tid, prefetched
    uint64_t next_diag = 0;
    if (tid < kBoxesPerWord) {
        uint64_t diag;
        load_row(mask, order, N, C, 0, tid, box, diag);
        stage_row(tid, box, diag, N, s_diag, s_unkeepable);
    }
    int64_t count = 0;  // boxes kept so far; the same in every thread
    __syncthreads();

    for (int64_t rb = 0; rb < C; ++rb) {
        const bool has_next = rb + 1 < C;
        // Prefetch the next row block; the loads complete behind the resolve and the OR pass.
        if (tid < kBoxesPerWord && has_next)
            load_row(mask, order, N, C, rb + 1, tid, next_box, next_diag);

        if (tid == 0) {
            uint64_t rem = removed[rb] | (uint64_t)s_unkeepable[0] |
                           ((uint64_t)s_unkeepable[1] << 32);
            // Bit t of rem is final when step t reads it: a diagonal word only holds bits of
            // later positions.
#pragma unroll
            for (int t = 0; t < kBoxesPerWord; ++t) {
                const uint64_t d = s_diag[t];
                rem |= ((rem >> t) & 1) ? uint64_t(0) : d;
            }
            s_kept = ~rem;
        }
        __syncthreads();  // s_kept published; s_diag and s_unkeepable read for the last time

        const uint64_t kept = s_kept;
        if (tid < kBoxesPerWord && ((kept >> tid) & 1)) {
            // box is in [0, N): unkeepable rows are never kept
            if (keep_mask) keep_mask[box] = true;
            if (keep_idx) keep_idx[count + __popcll(kept & ((uint64_t(1) << tid) - 1))] = box;
        }
        count += __popcll(kept);

        if (kept) {
            // Row rb*64 + t, column block cb is at col[t * C] with col = mask + rb*64*C + cb.
            // The kept rows are read kOrBatch at a time with unconditional loads, so that the
            // loads of a batch are in flight together (a branch per row would serialise them):
            // past the last kept row a batch re-reads the block's first kept row and masks it
            // out. Every row read is kept, hence < N, and cb > rb: upper triangle only.
            const int first = __ffsll((long long)kept) - 1;
            for (int64_t cb = rb + 1 + tid; cb < C; cb += kScanThreads) {
                const uint64_t* col = mask + rb * kBoxesPerWord * C + cb;
                uint64_t w = 0;
                uint64_t k = kept;  // the same in every thread: the loop does not diverge
                while (k) {
                    int64_t offset[kOrBatch];
                    uint64_t use[kOrBatch];
#pragma unroll
                    for (int u = 0; u < kOrBatch; ++u) {
                        const int t = k ? __ffsll((long long)k) - 1 : first;
                        use[u] = k ? ~uint64_t(0) : uint64_t(0);
                        offset[u] = (int64_t)t * C;
                        k &= k - 1;
                    }
                    uint64_t v[kOrBatch];
#pragma unroll
                    for (int u = 0; u < kOrBatch; ++u) v[u] = col[offset[u]];
#pragma unroll
                    for (int u = 0; u < kOrBatch; ++u) w |= v[u] & use[u];
                }
                removed[cb] |= w;
            }
        }

        if (tid < kBoxesPerWord && has_next) {
            stage_row(tid, next_box, next_diag, N, s_diag, s_unkeepable);
            box = next_box;
        }
        __syncthreads();  // removed[rb + 1] final; the next block's diagonal words staged
    }
    if (tid == 0 && num_kept) *num_kept = count;
}

// ------------------------------------------------------------------------------------------
// Grid path (N > kBlockMaxBoxes): the block path's algorithm with the data in global memory
// (L2-resident at these sizes), the preparation spread over the GPU, the scan by one block.

constexpr int kGridThreads = 256;     // preparation kernels
constexpr int kGridScanThreads = 1024;
constexpr int kGridPredSlots = 32;    // far preds stored per position (more: the runs again)
constexpr int32_t kGridInPred = 1 << 30;       // npred flag: a pred in the own row block
constexpr int32_t kGridPredCount = kGridInPred - 1;
constexpr int kGridRoundThreads = 256;         // multi-block rounds: a warp per row block
constexpr int64_t kGridRoundsSharedRbs = 3072;  // rounds state in shared memory up to this C

int64_t grid_max_cells(int64_t N) { return N < 512 ? 1024 : 2 * N; }

// Rounds run on the whole GPU (nms_grid_round_kernel) before the one-block rounds kernel: three
// whenever the grid path is taken by size (random scenes of 16384 to 65536 boxes leave a few
// hundred rows undecided after them, which one block then finishes; dense scenes, where rows
// have more preds than their slots, are decided there in parallel), none below (forced only).
int64_t grid_gpu_rounds(int64_t C) { return C > kBlockMaxBoxes / kBoxesPerWord ? 3 : 0; }

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

__device__ __forceinline__ BlockGrid grid_from_bbox(const unsigned long long* bbox,
                                                    double cell_min, int max_cells) {
    if (bbox[0] == ~0ull) return make_grid(INFINITY, INFINITY, -INFINITY, -INFINITY, cell_min,
                                           max_cells);  // nothing finite: one cell
    return make_grid(from_ordered_bits(bbox[0]), from_ordered_bits(bbox[1]),
                     from_ordered_bits(bbox[2]), from_ordered_bits(bbox[3]), cell_min,
                     max_cells);
}

// Cell key of every position (ncells for a non-finite centre); the grid for later kernels.
template <typename T>
__global__ void __launch_bounds__(kGridThreads)
nms_grid_keys_kernel(const T* __restrict__ xs, const T* __restrict__ ys, int64_t N,
                     const unsigned long long* __restrict__ bbox, double cell_min,
                     int max_cells, BlockGrid* __restrict__ grid_out,
                     uint32_t* __restrict__ ckey, int32_t* __restrict__ cpos) {
    const BlockGrid gr = grid_from_bbox(bbox, cell_min, max_cells);
    if (blockIdx.x == 0 && threadIdx.x == 0) *grid_out = gr;
    const uint32_t ncells = (uint32_t)(gr.gx * gr.gy);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < N; p += stride) {
        const T x = xs[p], y = ys[p];
        uint32_t k = ncells;
        if (finite_xy(x, y))
            k = (uint32_t)grid_coord((double)y, gr.y0, gr.inv, gr.gy) * (uint32_t)gr.gx +
                (uint32_t)grid_coord((double)x, gr.x0, gr.inv, gr.gx);
        ckey[p] = k;
        cpos[p] = (int32_t)p;
    }
}

// cell_begin[c] (c in [0, ncells]): the first spatial index whose cell is >= c; the boxes in
// spatial order (sx, sy, sg).
template <typename T>
__global__ void __launch_bounds__(kGridThreads)
nms_grid_cells_kernel(const uint32_t* __restrict__ skey, const int32_t* __restrict__ spos,
                      int64_t N, const BlockGrid* __restrict__ grid, const T* __restrict__ xs,
                      const T* __restrict__ ys, const int64_t* __restrict__ gs,
                      int32_t* __restrict__ cell_begin, T* __restrict__ sx, T* __restrict__ sy,
                      int64_t* __restrict__ sg) {
    const int64_t ncells = (int64_t)grid->gx * grid->gy;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; s <= N; s += stride) {
        // keys are <= ncells; cells (prev, cur] start at s (each c written once over all s)
        const int64_t cur = s < N ? (int64_t)skey[s] : ncells;
        const int64_t prev = s > 0 ? (int64_t)skey[s - 1] : -1;
        for (int64_t c = prev + 1; c <= cur; ++c) cell_begin[c] = (int32_t)s;
        if (s < N) {
            const int32_t p = spos[s];
            sx[s] = xs[p];
            sy[s] = ys[p];
            if (sg) sg[s] = gs[p];
        }
    }
}

// Per position p: the runs of spatial indices of the 3 cell rows around its cell (runs[6p..]:
// begin, end for cell rows cy-1, cy, cy+1; empty off the grid or for a non-finite centre),
// inpred[p] (bits of the earlier positions of its own row block within the radius, same
// group), and its far preds (earlier positions of earlier row blocks within the radius, same
// group): npred[p] & kGridPredCount of them, the first kGridPredSlots in preds[k * N + p]
// (k-major: a warp's loads of one slot are coalesced), in no fixed order; npred[p] has
// kGridInPred set when inpred[p] is not 0 (npred[p] == 0: no pred at all, p is kept).
template <typename T>
__global__ void __launch_bounds__(kGridThreads)
nms_grid_neighbours_kernel(const T* __restrict__ xs, const T* __restrict__ ys,
                           const int64_t* __restrict__ gs, int64_t N,
                           const BlockGrid* __restrict__ grid,
                           const int32_t* __restrict__ cell_begin, const T* __restrict__ sx,
                           const T* __restrict__ sy, const int64_t* __restrict__ sg,
                           const int32_t* __restrict__ spos, T r2, int32_t* __restrict__ runs,
                           uint64_t* __restrict__ inpred, int32_t* __restrict__ npred,
                           int32_t* __restrict__ preds) {
    const BlockGrid gr = *grid;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < N; p += stride) {
        const T xp = xs[p], yp = ys[p];
        const int64_t gp = gs ? gs[p] : 0;
        const int64_t base = p / kBoxesPerWord * kBoxesPerWord;
        uint64_t word = 0;
        int32_t n = 0;
        int32_t run[6] = {0, 0, 0, 0, 0, 0};
        if (finite_xy(xp, yp)) {
            const int cx = grid_coord((double)xp, gr.x0, gr.inv, gr.gx);
            const int cy = grid_coord((double)yp, gr.y0, gr.inv, gr.gy);
            const int x_lo = cx > 0 ? cx - 1 : 0, x_hi = cx + 1 < gr.gx ? cx + 1 : cx;
            for (int k = 0; k < 3; ++k) {
                const int yy = cy - 1 + k;
                if (yy < 0 || yy >= gr.gy) continue;
                const int64_t row0 = (int64_t)yy * gr.gx;
                const int32_t b = cell_begin[row0 + x_lo], e = cell_begin[row0 + x_hi + 1];
                run[2 * k] = b;
                run[2 * k + 1] = e;
                for (int32_t s = b; s < e; ++s) {
                    const int64_t q = spos[s];
                    // earlier positions only: of p's row block (inpred), of earlier row blocks
                    // (preds)
                    if (q >= p) continue;
                    if (sg && sg[s] != gp) continue;
                    if (!(dist2_xy(sx[s], sy[s], xp, yp) < r2)) continue;
                    if (q >= base) {
                        word |= uint64_t(1) << (q % kBoxesPerWord);
                    } else {
                        if (n < kGridPredSlots) preds[(int64_t)n * N + p] = (int32_t)q;
                        ++n;
                    }
                }
            }
        }
#pragma unroll
        for (int k = 0; k < 6; ++k) runs[p * 6 + k] = run[k];
        inpred[p] = word;
        npred[p] = n | (word ? kGridInPred : 0);
    }
}

// Per-row-block arrays of the rounds kernel, in its shared memory (C <= kGridRoundsSharedRbs)
// or in the workspace; one carving for both.
struct GridRoundsState {
    ulonglong2* state[2];  // [C] kept, removed (two buffers: one read, one written a round)
    uint32_t* hit;         // [2C] per half row block: rows with a kept far pred
    uint32_t* wait;        // [2C] rows with an undecided far pred
    uint32_t* before;      // [C] kept positions before the row block
    size_t bytes;
};

__host__ __device__ inline GridRoundsState grid_rounds_state(void* base, int64_t C) {
    SmemCarver c(base);
    auto take = [&](size_t bytes) { return c.take(bytes); };
    GridRoundsState s;
    s.state[0] = (ulonglong2*)take((size_t)C * sizeof(ulonglong2));
    s.state[1] = (ulonglong2*)take((size_t)C * sizeof(ulonglong2));
    s.hit = (uint32_t*)take((size_t)2 * C * sizeof(uint32_t));
    s.wait = (uint32_t*)take((size_t)2 * C * sizeof(uint32_t));
    s.before = (uint32_t*)take((size_t)C * sizeof(uint32_t));
    s.bytes = c.off;
    return s;
}

// Far preds of position r (in row block starting at base) against the states `st` (NULL: the
// initial states, kept exactly when npred == 0, else undecided): whether one is kept (hit) or,
// if none is, whether one is undecided (wait). From the pred slots (all loads issued at once),
// or, past kGridPredSlots of them, from the cell runs again.
template <typename T>
__device__ __forceinline__ void grid_far_preds(
    int64_t r, int64_t base, int64_t N, const ulonglong2* st, const int32_t* __restrict__ npred,
    const int32_t* __restrict__ preds, const int32_t* __restrict__ runs,
    const T* __restrict__ xs, const T* __restrict__ ys, const int64_t* __restrict__ gs,
    const T* __restrict__ sx, const T* __restrict__ sy, const int64_t* __restrict__ sg,
    const int32_t* __restrict__ spos, T r2, bool& hit, bool& wait) {
    hit = false;
    wait = false;
    auto look = [&](int64_t q) {
        if (!st) {
            if (npred[q] == 0)
                hit = true;
            else
                wait = true;
            return;
        }
        const ulonglong2 sq = st[q / kBoxesPerWord];
        if ((sq.x >> (q % kBoxesPerWord)) & 1) {
            hit = true;
        } else if (!((sq.y >> (q % kBoxesPerWord)) & 1)) {
            wait = true;
        }
    };
    constexpr int kBatch = 8;  // loads in flight at once
    const int32_t n = npred[r] & kGridPredCount;
    if (n <= kGridPredSlots) {
        for (int32_t k0 = 0; k0 < n && !hit; k0 += kBatch) {
            int32_t q[kBatch];
#pragma unroll
            for (int u = 0; u < kBatch; ++u)
                q[u] = k0 + u < n ? preds[(int64_t)(k0 + u) * N + r] : -1;
#pragma unroll
            for (int u = 0; u < kBatch; ++u)
                if (q[u] >= 0) look(q[u]);
        }
        return;
    }
    const T xr = xs[r], yr = ys[r];
    const int64_t gr = gs ? gs[r] : 0;
    for (int k = 0; k < 3 && !hit; ++k) {
        const int32_t e = runs[r * 6 + 2 * k + 1];
        for (int32_t s0 = runs[r * 6 + 2 * k]; s0 < e && !hit; s0 += kBatch) {
            int32_t q[kBatch];
#pragma unroll
            for (int u = 0; u < kBatch; ++u) {
                const int32_t s = s0 + u;
                q[u] = -1;
                if (s < e) {
                    const int32_t qs = spos[s];
                    if (qs < base && (!sg || sg[s] == gr) && dist2_xy(sx[s], sy[s], xr, yr) < r2)
                        q[u] = qs;
                }
            }
#pragma unroll
            for (int u = 0; u < kBatch; ++u)
                if (q[u] >= 0) look(q[u]);
        }
    }
}

// One round of the grid path on the whole GPU (before the rounds kernel, for large N): a warp
// per row block, states read from st_in (NULL: the initial states) and written to st_out.
template <typename T>
__global__ void __launch_bounds__(kGridRoundThreads)
nms_grid_round_kernel(const T* __restrict__ xs, const T* __restrict__ ys,
                      const int64_t* __restrict__ gs, const uint64_t* __restrict__ inpred,
                      const int32_t* __restrict__ npred, const int32_t* __restrict__ preds,
                      const int32_t* __restrict__ runs, const T* __restrict__ sx,
                      const T* __restrict__ sy, const int64_t* __restrict__ sg,
                      const int32_t* __restrict__ spos, int64_t N, int64_t C, T r2,
                      const ulonglong2* __restrict__ st_in, ulonglong2* __restrict__ st_out) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t rb = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; rb < C;
         rb += warps) {
        const int64_t base = rb * kBoxesPerWord, a = base + lane, b = a + 32;
        uint64_t kept, removed;
        if (st_in) {
            const ulonglong2 sb = st_in[rb];
            kept = sb.x;
            removed = sb.y;
        } else {
            removed = rows_past_n(base, N);
            kept = ballot64(a < N && npred[a] == 0, b < N && npred[b] == 0) & ~removed;
        }
        const uint64_t und = ~(kept | removed);
        if (und) {
            bool hit_a = false, hit_b = false, wait_a = false, wait_b = false;
            if ((und >> lane) & 1)
                grid_far_preds(a, base, N, st_in, npred, preds, runs, xs, ys, gs, sx, sy, sg,
                               spos, r2, hit_a, wait_a);
            if ((und >> (lane + 32)) & 1)
                grid_far_preds(b, base, N, st_in, npred, preds, runs, xs, ys, gs, sx, sy, sg,
                               spos, r2, hit_b, wait_b);
            rounds_block_steps(a < N ? inpred[a] : 0, b < N ? inpred[b] : 0,
                               ballot64(hit_a, hit_b), ballot64(wait_a, wait_b), kept, removed,
                               kRoundSteps);
        }
        if (lane == 0) st_out[rb] = make_ulonglong2(kept, removed);
    }
}

// The greedy of the grid path by rounds (see "Rounds"), one block of kGridScanThreads threads;
// the per-row-block state in dynamic shared memory or (state_global) in the workspace.
//   start: the states after the rounds of nms_grid_round_kernel (st_init), or the initial ones
//     (rows with no pred at all kept);
//   a round: (A) a warp per half row block (32 rows): the far preds of its undecided rows ->
//     hit / wait bits; (B) a warp per row block: the in-block rule; two barriers;
//   the rest in order by warp 0; then the outputs by all threads.
template <typename T>
__global__ void __launch_bounds__(kGridScanThreads, 1)
nms_grid_rounds_kernel(const T* __restrict__ xs, const T* __restrict__ ys,
                       const int64_t* __restrict__ gs, const int32_t* __restrict__ order,
                       const uint64_t* __restrict__ inpred, const int32_t* __restrict__ npred,
                       const int32_t* __restrict__ preds, const int32_t* __restrict__ runs,
                       const T* __restrict__ sx, const T* __restrict__ sy,
                       const int64_t* __restrict__ sg, const int32_t* __restrict__ spos,
                       int64_t N, int64_t C, T r2, const ulonglong2* __restrict__ st_init,
                       void* state_global, bool* __restrict__ keep_mask,
                       int64_t* __restrict__ keep_idx,
                       int64_t* __restrict__ num_kept) {
    extern __shared__ __align__(16) unsigned char s_dyn[];
    __shared__ int s_round[2][2][32];
    __shared__ uint32_t s_warp[33];
    const GridRoundsState S = grid_rounds_state(state_global ? state_global : (void*)s_dyn, C);
    const int tid = threadIdx.x, nthreads = blockDim.x;
    const int warp = tid >> 5, lane = tid & 31, nwarps = nthreads >> 5;
    auto inpred_of = [&](int64_t r) -> uint64_t { return r < N ? inpred[r] : 0; };

    // start: the states of the rounds run on the whole GPU before (st_init), or the initial
    // ones (kept: the rows with no pred at all)
    for (int64_t rb = warp; rb < C; rb += nwarps) {
        const int64_t base = rb * kBoxesPerWord, a = base + lane, b = a + 32;
        ulonglong2 sb;
        if (st_init) {
            sb = st_init[rb];
        } else {
            const uint64_t past = rows_past_n(base, N);
            sb = make_ulonglong2(ballot64(a < N && npred[a] == 0, b < N && npred[b] == 0) & ~past,
                                 past);
        }
        if (lane == 0) S.state[0][rb] = sb;
    }
    __syncthreads();
    int buf = 0;
    for (int round = 0; round < kMaxRounds; ++round) {
        const ulonglong2* st = S.state[buf];
        // (A) far preds of the undecided rows, a half row block per warp
        for (int64_t h = warp; h < 2 * C; h += nwarps) {
            const ulonglong2 sb = st[h >> 1];
            const uint32_t und = (uint32_t)(~(sb.x | sb.y) >> ((h & 1) * 32));
            bool hit = false, wait = false;
            if ((und >> lane) & 1) {
                const int64_t r = h * 32 + lane;
                grid_far_preds(r, (h >> 1) * kBoxesPerWord, N, st, npred, preds, runs, xs, ys,
                               gs, sx, sy, sg, spos, r2, hit, wait);
            }
            const uint32_t hb = __ballot_sync(0xffffffffu, hit);
            const uint32_t wb = __ballot_sync(0xffffffffu, wait);
            if (lane == 0) {
                S.hit[h] = hb;
                S.wait[h] = wb;
            }
        }
        __syncthreads();  // hit / wait published
        // (B) the in-block rule, a row block per warp
        int decided = 0, open = 0;  // warp-uniform
        for (int64_t rb = warp; rb < C; rb += nwarps) {
            const ulonglong2 sb = st[rb];
            uint64_t kept = sb.x, removed = sb.y;
            const uint64_t und = ~(kept | removed);
            if (und) {
                const int64_t base = rb * kBoxesPerWord;
                const uint64_t hit = (uint64_t)S.hit[2 * rb] | ((uint64_t)S.hit[2 * rb + 1] << 32);
                const uint64_t wait =
                    (uint64_t)S.wait[2 * rb] | ((uint64_t)S.wait[2 * rb + 1] << 32);
                rounds_block_steps(inpred_of(base + lane), inpred_of(base + 32 + lane), hit, wait,
                                   kept, removed, kRoundSteps);
                decided += __popcll(und & (kept | removed));
                open += ~(kept | removed) != 0;
            }
            if (lane == 0) S.state[buf ^ 1][rb] = make_ulonglong2(kept, removed);
        }
        if (lane == 0) {
            s_round[buf][0][warp] = decided;
            s_round[buf][1][warp] = open;
        }
        __syncthreads();  // the new states and counts published; hit / wait free again
        const int total_decided = warp_sum(lane < nwarps ? s_round[buf][0][lane] : 0);
        const int total_open = warp_sum(lane < nwarps ? s_round[buf][1][lane] : 0);
        buf ^= 1;
        if (total_open <= kRoundMinOpen || total_decided < kRoundMinDecided) break;
    }
    // what is left, in order, by warp 0
    ulonglong2* st = S.state[buf];
    if (tid < 32) {
        for (int64_t c0 = 0; c0 < C; c0 += 32) {
            const bool has = c0 + lane < C && ~(st[c0 + lane].x | st[c0 + lane].y) != 0;
            for (uint32_t todo = __ballot_sync(0xffffffffu, has); todo; todo &= todo - 1) {
                const int64_t rb = c0 + __ffs(todo) - 1;
                const int64_t base = rb * kBoxesPerWord;
                const ulonglong2 sb = st[rb];
                const uint64_t und = ~(sb.x | sb.y);
                bool hit_a = false, hit_b = false, wait;
                if ((und >> lane) & 1)
                    grid_far_preds(base + lane, base, N, st, npred, preds, runs, xs, ys, gs, sx,
                                   sy, sg, spos, r2, hit_a, wait);
                if ((und >> (lane + 32)) & 1)
                    grid_far_preds(base + 32 + lane, base, N, st, npred, preds, runs, xs, ys, gs,
                                   sx, sy, sg, spos, r2, hit_b, wait);
                const uint64_t rem =
                    rounds_block_in_order(inpred_of(base + lane), inpred_of(base + 32 + lane),
                                          sb.y | ballot64(hit_a, hit_b));
                __syncwarp();  // every lane's reads of the states done
                if (lane == 0) st[rb] = make_ulonglong2(~rem, rem);
                __syncwarp();  // the final state visible to every lane
            }
        }
    }
    __syncthreads();
    // outputs: kept positions before each row block, then keep_mask, keep_idx, num_kept
    for (int64_t rb = tid; rb < C; rb += nthreads) S.before[rb] = (uint32_t)__popcll(st[rb].x);
    __syncthreads();
    const int64_t total = v2_block_scan(S.before, (int)C, s_warp);
    if (tid == 0 && num_kept) *num_kept = total;  // first: a host may be polling it
    for (int64_t r = tid; r < N; r += nthreads) {
        const int64_t rb = r / kBoxesPerWord;
        const int t = (int)(r % kBoxesPerWord);
        const uint64_t kept = st[rb].x;
        const bool is_kept = (kept >> t) & 1;
        if (keep_mask) keep_mask[order[r]] = is_kept;
        if (keep_idx && is_kept)
            keep_idx[S.before[rb] + __popcll(kept & ((uint64_t(1) << t) - 1))] = order[r];
    }
    if (keep_idx)
        for (int64_t p = total + tid; p < N; p += nthreads) keep_idx[p] = -1;
}

// ------------------------------------------------------------------------------------------
// launch plan and launchers

int next_pow2(int n) {
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}

// The launch plan, computed once from the sizes (by the size query and the launcher alike).
struct NmsPlan {
    int variant;  // 1 block path, 2 bitmask path, 3 grid path, 4 block path v2, 5 pair-tile
                  // path, 6 dataflow path, 0 nothing to launch (N == 0)
    int P;        // block paths: sort size
    int threads;  // block paths: block size
    int items;    // block path v2 (and the pair-tile path's v2 body): sort items per thread
};

// variant: 0 by size, 1 block, 2 bitmask, 3 grid, 4 block v2, 5 pair tiles, 6 dataflow. ok = false when
// the variant cannot take N.
NmsPlan nms_plan(int64_t N, int variant, bool& ok) {
    NmsPlan plan{0, 0, 0, 0};
    ok = N >= 0 && (N + kBoxesPerWord - 1) / kBoxesPerWord <= kMaxBlocks && variant >= 0 &&
         variant <= 6;
    if (!ok || N == 0) return plan;
    plan.variant = variant != 0 ? variant : (N <= kFlowMaxBoxes ? 6 : 3);
    if (plan.variant == 4 || plan.variant == 5 || plan.variant == 6) {
        // (6 keeps 4's plan for its fallback)
        if (N > (plan.variant == 5 ? kTileMaxBoxes
                                   : (plan.variant == 6 ? kFlowMaxBoxes : kBlockMaxBoxes))) {
            ok = false;
            return plan;
        }
        // a thread per box up to 1024 (at least 128); the sort: 32 items at least, up to 4 per
        // thread
        const int n2 = next_pow2((int)N);
        plan.threads = n2 < 128 ? 128 : (n2 > kV2Threads ? kV2Threads : n2);
        plan.P = n2 < 32 ? 32 : n2;
        plan.items = plan.P > plan.threads ? plan.P / plan.threads : 1;
    }
    if (plan.variant == 1) {
        if (N > kBlockMaxBoxes) {
            ok = false;
            return plan;
        }
        plan.P = next_pow2((int)N);
        const int t = plan.P / 2;
        plan.threads = t < 64 ? 64 : (t > kBlockMaxThreads ? kBlockMaxThreads : t);
    }
    return plan;
}

// Bitmask path workspace; one layout for the size query (base NULL) and the launcher.
struct MaskWorkspace {
    uint64_t *keys_in, *keys_out;
    int32_t *pos_in, *order;
    void* cub_temp;
    size_t cub_bytes;
    uint64_t* mask;     // [N][C]
    void *xs, *ys;      // [N] dtype
    int64_t* gs;        // [N]
    uint64_t* removed;  // [C]
    size_t bytes;
};

int score_end_bit(pcops_dtype score_dtype) { return score_dtype == PCOPS_FLOAT64 ? 64 : 32; }

// cub's temp bytes for the sort by score (size only: no launch, the temp pointer is NULL).
size_t score_sort_bytes(pcops_dtype score_dtype, int64_t N, cudaStream_t stream) {
    size_t bytes = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, bytes, (const uint64_t*)nullptr, (uint64_t*)nullptr,
                                    (const int32_t*)nullptr, (int32_t*)nullptr, (int)N, 0,
                                    score_end_bit(score_dtype), stream);
    return bytes;
}

// The first pieces of both layouts (MaskWorkspace, GridWorkspace): the sort by score's keys
// and positions, then cub's temp (w.cub_bytes).
template <typename Workspace>
void carve_score_sort(pcops_carver* c, int64_t N, Workspace& w) {
    w.keys_in = (uint64_t*)pcops_carve(c, N, sizeof(uint64_t));
    w.keys_out = (uint64_t*)pcops_carve(c, N, sizeof(uint64_t));
    w.pos_in = (int32_t*)pcops_carve(c, N, sizeof(int32_t));
    w.order = (int32_t*)pcops_carve(c, N, sizeof(int32_t));
    w.cub_temp = pcops_carve(c, (int64_t)w.cub_bytes, 1);
}

MaskWorkspace mask_layout(void* base, size_t elem, pcops_dtype score_dtype, int64_t N,
                          cudaStream_t stream) {
    const int64_t C = (N + kBoxesPerWord - 1) / kBoxesPerWord;
    MaskWorkspace w;
    w.cub_bytes = score_sort_bytes(score_dtype, N, stream);
    pcops_carver c = pcops_carver_init(base);
    carve_score_sort(&c, N, w);
    w.mask = (uint64_t*)pcops_carve(&c, N * C, sizeof(uint64_t));
    w.xs = pcops_carve(&c, N, elem);
    w.ys = pcops_carve(&c, N, elem);
    w.gs = (int64_t*)pcops_carve(&c, N, sizeof(int64_t));
    w.removed = (uint64_t*)pcops_carve(&c, C, sizeof(uint64_t));
    w.bytes = pcops_carver_bytes(&c);
    return w;
}

// Lets `kernel` use `bytes` of dynamic shared memory (above 48 KB), once per device: `done`,
// one per kernel, holds a bit per device ordinal < 64 (others set it on every call).
template <typename Kernel>
cudaError_t allow_shared_once(std::atomic<unsigned long long>& done, Kernel kernel, int bytes) {
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    const unsigned long long bit = dev < 64 ? 1ull << dev : 0;
    if (bit && (done.load(std::memory_order_relaxed) & bit)) return cudaSuccess;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err == cudaSuccess && bit) done.fetch_or(bit, std::memory_order_relaxed);
    return err;
}

// Opts the block kernel into its shared memory (above 48 KB) once per device.
template <typename T, typename S>
cudaError_t block_kernel_attributes() {
    static std::atomic<unsigned long long> done{0};
    const size_t most = block_smem<T>(nullptr, kBlockMaxBoxes, kBlockMaxBoxes, true).bytes;
    return allow_shared_once(done, nms_block_kernel<T, S>, (int)most);
}

template <typename T, typename S>
cudaError_t launch_block(const NmsPlan& plan, const T* centers, int64_t D, const S* scores,
                         const int64_t* groups, int64_t N, double radius2, bool* keep_mask,
                         int64_t* keep_idx, int64_t* num_kept, cudaStream_t stream) {
    cudaError_t err = block_kernel_attributes<T, S>();
    if (err != cudaSuccess) return err;
    const T r2 = (T)radius2;  // rounded as the CPU rounds it
    // cells at least the radius wide, with room for the rounding of the distance test
    const double cell_min = sqrt((double)r2) * (1.0 + 1.0 / 1024.0);
    const size_t smem = block_smem<T>(nullptr, (int)N, plan.P, groups != nullptr).bytes;
    nms_block_kernel<T, S><<<1, plan.threads, smem, stream>>>(
        centers, D, scores, groups, (int)N, plan.P, r2, cell_min, keep_mask, keep_idx,
        num_kept);
    return cudaGetLastError();
}

// The v2 kernel takes all the shared memory a block may opt into (what is left after its
// fixed arrays holds the pred lists); opted in and measured once per device (ordinal < 64).
template <typename T, typename S>
cudaError_t block_v2_attributes(int* bytes) {
    static std::atomic<int> cached[64];  // static storage: zero until measured
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (dev < 64 && (*bytes = cached[dev].load(std::memory_order_relaxed)) > 0)
        return cudaSuccess;
    int optin = 0;
    err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (err != cudaSuccess) return err;
    cudaFuncAttributes attr;
    err = cudaFuncGetAttributes(&attr, nms_block_v2_kernel<T, S>);
    if (err != cudaSuccess) return err;
    *bytes = optin - (int)attr.sharedSizeBytes;
    err = cudaFuncSetAttribute(nms_block_v2_kernel<T, S>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, *bytes);
    if (err == cudaSuccess && dev < 64) cached[dev].store(*bytes, std::memory_order_relaxed);
    return err;
}

// The v2 body's shared-memory carving for n boxes in `bytes` (sets max_cells): up to 16 cells
// a box (kV2MaxCells in all): cells as small as the radius allows cut the candidates of the
// pred-list pass (uniform boxes, 0.41 a squared radius: 7 a box with cells of 1.38 radii, 3.7
// with cells of one), fewer where the pred lists would get less than kV2MinPool entries a box.
template <typename T, typename S>
V2Smem<T> v2_layout(int bytes, int n, int P, bool with_groups, int& max_cells) {
    max_cells = 16 * n < 256 ? 256 : (16 * n > kV2MaxCells ? kV2MaxCells : 16 * n);
    V2Smem<T> s = v2_smem<T, S>(nullptr, (size_t)bytes, n, P, max_cells, with_groups);
    while (max_cells > 256 && s.pool_cap < kV2MinPool * n) {
        max_cells /= 2;
        s = v2_smem<T, S>(nullptr, (size_t)bytes, n, P, max_cells, with_groups);
    }
    return s;
}

template <typename T, typename S>
cudaError_t launch_block_v2(const NmsPlan& plan, const T* centers, int64_t D, const S* scores,
                            const int64_t* groups, int64_t N, double radius2, bool* keep_mask,
                            int64_t* keep_idx, int64_t* num_kept, cudaStream_t stream) {
    int bytes = 0;
    cudaError_t err = block_v2_attributes<T, S>(&bytes);
    if (err != cudaSuccess) return err;
    const T r2 = (T)radius2;  // rounded as the CPU rounds it
    const double cell_min = sqrt((double)r2) * (1.0 + 1.0 / 1024.0);
    const int n = (int)N;
    int max_cells = 0;
    const V2Smem<T> s = v2_layout<T, S>(bytes, n, plan.P, groups != nullptr, max_cells);
    if (s.sort_end > (size_t)bytes || s.fixed_end > (size_t)bytes) return cudaErrorInvalidValue;
    nms_block_v2_kernel<T, S><<<1, plan.threads, (size_t)bytes, stream>>>(
        centers, D, scores, groups, n, plan.P, plan.items, max_cells, s, r2, cell_min,
        keep_mask, keep_idx, num_kept);
    return cudaGetLastError();
}

// Per device (ordinal < 64), measured once: the dynamic shared memory a block of a cooperative
// kernel may opt into (all of it) and how many of its blocks fit on the device at once with that
// much (0: the device has no cooperative launch).
struct CoopAttributes {
    std::atomic<int> bytes[64], blocks[64];  // zero until measured
};

template <typename Kernel>
cudaError_t coop_attributes(Kernel* kernel, int threads, CoopAttributes& cache, int* bytes,
                            int* blocks) {
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (dev < 64 && (*bytes = cache.bytes[dev].load()) > 0) {
        *blocks = cache.blocks[dev].load();
        return cudaSuccess;
    }
    int optin = 0, sms = 0, cooperative = 0, per_sm = 0;
    err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, dev);
    cudaFuncAttributes attr;
    if (err == cudaSuccess) err = cudaFuncGetAttributes(&attr, kernel);
    if (err != cudaSuccess) return err;
    *bytes = optin - (int)attr.sharedSizeBytes;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, *bytes);
    if (err == cudaSuccess && cooperative)
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads,
                                                            (size_t)*bytes);
    if (err != cudaSuccess) return err;
    *blocks = per_sm * sms;
    if (dev < 64) {
        cache.blocks[dev].store(*blocks);
        cache.bytes[dev].store(*bytes);  // last: a nonzero size marks the entry complete
    }
    return cudaSuccess;
}

// The pair-tile kernel's (the v2 kernel's shared memory: all a block may opt into).
template <typename T, typename S>
cudaError_t tiles_attributes(int* bytes, int* blocks) {
    static CoopAttributes cache;
    return coop_attributes(nms_tiles_kernel<T, S>, kV2Threads, cache, bytes, blocks);
}

// The pair-tile path; the v2 kernel where no cooperative launch of the tiles kernel can run
// (the device has none, or not one block of it fits: a shared GPU).
template <typename T, typename S>
cudaError_t launch_tiles(const NmsPlan& plan, const T* centers, int64_t D, const S* scores,
                         const int64_t* groups, int64_t N, double radius2, void* workspace,
                         bool* keep_mask, int64_t* keep_idx, int64_t* num_kept,
                         cudaStream_t stream) {
    int bytes = 0, max_blocks = 0;
    cudaError_t err = tiles_attributes<T, S>(&bytes, &max_blocks);
    if (err != cudaSuccess) return err;
    const int64_t C = (N + kBoxesPerWord - 1) / kBoxesPerWord;
    const int64_t RW = (N + kTileRows - 1) / kTileRows;
    const size_t slices = (size_t)(plan.threads / 32) * kBoxesPerWord *
                          (sizeof(V2Pair<T>) + sizeof(V2Item<S>) + sizeof(int64_t));
    if (max_blocks < 1 || RW * C > 2 * (int64_t)plan.threads || slices > (size_t)bytes)
        return launch_block_v2(plan, centers, D, scores, groups, N, radius2, keep_mask,
                               keep_idx, num_kept, stream);
    T r2 = (T)radius2;  // rounded as the CPU rounds it
    double cell_min = sqrt((double)r2) * (1.0 + 1.0 / 1024.0);
    int n = (int)N, P = plan.P, items = plan.items, max_cells = 0;
    V2Smem<T> s = v2_layout<T, S>(bytes, n, P, groups != nullptr, max_cells);
    if (s.sort_end > (size_t)bytes || s.fixed_end > (size_t)bytes) return cudaErrorInvalidValue;
    TileWorkspace ws = tile_layout(workspace, N);
    int ntri = (int)triangle_tiles(RW);
    const int64_t want = (RW * C + kTilesPerBlock - 1) / kTilesPerBlock;
    const unsigned blocks = (unsigned)(want < max_blocks ? want : max_blocks);
    void* args[] = {(void*)&centers, (void*)&D,         (void*)&scores,   (void*)&groups,
                    (void*)&n,       (void*)&P,         (void*)&items,    (void*)&max_cells,
                    (void*)&s,       (void*)&r2,        (void*)&cell_min, (void*)&ws,
                    (void*)&ntri,    (void*)&keep_mask, (void*)&keep_idx, (void*)&num_kept};
    err = cudaLaunchCooperativeKernel((const void*)nms_tiles_kernel<T, S>, dim3(blocks),
                                      dim3(plan.threads), args, (size_t)bytes, stream);
    if (err == cudaErrorCooperativeLaunchTooLarge) {  // fewer SMs free than measured
        (void)cudaGetLastError();
        return launch_block_v2(plan, centers, D, scores, groups, N, radius2, keep_mask,
                               keep_idx, num_kept, stream);
    }
    return err;
}

// The dataflow kernel's.
template <typename T, typename S>
cudaError_t flow_attributes(int* bytes, int* blocks) {
    static CoopAttributes cache;
    return coop_attributes(nms_flow_kernel<T, S>, kFlowThreads, cache, bytes, blocks);
}

// The dataflow path; the v2 kernel (no workspace) where its ceil(N / 32) blocks cannot all be
// resident (no cooperative launch, a small or shared GPU) or its shared memory does not fit.
template <typename T, typename S>
cudaError_t launch_flow(const NmsPlan& plan, const T* centers, int64_t D, const S* scores,
                        const int64_t* groups, int64_t N, double radius2, void* workspace,
                        bool* keep_mask, int64_t* keep_idx, int64_t* num_kept,
                        cudaStream_t stream) {
    int bytes = 0, max_blocks = 0;
    cudaError_t err = flow_attributes<T, S>(&bytes, &max_blocks);
    if (err != cudaSuccess) return err;
    int n = (int)N;
    const int64_t RB = (N + kFlowRows - 1) / kFlowRows;
    const size_t need = flow_smem<T, S>(nullptr, n, groups != nullptr).bytes;
    if (RB > max_blocks || need > (size_t)bytes)
        return launch_block_v2(plan, centers, D, scores, groups, N, radius2, keep_mask,
                               keep_idx, num_kept, stream);
    T r2 = (T)radius2;  // rounded as the CPU rounds it
    FlowWorkspace ws = flow_layout(workspace, N);
    void* args[] = {(void*)&centers, (void*)&D,         (void*)&scores,   (void*)&groups,
                    (void*)&n,       (void*)&r2,        (void*)&ws,       (void*)&keep_mask,
                    (void*)&keep_idx, (void*)&num_kept};
    err = cudaLaunchCooperativeKernel((const void*)nms_flow_kernel<T, S>, dim3((unsigned)RB),
                                      dim3(kFlowThreads), args, need, stream);
    if (err == cudaErrorCooperativeLaunchTooLarge) {  // fewer SMs free than measured
        (void)cudaGetLastError();
        return launch_block_v2(plan, centers, D, scores, groups, N, radius2, keep_mask,
                               keep_idx, num_kept, stream);
    }
    return err;
}

template <typename T, typename S>
cudaError_t launch_mask(const T* centers, int64_t D, pcops_dtype score_dtype, const S* scores,
                        const int64_t* groups, int64_t N, double radius2, void* workspace,
                        bool* keep_mask, int64_t* keep_idx, int64_t* num_kept,
                        cudaStream_t stream) {
    const int64_t C = (N + kBoxesPerWord - 1) / kBoxesPerWord;
    MaskWorkspace w = mask_layout(workspace, sizeof(T), score_dtype, N, stream);
    T* xs = (T*)w.xs;
    T* ys = (T*)w.ys;
    int64_t* gs = groups ? w.gs : nullptr;

    const int64_t key_blocks = (N + kKeyThreads - 1) / kKeyThreads;
    nms_score_keys_kernel<S><<<(unsigned)(key_blocks < 4096 ? key_blocks : 4096), kKeyThreads,
                               0, stream>>>(scores, N, w.keys_in, w.pos_in, nullptr);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    // stable: equal keys keep the index order of pos_in, so ties go to the lower index
    err = cub::DeviceRadixSort::SortPairs(w.cub_temp, w.cub_bytes, w.keys_in, w.keys_out,
                                          w.pos_in, w.order, (int)N, 0,
                                          score_end_bit(score_dtype), stream);
    if (err != cudaSuccess) return err;

    const int64_t gather_blocks = (N + kGatherThreads - 1) / kGatherThreads;
    nms_gather_kernel<T><<<(unsigned)(gather_blocks < 4096 ? gather_blocks : 4096),
                           kGatherThreads, 0, stream>>>(centers, D, w.order, groups, N, xs, ys,
                                                        gs, keep_mask, keep_idx);
    nms_mask_kernel<T><<<dim3((unsigned)C, (unsigned)C), kBoxesPerWord, 0, stream>>>(
        xs, ys, gs, N, C, (T)radius2, w.mask);
    const bool shared = C <= kScanSharedWords;
    nms_scan_kernel<<<1, kScanThreads, shared ? C * sizeof(uint64_t) : 0, stream>>>(
        w.mask, w.order, N, C, shared ? nullptr : w.removed, keep_mask, keep_idx, num_kept);
    return cudaGetLastError();
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
    BlockGrid* grid;
    uint32_t *ckey, *skey;
    int32_t *cpos, *spos, *cell_begin, *runs;
    void *sx, *sy;  // [N] dtype, spatial order
    int64_t* sg;
    uint64_t* inpred;
    int32_t *npred, *preds;  // [N], [kGridPredSlots][N]
    void* rounds;       // grid_rounds_state(C) when it does not fit in shared memory
    ulonglong2* round_state[2];  // [C] each: the rounds of nms_grid_round_kernel
    int cell_bits;      // bits of the cell keys
    size_t bytes;
};

GridWorkspace grid_layout(void* base, size_t elem, pcops_dtype score_dtype, int64_t N,
                          cudaStream_t stream) {
    GridWorkspace w;
    const int64_t max_cells = grid_max_cells(N);
    w.cell_bits = 1;
    while (w.cell_bits < 32 && (int64_t(1) << w.cell_bits) <= max_cells) ++w.cell_bits;
    // cub's temp serves both sorts (size only: no launch, the temp pointer is NULL)
    const size_t score_bytes = score_sort_bytes(score_dtype, N, stream);
    size_t cell_bytes = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, cell_bytes, (const uint32_t*)nullptr,
                                    (uint32_t*)nullptr, (const int32_t*)nullptr,
                                    (int32_t*)nullptr, (int)N, 0, w.cell_bits, stream);
    w.cub_bytes = score_bytes > cell_bytes ? score_bytes : cell_bytes;
    pcops_carver c = pcops_carver_init(base);
    carve_score_sort(&c, N, w);
    w.xs = pcops_carve(&c, N, elem);
    w.ys = pcops_carve(&c, N, elem);
    w.gs = (int64_t*)pcops_carve(&c, N, sizeof(int64_t));
    w.bbox = (unsigned long long*)pcops_carve(&c, 4, sizeof(unsigned long long));
    w.grid = (BlockGrid*)pcops_carve(&c, 1, sizeof(BlockGrid));
    w.ckey = (uint32_t*)pcops_carve(&c, N, sizeof(uint32_t));
    w.skey = (uint32_t*)pcops_carve(&c, N, sizeof(uint32_t));
    w.cpos = (int32_t*)pcops_carve(&c, N, sizeof(int32_t));
    w.spos = (int32_t*)pcops_carve(&c, N, sizeof(int32_t));
    w.cell_begin = (int32_t*)pcops_carve(&c, max_cells + 1, sizeof(int32_t));
    w.runs = (int32_t*)pcops_carve(&c, 6 * N, sizeof(int32_t));
    w.sx = pcops_carve(&c, N, elem);
    w.sy = pcops_carve(&c, N, elem);
    w.sg = (int64_t*)pcops_carve(&c, N, sizeof(int64_t));
    w.inpred = (uint64_t*)pcops_carve(&c, N, sizeof(uint64_t));
    w.npred = (int32_t*)pcops_carve(&c, N, sizeof(int32_t));
    w.preds = (int32_t*)pcops_carve(&c, kGridPredSlots * N, sizeof(int32_t));
    const int64_t C = (N + kBoxesPerWord - 1) / kBoxesPerWord;
    w.rounds = pcops_carve(&c, C > kGridRoundsSharedRbs
                                   ? (int64_t)grid_rounds_state(nullptr, C).bytes : 0, 1);
    const int64_t gpu_rounds = grid_gpu_rounds(C);
    w.round_state[0] = (ulonglong2*)pcops_carve(&c, gpu_rounds > 0 ? C : 0, sizeof(ulonglong2));
    w.round_state[1] = (ulonglong2*)pcops_carve(&c, gpu_rounds > 1 ? C : 0, sizeof(ulonglong2));
    w.bytes = pcops_carver_bytes(&c);
    return w;
}

// Opts the grid scan kernel into its shared memory (the removed bits, above 48 KB) once per
// device.
template <typename T>
cudaError_t grid_scan_attributes() {
    static std::atomic<unsigned long long> done{0};
    return allow_shared_once(done, nms_grid_rounds_kernel<T>,
                             (int)grid_rounds_state(nullptr, kGridRoundsSharedRbs).bytes);
}

unsigned grid_blocks(int64_t n) {
    const int64_t b = (n + kGridThreads - 1) / kGridThreads;
    return (unsigned)(b < 1 ? 1 : (b < 8192 ? b : 8192));
}

template <typename T, typename S>
cudaError_t launch_grid(const T* centers, int64_t D, pcops_dtype score_dtype, const S* scores,
                        const int64_t* groups, int64_t N, double radius2, void* workspace,
                        bool* keep_mask, int64_t* keep_idx, int64_t* num_kept,
                        cudaStream_t stream) {
    cudaError_t err = grid_scan_attributes<T>();
    if (err != cudaSuccess) return err;
    const int64_t C = (N + kBoxesPerWord - 1) / kBoxesPerWord;
    GridWorkspace w = grid_layout(workspace, sizeof(T), score_dtype, N, stream);
    const T r2 = (T)radius2;  // rounded as the CPU rounds it
    const double cell_min = sqrt((double)r2) * (1.0 + 1.0 / 1024.0);
    const int max_cells = (int)grid_max_cells(N);
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
        xs, ys, N, w.bbox, cell_min, max_cells, w.grid, w.ckey, w.cpos);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    err = cub::DeviceRadixSort::SortPairs(w.cub_temp, w.cub_bytes, w.ckey, w.skey, w.cpos,
                                          w.spos, (int)N, 0, w.cell_bits, stream);
    if (err != cudaSuccess) return err;
    nms_grid_cells_kernel<T><<<grid_blocks(N + 1), kGridThreads, 0, stream>>>(
        w.skey, w.spos, N, w.grid, xs, ys, gs, w.cell_begin, sx, sy, sg);
    nms_grid_neighbours_kernel<T><<<blocks, kGridThreads, 0, stream>>>(
        xs, ys, gs, N, w.grid, w.cell_begin, sx, sy, sg, w.spos, r2, w.runs, w.inpred, w.npred,
        w.preds);
    const int64_t gpu_rounds = grid_gpu_rounds(C);
    const ulonglong2* st = nullptr;
    for (int64_t i = 0; i < gpu_rounds; ++i) {
        ulonglong2* out = w.round_state[i & 1];
        const int64_t round_blocks = (C + kGridRoundThreads / 32 - 1) / (kGridRoundThreads / 32);
        nms_grid_round_kernel<T><<<(unsigned)(round_blocks < 8192 ? round_blocks : 8192),
                                   kGridRoundThreads, 0, stream>>>(
            xs, ys, gs, w.inpred, w.npred, w.preds, w.runs, sx, sy, sg, w.spos, N, C, r2, st,
            out);
        st = out;
    }
    const bool shared = C <= kGridRoundsSharedRbs;
    nms_grid_rounds_kernel<T><<<1, kGridScanThreads,
                                shared ? grid_rounds_state(nullptr, C).bytes : 0, stream>>>(
        xs, ys, gs, w.order, w.inpred, w.npred, w.preds, w.runs, sx, sy, sg, w.spos, N, C, r2,
        st, shared ? nullptr : w.rounds, keep_mask, keep_idx, num_kept);
    return cudaGetLastError();
}

template <typename T>
cudaError_t launch_by_score(const NmsPlan& plan, const T* centers, int64_t D,
                            pcops_dtype score_dtype, const void* scores, const int64_t* groups,
                            int64_t N, double radius2, void* workspace, bool* keep_mask,
                            int64_t* keep_idx, int64_t* num_kept, cudaStream_t stream) {
    auto launch = [&](auto* s) {
        switch (plan.variant) {
            case 1:
                return launch_block(plan, centers, D, s, groups, N, radius2, keep_mask,
                                    keep_idx, num_kept, stream);
            case 2:
                return launch_mask(centers, D, score_dtype, s, groups, N, radius2, workspace,
                                   keep_mask, keep_idx, num_kept, stream);
            case 4:
                return launch_block_v2(plan, centers, D, s, groups, N, radius2, keep_mask,
                                       keep_idx, num_kept, stream);
            case 5:
                return launch_tiles(plan, centers, D, s, groups, N, radius2, workspace,
                                    keep_mask, keep_idx, num_kept, stream);
            case 6:
                return launch_flow(plan, centers, D, s, groups, N, radius2, workspace,
                                   keep_mask, keep_idx, num_kept, stream);
            default:
                return launch_grid(centers, D, score_dtype, s, groups, N, radius2, workspace,
                                   keep_mask, keep_idx, num_kept, stream);
        }
    };
    if (score_dtype == PCOPS_FLOAT32) return launch((const float*)scores);
    return launch((const double*)scores);
}

}  // namespace

extern "C" size_t pcops_circle_nms_cuda_workspace_bytes(pcops_dtype dtype,
                                                        pcops_dtype score_dtype, int64_t N,
                                                        int variant) {
    const size_t elem = pcops_dtype_size(dtype);
    bool ok;
    const NmsPlan plan = nms_plan(N, variant, ok);
    if (!ok || elem == 0 || plan.variant == 0 || plan.variant == 1 || plan.variant == 4)
        return 0;
    if (plan.variant == 2) return mask_layout(nullptr, elem, score_dtype, N, 0).bytes;
    if (plan.variant == 5) return tile_layout(nullptr, N).bytes;
    if (plan.variant == 6) return flow_layout(nullptr, N).bytes;
    return grid_layout(nullptr, elem, score_dtype, N, 0).bytes;
}

extern "C" cudaError_t pcops_circle_nms_cuda_path(
    pcops_dtype dtype, const void* centers, int64_t D, pcops_dtype score_dtype,
    const void* scores, const int64_t* groups, int64_t N, double radius2, void* workspace,
    bool* keep_mask, int64_t* keep_idx, int64_t* num_kept, int variant, cudaStream_t stream) {
    bool ok;
    const NmsPlan plan = nms_plan(N, variant, ok);
    if (!ok || D < 2) return cudaErrorInvalidValue;
    if (score_dtype != PCOPS_FLOAT32 && score_dtype != PCOPS_FLOAT64)
        return cudaErrorInvalidValue;
    if (N > 0 && (!centers || !scores ||
                  ((plan.variant == 2 || plan.variant == 3 || plan.variant == 5 ||
                    plan.variant == 6) &&
                   !workspace)))
        return cudaErrorInvalidValue;
    if (N == 0)
        return pcops_launch_tail(
            num_kept ? cudaMemsetAsync(num_kept, 0, sizeof(int64_t), stream) : cudaSuccess,
            stream);
    return pcops_dispatch_float(dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        return launch_by_score<T>(plan, (const T*)centers, D, score_dtype, scores, groups, N,
                                  radius2, workspace, keep_mask, keep_idx, num_kept, stream);
    });
}

extern "C" cudaError_t pcops_circle_nms_cuda(pcops_dtype dtype, const void* centers, int64_t D,
                                             pcops_dtype score_dtype, const void* scores,
                                             const int64_t* groups, int64_t N, double radius2,
                                             void* workspace, bool* keep_mask,
                                             int64_t* keep_idx, int64_t* num_kept,
                                             cudaStream_t stream) {
    return pcops_circle_nms_cuda_path(dtype, centers, D, score_dtype, scores, groups, N,
                                         radius2, workspace, keep_mask, keep_idx, num_kept, 0,
                                         stream);
}
