/*
 * circle_nms/block.cuh -- the block path (PCOPS_CIRCLE_NMS_BLOCK, N <= kBlockMaxBoxes): the
 * whole circle NMS in ONE thread block of up to 1024 threads, everything in shared memory, no
 * workspace. Words (position, pred, row block): common.cuh.
 *
 * When it wins: where the flow path cannot launch (a device without cooperative launch, or
 * fewer free SMs than flow's ceil(N / 32) blocks: a small or shared GPU), which is where AUTO
 * takes it. It runs on one SM, so wherever the flow path can run, flow (its pair tests spread
 * over ceil(N / 32) SMs) is faster.
 *
 * What it does, phase by phase (a to d in block_prepare, e and the outputs in block_finish):
 *   a. the visiting order. The pass that loads the centres (and groups) and their bounding box
 *      also checks whether the scores are already in visiting order (as after a top-k); then
 *      the order is the identity. Otherwise a bitonic sort of the score items (SortItem), up to
 *      4 per thread in registers: stages within a thread, across the lanes of a warp by
 *      shuffles, across warps through shared memory (two buffers: one barrier a stage);
 *   b. a grid over the bounding box of the finite centres (make_grid, common.cuh), cells at
 *      least the radius wide, at most 16 cells a box (256 to kBlockMaxCells);
 *   c. the positions sorted into it by a counting sort (histogram, scan, scatter);
 *   d. one pass over the 3x3 cells around every position p: inpred[p] (its preds in its own row
 *      block, a bit each) and its preds in earlier row blocks, appended as q << 6 | (p % 64) to
 *      the list of p's row block; each row block owns an equal share of what is left of shared
 *      memory (the pool);
 *   e. list mode (every list fits its share): the rule of the rounds (common.cuh) as a dataflow
 *      (block_decide_dataflow): a warp per row block reads the states of the far preds on its
 *      list as the earlier row blocks publish them, and resolves the block in order once no row
 *      waits on a far pred; no block barrier. Push mode (a list outgrew its share: dense
 *      scenes): warp 0 resolves the row blocks in order, and after each the kept rows that
 *      have a neighbour in a later row block set that neighbour's removed bit (two barriers a
 *      row block; the work is bounded by the kept boxes' neighbourhoods);
 *   f. the outputs by all threads: num_kept first, keep_mask by box, keep_idx from a prefix of
 *      the kept counts of the row blocks, -1 past them.
 *
 * Invariants: N <= kBlockMaxBoxes = 4096 (positions and cells are uint16; 64 row blocks, two
 * per lane of warp 0 in the prefix of f). Cells are at least radius * (1 + 2**-10) wide, so a
 * box and every box within its radius lie in the same or adjacent cells; non-finite centres
 * get no cell (they are within the radius of nothing). Every state bit published in e is a
 * fact (kept or removed), so any mix of older and newer states read by a warp is true, and a
 * row block waits only on earlier ones: every row block ends.
 */
#pragma once

#include "common.cuh"

namespace {

constexpr int kBlockMaxBoxes = PCOPS_CIRCLE_NMS_CUDA_BLOCK_MAX;
constexpr int kBlockMaxThreads = 1024;  // the kernel's launch bound
constexpr int kBlockThreads = 1024;     // block size at most: the per-box phases want every warp
constexpr int kBlockMaxCells = 16384;   // cell indices are uint16
constexpr int kBlockMinPool = 4;        // pred-list entries a box, at least, before cells shrink
constexpr uint16_t kNoCell = 0xffff;    // the cell of a non-finite centre
constexpr int kBlockPushSplit = 4;      // push mode: threads per (kept row, cell row) run
constexpr int kBlockLoadBatch = 4;      // boxes whose loads a thread issues at once

// ------------------------------------------------------------------------------------------
// CUDA kernel and its phases

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
__device__ void block_sort_scores(const S* __restrict__ scores, int N, int P, SortItem<S>* buf,
                               uint16_t* order) {
    using Item = SortItem<S>;
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

// Shared memory of the block kernel: order, then a region that first holds the sort's two buffers
// and then everything else, the pred pool last (to the end of the allocation). One carving for
// the host (sizes) and the device (pointers).
template <typename T>
struct BlockSmem {
    uint16_t* order;     // [N] box index by position
    void* sort_buf;      // [2 P] sort items (the region below, before the sort is done)
    size_t sort_end;     // byte offset where the sort buffers end
    T* xy;               // [2 N] centres by position, x and y side by side (one load)
    int64_t* g;          // [N] groups by position (when groups are given)
    uint16_t* cell;      // [N] cell of a position (kNoCell: not finite)
    uint32_t* cell_end;  // [max_cells] after the counting sort: end of each cell's run
    uint16_t* by_cell;   // [N] positions in cell order, the non-finite ones last
    uint64_t* inpred;    // [N] bit t: position rb * 64 + t (< p) is a pred of p
    uint32_t* pool;      // [pool_cap] pred entries, q << 6 | t; row block rb owns
                         // [rb * block_cap, (rb + 1) * block_cap), block_cap = pool_cap / C
    size_t fixed_end;    // byte offset of the pool
    int pool_cap;

    // The carving made on the host (base NULL: the pointers are offsets), placed on the
    // block's shared memory: a few adds instead of every thread carving again.
    __device__ __forceinline__ BlockSmem placed(unsigned char* base) const {
        BlockSmem s = *this;
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
__host__ __device__ BlockSmem<T> block_smem(void* base, size_t bytes, int N, int P, int max_cells,
                                      bool with_groups) {
    SmemCarver c(base);
    auto take = [&](size_t bytes) { return c.take(bytes); };
    BlockSmem<T> s;
    s.order = (uint16_t*)take((size_t)N * sizeof(uint16_t));
    const size_t region = c.off;
    s.sort_buf = c.base + region;
    s.sort_end = region + 2 * (size_t)P * sizeof(SortItem<S>);
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
__device__ __forceinline__ void block_for_each_near(const BlockSmem<T>& sm, const BlockGrid& gr, int p,
                                                 F&& f) {
    const int c = sm.cell[p];
    if (c == kNoCell) return;
    const int cx = c % gr.gx, cy = c / gr.gx;
    const int x_lo = cx > 0 ? cx - 1 : 0, x_hi = cx + 1 < gr.gx ? cx + 1 : cx;
    const int y_lo = cy > 0 ? cy - 1 : 0, y_hi = cy + 1 < gr.gy ? cy + 1 : cy;
    for (int yy = y_lo; yy <= y_hi; ++yy) {
        const int c0 = yy * gr.gx + x_lo, c1 = yy * gr.gx + x_hi;
        const int e = (int)sm.cell_end[c1];
        for (int s = c0 > 0 ? (int)sm.cell_end[c0 - 1] : 0; s < e; ++s) f((int)sm.by_cell[s]);
    }
}

// Phase clock of the block kernel for lab/phases_circle_nms.cu (built with -DPCOPS_NMS_PHASES:
// thread 0 prints the cycles of each phase, kept in BlockShared::clock); nothing otherwise.
#ifdef PCOPS_NMS_PHASES
#define NMS_PHASE(i) (threadIdx.x == 0 ? (void)(sh.clock[i] = clock64()) : (void)0)
#else
#define NMS_PHASE(i) ((void)0)
#endif

// The fixed shared memory of the block kernel. (`round` is not read: it keeps the offsets of
// the fields after it, and so the kernel's code, as they were when other kernels used it.)
struct BlockShared {
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

// Phases a-d (see the top of this file): the visiting order, the grid, the counting sort into
// it, the in-block pred words and the far-pred lists. Returns whether the lists fit (list
// mode); the grid is left in sh.grid. Called by every thread of the block.
template <typename T, typename S>
__device__ __forceinline__ bool block_prepare(BlockShared& sh, const BlockSmem<T>& sm,
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
    // the loads of up to kBlockLoadBatch boxes before it uses any (one memory latency, not four).
    bool in_order = true;
    Box2 box = Box2::empty();
    for (int i0 = tid; i0 < N; i0 += kBlockLoadBatch * nthreads) {
        T x[kBlockLoadBatch], y[kBlockLoadBatch];
        S s0[kBlockLoadBatch], s1[kBlockLoadBatch];
#pragma unroll
        for (int u = 0; u < kBlockLoadBatch; ++u) {
            const int i = i0 + u * nthreads;
            if (i < N) {
                x[u] = centers[(int64_t)i * D + 0];
                y[u] = centers[(int64_t)i * D + 1];
                s0[u] = scores[i];
                s1[u] = i + 1 < N ? scores[i + 1] : s0[u];
            }
        }
#pragma unroll
        for (int u = 0; u < kBlockLoadBatch; ++u) {
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
    SortItem<S>* sort_buf = (SortItem<S>*)sm.sort_buf;
    if (__syncthreads_and(in_order)) {
        for (int p = tid; p < N; p += nthreads) sm.order[p] = (uint16_t)p;
    } else {
        // the sort's buffers overlap the centres just stored: sort, then gather again
        if (items_per_thread == 1)
            block_sort_scores<1>(scores, N, P, sort_buf, sm.order);
        else if (items_per_thread == 2)
            block_sort_scores<2>(scores, N, P, sort_buf, sm.order);
        else
            block_sort_scores<4>(scores, N, P, sort_buf, sm.order);
        __syncthreads();  // order written; the sort buffers read for the last time
        for (int p0 = tid; p0 < N; p0 += kBlockLoadBatch * nthreads) {
            T x[kBlockLoadBatch], y[kBlockLoadBatch];
#pragma unroll
            for (int u = 0; u < kBlockLoadBatch; ++u) {
                const int p = p0 + u * nthreads;
                if (p < N) {
                    const int o = sm.order[p];
                    x[u] = centers[(int64_t)o * D + 0];
                    y[u] = centers[(int64_t)o * D + 1];
                }
            }
#pragma unroll
            for (int u = 0; u < kBlockLoadBatch; ++u) {
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
        uint16_t c = kNoCell;
        if (finite_xy(x, y)) {
            c = (uint16_t)(grid_coord((double)y, gr.y0, gr.inv, gr.gy) * gr.gx +
                           grid_coord((double)x, gr.x0, gr.inv, gr.gx));
            atomicAdd(&sm.cell_end[c], 1u);
        }
        sm.cell[p] = c;
    }
    __syncthreads();
    const uint32_t finite = block_scan(sm.cell_end, gr.gx * gr.gy, sh.warp);  // cell starts
    for (int p = tid; p < N; p += nthreads) {
        const int c = sm.cell[p];
        const uint32_t s = c != kNoCell ? atomicAdd(&sm.cell_end[c], 1u)
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
        const XY<T> cp = load_xy(sm.xy, p);
        const T xp = cp.x, yp = cp.y;
        const int64_t gp = sm.g ? sm.g[p] : 0;
        const int rb = p / kBoxesPerWord, base = rb * kBoxesPerWord;
        uint32_t* list = sm.pool + (size_t)rb * block_cap;
        uint64_t word = 0;
        block_for_each_near(sm, gr, p, [&](int q) {
            if (q >= p) return;  // p itself, later positions
            if (sm.g && sm.g[q] != gp) return;
            const XY<T> cq = load_xy(sm.xy, q);
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
__device__ __forceinline__ void block_decide_dataflow(BlockShared& sh, const BlockSmem<T>& sm, int N,
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
            hit = pcops_warp::or_u64(hit);
            wait = pcops_warp::or_u64(wait);
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

// Phase e and the outputs (f): the greedy from the pred words and lists (list
// mode: rounds, then the in-order pass) or the push scan (which needs the grid and cells of
// block_prepare), then keep_mask, keep_idx and num_kept. sm.order and sm.inpred are final, and
// the lists too in list mode. Called by every thread of the block.
template <typename T>
__device__ __forceinline__ void block_finish(BlockShared& sh, const BlockSmem<T>& sm, int N,
                                          bool list_mode, T r2, bool* __restrict__ keep_mask,
                                          int64_t* __restrict__ keep_idx,
                                          int64_t* __restrict__ num_kept) {
    const int tid = threadIdx.x, nthreads = blockDim.x;
    const int C = (N + kBoxesPerWord - 1) / kBoxesPerWord;
    const int block_cap = sm.pool_cap / C;
    // e. the greedy scan
    NMS_PHASE(5);
    if (list_mode) {
        block_decide_dataflow(sh, sm, N, block_cap);
    } else {
        const BlockGrid gr = sh.grid;
        // push mode: first far[p], whether a later row block holds a neighbour of p (the rows
        // whose kept boxes push)
        for (int s = tid; s < N; s += nthreads) {
            const int p = sm.by_cell[s];
            const XY<T> cp = load_xy(sm.xy, p);
            const int64_t gp = sm.g ? sm.g[p] : 0;
            const int block_end = (p / kBoxesPerWord + 1) * kBoxesPerWord;
            bool far = false;
            block_for_each_near(sm, gr, p, [&](int q) {
                if (far || q < block_end || (sm.g && sm.g[q] != gp)) return;
                const XY<T> cq = load_xy(sm.xy, q);
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
                for (int item = tid; item < kBoxesPerWord * 3 * kBlockPushSplit; item += nthreads) {
                    const int t = item / (3 * kBlockPushSplit);
                    if (!((kept_far >> t) & 1)) continue;
                    const int k = (item / kBlockPushSplit) % 3, j = item % kBlockPushSplit;
                    const int p = base + t;  // < N and finite: far is set only for those
                    const int c = sm.cell[p];
                    const int cx = c % gr.gx, yy = c / gr.gx + k - 1;
                    if (yy < 0 || yy >= gr.gy) continue;
                    const int x_lo = cx > 0 ? cx - 1 : 0, x_hi = cx + 1 < gr.gx ? cx + 1 : cx;
                    const int c0 = yy * gr.gx + x_lo, c1 = yy * gr.gx + x_hi;
                    const int e = (int)sm.cell_end[c1];
                    const XY<T> cp = load_xy(sm.xy, p);
                    const T xp = cp.x, yp = cp.y;
                    const int64_t gp = sm.g ? sm.g[p] : 0;
                    for (int s = (c0 > 0 ? (int)sm.cell_end[c0 - 1] : 0) + j; s < e;
                         s += kBlockPushSplit) {
                        const int q = sm.by_cell[s];
                        if (q < block_end) continue;
                        if (sm.g && sm.g[q] != gp) continue;
                        const XY<T> cq = load_xy(sm.xy, q);
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
// carved as `layout` (block_smem with base NULL, for N, P, max_cells and whether groups are given);
// N in [1, kBlockMaxBoxes]; the sort: P items, E = items_per_thread (1, 2 or 4) per thread,
// P / E <= blockDim.x (block_sort_scores).
template <typename T, typename S>
__global__ void __launch_bounds__(kBlockMaxThreads, 1)
nms_block_kernel(const T* __restrict__ centers, int64_t D, const S* __restrict__ scores,
                 const int64_t* __restrict__ groups, int N, int P, int items_per_thread,
                 int max_cells, BlockSmem<T> layout, T r2, double cell_min,
                 bool* __restrict__ keep_mask, int64_t* __restrict__ keep_idx,
                 int64_t* __restrict__ num_kept) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ BlockShared sh;
    const BlockSmem<T> sm = layout.placed(smem);
    const bool list_mode = block_prepare<T, S>(sh, sm, centers, D, scores, groups, N, P,
                                               items_per_thread, max_cells, r2, cell_min);
    block_finish<T>(sh, sm, N, list_mode, r2, keep_mask, keep_idx, num_kept);
#ifdef PCOPS_NMS_PHASES
    if (threadIdx.x == 0)
        printf("block N=%d threads=%d sort %d x %d cap=%d list=%d kept=%lld cycles: sort %lld grid "
               "%lld cells %lld lists %lld - %lld scan %lld out %lld total %lld\n",
               N, (int)blockDim.x, P, items_per_thread,
               sm.pool_cap / ((N + kBoxesPerWord - 1) / kBoxesPerWord), (int)list_mode,
               (long long)sh.count, sh.clock[1] - sh.clock[0], sh.clock[2] - sh.clock[1],
               sh.clock[3] - sh.clock[2], sh.clock[4] - sh.clock[3], sh.clock[5] - sh.clock[4],
               sh.clock[6] - sh.clock[5], sh.clock[7] - sh.clock[6], sh.clock[7] - sh.clock[0]);
#endif
}

// ------------------------------------------------------------------------------------------
// launcher

// The block kernel takes all the shared memory a block may opt into (what is left after its
// fixed arrays holds the pred lists).
template <typename T, typename S>
cudaError_t block_attributes(int* bytes) {
    static SmemOptIn cache;
    int blocks = 0;
    return opt_into_shared(nms_block_kernel<T, S>, kBlockThreads, cache, bytes, &blocks);
}

// The block kernel's shared-memory carving for n boxes in `bytes` (sets max_cells): up to 16 cells
// a box (kBlockMaxCells in all): cells as small as the radius allows cut the candidates of the
// pred-list pass (uniform boxes, 0.41 a squared radius: 7 a box with cells of 1.38 radii, 3.7
// with cells of one), fewer where the pred lists would get less than kBlockMinPool entries a box.
template <typename T, typename S>
BlockSmem<T> block_layout(int bytes, int n, int P, bool with_groups, int& max_cells) {
    max_cells = 16 * n < 256 ? 256 : (16 * n > kBlockMaxCells ? kBlockMaxCells : 16 * n);
    BlockSmem<T> s = block_smem<T, S>(nullptr, (size_t)bytes, n, P, max_cells, with_groups);
    while (max_cells > 256 && s.pool_cap < kBlockMinPool * n) {
        max_cells /= 2;
        s = block_smem<T, S>(nullptr, (size_t)bytes, n, P, max_cells, with_groups);
    }
    return s;
}

// The block size and the sort of the block path for N boxes: a thread per box up to 1024 (at
// least 128); the sort takes P = next power of two >= N items (at least 32), up to 4 a thread.
struct BlockShape {
    int P;        // sort items
    int threads;  // block size
    int items;    // sort items per thread: 1, 2 or 4
};

inline BlockShape block_shape(int N) {
    int n2 = 1;
    while (n2 < N) n2 <<= 1;
    BlockShape b;
    b.threads = n2 < 128 ? 128 : (n2 > kBlockThreads ? kBlockThreads : n2);
    b.P = n2 < 32 ? 32 : n2;
    b.items = b.P > b.threads ? b.P / b.threads : 1;
    return b;
}

// The block path for N in [1, kBlockMaxBoxes] boxes (no workspace).
template <typename T, typename S>
cudaError_t launch_block(const T* centers, int64_t D, const S* scores, const int64_t* groups,
                         int64_t N, double radius2, bool* keep_mask, int64_t* keep_idx,
                         int64_t* num_kept, cudaStream_t stream) {
    int bytes = 0;
    cudaError_t err = block_attributes<T, S>(&bytes);
    if (err != cudaSuccess) return err;
    const T r2 = (T)radius2;  // rounded as the CPU rounds it
    const double cell_min = sqrt((double)r2) * (1.0 + 1.0 / 1024.0);
    const int n = (int)N;
    const BlockShape shape = block_shape(n);
    int max_cells = 0;
    const BlockSmem<T> s = block_layout<T, S>(bytes, n, shape.P, groups != nullptr, max_cells);
    if (s.sort_end > (size_t)bytes || s.fixed_end > (size_t)bytes) return cudaErrorInvalidValue;
    nms_block_kernel<T, S><<<1, shape.threads, (size_t)bytes, stream>>>(
        centers, D, scores, groups, n, shape.P, shape.items, max_cells, s, r2, cell_min,
        keep_mask, keep_idx, num_kept);
    return cudaGetLastError();
}

}  // namespace
