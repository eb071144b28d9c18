/*
 * circle_nms/common.cuh -- what the CUDA paths of circle NMS share (included by
 * kernels/circle_nms.cu through the path headers; not part of the C API).
 *
 * Words: N = boxes; "position" = place in the visiting order (descending score, NaN first,
 * ties to the lower index: the score key of kernels/circle_nms.h); "pred" of a position p = an
 * earlier position of p's group whose centre lies within the radius of p's (pcops_dist2_xy of
 * geometry.h < (T)radius2). The greedy keeps p iff none of its preds is kept. A "row block" is
 * 64 consecutive positions (a bit each in a 64-bit word).
 *
 * What lives here, top to bottom:
 *   1. the distance and score key in both dtypes, a 64-lane ballot;
 *   2. the rule of the rounds on a row block's kept / removed words (the block path);
 *   3. the grid over the bounding box of the finite centres (the block path) and that bounding
 *      box (block and grid paths);
 *   4. sort items of the score order and interleaved centres (block and flow paths), the
 *      block-wide exclusive scan (block and grid paths);
 *   5. the shared-memory carver, and the host helpers that opt a kernel into its shared memory.
 */
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../circle_nms.h"
#include "../geometry.h"
#include "../pcops.h"
#include "../warp.cuh"

namespace {

constexpr int kBoxesPerWord = 64;  // positions per row block = bits of a state word

// ------------------------------------------------------------------------------------------
// 1. Distance, score key, ballot

__device__ __forceinline__ float dist2_xy(float ax, float ay, float bx, float by) {
    return pcops_dist2_xy_f32(ax, ay, bx, by);
}
__device__ __forceinline__ double dist2_xy(double ax, double ay, double bx, double by) {
    return pcops_dist2_xy_f64(ax, ay, bx, by);
}
__device__ __forceinline__ uint64_t score_key(float s) { return pcops_nms_score_key_f32(s); }
__device__ __forceinline__ uint64_t score_key(double s) { return pcops_nms_score_key_f64(s); }

// Bit l of the result: a of lane l; bit 32 + l: b of lane l.
__device__ __forceinline__ uint64_t ballot64(bool a, bool b) {
    return (uint64_t)__ballot_sync(0xffffffffu, a) | ((uint64_t)__ballot_sync(0xffffffffu, b) << 32);
}

// ------------------------------------------------------------------------------------------
// 2. Rounds: the greedy decided in parallel (the block path in list mode applies the rule as a
// dataflow: block_decide_dataflow; the grid path applies it per box: grid.cuh).
//
// Box p is kept iff none of its preds (earlier positions of its group within the radius) is
// kept. That is a rule on facts: p is removed as soon as one pred is known kept, kept as soon
// as every pred is known removed, and every decision so made is the greedy's.
//
// State of a row block (64 positions): kept bits and removed bits (positions past N count as
// removed); a position in neither is undecided. Inside a row block the preds are the in-block
// pred words (bit t of inpred[r] is set when position base + t < r is a pred of r), one per
// row, so a lane tests its rows against the block's kept / undecided bits and a ballot
// gathers the answers; the preds in earlier row blocks ("far") come in as two masks, far_hit
// (rows with a kept far pred) and far_wait (rows with an undecided one).
//
// A row block whose rows no longer wait on a far pred is resolved in order (a long chain of
// preds, e.g. boxes on a line visited along it, would otherwise need a step per box). The
// answer is the same bits whichever way a box is decided.

constexpr int kRoundSteps = 8;  // in-block rule applications per row block and step

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

// ------------------------------------------------------------------------------------------
// 3. The grid over the bounding box of the finite centres

// The grid: cell (cx, cy) of a finite centre, cx in [0, gx), cy in [0, gy).
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

// The bounding box of the finite centres: one per thread, then per warp (the block path's grid
// spans it; the grid path's cells start at its low corner). lo > hi: no finite centre.
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
            auto key = [](double v) {
                const uint32_t u = __float_as_uint((float)v);
                return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
            };
            auto value = [](uint32_t k) {
                return (double)__uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
            };
            lo_x = value(pcops_warp::min_u32(key(lo_x)));
            lo_y = value(pcops_warp::min_u32(key(lo_y)));
            hi_x = value(pcops_warp::max_u32(key(hi_x)));
            hi_y = value(pcops_warp::max_u32(key(hi_y)));
            return;
        }
#endif
        warp_reduce();
    }
};

// ------------------------------------------------------------------------------------------
// 4. Sort items, centres, block scan

// Sort items: ascending order = visiting order, every item distinct.
template <typename S>
struct SortItem;

template <>
struct SortItem<float> {  // float32 score key (32 bits, circle_nms.h) << 32 | box index
    uint64_t k;
    __device__ __forceinline__ static SortItem make(float s, int i) {
        return {(score_key(s) << 32) | (uint32_t)i};
    }
    __device__ __forceinline__ static SortItem pad() { return {~uint64_t(0)}; }  // after all
    __device__ __forceinline__ int index() const { return (int)(uint32_t)k; }
    __device__ __forceinline__ bool before(const SortItem& o) const { return k < o.k; }
    __device__ __forceinline__ SortItem shfl_xor(int m) const {
        return {__shfl_xor_sync(0xffffffffu, k, m)};
    }
};

template <>
struct SortItem<double> {  // float64 score key (64 bits) and box index, compared in that order
    uint64_t k;
    int32_t i;
    __device__ __forceinline__ static SortItem make(double s, int idx) { return {score_key(s), idx}; }
    __device__ __forceinline__ static SortItem pad() { return {~uint64_t(0), 0x7fffffff}; }
    __device__ __forceinline__ int index() const { return i; }
    __device__ __forceinline__ bool before(const SortItem& o) const {
        return k < o.k || (k == o.k && i < o.i);
    }
    __device__ __forceinline__ SortItem shfl_xor(int m) const {
        return {__shfl_xor_sync(0xffffffffu, k, m), __shfl_xor_sync(0xffffffffu, i, m)};
    }
};

// A centre as one 8-byte (float) or 16-byte (double) load from the interleaved xy array.
template <typename T>
struct XY {
    T x, y;
};
__device__ __forceinline__ XY<float> load_xy(const float* xy, int p) {
    const float2 v = reinterpret_cast<const float2*>(xy)[p];
    return {v.x, v.y};
}
__device__ __forceinline__ XY<double> load_xy(const double* xy, int p) {
    const double2 v = reinterpret_cast<const double2*>(xy)[p];
    return {v.x, v.y};
}

// Exclusive prefix sum of a[0, n) in place by the whole block; returns the total. s_warp: 33
// words of shared memory. Barriers inside (uniform control flow); a[] is final on return.
__device__ uint32_t block_scan(uint32_t* a, int n, uint32_t* s_warp) {
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

// ------------------------------------------------------------------------------------------
// 5. Shared memory: carving, and opting a kernel into it (host)

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

// Per device (ordinal < 64), measured once per kernel: the dynamic shared memory a block may opt
// into (all the device allows, less the kernel's static shared memory; 0 unless all_shared) and
// how many blocks of `threads` threads with that much fit on the device at once (0: the device
// has no cooperative launch). With all_shared, the kernel is opted into that size when it is
// measured.
struct SmemOptIn {
    std::atomic<int> bytes[64], blocks[64];  // bytes + 1 and blocks; zero until measured
};

template <typename Kernel>
cudaError_t opt_into_shared(Kernel* kernel, int threads, SmemOptIn& cache, int* bytes,
                            int* blocks, bool all_shared = true) {
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (dev < 64 && (*bytes = cache.bytes[dev].load() - 1) >= 0) {
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
    *bytes = all_shared ? optin - (int)attr.sharedSizeBytes : 0;
    if (all_shared)
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, *bytes);
    if (err == cudaSuccess && cooperative)
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads,
                                                            (size_t)*bytes);
    if (err != cudaSuccess) return err;
    *blocks = per_sm * sms;
    if (dev < 64) {
        cache.blocks[dev].store(*blocks);
        cache.bytes[dev].store(*bytes + 1);  // last: nonzero marks the entry complete
    }
    return cudaSuccess;
}

// One cooperative launch (every block resident). *ran is false, and the error cleared, where
// fewer blocks than measured are free now (other work holds SMs): the caller runs its fallback.
inline cudaError_t launch_cooperative(const void* kernel, unsigned blocks, unsigned threads,
                                      void** args, size_t smem, cudaStream_t stream, bool* ran) {
    const cudaError_t err = cudaLaunchCooperativeKernel(kernel, dim3(blocks), dim3(threads), args,
                                                        smem, stream);
    *ran = err != cudaErrorCooperativeLaunchTooLarge;
    if (*ran) return err;
    (void)cudaGetLastError();
    return cudaSuccess;
}

}  // namespace
