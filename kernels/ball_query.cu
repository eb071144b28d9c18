/*
 * ball_query.cu -- ball query on CUDA.
 *
 * B = batch, M = queries, N = reference points, S = nsample.
 * query[B,M,3], ref[B,N,3] -> idx[B,M,S] (int64), count[B,M] (int64).
 *
 * Same contract and arithmetic as ball_query.c: the first S valid refs in index order with
 * d = pcops_dist2(ref, query) < (T)radius2 (geometry.h: no FMA contraction), empty slots
 * repeating the first neighbour, -1 everywhere (count 0) for a query with no neighbour and for
 * an invalid query. CPU and CUDA return the same indices.
 *
 * Work distribution: a warp per query, a block of WARPS warps per WARPS consecutive queries of
 * one cloud. The block walks its cloud in tiles of THREADS refs, staged in shared memory (one
 * ref per thread, structure of arrays) so the refs are read from L2 once per block rather than
 * once per query. Each warp scans the tile 32 refs at a time: lane j tests ref j, a
 * __ballot_sync gathers the hits, and each hit's slot is the warp's count so far plus the
 * number of hits in lower lanes (popc of the ballot under the lane mask): hits are appended in
 * index order. A warp stops when it has S; the block stops loading tiles once no warp is left
 * scanning (__syncthreads_or), so a dense ball costs a tile or two, not the whole cloud.
 * Warp per query (rather than thread per query) keeps the GPU busy when there are few queries
 * and many refs (a single large scan becomes N/32 steps) and makes the early exit of a query
 * exact to 32 refs.
 *
 * The split path (ball_query_split_kernel, nsample <= 64): a thread per query, 32 queries a block
 * and the cloud's refs split into one range per warp of the block, each range's first S hits
 * kept in shared memory and concatenated in range order at the end (the section's comment).
 * A ref costs a warp a shared-memory broadcast and the distance for 32 queries (no ballot, no
 * loop step per 32 refs), and W warps per 32 queries fill the GPU when queries are few (H100,
 * B=32 M=512 N=1024 S=32: 16 us of kernel against the warp-per-query kernel's 46). Each warp
 * skips the refs outside its 32 queries' box widened by the radius; with the queries of each
 * cloud first put in a spatial order by one more launch (SPLIT_SORTED: a counting sort along a
 * Hilbert curve) that box is small and most refs are skipped (B=16 M=1024 N=4096 r=0.1 S=64:
 * 6 + 17 us of kernels against 43).
 *
 * The grid path (ball_query_grid_kernel; kernels/grid.h, grid_cuda.cuh): the refs of each cloud
 * binned into a uniform grid of cells of at least half the radius on the device (a
 * stable sort: index order inside a cell), the queries in cell order (a counting sort); one
 * thread per query visits the cells overlapping its ball and keeps the S smallest in-range
 * indices, in a sorted register list for S <= 64, else in a max-heap in its output row sorted
 * at the end (the refs of a cell are in index order, so a cell is left as soon as its indices
 * pass the largest kept one): the same first S in index order. The path is chosen by a plan
 * (pcops_ball_query_cuda_plan_make): the split kernel up to a number of pairs B * M * N (on
 * sorted queries from 3e7 pairs), the grid above, the warp-per-query kernel for nsample > 64
 * below N = 16384.
 */
#include <climits>
#include <cstdint>
#include <cstdlib>

#include "geometry.h"
#include "grid.h"
#include "grid_cuda.cuh"
#include "pcops.h"
#include "warp.cuh"

namespace {

using pcops_grid_cuda::Point4;  // x, y, z and the point's index in w:
using pcops_grid_cuda::index_as;  // the index into w
using pcops_grid_cuda::point_id;  // and back

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;  // also the tile length in refs
constexpr unsigned kFullMask = 0xffffffffu;

// geometry.h's squared distance (a - b, the CPU's bits), by type.
__device__ __forceinline__ float dist2(float ax, float ay, float az, float bx, float by, float bz) {
    return pcops_dist2_f32(ax, ay, az, bx, by, bz);
}
__device__ __forceinline__ double dist2(double ax, double ay, double az, double bx, double by,
                                        double bz) {
    return pcops_dist2_f64(ax, ay, az, bx, by, bz);
}

// ------------------------------------------------------------------------------------------
// CUDA kernels

template <typename T>
__global__ void __launch_bounds__(kThreads)
ball_query_kernel(const T* __restrict__ query, const T* __restrict__ ref,
                  const int64_t* __restrict__ query_lengths,
                  const int64_t* __restrict__ ref_lengths,
                  int64_t M, int64_t N, T radius2, int64_t S, int64_t blocks_per_cloud,
                  int64_t num_blocks, int64_t* __restrict__ idx, int64_t* __restrict__ count) {
    __shared__ T tile_x[kThreads], tile_y[kThreads], tile_z[kThreads];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const unsigned lower_lanes = (1u << lane) - 1u;

    // Grid-stride over blocks of queries; every branch below that contains a barrier depends
    // only on the block's cloud (b, L_ref) or on a block-wide vote, so all threads reach it.
    for (int64_t blk = blockIdx.x; blk < num_blocks; blk += gridDim.x) {
        const int64_t b = blk / blocks_per_cloud;
        const int64_t m = (blk - b * blocks_per_cloud) * kWarps + warp;
        const int64_t L_query = pcops_valid_length(query_lengths, b, M);
        const int64_t L_ref = pcops_valid_length(ref_lengths, b, N);
        const T* cloud = ref + b * N * 3;
        const bool in_range = m < M;  // a warp past the last query writes nothing
        bool scanning = in_range && m < L_query;
        T qx = T(0), qy = T(0), qz = T(0);
        if (scanning) {
            const T* q = query + (b * M + m) * 3;
            qx = q[0];
            qy = q[1];
            qz = q[2];
        }
        int64_t* out = idx + (b * M + m) * S;
        int64_t found = 0;     // warp-uniform
        int64_t first = -1;    // warp-uniform: the first neighbour, for the fill

        for (int64_t t0 = 0; t0 < L_ref; t0 += kThreads) {
            // Barrier: the previous tile is no longer read by anyone, and the block votes.
            if (!__syncthreads_or(scanning)) break;
            const int64_t n = t0 + threadIdx.x;
            if (n < L_ref) {
                tile_x[threadIdx.x] = cloud[3 * n + 0];
                tile_y[threadIdx.x] = cloud[3 * n + 1];
                tile_z[threadIdx.x] = cloud[3 * n + 2];
            }
            __syncthreads();
            if (!scanning) continue;
            const int tile_len = (int)(L_ref - t0 < kThreads ? L_ref - t0 : kThreads);
            for (int c = 0; c < tile_len; c += 32) {
                const int j = c + lane;
                bool hit = false;
                if (j < tile_len) {  // only entries written for this tile are read
                    const T d = dist2(tile_x[j], tile_y[j], tile_z[j], qx, qy, qz);
                    hit = d < radius2;                         // NaN is never a neighbour
                }
                const unsigned ballot = __ballot_sync(kFullMask, hit);
                if (ballot == 0u) continue;
                if (first < 0) first = t0 + c + (__ffs(ballot) - 1);
                if (hit) {
                    const int64_t slot = found + __popc(ballot & lower_lanes);
                    if (slot < S) out[slot] = t0 + j;
                }
                found += __popc(ballot);
                if (found >= S) {
                    found = S;
                    scanning = false;
                    break;
                }
            }
        }
        if (in_range) {
            for (int64_t s = found + lane; s < S; s += 32) out[s] = first;  // -1 if none
            if (lane == 0) count[b * M + m] = found;
        }
    }
}

// ------------------------------------------------------------------------------------------
// kernel launchers

template <typename T>
cudaError_t launch_ball_query(const T* query, const T* ref, const int64_t* query_lengths,
                              const int64_t* ref_lengths, int64_t B, int64_t M, int64_t N,
                              double radius2, int64_t S, int64_t* idx, int64_t* count,
                              cudaStream_t stream) {
    const int64_t blocks_per_cloud = (M + kWarps - 1) / kWarps;
    const int64_t num_blocks = B * blocks_per_cloud;
    const unsigned grid = (unsigned)(num_blocks < INT_MAX ? num_blocks : INT_MAX);
    ball_query_kernel<T><<<grid, kThreads, 0, stream>>>(query, ref, query_lengths, ref_lengths,
                                                        M, N, (T)radius2, S, blocks_per_cloud,
                                                        num_blocks, idx, count);
    return cudaGetLastError();
}

// ------------------------------------------------------------------------------------------
// the split brute force (PCOPS_BALL_QUERY_BRUTE_SPLIT and PCOPS_BALL_QUERY_SPLIT_SORTED, S <= kSplitMaxS)
//
// A block of W warps takes 32 queries of one cloud, one per lane, and splits the cloud's refs
// into W consecutive ranges of whole 32-ref chunks, one per warp. Every lane tests refs against
// its own query, reading them from shared memory by broadcast: a hit sets bit j of a mask, and
// the mask's bits are appended in index order to the lane's list of at most S (the first S of
// the warp's range). A warp stops when all its lanes hold S or its range ends. Then the block
// concatenates each query's W lists in range order, keeps the first S (the first S of the
// cloud in index order, as the warp-per-query kernel) and writes the row with the fill. A ref
// costs the warp one shared-memory load, the distance and two integer instructions for 32
// pairs (~11 warp instructions; the 8 of the distance are the floor), and W warps per 32
// queries fill the GPU when there are few queries; the price is no early exit across warps
// (each range needs its own S hits) and a shared-memory list per (warp, query).
//
// The box filter: every warp knows the box of its 32 queries, widened by the radius (with a
// margin, rounded outward; split_box). Lane j loads ref j of a chunk and keeps it only if it
// lies in that box; the kept refs are staged in index order (a ballot's prefix) and tested
// 32 at a time, so a ref outside the box costs the warp ~1/32 of a pair test instead of 32.
// A ref outside the box is out of every query's ball by the margin: the result is the same
// bits. With the queries in their input order the box of 32 random queries is most of the
// cloud and the filter skips little; SPLIT_SORTED first puts each cloud's queries in a
// spatial order (ball_query_order_kernel, a counting sort by cell along a Hilbert curve), so
// that a block's 32 queries are neighbours: at B=16 N=4096 M=1024 r=0.1 (uniform) their widened
// box holds ~1/9 of the cloud. The block reads its queries through the order and writes their rows back
// at their own indices.

constexpr int kSplitMaxS = 64;           // plans take this kernel for S <= kSplitMaxS
constexpr int kSplitMaxWarps = 8;
constexpr size_t kSplitSmemBytes = 48 * 1024;  // no opt-in to more dynamic shared memory
constexpr int kSplitStage = 64;          // refs staged per warp: 32 tested, up to 31 waiting
constexpr int kSplitUnroll = 4;          // chunks a warp loads per step (and ahead)

// Odd row stride of a (warp, query) list: the lanes of a warp append at different rows without
// bank conflicts.
__host__ __device__ __forceinline__ int split_list_stride(int64_t S) { return (int)(S | 1); }

// Shared memory of a block of the split kernel: per warp its staged refs, its (warp, query)
// lists and counts; per block the 32 merged rows.
template <typename T>
__host__ __device__ __forceinline__ size_t split_smem_bytes(int warps, int64_t S) {
    const size_t per_warp = kSplitStage * sizeof(Point4<T>) +
                            32 * sizeof(int32_t) * (split_list_stride(S) + 1);
    return (size_t)warps * per_warp + 32 * sizeof(int32_t) * (size_t)split_list_stride(S);
}

// Warps a block of the split kernel gets: 4 below N = 8192, else 8 (H100, L2 flushed, us of
// kernel: B=32 M=512 N=1024 S=32 15.5 with 4 / 15.7 with 8 (22.6 with 2); 8 x 2048 refs with
// full balls 22 / 28 (the ranges' early exits); 4 x 8192 71 / 69), as many as fit in
// kSplitSmemBytes, and no more than ranges of 4 chunks (128 refs) need.
template <typename T>
int split_warps(int64_t N, int64_t S) {
    int w = N >= 8192 ? kSplitMaxWarps : 4;
    while (w > 1 && split_smem_bytes<T>(w, S) > kSplitSmemBytes) --w;
    const int64_t by_n = (N + 127) / 128;
    if (by_n < w) w = (int)(by_n < 1 ? 1 : by_n);
    return w < 1 ? 1 : w;
}

// Sizes the split kernel takes: its indices and group numbers are int32.
__host__ __device__ __forceinline__ bool split_fits(int64_t B, int64_t M, int64_t N, int64_t S) {
    return S >= 1 && S <= kSplitMaxS && M <= INT_MAX - 31 && N <= INT_MAX - 1024 &&
           B * ((M + 31) / 32) <= INT_MAX;
}

// A float as an int in the same order (min / max by integer reductions), and back.
__device__ __forceinline__ int order_int(float f) {
    const int i = __float_as_int(f);
    return i >= 0 ? i : i ^ 0x7fffffff;
}
__device__ __forceinline__ float order_float(int i) { return __int_as_float(i >= 0 ? i : i ^ 0x7fffffff); }

// A coordinate as float bounds below and above it (the same float for a float).
__device__ __forceinline__ void float_bounds(float x, float* lo, float* hi) { *lo = *hi = x; }
__device__ __forceinline__ void float_bounds(double x, float* lo, float* hi) {
    *lo = __double2float_rd(x);
    *hi = __double2float_ru(x);
}

// A double bound rounded outward to T.
__device__ __forceinline__ void split_round_out(double lo, double hi, float* lo_t, float* hi_t) {
    *lo_t = __double2float_rd(lo);
    *hi_t = __double2float_ru(hi);
}
__device__ __forceinline__ void split_round_out(double lo, double hi, double* lo_t, double* hi_t) {
    *lo_t = lo;
    *hi_t = hi;
}

// The box of the warp's finite queries (use: this lane's query counts; reduced as float
// bounds, six integer reductions), widened by rr and rounded outward to T: a ref p with
// p.x < lo[0] (or > hi[0], on any axis) is farther than rr from every query on that axis.
// rr = sqrt(radius2) (1 + 2^-20): for a difference delta > rr, fl(delta) >= delta (1 - 2^-24) >
// sqrt(radius2), so fl(delta)^2 rounds to >= radius2 and so does the distance (a sum of that
// square and two non-negative ones, each rounding monotone): d < radius2 fails, as in the exact
// test. Non-finite queries (never in range of anything) stay out of the box; no finite query:
// an empty box (lo > hi), and with radius2 = +inf an unbounded one. Called by whole warps.
template <typename T>
__device__ __forceinline__ void split_box(bool use, T qx, T qy, T qz, T radius2, T (&lo)[3],
                                          T (&hi)[3]) {
    const T q[3] = {qx, qy, qz};
    const double r2 = (double)radius2;
    const double rr = r2 < INFINITY ? __dmul_ru(__dsqrt_ru(r2), 1.0 + 0x1p-20) : INFINITY;
#pragma unroll
    for (int j = 0; j < 3; ++j) {
        float a = INFINITY, b = -INFINITY;
        if (use) float_bounds(q[j], &a, &b);
        const double mn = order_float(pcops_warp::min_i32(order_int(a)));
        const double mx = order_float(pcops_warp::max_i32(order_int(b)));
        split_round_out(__dsub_rd(mn, rr), __dadd_ru(mx, rr), &lo[j], &hi[j]);
    }
}

template <typename T>
__global__ void __launch_bounds__(32 * kSplitMaxWarps)
ball_query_split_kernel(const T* __restrict__ query, const T* __restrict__ ref,
                        const int64_t* __restrict__ query_lengths,
                        const int64_t* __restrict__ ref_lengths,
                        const int32_t* __restrict__ order, int M, int N, T radius2, int S,
                        int groups_per_cloud, int num_groups, int64_t* __restrict__ idx,
                        int64_t* __restrict__ count) {
    extern __shared__ __align__(16) unsigned char split_smem[];
    const int W = (int)(blockDim.x >> 5);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const unsigned lower_lanes = (1u << lane) - 1u;
    const int stride = split_list_stride(S);
    Point4<T>* stage = reinterpret_cast<Point4<T>*>(split_smem) + warp * kSplitStage;
    int32_t* lists =
        reinterpret_cast<int32_t*>(split_smem + (size_t)W * kSplitStage * sizeof(Point4<T>));
    int32_t* merged = lists + W * 32 * stride;  // [32][stride]: the queries' result rows
    int32_t* counts = merged + 32 * stride;
    int32_t* my_list = lists + (warp * 32 + lane) * stride;
    const T inf = (T)INFINITY;

    // Grid-stride over groups of 32 queries; the barriers' conditions depend on the group only.
    for (int grp = blockIdx.x; grp < num_groups; grp += gridDim.x) {
        const int b = (int)((unsigned)grp / (unsigned)groups_per_cloud);
        const int m0 = (grp - b * groups_per_cloud) * 32;
        const int L_query = (int)pcops_valid_length(query_lengths, b, M);
        const int L_ref = (int)pcops_valid_length(ref_lengths, b, N);
        const T* cloud = ref + (int64_t)b * N * 3;

        // phase 1: this warp's range of whole chunks (its first refs loaded before the query,
        // so that the two loads' latencies overlap), this lane's query (slot m0 + lane of the
        // cloud's order: query m)
        const int chunks = (int)(((unsigned)L_ref + 31u) >> 5);
        const int per_warp = (int)(((unsigned)chunks + (unsigned)W - 1u) / (unsigned)W);
        const int r_lo = warp * per_warp * 32;
        const int r_hi = min(r_lo + per_warp * 32, L_ref);
        // this lane's refs of the next kSplitUnroll chunks (+inf past the range: never
        // kept), each loaded kSplitUnroll chunks ahead of its use
        T nx[kSplitUnroll], ny[kSplitUnroll], nz[kSplitUnroll];
        auto load = [&](int u, int c0) {
            const int n = c0 + lane;
            nx[u] = ny[u] = nz[u] = inf;
            if (n < r_hi) {
                const T* r = cloud + (int64_t)n * 3;
                nx[u] = r[0];
                ny[u] = r[1];
                nz[u] = r[2];
            }
        };
#pragma unroll
        for (int u = 0; u < kSplitUnroll; ++u) load(u, r_lo + 32 * u);
        const int slot = m0 + lane;
        int m = slot;
        if (order != nullptr && slot < M) m = order[(int64_t)b * M + slot];
        const bool active = slot < M && m < L_query;
        T qx = T(0), qy = T(0), qz = T(0);
        if (active) {
            const T* q = query + ((int64_t)b * M + m) * 3;
            qx = q[0];
            qy = q[1];
            qz = q[2];
        }
        const bool finite = pcops_grid_finite3((double)qx, (double)qy, (double)qz);
        T lo[3], hi[3];
        split_box(active && finite, qx, qy, qz, radius2, lo, hi);
        int cnt = 0;
        bool done = !active || !finite;  // a non-finite query is in range of nothing
        // Tests stage[0, 32) against this lane's query and appends the hits in index order.
        auto test_stage = [&]() {
            unsigned mask = 0u;
            if constexpr (sizeof(T) == 4) {
                // d >= +0 or NaN (the GPU's NaN is 0x7fffffff) and 0 < radius2 <= +inf: as
                // uint32 both lie in [0, 2^31), so the sign of the bits' difference is
                // d < radius2 (false for NaN); a funnel shift appends it, ref j at bit 31 - j
                const unsigned r2bits = __float_as_uint(radius2);
#pragma unroll
                for (int j = 0; j < 32; ++j) {
                    const Point4<T> p = stage[j];
                    const T d = dist2(p.x, p.y, p.z, qx, qy, qz);
                    mask = __funnelshift_l(__float_as_uint(d) - r2bits, mask, 1);
                }
                mask = __brev(mask);
            } else {
#pragma unroll
                for (int j = 0; j < 32; ++j) {
                    const Point4<T> p = stage[j];
                    const T d = dist2(p.x, p.y, p.z, qx, qy, qz);
                    mask |= (d < radius2 ? 1u : 0u) << j;  // NaN is never a neighbour
                }
            }
            if (done) mask = 0u;
            while (mask != 0u && cnt < S) {
                my_list[cnt++] = point_id(stage[__ffs(mask) - 1]);
                mask &= mask - 1u;
            }
            done = done || cnt >= S;
        };
        if (r_lo < r_hi && !__all_sync(kFullMask, done)) {
            int staged = 0;  // warp-uniform: refs waiting in stage[0, staged)
            bool finished = false;
            for (int c0 = r_lo; c0 < r_hi && !finished; c0 += 32 * kSplitUnroll) {
#pragma unroll
                for (int u = 0; u < kSplitUnroll; ++u) {
                    const T px = nx[u], py = ny[u], pz = nz[u];
                    load(u, c0 + 32 * (u + kSplitUnroll));
                    const int n = c0 + u * 32 + lane;
                    // NaN coordinates compare false: such a ref is kept (and never in range)
                    const bool keep = n < r_hi && !(px < lo[0] || px > hi[0] || py < lo[1] ||
                                                    py > hi[1] || pz < lo[2] || pz > hi[2]);
                    const unsigned kept = __ballot_sync(kFullMask, keep);
                    if (kept == 0u) continue;
                    if (keep)
                        stage[staged + __popc(kept & lower_lanes)] =
                            Point4<T>{px, py, pz, index_as<T>(n)};
                    staged += __popc(kept);
                    if (staged >= 32) {
                        __syncwarp();
                        test_stage();
                        __syncwarp();  // stage[0, 32) is read by every lane
                        if (lane < staged - 32) stage[lane] = stage[32 + lane];
                        staged -= 32;
                        __syncwarp();
                        if (__all_sync(kFullMask, done)) {
                            finished = true;
                            break;
                        }
                    }
                }
            }
            if (!finished && staged > 0) {  // the rest, padded with refs never in range
                if (lane >= staged) stage[lane] = Point4<T>{inf, inf, inf, index_as<T>(0)};
                __syncwarp();
                test_stage();
            }
            __syncwarp();  // the stage is rewritten by the next group
        }
        counts[warp * 32 + lane] = cnt;
        __syncthreads();

        // phase 2: thread (w, q) copies range w's list of query q to the query's merged row at
        // the ranges' offset (the counts of the ranges before it), up to slot S, and fills
        // slots w, w + W, ... from the number found on with the first neighbour (-1 if none)
        int before = 0, total = 0, first = -1;
        for (int u = 0; u < W; ++u) {
            const int cu = counts[u * 32 + lane];
            if (first < 0 && cu > 0) first = lists[(u * 32 + lane) * stride];
            before += u < warp ? cu : 0;
            total += cu;
        }
        const int found = min(total, S);
        int32_t* row = merged + lane * stride;
        for (int i = 0; i < cnt && before + i < S; ++i) row[before + i] = my_list[i];
        for (int s = found + warp; s < S; s += W) row[s] = first;
        if (warp == 0 && slot < M) count[(int64_t)b * M + m] = found;
        __syncthreads();
        // the rows to global memory, a warp per row (query m of lane qq), coalesced
        for (int qq = warp; qq < 32; qq += W) {
            const int mq = __shfl_sync(kFullMask, m, qq);
            if (m0 + qq >= M) break;
            int64_t* out = idx + ((int64_t)b * M + mq) * S;
            for (int s = lane; s < S; s += 32) out[s] = merged[qq * stride + s];
        }
        __syncthreads();  // the lists and counts are reused by the next group
    }
}

// The spatial order of the queries (PCOPS_BALL_QUERY_SPLIT_SORTED): one block per cloud bins its
// queries by a cell of `bits` bits per axis over the box of its valid finite queries, numbered
// along a Hilbert curve (consecutive cells are neighbours, so a run of cells -- a block's 32
// queries -- is compact: at B=16 N=4096 M=1024 r=0.1 the widened boxes hold 11 % of the refs
// against 17 % in Morton order, whose runs jump across the cloud at every octant), by a
// counting sort in shared memory (counts, their scan, the placing); invalid and non-finite
// queries last. order[b * M + slot] = the query at that slot. The order inside a cell is that of
// the atomics (it may change from call to call): the split kernel's rows do not depend on it
// (the box filter only skips refs out of range). The box and the cells are float arithmetic:
// the order is a heuristic, any permutation gives the same rows.
constexpr int kOrderThreads = 1024;
constexpr int kOrderMaxBits = 4;
constexpr int kOrderPer = 4;  // keys a thread keeps in registers; past kOrderPer * kOrderThreads
                              // queries in the workspace

// The Hilbert index of cell (x, y, z) of a 2^bits grid (Skilling's transpose algorithm).
__device__ __forceinline__ int hilbert3(unsigned x, unsigned y, unsigned z, int bits) {
    unsigned X[3] = {x, y, z};
    for (unsigned q = 1u << (bits - 1); q > 1u; q >>= 1) {
        const unsigned p = q - 1u;
#pragma unroll
        for (int i = 0; i < 3; ++i) {
            if (X[i] & q) {
                X[0] ^= p;
            } else {
                const unsigned t = (X[0] ^ X[i]) & p;
                X[0] ^= t;
                X[i] ^= t;
            }
        }
    }
    X[1] ^= X[0];
    X[2] ^= X[1];
    unsigned t = 0u;
    for (unsigned q = 1u << (bits - 1); q > 1u; q >>= 1)
        if (X[2] & q) t ^= q - 1u;
    int h = 0;
    for (int b = bits - 1; b >= 0; --b)
#pragma unroll
        for (int i = 0; i < 3; ++i) h = (h << 1) | (int)(((X[i] ^ t) >> b) & 1u);
    return h;
}

template <typename T>
__global__ void __launch_bounds__(kOrderThreads)
ball_query_order_kernel(const T* __restrict__ query, const int64_t* __restrict__ query_lengths,
                        int M, int bits, int32_t* __restrict__ order, int32_t* __restrict__ keys) {
    extern __shared__ int32_t order_counts[];  // [cells + 1], the last one the unbinned queries
    __shared__ int box[6];                     // order_int of the mins and of the maxes
    __shared__ int red[32];
    const int b = blockIdx.x;
    const int tid = threadIdx.x, nt = (int)blockDim.x;
    const int L = (int)pcops_valid_length(query_lengths, b, M);
    const T* cloud = query + (int64_t)b * M * 3;
    const int side = 1 << bits, cells = 1 << (3 * bits);
    for (int c = tid; c <= cells; c += nt) order_counts[c] = 0;
    if (tid < 6) box[tid] = tid < 3 ? INT_MAX : INT_MIN;

    float lo[3] = {INFINITY, INFINITY, INFINITY}, hi[3] = {-INFINITY, -INFINITY, -INFINITY};
    for (int i = tid; i < L; i += nt) {
        const T* q = cloud + (int64_t)i * 3;
        const float p[3] = {(float)q[0], (float)q[1], (float)q[2]};
        if (!(isfinite(p[0]) && isfinite(p[1]) && isfinite(p[2]))) continue;
#pragma unroll
        for (int j = 0; j < 3; ++j) {
            lo[j] = fminf(lo[j], p[j]);
            hi[j] = fmaxf(hi[j], p[j]);
        }
    }
    int v[6];
#pragma unroll
    for (int j = 0; j < 3; ++j) {
        v[j] = pcops_warp::min_i32(order_int(lo[j]));
        v[j + 3] = pcops_warp::max_i32(order_int(hi[j]));
    }
    __syncthreads();  // the counts and the box are initialised
    if ((tid & 31) == 0) {
#pragma unroll
        for (int j = 0; j < 3; ++j) {
            atomicMin(&box[j], v[j]);
            atomicMax(&box[j + 3], v[j + 3]);
        }
    }
    __syncthreads();
    float scale[3];
#pragma unroll
    for (int j = 0; j < 3; ++j) {
        lo[j] = order_float(box[j]);
        const float ext = order_float(box[j + 3]) - lo[j];
        scale[j] = ext > 0.0f && ext < INFINITY ? (float)side / ext : 0.0f;  // else one cell
    }
    auto key_of = [&](int i) {
        const T* q = cloud + (int64_t)i * 3;
        const float p[3] = {(float)q[0], (float)q[1], (float)q[2]};
        if (i >= L || !(isfinite(p[0]) && isfinite(p[1]) && isfinite(p[2]))) return cells;
        unsigned c[3];
#pragma unroll
        for (int j = 0; j < 3; ++j)
            c[j] = (unsigned)min(max((int)((p[j] - lo[j]) * scale[j]), 0), side - 1);
        return hilbert3(c[0], c[1], c[2], bits);
    };
    int kreg[kOrderPer];
#pragma unroll
    for (int k = 0; k < kOrderPer; ++k) {
        const int i = tid + k * nt;
        kreg[k] = i < M ? key_of(i) : 0;
        if (i < M) atomicAdd(&order_counts[kreg[k]], 1);
    }
    for (int i = tid + kOrderPer * nt; i < M; i += nt) {
        const int key = key_of(i);
        keys[(int64_t)b * M + i] = key;
        atomicAdd(&order_counts[key], 1);
    }
    __syncthreads();
    // the exclusive scan of the counts: a run of `per` consecutive cells a thread
    const int per = (cells + 1 + nt - 1) / nt;
    const int c0 = tid * per;
    int sum = 0;
    for (int c = c0; c < c0 + per && c <= cells; ++c) sum += order_counts[c];
    int total;
    int run = pcops_grid_cuda::block_exclusive_scan(sum, red, &total);
    for (int c = c0; c < c0 + per && c <= cells; ++c) {
        const int n = order_counts[c];
        order_counts[c] = run;
        run += n;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kOrderPer; ++k) {
        const int i = tid + k * nt;
        if (i < M) order[(int64_t)b * M + atomicAdd(&order_counts[kreg[k]], 1)] = i;
    }
    for (int i = tid + kOrderPer * nt; i < M; i += nt)
        order[(int64_t)b * M + atomicAdd(&order_counts[keys[(int64_t)b * M + i]], 1)] = i;
}

// Workspace of the query order: the order, then (past kOrderPer keys a thread) the keys.
inline size_t order_workspace_bytes(int64_t B, int64_t M) {
    const size_t n = (size_t)B * (size_t)M * sizeof(int32_t);
    return M > (int64_t)kOrderPer * kOrderThreads ? 2 * ((n + 255) / 256 * 256) : n;
}

// AUTO sorts the queries from this many pairs B * M * N (below, the order's launch costs
// more than the box filter saves).
constexpr double kSortedMinPairs = 3e7;

// Bits per axis of the query order: ~2 queries a cell (a block's 32 queries in a run of ~16
// cells), at most kOrderMaxBits.
inline int order_bits_for(int64_t M) {
    int bits = 1;
    while (bits < kOrderMaxBits && ((int64_t)1 << (3 * bits)) * 2 < M) ++bits;
    return bits;
}

template <typename T>
cudaError_t launch_ball_query_split(const T* query, const T* ref, const int64_t* query_lengths,
                                    const int64_t* ref_lengths, int64_t B, int64_t M, int64_t N,
                                    double radius2, int64_t S, int64_t warps, int64_t order_bits,
                                    void* workspace, int64_t* idx, int64_t* count,
                                    cudaStream_t stream) {
    const int64_t groups_per_cloud = (M + 31) / 32;
    const int64_t num_groups = B * groups_per_cloud;
    if (!split_fits(B, M, N, S) || warps < 1 || warps > kSplitMaxWarps)
        return cudaErrorInvalidValue;
    const size_t smem = split_smem_bytes<T>((int)warps, S);
    if (smem > kSplitSmemBytes) return cudaErrorInvalidValue;
    int32_t* order = nullptr;
    if (order_bits > 0) {
        if (order_bits > kOrderMaxBits || workspace == nullptr || B > INT_MAX)
            return cudaErrorInvalidValue;
        order = static_cast<int32_t*>(workspace);
        int32_t* keys = nullptr;
        if (M > (int64_t)kOrderPer * kOrderThreads)
            keys = order + ((size_t)B * (size_t)M * sizeof(int32_t) + 255) / 256 * 256 / sizeof(int32_t);
        const size_t cells = (size_t)1 << (3 * order_bits);
        ball_query_order_kernel<T><<<(unsigned)B, kOrderThreads, (cells + 1) * sizeof(int32_t),
                                     stream>>>(query, query_lengths, (int)M, (int)order_bits,
                                               order, keys);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    ball_query_split_kernel<T><<<(unsigned)num_groups, (unsigned)(32 * warps), smem, stream>>>(
        query, ref, query_lengths, ref_lengths, order, (int)M, (int)N, (T)radius2, (int)S,
        (int)groups_per_cloud, (int)num_groups, idx, count);
    return cudaGetLastError();
}

// ------------------------------------------------------------------------------------------
// the grid path

template <typename T>
__device__ __forceinline__ T grid_dist2(T qx, T qy, T qz, const Point4<T>& r) {
    return dist2(r.x, r.y, r.z, qx, qy, qz);
}

// Max-heap of indices in a query's output row.
__device__ __forceinline__ void index_heap_sift_down(int64_t* h, int64_t count, int64_t i,
                                                     int64_t n) {
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= count) break;
        int64_t hc = h[c];
        if (c + 1 < count) {
            const int64_t hr = h[c + 1];
            if (hr > hc) {
                ++c;
                hc = hr;
            }
        }
        if (hc <= n) break;
        h[i] = hc;
        i = c;
    }
    h[i] = n;
}

struct BallGridParams {
    const int64_t* query_lengths;
    int64_t B, M, C, S;
    const pcops_grid* grids;
    const int32_t* start;
    const int32_t* ids;
    const int32_t* order;  // [B * M] the query index of each sorted slot of its cloud
};

// The S smallest indices found so far, ascending, in registers (S <= K; the first K - S slots
// hold -1 and never move; empty slots INT_MAX).
template <int K>
struct IndexList {
    int32_t v[K];
    __device__ __forceinline__ void init(int64_t S) {
#pragma unroll
        for (int s = 0; s < K; ++s) v[s] = s < K - S ? -1 : INT_MAX;
    }
    __device__ __forceinline__ int64_t top() const { return v[K - 1] == INT_MAX ? LLONG_MAX : v[K - 1]; }
    __device__ __forceinline__ void offer(int32_t n) {  // n < v[K - 1], not in the list
        pcops_grid_cuda::insert_sorted(v, n);
    }
};

// The output row's max-heap (any S).
struct HeapIndexList {
    int64_t* out;
    int64_t S, found, topv;
    __device__ __forceinline__ int64_t top() const { return topv; }
    __device__ __forceinline__ void offer(int64_t n) {
        if (found < S) {  // push
            int64_t i = found;
            while (i > 0) {
                const int64_t par = (i - 1) / 2;
                const int64_t hp = out[par];
                if (hp >= n) break;
                out[i] = hp;
                i = par;
            }
            out[i] = n;
            if (++found == S) topv = out[0];
        } else {
            index_heap_sift_down(out, S, 0, n);
            topv = out[0];
        }
    }
};

// Visits the cells overlapping the ball of query q and offers its in-range refs to the list;
// a cell's refs are in index order, so a cell is left at the first index above the list's top.
// The bound of a cell is separable (gap_z^2 + gap_y^2 + gap_x^2): a plane or a row beyond the
// radius is skipped whole, a row's end cells beyond it are trimmed, and the cells left in a
// row are consecutive, so one cell's end is the next one's start.
template <typename T, typename List>
__device__ __forceinline__ void ball_walk(const BallGridParams& p, int64_t b, const pcops_grid& g,
                                          const Point4<T>* __restrict__ pts, T qx, T qy, T qz,
                                          T r2, List& list) {
    const double q[3] = {qx, qy, qz};
    const double reach = sqrt((double)r2 / PCOPS_GRID_SHRINK) + g.margin;
    const double lim = (double)r2;
    int32_t c0[3], c1[3];
    for (int a = 0; a < 3; ++a) {
        c0[a] = pcops_grid_coord(&g, a, q[a] - reach);
        c1[a] = pcops_grid_coord(&g, a, q[a] + reach);
    }
    const int32_t* start = p.start + b * p.C;
    for (int32_t cz = c0[2]; cz <= c1[2]; ++cz) {
        const double gz = pcops_grid_axis_gap(&g, 2, q[2], cz, cz);
        const double bz = gz * gz;
        if (bz * PCOPS_GRID_SHRINK >= lim) continue;
        for (int32_t cy = c0[1]; cy <= c1[1]; ++cy) {
            const double gy = pcops_grid_axis_gap(&g, 1, q[1], cy, cy);
            const double byz = bz + gy * gy;
            if (byz * PCOPS_GRID_SHRINK >= lim) continue;
            int32_t xa = c0[0], xb = c1[0];
            pcops_grid_cuda::trim_row<true>(&g, q[0], byz, lim, xa, xb);
            if (xa > xb) continue;
            const int64_t row = ((int64_t)cz * g.dims[1] + cy) * g.dims[0];
            int32_t j0 = start[row + xa];
            for (int32_t cx = xa; cx <= xb; ++cx) {
                const int32_t j1 = start[row + cx + 1];
                for (int32_t j = j0; j < j1; ++j) {
                    const int32_t n = p.ids[j];
                    if ((int64_t)n > list.top()) break;  // the rest of the cell is larger
                    if (grid_dist2(qx, qy, qz, pts[j]) < r2) list.offer(n);
                }
                j0 = j1;
            }
        }
    }
}

// Blocks of kThreads an SM should hold: float lists of up to 32 indices in 85 registers (three
// blocks an SM), not the 117-119 ptxas takes unasked (two): H100, Q3 (1e5 queries, one wave of
// blocks either way), 1.07 -> 0.94 ms with cells of r / 3 (a few spilled bytes included).
template <typename T, int K>
struct GridMinBlocks {
    static constexpr int value = sizeof(T) == 4 && K >= 1 && K <= 32 ? 3 : 1;
};

// One thread per query (B * M threads), the queries in cell order; K > 0: S <= K, the list in
// registers; K = 0: a heap in the output row.
template <typename T, int K>
__global__ void __launch_bounds__(kThreads, GridMinBlocks<T, K>::value)
ball_query_grid_kernel(const T* __restrict__ query, BallGridParams p,
                       const Point4<T>* __restrict__ pts, T r2, int64_t* __restrict__ idx,
                       int64_t* __restrict__ count) {
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= p.B * p.M) return;
    const int64_t b = t / p.M;
    t = b * p.M + p.order[t];
    const int64_t m = t % p.M;
    int64_t* out = idx + t * p.S;
    const int64_t S = p.S;
    int64_t found = 0;
    const T qx = query[3 * t], qy = query[3 * t + 1], qz = query[3 * t + 2];
    const pcops_grid g = p.grids[b];
    const bool active = m < pcops_valid_length(p.query_lengths, b, p.M) && g.cells > 0 &&
                        pcops_grid_finite3(qx, qy, qz) && r2 > T(0);
    if constexpr (K > 0) {
        IndexList<K> list;
        list.init(S);
        if (active) ball_walk<T>(p, b, g, pts, qx, qy, qz, r2, list);
        int64_t first = -1;
#pragma unroll
        for (int s = 0; s < K; ++s) {
            if (s >= K - S && list.v[s] != INT_MAX) {
                out[s - (K - S)] = list.v[s];
                if (found == 0) first = list.v[s];
                ++found;
            }
        }
        for (int64_t s = found; s < S; ++s) out[s] = first;
    } else {
        HeapIndexList list{out, S, 0, LLONG_MAX};
        if (active) ball_walk<T>(p, b, g, pts, qx, qy, qz, r2, list);
        found = list.found;
        for (int64_t end = found - 1; end > 0; --end) {  // heapsort: ascending
            const int64_t n = out[end];
            out[end] = out[0];
            index_heap_sift_down(out, end, 0, n);
        }
        const int64_t fill = found > 0 ? out[0] : -1;
        for (int64_t s = found; s < S; ++s) out[s] = fill;
    }
    count[t] = found;
}

// The cell edge of the ball-query grid: at least half the radius. H100, Q3 (1e6 refs, r = 0.05,
// ~65 refs a radius cube), the whole call: 0.87 ms with r / 2, 0.91 with r / 2.5, 0.94 with
// r / 3, 1.18 with r / 4, 1.42 with r / 5 (smaller cells: more starts to load than refs
// skipped; a ball overlaps ~80 cells of r / 2). The scan of a cell stops at the first index
// above the list's largest.
double ball_min_cell(double radius2) { return sqrt(radius2) / 2.0; }

template <typename T>
cudaError_t launch_ball_query_grid(const pcops_ball_query_cuda_plan& plan, const T* query,
                                   const T* ref, const int64_t* query_lengths,
                                   const int64_t* ref_lengths, void* workspace, int64_t* idx,
                                   int64_t* count, cudaStream_t stream) {
    pcops_grid_cuda::Scratch<T> s;
    const size_t grid_bytes = pcops_grid_cuda::carve<T>(workspace, plan.B, plan.N, plan.cells, &s);
    pcops_grid_cuda::CountScratch<T> o;
    pcops_grid_cuda::carve_counting<T>(static_cast<char*>(workspace) + grid_bytes, plan.B, 0,
                                       plan.M, plan.cells, &o);
    cudaError_t err = pcops_grid_cuda::build<T>(ref, ref_lengths, plan.B, plan.N, plan.cells,
                                                ball_min_cell(plan.radius2), s, stream);
    if (err != cudaSuccess) return err;
    err = pcops_grid_cuda::order_queries<T>(query, query_lengths, plan.B, plan.M, plan.cells,
                                            s.grids, o, stream);
    if (err != cudaSuccess) return err;
    BallGridParams p{query_lengths, plan.B, plan.M, plan.cells, plan.S, s.grids, s.start,
                     s.vals_out, o.order};
    const int64_t blocks = (plan.B * plan.M + kThreads - 1) / kThreads;
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
    const unsigned g = (unsigned)blocks;
    const int64_t S = plan.S;
    const T r2 = (T)plan.radius2;
    if (S <= 8)
        ball_query_grid_kernel<T, 8><<<g, kThreads, 0, stream>>>(query, p, s.pts, r2, idx, count);
    else if (S <= 16)
        ball_query_grid_kernel<T, 16><<<g, kThreads, 0, stream>>>(query, p, s.pts, r2, idx, count);
    else if (S <= 32)
        ball_query_grid_kernel<T, 32><<<g, kThreads, 0, stream>>>(query, p, s.pts, r2, idx, count);
    else if (S <= 64)
        ball_query_grid_kernel<T, 64><<<g, kThreads, 0, stream>>>(query, p, s.pts, r2, idx, count);
    else
        ball_query_grid_kernel<T, 0><<<g, kThreads, 0, stream>>>(query, p, s.pts, r2, idx, count);
    return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t pcops_ball_query_cuda_plan_make(pcops_dtype dtype, int64_t B, int64_t M,
                                                       int64_t N, double radius2, int64_t S,
                                                       pcops_ball_query_path variant,
                                                       pcops_ball_query_cuda_plan* plan) {
    if (!plan) return cudaErrorInvalidValue;
    *plan = pcops_ball_query_cuda_plan{};
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return cudaErrorInvalidValue;
    if (B < 0 || M < 0 || N < 0 || S < 1) return cudaErrorInvalidValue;
    plan->dtype = dtype;
    plan->B = B;
    plan->M = M;
    plan->N = N;
    plan->S = S;
    plan->radius2 = radius2;
    const pcops_ball_query_path requested = variant;
    const int64_t cells = pcops_grid_budget(N, 1.0);
    const bool grid_ok = 2 * B * cells + 1 < INT_MAX && B * N < INT_MAX && B * M < INT_MAX;
    // AUTO, from the H100 (BENCHMARKS.md, stops 24 and 26; uniform clouds, ~S/2 refs a ball, ms
    // from an idle GPU / queued, L2 flushed). The split brute force costs ~0.02 ms + 0.49 ms per
    // 1e9 pairs (B * M * N) whatever S; on sorted queries (SPLIT_SORTED) its box filter skips
    // most refs: 0.05-0.15 ms for 6.7e7-1.1e9 pairs (B=16 N=4096 M=1024 r=0.1 S=64 0.043 / 0.027
    // against 0.060 / 0.046 unsorted; 1 x 65536 of 16384 0.146 / 0.132 against the grid's
    // 0.281 / 0.251), 0.32-0.77 ms at 4.3e9-1e10 where the grid takes 0.24-0.28. Below 3e7 pairs
    // the order's launch costs more than the filter saves (B=32 N=1024 M=512 r=0.2: 0.042 /
    // 0.021 sorted, 0.036 / 0.018 not). So: the split kernel up to 2e9 pairs, on sorted queries
    // from 3e7, the grid above. For S > 64 (the warp-per-query kernel) the grid from N = 16384
    // (stop 23: the brute force wins up to N = 8192 by 1.6-4.5x, the grid from 16384 by
    // 1.2-8.5x). A few groups of 32 queries against a large cloud leave each warp of the split
    // kernel a long chain of loads (~0.6 us a step of 128 refs): the grid where a warp's range
    // exceeds 40960 refs and there are fewer than 264 groups (2 an SM); 1 x 200000 of 4096
    // (128 groups, 25000 refs a warp): 0.154 / 0.133 sorted, 0.307 / 0.266 the grid.
    const bool split_ok = split_fits(B, M, N, S);
    const double pairs = (double)B * (double)M * (double)N;
    const int warps = dtype == PCOPS_FLOAT32 ? split_warps<float>(N, S) : split_warps<double>(N, S);
    const bool few_groups = N > 40960 * (int64_t)warps && B * ((M + 31) / 32) < 264;
    if (variant == PCOPS_BALL_QUERY_AUTO) {
        if (split_ok && pairs <= 2e9 && !few_groups)
            variant = pairs >= kSortedMinPairs ? PCOPS_BALL_QUERY_SPLIT_SORTED
                                               : PCOPS_BALL_QUERY_BRUTE_SPLIT;
        else if (N >= 16384)
            variant = PCOPS_BALL_QUERY_GRID;
        else
            variant = split_ok ? PCOPS_BALL_QUERY_SPLIT_SORTED : PCOPS_BALL_QUERY_BRUTE;
    }
    if (variant == PCOPS_BALL_QUERY_GRID && !grid_ok) variant = PCOPS_BALL_QUERY_BRUTE_SPLIT;
    if ((variant == PCOPS_BALL_QUERY_BRUTE_SPLIT || variant == PCOPS_BALL_QUERY_SPLIT_SORTED) && !split_ok)
        variant = PCOPS_BALL_QUERY_BRUTE;
    if (variant != PCOPS_BALL_QUERY_GRID && variant != PCOPS_BALL_QUERY_BRUTE_SPLIT &&
        variant != PCOPS_BALL_QUERY_SPLIT_SORTED)
        variant = PCOPS_BALL_QUERY_BRUTE;
    if (requested != PCOPS_BALL_QUERY_AUTO && variant != requested)
        return cudaErrorInvalidValue;  // a forced path runs as asked or not at all
    plan->path = variant;
    if (variant == PCOPS_BALL_QUERY_BRUTE_SPLIT || variant == PCOPS_BALL_QUERY_SPLIT_SORTED)
        plan->warps = warps;
    if (variant == PCOPS_BALL_QUERY_SPLIT_SORTED && B > 0 && M > 0) {
        plan->order_bits = order_bits_for(M);
        plan->workspace_bytes = order_workspace_bytes(B, M);
    }
    if (variant == PCOPS_BALL_QUERY_GRID && B > 0 && M > 0) {
        plan->cells = cells;
        // the stable grid of the refs, then the counting sort of the queries (no refs)
        plan->workspace_bytes =
            dtype == PCOPS_FLOAT32
                ? pcops_grid_cuda::carve<float>(nullptr, B, N, cells, nullptr) +
                      pcops_grid_cuda::carve_counting<float>(nullptr, B, 0, M, cells, nullptr)
                : pcops_grid_cuda::carve<double>(nullptr, B, N, cells, nullptr) +
                      pcops_grid_cuda::carve_counting<double>(nullptr, B, 0, M, cells, nullptr);
    }
    return cudaSuccess;
}

extern "C" cudaError_t pcops_ball_query_cuda_run(const pcops_ball_query_cuda_plan* plan,
                                                 const void* query, const void* ref,
                                                 const int64_t* query_lengths,
                                                 const int64_t* ref_lengths, void* workspace,
                                                 int64_t* idx, int64_t* count,
                                                 cudaStream_t stream) {
    if (!plan) return cudaErrorInvalidValue;
    if (plan->path == PCOPS_BALL_QUERY_BRUTE)
        return pcops_ball_query_cuda(plan->dtype, query, ref, query_lengths, ref_lengths, plan->B,
                                     plan->M, plan->N, plan->radius2, plan->S, idx, count, stream);
    if (plan->B == 0 || plan->M == 0) return cudaSuccess;
    if (plan->path == PCOPS_BALL_QUERY_BRUTE_SPLIT || plan->path == PCOPS_BALL_QUERY_SPLIT_SORTED)
        return pcops_dispatch_float(plan->dtype, stream, [&](auto zero) {
            using T = decltype(zero);
            return launch_ball_query_split((const T*)query, (const T*)ref, query_lengths,
                                           ref_lengths, plan->B, plan->M, plan->N, plan->radius2,
                                           plan->S, plan->warps,
                                           plan->path == PCOPS_BALL_QUERY_SPLIT_SORTED
                                               ? plan->order_bits
                                               : 0,
                                           workspace, idx, count, stream);
        });
    if (workspace == nullptr) return cudaErrorInvalidValue;
    return pcops_dispatch_float(plan->dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        return launch_ball_query_grid(*plan, (const T*)query, (const T*)ref,
                                         query_lengths, ref_lengths, workspace, idx, count,
                                         stream);
    });
}


extern "C" cudaError_t pcops_ball_query_cuda(pcops_dtype dtype, const void* query,
                                             const void* ref, const int64_t* query_lengths,
                                             const int64_t* ref_lengths, int64_t B, int64_t M,
                                             int64_t N, double radius2, int64_t S, int64_t* idx,
                                             int64_t* count, cudaStream_t stream) {
    if (B < 0 || M < 0 || N < 0 || S < 1) return cudaErrorInvalidValue;
    if (B == 0 || M == 0) return cudaSuccess;
    return pcops_dispatch_float(dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        return launch_ball_query((const T*)query, (const T*)ref, query_lengths,
                                    ref_lengths, B, M, N, radius2, S, idx, count, stream);
    });
}
