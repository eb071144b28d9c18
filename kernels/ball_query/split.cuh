/*
 * ball_query/split.cuh -- paths "brute_split" and "split_sorted" (S <= kSplitMaxS = 64): the
 * brute force with a thread per query, the cloud's refs split among the warps of a block, each
 * warp skipping the refs outside its queries' box; "split_sorted" first puts each cloud's
 * queries in a spatial order so that those boxes are small.
 *
 * What it does: a block of W warps takes 32 queries of one cloud, one per lane, and splits the
 * cloud's refs into W consecutive ranges of whole 32-ref chunks, one per warp. Every lane tests
 * refs against its own query, reading them from shared memory by broadcast: a hit sets bit j of
 * a mask, and the mask's bits are appended in index order to the lane's list of at most S (the
 * first S of the warp's range). A warp stops when all its lanes hold S or its range ends. Then
 * the block concatenates each query's W lists in range order, keeps the first S and writes the
 * row with the fill. A ref costs the warp one shared-memory load, the distance and two integer
 * instructions for 32 pairs, and W warps per 32 queries fill the GPU when there are few
 * queries; the price is no early exit across warps (each range needs its own S hits) and a
 * shared-memory list per (warp, query).
 *
 * The box filter: every warp knows the box of its 32 queries, widened by the radius (with a
 * margin, rounded outward; split_box). Lane j loads ref j of a chunk and keeps it only if it
 * lies in that box; the kept refs are staged in index order (a ballot's prefix) and tested 32 at
 * a time, so a ref outside the box costs the warp ~1/32 of a pair test instead of 32. With the
 * queries in their input order the box of 32 random queries is most of the cloud and the filter
 * skips little; split_sorted first orders each cloud's queries along a Hilbert curve
 * (ball_query_order_kernel, one more launch), so that a block's 32 queries are neighbours and
 * their widened box holds a small part of the cloud. The block reads its queries through the
 * order and writes their rows back at their own indices.
 *
 * When they win: up to a few billion pairs B * M * N with S <= 64, the sorted form once the
 * pairs pay for the order's launch (ball_query/plan.cuh).
 *
 * Invariants: the ranges are concatenated in index order and each keeps its first S hits, so
 * the rows are the first S in range, as the warp-per-query brute force's; a ref outside a
 * warp's box is out of range of every query of the warp by the margin, so the filter changes
 * nothing; the query order is a heuristic (any permutation gives the same rows).
 */
#pragma once

#include <climits>
#include <cstdint>

#include "../warp.cuh"
#include "common.cuh"

namespace {

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
                        const int32_t* __restrict__ order, int M, int N, T radius2, T lim, int S,
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
                nx[u] = staged_x(r[0], r[1], r[2]);  // NaN when not finite (geometry.h)
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
                // d < radius2 (false for NaN); a funnel shift appends it, ref j at bit 31 - j.
                // radius2 = +inf (radius**2 overflowed) counts as the bits above it, so that
                // d = +inf (finite staged points whose distance overflowed) is inside, as the
                // overflow rule says (ball_limit)
                const unsigned r2bits = __float_as_uint(radius2) + (radius2 == T(INFINITY));
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
                    mask |= (d <= lim ? 1u : 0u) << j;  // NaN is never a neighbour
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

// ------------------------------------------------------------------------------------------
// The spatial order of the queries (split_sorted): one block per cloud bins its queries by a
// cell of `bits` bits per axis over the box of its valid finite queries, numbered along a
// Hilbert curve (consecutive cells are neighbours, so a run of cells -- a block's 32 queries --
// is compact, where a Morton order's runs jump across the cloud at every octant), by a
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

// ------------------------------------------------------------------------------------------
// kernel launchers

// The workspace of the query order: the order [B * M], then (past kOrderPer keys a thread) the
// keys [B * M] (a carver with base NULL only counts).
inline void carve_order(pcops_carver* w, int64_t B, int64_t M, int32_t** order, int32_t** keys) {
    *order = (int32_t*)pcops_carve(w, B * M, sizeof(int32_t));
    *keys = M > (int64_t)kOrderPer * kOrderThreads
                ? (int32_t*)pcops_carve(w, B * M, sizeof(int32_t))
                : nullptr;
}

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
        pcops_carver w = pcops_carver_init(workspace);
        int32_t* keys;
        carve_order(&w, B, M, &order, &keys);
        const size_t cells = (size_t)1 << (3 * order_bits);
        ball_query_order_kernel<T><<<(unsigned)B, kOrderThreads, (cells + 1) * sizeof(int32_t),
                                     stream>>>(query, query_lengths, (int)M, (int)order_bits,
                                               order, keys);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    ball_query_split_kernel<T><<<(unsigned)num_groups, (unsigned)(32 * warps), smem, stream>>>(
        query, ref, query_lengths, ref_lengths, order, (int)M, (int)N, (T)radius2,
        ball_limit((T)radius2), (int)S, (int)groups_per_cloud, (int)num_groups, idx, count);
    return cudaGetLastError();
}

template <>
struct BallQueryPath<PCOPS_BALL_QUERY_BRUTE_SPLIT> {
    static constexpr bool kGrid = false;
    static bool takes(const BallQuerySizes& s) { return split_fits(s.B, s.M, s.N, s.S); }
    template <typename T>
    static cudaError_t launch(const pcops_ball_query_cuda_plan& plan, const BallQueryArgs<T>& a) {
        return launch_ball_query_split<T>(a.query, a.ref, a.query_lengths, a.ref_lengths, plan.B,
                                          plan.M, plan.N, plan.radius2, plan.S, plan.warps, 0,
                                          a.workspace, a.idx, a.count, a.stream);
    }
};

template <>
struct BallQueryPath<PCOPS_BALL_QUERY_SPLIT_SORTED> {
    static constexpr bool kGrid = false;
    static bool takes(const BallQuerySizes& s) { return split_fits(s.B, s.M, s.N, s.S); }
    template <typename T>
    static cudaError_t launch(const pcops_ball_query_cuda_plan& plan, const BallQueryArgs<T>& a) {
        return launch_ball_query_split<T>(a.query, a.ref, a.query_lengths, a.ref_lengths, plan.B,
                                          plan.M, plan.N, plan.radius2, plan.S, plan.warps,
                                          plan.order_bits, a.workspace, a.idx, a.count, a.stream);
    }
};

}  // namespace
