/*
 * circle_nms/grid.cuh -- the grid path (PCOPS_CIRCLE_NMS_GRID, any N up to
 * PCOPS_CIRCLE_NMS_CUDA_MAX): the boxes sorted into a spatial grid in the workspace by the
 * whole GPU, the greedy decided by rounds. Words (position, pred, row block, rounds):
 * common.cuh.
 *
 * When it wins: large N (AUTO takes it above the plan's flow_max_boxes, plan.cuh): its work is
 * O(N) sorts plus the pairs within each box's 3x3 cells, spread over the GPU, where the flow and
 * block paths test all N**2 / 2 pairs.
 *
 * What it does (kernels in launch order):
 *   a. nms_score_keys_kernel + cub::DeviceRadixSort::SortPairs (stable: ties keep the lower
 *      index first) -> order (int32, position -> box);
 *   b. nms_grid_gather_kernel: centres (and groups) into visiting order; the bounding box of
 *      the finite centres by atomics;
 *   c. nms_grid_keys_kernel: the grid over that box (make_grid, common.cuh: cells at least the
 *      radius wide, at most grid_max_cells(N)), each position's cell key; a cub sort by cell
 *      (stable: positions ascending within a cell) -> spatial order;
 *   d. nms_grid_cells_kernel: cell_begin[] and the boxes in spatial order;
 *   e. nms_grid_neighbours_kernel, per position: the three runs of spatial indices covering its
 *      3x3 cells, inpred (its preds in its own row block, a bit each), its far preds in up to
 *      kGridPredSlots slots, and whether it has a pred at all;
 *   f. rounds: a few on the whole GPU (nms_grid_round_kernel, a warp per row block; above
 *      kGridGpuRoundsMinC row blocks), then nms_grid_rounds_kernel, one block: rounds until few
 *      row blocks are left undecided or a round decides little, those in order by one warp,
 *      then the outputs (num_kept first).
 * Invariants: cells are at least radius * (1 + 2**-10) wide, so a box and every box within its
 * radius lie in the same or adjacent cells; non-finite centres get the key past every cell.
 * Every decision of a round is the greedy's (the rule of the rounds), so the answer does not
 * depend on how many rounds run. Positions are int32 (N <= PCOPS_CIRCLE_NMS_CUDA_MAX).
 * Workspace O(N) (grid_layout), L2-resident at the sizes that matter.
 */
#pragma once

#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"

namespace {

constexpr int kGridThreads = 256;     // preparation kernels
constexpr int kGridScanThreads = 1024;
constexpr int kGridPredSlots = 32;    // far preds stored per position (more: the runs again)
constexpr int32_t kGridInPred = 1 << 30;       // npred flag: a pred in the own row block
constexpr int32_t kGridPredCount = kGridInPred - 1;
constexpr int kGridRoundThreads = 256;         // multi-block rounds: a warp per row block
constexpr int64_t kGridRoundsSharedRbs = 3072;  // rounds state in shared memory up to this C
constexpr int64_t kGridGpuRoundsMinC = 64;      // rounds on the whole GPU above this C

int64_t grid_max_cells(int64_t N) { return N < 512 ? 1024 : 2 * N; }

// Rounds run on the whole GPU (nms_grid_round_kernel) before the one-block rounds kernel: three
// whenever the grid path is taken by size (random scenes of 16384 to 65536 boxes leave a few
// hundred rows undecided after them, which one block then finishes; dense scenes, where rows
// have more preds than their slots, are decided there in parallel), none below (forced only).
int64_t grid_gpu_rounds(int64_t C) { return C > kGridGpuRoundsMinC ? 3 : 0; }

// ------------------------------------------------------------------------------------------
// CUDA kernels

// Score keys and their box indices; with bbox (grid path), also the empty bounding box that
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
        const int total_decided = pcops_warp::sum_i32(lane < nwarps ? s_round[buf][0][lane] : 0);
        const int total_open = pcops_warp::sum_i32(lane < nwarps ? s_round[buf][1][lane] : 0);
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
    const int64_t total = block_scan(S.before, (int)C, s_warp);
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
    void* rounds;       // grid_rounds_state(C), where it does not live in shared memory
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
    w.keys_in = (uint64_t*)pcops_carve(&c, N, sizeof(uint64_t));
    w.keys_out = (uint64_t*)pcops_carve(&c, N, sizeof(uint64_t));
    w.pos_in = (int32_t*)pcops_carve(&c, N, sizeof(int32_t));
    w.order = (int32_t*)pcops_carve(&c, N, sizeof(int32_t));
    w.cub_temp = pcops_carve(&c, (int64_t)w.cub_bytes, 1);
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
    w.rounds = pcops_carve(&c, (int64_t)grid_rounds_state(nullptr, C).bytes, 1);
    const int64_t gpu_rounds = grid_gpu_rounds(C);
    w.round_state[0] = (ulonglong2*)pcops_carve(&c, gpu_rounds > 0 ? C : 0, sizeof(ulonglong2));
    w.round_state[1] = (ulonglong2*)pcops_carve(&c, gpu_rounds > 1 ? C : 0, sizeof(ulonglong2));
    w.bytes = pcops_carver_bytes(&c);
    return w;
}

// The rounds kernel's shared memory (all a block may opt into: its state up to
// kGridRoundsSharedRbs row blocks where that fits, else the state lives in the workspace).
template <typename T>
cudaError_t grid_rounds_attributes(int* bytes) {
    static SmemOptIn cache;
    int blocks = 0;
    return opt_into_shared(nms_grid_rounds_kernel<T>, kGridScanThreads, cache, bytes, &blocks);
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
    int smem_bytes = 0;
    cudaError_t err = grid_rounds_attributes<T>(&smem_bytes);
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
    const size_t state_bytes = grid_rounds_state(nullptr, C).bytes;
    const bool shared = C <= kGridRoundsSharedRbs && state_bytes <= (size_t)smem_bytes;
    nms_grid_rounds_kernel<T><<<1, kGridScanThreads, shared ? state_bytes : 0, stream>>>(
        xs, ys, gs, w.order, w.inpred, w.npred, w.preds, w.runs, sx, sy, sg, w.spos, N, C, r2,
        st, shared ? nullptr : w.rounds, keep_mask, keep_idx, num_kept);
    return cudaGetLastError();
}

}  // namespace
