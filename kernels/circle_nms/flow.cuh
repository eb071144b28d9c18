/*
 * circle_nms/flow.cuh -- the flow (dataflow) path (PCOPS_CIRCLE_NMS_FLOW, N <= kFlowMaxBoxes):
 * the greedy decided where the pairs are tested, with no sort and no hand-over. Words
 * (position, pred, row block): common.cuh.
 *
 * When it wins: small N (AUTO takes it up to the plan's flow_max_boxes, plan.cuh): its
 * N**2 / 2 pair tests spread over ceil(N / 32) SMs, and its only global barrier is one grid
 * sync, so a call costs about one launch plus a few memory round trips. Above a few thousand
 * boxes the quadratic tests lose to the grid path. Where its cooperative launch cannot run (no
 * cooperative launch on the device, or fewer free SMs than blocks), it runs the block path.
 *
 * What it does: block r owns the 32 positions 32r .. 32r + 31 (a lane each of warp 0) and
 * decides them itself, reading the states of their preds in earlier blocks as those blocks
 * publish them. One cooperative launch of ceil(N / 32) blocks (every block resident):
 *   a. every block loads all scores (as sort items), centres and groups into shared memory and
 *      checks whether the scores are already in visiting order (every block alike). If they
 *      are not, block r counts, for its 32 boxes (by index), the boxes visited before each:
 *      that is the box's position, and it writes order[position] = box. Block r also clears
 *      its state and count words. One grid barrier (the clears and `order` are then visible);
 *   b. (scores out of order) the centres and groups of positions < 32 (r + 1) gathered into
 *      position order through `order`;
 *   c. the pairs of block r's rows (lane l: position p = 32r + l) with the columns before them,
 *      in chunks of 32 columns, a warp a chunk: the in-block chunk gives each row its in-block
 *      pred word (bit t: position 32r + t < p is a pred), the earlier chunks a list of nonzero
 *      (chunk, word) entries per row. Only the lower triangle is tested: positions, not
 *      indices, and nothing is ever sorted;
 *   d. warp 0 applies the rule of the rounds (kept iff no pred kept; common.cuh) as a
 *      dataflow: each undecided row walks its far entries, reading the owning block's state
 *      word, and stops at the first undecided pred (a row with a kept pred is removed); the
 *      rows no longer waiting on a far pred are then resolved in order from the in-block
 *      words, and the new states are published (one atomicOr);
 *   e. keep_mask per row; for keep_idx / num_kept block r publishes its kept count and sums the
 *      counts of blocks < r (a look-back without chaining: every block publishes its own count);
 *      the last block writes num_kept (first: a host may be polling it) and -1 past the kept
 *      entries.
 * Invariants: every block is resident (the cooperative launch), so spinning on an earlier
 * block's words ends; a state word (kept bits | removed bits << 32) only gains bits, and every
 * bit is a fact, so any mix of older and newer states is true; a block waits only on earlier
 * blocks, so every block ends (induction on r). A chain of preds along the visiting order
 * costs a global round trip per block it crosses (at most ceil(N / 32) - 1) and an in-order
 * step per row.
 * Work: N**2 / 2 pair tests over ceil(N / 32) SMs, N**2 / 2 score comparisons more when the
 * scores are out of order, and N loads of every input per block (L2-resident). Workspace:
 * order (int32 [N]), a state word and a count per block.
 */
#pragma once

#include <cooperative_groups.h>

#include "block.cuh"
#include "common.cuh"

namespace {

namespace cg = cooperative_groups;

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
    SortItem<S>* key;   // [M] sort items by box (a, before the grid barrier); then the storage
                      // of xyp (b, after it)
    XY<T>* xy;    // [M] centres by box
    XY<T>* xyp;   // [M] centres by position (xy itself when the scores are in order)
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
    const size_t key_bytes = (size_t)M * (sizeof(SortItem<S>) > sizeof(XY<T>)
                                              ? sizeof(SortItem<S>)
                                              : sizeof(XY<T>));
    s.key = (SortItem<S>*)c.take(key_bytes);
    s.xy = (XY<T>*)c.take((size_t)M * sizeof(XY<T>));
    s.xyp = (XY<T>*)s.key;
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
__device__ __forceinline__ uint32_t flow_chunk_word(const XY<T>* __restrict__ xyp,
                                                    const int64_t* __restrict__ gp, int c,
                                                    T xi, T yi, int64_t gi, T r2, int kmax) {
    uint32_t w = 0;
    const XY<T>* col = xyp + c * kFlowRows;
#pragma unroll
    for (int k = 0; k < kFlowRows; ++k) {
        const XY<T> q = col[k];
        const bool pred = k < kmax && (!kGroups || gp[c * kFlowRows + k] == gi) &&
                          dist2_xy(q.x, q.y, xi, yi) < r2;
        w |= (uint32_t)pred << k;
    }
    return w;
}

#ifdef PCOPS_NMS_PHASES
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
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
        sm.key[k] = in ? SortItem<S>::make(scores[k], k) : SortItem<S>::pad();
        sm.xy[k] = in ? XY<T>{centers[(int64_t)k * D], centers[(int64_t)k * D + 1]}
                      : XY<T>{(T)NAN, (T)NAN};  // past N: within the radius of nothing
        if (groups) sm.g[k] = in ? groups[k] : 0;
    }
    __syncthreads();
    FLOW_CLOCK(1);
    bool ok = true;
    for (int k = tid; k < N - 1; k += nthreads) ok = ok && sm.key[k].before(sm.key[k + 1]);
    const bool in_order = __syncthreads_and(ok);
    const int row = r * kFlowRows + lane;  // block r's box (a) or position (c, d, e) of lane
    if (!in_order) {  // position of box `row`: the boxes visited before it
        const SortItem<S> ki = row < N ? sm.key[row] : SortItem<S>::pad();
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
    const XY<T>* xyp = sm.xy;
    const int64_t* gp = sm.g;
    if (!in_order) {
        const int P1 = (r + 1) * kFlowRows;
        for (int k = tid; k < P1; k += nthreads) {
            const int o = k < N ? __ldcg(ws.order + k) : -1;
            sm.xyp[k] = o >= 0 ? sm.xy[o] : XY<T>{(T)NAN, (T)NAN};
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
        const XY<T> pi = xyp[row];
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
    before = pcops_warp::sum_i32(before);
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
// launcher

// The flow kernel's shared memory (all a block may opt into) and resident blocks.
template <typename T, typename S>
cudaError_t flow_attributes(int* bytes, int* blocks) {
    static SmemOptIn cache;
    return opt_into_shared(nms_flow_kernel<T, S>, kFlowThreads, cache, bytes, blocks);
}

// The flow path for N in [1, kFlowMaxBoxes] boxes; the block path (no workspace) where its
// ceil(N / 32) blocks cannot all be resident (no cooperative launch, a small or shared GPU) or
// its shared memory does not fit.
template <typename T, typename S>
cudaError_t launch_flow(const T* centers, int64_t D, const S* scores, const int64_t* groups,
                        int64_t N, double radius2, void* workspace, bool* keep_mask,
                        int64_t* keep_idx, int64_t* num_kept, cudaStream_t stream) {
    int bytes = 0, max_blocks = 0;
    cudaError_t err = flow_attributes<T, S>(&bytes, &max_blocks);
    if (err != cudaSuccess) return err;
    int n = (int)N;
    const int64_t RB = (N + kFlowRows - 1) / kFlowRows;
    const size_t need = flow_smem<T, S>(nullptr, n, groups != nullptr).bytes;
    if (RB > max_blocks || need > (size_t)bytes)
        return launch_block(centers, D, scores, groups, N, radius2, keep_mask, keep_idx,
                            num_kept, stream);
    T r2 = (T)radius2;  // rounded as the CPU rounds it
    FlowWorkspace ws = flow_layout(workspace, N);
    void* args[] = {(void*)&centers, (void*)&D,         (void*)&scores,   (void*)&groups,
                    (void*)&n,       (void*)&r2,        (void*)&ws,       (void*)&keep_mask,
                    (void*)&keep_idx, (void*)&num_kept};
    bool ran = false;
    err = launch_cooperative((const void*)nms_flow_kernel<T, S>, (unsigned)RB, kFlowThreads, args,
                             need, stream, &ran);
    if (err != cudaSuccess || ran) return err;
    return launch_block(centers, D, scores, groups, N, radius2, keep_mask, keep_idx, num_kept,
                        stream);
}

}  // namespace
