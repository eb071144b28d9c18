/*
 * circle_nms.cu -- greedy centre-distance NMS (circle NMS) on CUDA, with no host synchronisation.
 *
 * N = boxes, D = coordinate dims of a centre (only x and y are used), C = ceil(N / 64) blocks of
 * 64 consecutive positions of the visiting order ("row blocks" or "column blocks").
 * centers[N,D], order[N], groups[N]? -> keep_mask[N] (bool), keep_idx[N] (int64), num_kept[1].
 *
 * Same semantics and arithmetic as circle_nms.c: positions in visiting order; box j (later) is
 * removed by a kept box i (earlier) of its group when d = dx*dx + dy*dy < (T)radius2 with
 * dx = x[j] - x[i], evaluated without FMA contraction (__fmul_rn / __fadd_rn). Both therefore
 * keep exactly the same boxes.
 *
 * Three kernels on the caller's stream:
 *  1. nms_gather_kernel: the centres (and groups) gathered into visiting order, structure of
 *     arrays, in the workspace; keep_mask set to false and keep_idx to -1 everywhere (so every
 *     output element is written whatever the scan keeps). One thread per position.
 *  2. nms_mask_kernel: the suppression bitmask mask[N][C] of 64-bit words: bit t of
 *     mask[i][cb] is set when the box at position j = cb*64 + t comes later than position i
 *     (j > i), is in the same group and lies within the radius. One block of 64 threads per
 *     (row block rb, column block cb) pair with cb >= rb: the 64 column centres are staged in
 *     shared memory, thread t computes the word of row rb*64 + t. Blocks with cb < rb return at
 *     once: the lower triangle is never written, and never read.
 *  3. nms_scan_kernel: the greedy pass over the mask, by ONE thread block. removed[C] (a bit
 *     per position; in shared memory when C <= kScanSharedWords, else in the workspace) starts
 *     at 0. For each row block rb in turn:
 *       - thread 0 resolves the block's 64 boxes one after the other: box t is kept unless its
 *         bit is in `rem` (removed[rb], plus the rows that can never be kept: past N, or with
 *         an order entry outside [0, N)), and a kept box ORs its
 *         diagonal word mask[rb*64 + t][rb] into `rem`. The 64 diagonal words were loaded
 *         into shared memory in parallel, during the previous block's turn (a prefetch);
 *       - the kept boxes are written out (keep_mask[order[pos]] = true, keep_idx compacted in
 *         visiting order: every thread keeps the running count);
 *       - the kept rows' words are ORed into removed[cb] for every later column block cb, the
 *         column blocks split between the threads (one thread per cb; its loads of the kept
 *         rows go out kOrBatch at a time, independent of each other; a warp's loads of one row
 *         are consecutive words).
 *     Two barriers per row block. Cost: C sequential steps plus reading the K kept rows'
 *     upper-triangle words once.
 *
 * Workspace: mask N*C words (about N**2 / 8 bytes), x and y in visiting order (N each, dtype),
 * groups in visiting order (N int64), removed (C words, used when it does not fit in shared
 * memory). N <= 65535 * 64, the grid's limit in y.
 */
#include <cstdint>

#include "common.h"
#include "pcops.h"

namespace {

constexpr int kBoxesPerWord = 64;     // positions per row / column block = bits of a mask word
constexpr int kGatherThreads = 256;
constexpr int kScanThreads = 256;
constexpr int kOrBatch = 16;  // kept rows whose mask words a scan thread loads at once
constexpr int64_t kScanSharedWords = 4096;  // removed[] lives in shared memory up to this C (32 KB)
constexpr int64_t kMaxBlocks = 65535;       // C limit: gridDim.y of the mask kernel

// Squared xy distance, left to right, no contraction whatever the compiler flags.
__device__ __forceinline__ float squared_distance_xy(float dx, float dy) {
    return __fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy));
}
__device__ __forceinline__ double squared_distance_xy(double dx, double dy) {
    return __dadd_rn(__dmul_rn(dx, dx), __dmul_rn(dy, dy));
}

// ------------------------------------------------------------------------------------------
// CUDA kernels

template <typename T>
__global__ void __launch_bounds__(kGatherThreads)
nms_gather_kernel(const T* __restrict__ centers, int64_t D, const int64_t* __restrict__ order,
                  const int64_t* __restrict__ groups, int64_t N, T* __restrict__ xs,
                  T* __restrict__ ys, int64_t* __restrict__ gs, bool* __restrict__ keep_mask,
                  int64_t* __restrict__ keep_idx) {
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
        keep_mask[p] = false;
        keep_idx[p] = -1;
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
        const T d = squared_distance_xy(s_x[c] - xi, s_y[c] - yi);
        const bool hit = d < r2 && (gs == nullptr || s_g[c] == gi);
        word |= (uint64_t)hit << c;
    }
    mask[i * C + cb] = word;
}

// Position rb*64 + t of the visiting order: its box index (-1 past N) and its diagonal word.
__device__ __forceinline__ void load_row(const uint64_t* __restrict__ mask,
                                         const int64_t* __restrict__ order, int64_t N,
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
nms_scan_kernel(const uint64_t* __restrict__ mask, const int64_t* __restrict__ order, int64_t N,
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
            keep_mask[box] = true;  // box is in [0, N): unkeepable rows are never kept
            keep_idx[count + __popcll(kept & ((uint64_t(1) << tid) - 1))] = box;
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
    if (tid == 0) *num_kept = count;
}

// ------------------------------------------------------------------------------------------
// kernel launchers

size_t align256(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

// Workspace layout, shared by the size query and the launcher.
struct NmsWorkspace {
    uint64_t* mask;     // [N][C]
    void* xs;           // [N] dtype
    void* ys;           // [N] dtype
    int64_t* gs;        // [N]
    uint64_t* removed;  // [C]
    size_t bytes;
};

NmsWorkspace carve_workspace(void* base, size_t elem, int64_t N) {
    const size_t n = (size_t)N;
    const size_t c = (n + kBoxesPerWord - 1) / kBoxesPerWord;
    char* p = (char*)base;
    NmsWorkspace w;
    size_t off = 0;
    w.mask = (uint64_t*)(p + off);
    off += align256(n * c * sizeof(uint64_t));
    w.xs = p + off;
    off += align256(n * elem);
    w.ys = p + off;
    off += align256(n * elem);
    w.gs = (int64_t*)(p + off);
    off += align256(n * sizeof(int64_t));
    w.removed = (uint64_t*)(p + off);
    off += align256(c * sizeof(uint64_t));
    w.bytes = off;
    return w;
}

template <typename T>
cudaError_t launch_circle_nms(const T* centers, int64_t D, const int64_t* order,
                              const int64_t* groups, int64_t N, double radius2, void* workspace,
                              bool* keep_mask, int64_t* keep_idx, int64_t* num_kept,
                              cudaStream_t stream) {
    const int64_t C = (N + kBoxesPerWord - 1) / kBoxesPerWord;
    NmsWorkspace w = carve_workspace(workspace, sizeof(T), N);
    T* xs = (T*)w.xs;
    T* ys = (T*)w.ys;
    int64_t* gs = groups ? w.gs : nullptr;

    const int64_t gather_blocks = (N + kGatherThreads - 1) / kGatherThreads;
    nms_gather_kernel<T><<<(unsigned)(gather_blocks < 4096 ? gather_blocks : 4096),
                           kGatherThreads, 0, stream>>>(centers, D, order, groups, N, xs, ys, gs,
                                                        keep_mask, keep_idx);
    // Rounded in the launch, as the CPU rounds it: the same (T)radius2 on both.
    nms_mask_kernel<T><<<dim3((unsigned)C, (unsigned)C), kBoxesPerWord, 0, stream>>>(
        xs, ys, gs, N, C, (T)radius2, w.mask);
    const bool shared = C <= kScanSharedWords;
    nms_scan_kernel<<<1, kScanThreads, shared ? C * sizeof(uint64_t) : 0, stream>>>(
        w.mask, order, N, C, shared ? nullptr : w.removed, keep_mask, keep_idx, num_kept);
    return cudaGetLastError();
}

}  // namespace

extern "C" size_t pcops_circle_nms_cuda_workspace_bytes(pcops_dtype dtype, int64_t N) {
    const size_t elem = pcops_dtype_size(dtype);
    if (N <= 0 || elem == 0) return 0;
    return carve_workspace(nullptr, elem, N).bytes;
}

extern "C" cudaError_t pcops_circle_nms_cuda(pcops_dtype dtype, const void* centers, int64_t D,
                                             const int64_t* order, const int64_t* groups,
                                             int64_t N, double radius2, void* workspace,
                                             bool* keep_mask, int64_t* keep_idx,
                                             int64_t* num_kept, cudaStream_t stream) {
    if (N < 0 || D < 2 || !num_kept) return cudaErrorInvalidValue;
    if ((N + kBoxesPerWord - 1) / kBoxesPerWord > kMaxBlocks) return cudaErrorInvalidValue;
    if (N > 0 && (!centers || !order || !workspace || !keep_mask || !keep_idx))
        return cudaErrorInvalidValue;
    cudaError_t err;
    if (N == 0) {
        err = cudaMemsetAsync(num_kept, 0, sizeof(int64_t), stream);
    } else {
        switch (dtype) {
            case PCOPS_FLOAT32:
                err = launch_circle_nms((const float*)centers, D, order, groups, N, radius2,
                                        workspace, keep_mask, keep_idx, num_kept, stream);
                break;
            case PCOPS_FLOAT64:
                err = launch_circle_nms((const double*)centers, D, order, groups, N, radius2,
                                        workspace, keep_mask, keep_idx, num_kept, stream);
                break;
            default:
                return cudaErrorInvalidValue;
        }
    }
#ifdef PCOPS_DEBUG_SYNC
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
#endif
    return err;
}
