/*
 * knn_nd/tc.cuh -- the tensor-core shortlist of the kNN of any dimension (path "tc" of
 * kernels/knn_paths.h): L2, float32 compute (float16 / bfloat16 inputs arrive upcast), D >= 16,
 * k <= 64, sm_80 and newer. kernels/knn_nd.cu makes the plan and launches it.
 *
 * B = batch, M = queries per cloud, N = refs per cloud, D = coordinates, K = neighbours,
 * Lq / L = valid queries / refs of a cloud, C = shortlist capacity of a query.
 *
 * What it does. The exact search (knn_nd.cu's brute force) spends D exactly rounded steps on
 * every pair. In feature space that is a matrix product's work, and the tensor cores do it an
 * order of magnitude faster, approximately. So:
 *   1. norms: per point p, n_p = |p|^2 in float32 and s_p = sqrt(n_p) (a warp a point);
 *   2. shortlist: per query q and ref r, g = q~ . r~ on the tensor cores (mma m16n8k8, TF32
 *      operands, float32 accumulation) and the approximate distance d~ = (n_q + n_r) - 2 g with
 *      a bound e(q, r) >= |d~ - d| on its distance from d, the exact distance of the brute
 *      force (below). tau(q) is an upper bound of the K-th smallest d~ + e over the cloud;
 *      every ref among the K nearest by (d, index) has d~ - e <= tau(q): if d~_r - e_r > tau,
 *      then d_r >= d~_r - e_r > tau >= d~_s + e_s >= d_s for at least K refs s, which all come
 *      before r. One pass over the refs: after each tile the running tau (from the lists of
 *      the refs seen so far, tile included; below) is at least the final one, as the lists
 *      only shrink, so appending the tile's refs with d~ - e <= the running tau appends every
 *      ref with d~ - e <= the final tau (and some more, under the earlier, larger taus: the
 *      re-rank drops those, with d~ - e stored beside each ref). A block takes 64 queries,
 *      four warps of 16, and walks the refs in tiles of 64, staged through shared memory in
 *      chunks of 32 coordinates (zero-padded: zeros add nothing to g), double-buffered (the
 *      next chunk's loads in flight during this chunk's products); the queries' coordinates are
 *      staged once per block where D <= kTcResidentD, with each chunk of refs above;
 *   3. re-rank: a warp a query keeps the refs of its shortlist with d~ - e <= the final tau
 *      (a superset of the K nearest, so their ranks among it are their ranks among all refs),
 *      computes their exact distances, a lane a
 *      candidate (knn_nd.h's steps, the brute force's order: the same bits; the rows staged
 *      coalesced through shared memory, 32 coordinates at a time) and writes the K smallest keys
 *      (d, index), each entry at its rank among the shortlist (indices are distinct, so the
 *      ranks are), -1 / +inf past the shortlist;
 *   4. fallback: a query whose shortlist overflows C, a query whose norm is above
 *      kTcNormLimit or not finite, and every query of a cloud with such a ref, is marked
 *      (count C + 1) and searched by the brute force afterwards (knn_nd.cu). So the answer is
 *      the brute force's for every input; near-ties by the hundred, duplicates, clouds far from
 *      the origin only cost time. The overflow rule of geometry.h needs no work here: below the
 *      norm limit no distance can overflow, and non-finite points are the brute force's.
 *
 * tau. Each lane of a quad holds two query rows' values of 2 of every 8 columns, and keeps the
 * KL = ceil(K / 4) (rounded up to 1, 2, 4, 8 or 16) smallest d~ + e it sees per row in
 * registers. The final tau = the K-th smallest of the quad's 4 KL kept values (tc_quad_kth):
 * at least K refs have d~ + e <= tau, which is all the argument above needs (a larger tau only
 * lengthens the shortlist), and it is the row's exact K-th smallest unless one lane holds more
 * than KL of the row's K smallest. The running tau after a tile is cheaper: the largest of the
 * quad's four kq-th kept values, kq = ceil(K / 4) (4 kq >= K refs at or below it), never below
 * tc_quad_kth of the same lists, hence never below the final tau. C = 2 (8 KL + 64): room for
 * the refs appended under the early taus.
 *
 * Why TF32, not bf16 / fp16. The error of d~ is dominated by the operands' rounding, 2 u_in
 * |q| |r|: TF32's u_in = 2^-11 makes the shortlist band 8x narrower than bf16's 2^-8, and fp16
 * would need range checks. The product is not what limits this path (the selection is):
 * bf16's doubled rate would buy little and cost shortlist length and fallbacks.
 *
 * The bound e(q, r) (tests/test_knn_tc_bound.py checks it on emulated roundings). Reals: q, r
 * the float32 inputs; delta = |q - r|^2 = |q|^2 + |r|^2 - 2 q.r exactly; d the brute force's
 * float32 distance; u = 2^-24, t = 2^-11 (cvt.rna.tf32: relative error <= t), v = 2^-20;
 * S = sum_d |q_d r_d| <= |q| |r|. With D <= kTcMaxD (D u <= 2^-8), gamma_n = n u / (1 - n u):
 *   a. operands: q~_d = q_d (1 + a_d), r~_d = r_d (1 + b_d), |a_d|, |b_d| <= t, so
 *      |q~.r~ - q.r| <= (2 t + t^2) S.
 *   b. accumulation: the tensor cores' float32 accumulation is not IEEE and not documented
 *      (Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ
 *      CS 2021: exact products, aligned to the largest addend, truncated). Assume only that
 *      much, with no guard bits: a step adds 8 exact products p_i to c, each of the 9 addends
 *      aligned to the largest (m) and truncated to 24 bits (each loses < 2^-23 m), the sum
 *      truncated to 24 bits (< 2^-23 of it): < 10 * 2^-23 (|c| + sum |p_i|) <= 10 * 2^-23 S~
 *      per step, S~ = sum |q~_d r~_d| <= (1 + t)^2 S; D / 8 steps: < 1.25 * 2^-23 D S~. The
 *      bound takes (D + 8) v S~, over 6 times that; steps of any n products would give
 *      (D / n)(n + 2) 2^-23 S~ <= 3 * 2^-23 D S~, still inside.
 *   c. norms: n_p = |p|^2 (1 + e), |e| <= gamma_D (D rounded squares, all >= 0, summed in
 *      any order: the norms kernel's lanes and shuffle tree), so |Delta n_p| <= 2 D u n_p, and
 *      |q| |r| <= (1 + 2 D u) sqrt(n_q n_r) <= (1 + 2 D u)(1 + 2u) s_q s_r.
 *   d. d~'s own two roundings: <= u (n_q + n_r) + u |d~| <= 4 u (n_q + n_r), as
 *      |g| <= 0.6 (n_q + n_r).
 *   e. the brute force: |d - delta| <= gamma_{D+2} delta, delta <= 2 (|q|^2 + |r|^2), so
 *      <= 3 (D + 2) u (n_q + n_r).
 *   f. the comparisons' roundings: fl(d~ + e) and fl(d~ - e) lie within u (|d~| + e) <=
 *      3 u (n_q + n_r) + u e of the reals.
 *   g. underflow: subnormal operands or products flushed by the tensor cores, subnormal norms
 *      and sums: at most 2^-110 (1 + |q|^2 + |r|^2) in all for D <= 2^16.
 * Summed: |d~ - d| + (f) <= 2 [(2 t + t^2) + (D + 8) v (1 + t)^2] (1 + 2 D u)(1 + 2u) s_q s_r
 *   + (2 D + 4 + 3 D + 6 + 3) u (n_q + n_r) + u e + 2^-110 (1 + n_q + n_r). Hence
 *   e(q, r) = A s_q s_r + w_q + w_r,  w_p = Bn n_p + 2^-100 (1/2 + n_p), with
 *   A  = 2 [(2 t + t^2) + (D + 8) v (1 + t)^2] (1 + 2 D u)(1 + 2^-10),
 *   Bn = (6 D + 32) u (1 + 2^-10),
 * the factor 1 + 2^-10 covering the roundings of computing A, Bn, s_p, w_p and e in float32
 * (a few u each, all terms positive) and the u e of (f). Relative to the distances of
 * unit-scale features the band is about 2^-9 |q| |r|; far from the origin |q| |r| grows and
 * the band with it, until the shortlists overflow and the brute force takes over (so do
 * clouds of coordinates below about 2^-45, where the absolute 2^-100 term dominates).
 *
 * Norm limit: n_p <= kTcNormLimit = 2^100, so no sum above overflows and the exact distance
 * (<= 2^103) never saturates. A point above it, or non-finite (its norm is +inf or NaN), is the
 * brute force's: its own query, or its whole cloud when it is a ref.
 */
#pragma once

#include <cstdint>
#include <type_traits>

#include "../geometry.h"
#include "../knn_nd.h"

namespace {

constexpr int kTcThreads = 128;   // four warps
constexpr int kTcQueries = 64;    // queries a block: 16 a warp (the mma's M)
constexpr int kTcRefs = 64;       // refs a tile: 8 column blocks of the mma's N = 8
constexpr int kTcChunk = 32;      // coordinates a staged chunk: 4 mma steps of K = 8
constexpr int kTcStride = kTcChunk + 4;  // padded rows: the fragment loads hit 32 banks
// Up to this D (rounded up to kTcChunk) a block stages its 64 queries' coordinates once, in
// dynamic shared memory (64 x (D + 4) floats, 66.5 KiB at 256), instead of once per ref tile.
constexpr int64_t kTcResidentD = 256;
constexpr int kTcRerankWarps = 4;
constexpr int64_t kTcMinD = 16;
constexpr int64_t kTcMaxD = 65536;
constexpr int64_t kTcMaxK = 64;
constexpr float kTcNormLimit = 0x1p100f;

// e(q, r) = a * s_q * s_r + w_q + w_r, w_p = b * n_p + 2^-100 (1/2 + n_p): the coefficients of
// the header's bound for D coordinates.
struct TcBound {
    float a, b;
};

inline TcBound tc_bound(int64_t D) {
    const double u = 0x1p-24, t = 0x1p-11, v = 0x1p-20, safe = 1.0 + 0x1p-10;
    const double Dd = (double)D;
    TcBound c;
    c.a = (float)(2.0 * ((2.0 * t + t * t) + (Dd + 8.0) * v * (1.0 + t) * (1.0 + t)) *
                  (1.0 + 2.0 * Dd * u) * safe);
    c.b = (float)((6.0 * Dd + 32.0) * u * safe);
    return c;
}

// The lanes' list length KL for k: the smallest of 1, 2, 4, 8, 16 with 4 KL >= k.
inline int tc_lane_k(int64_t K) {
    int kl = 1;
    while (4 * kl < K) kl *= 2;
    return kl;
}

inline int64_t tc_capacity(int64_t K) { return 2 * (8 * (int64_t)tc_lane_k(K) + 64); }

// Whether this compilation of the kernels has the mma (sm_80+). The plan refuses older devices;
// should a build still run the kernels there (PTX for an older architecture JIT-compiled on a
// newer device), every query goes to the brute force, so the answer stays exact.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr bool kTcHasMma = false;
#else
constexpr bool kTcHasMma = true;
#endif

// The float32 value rounded to TF32 (10 mantissa bits, to nearest, ties away), as a float.
__device__ __forceinline__ float tc_round(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t y;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(y) : "f"(x));
    return __uint_as_float(y);
#else
    return x;
#endif
}

// c += a * b on one 16 x 8 x 8 tile (TF32 operands, float32 accumulators). Fragments, with
// g = lane / 4 and j = lane % 4: a = A[g][j], A[g+8][j], A[g][j+4], A[g+8][j+4];
// b = B[j][g], B[j+4][g]; c = C[g][2j], C[g][2j+1], C[g+8][2j], C[g+8][2j+1].
__device__ __forceinline__ void tc_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)c, (void)a, (void)b0, (void)b1;  // never launched below sm_80 (the plan refuses)
#endif
}

// v into the ascending list l of the KL smallest values seen (values only).
template <int KL>
__device__ __forceinline__ void tc_keep(float (&l)[KL], float v) {
    if (!(v < l[KL - 1])) return;
#pragma unroll
    for (int s = KL - 1; s >= 0; --s) {
        const float below = s > 0 ? l[s - 1] : -INFINITY;
        if (v < l[s]) l[s] = v < below ? below : v;
    }
}

// tau of a query row from its quad's four lists (each lane's KL smallest d~ + e of its own
// refs, ascending): the K-th smallest value of their union, K <= 4 KL. The union holds actual
// values of distinct refs (or +inf), so at least K refs lie at or below it; it is at most the
// largest of the four KL-th values, and equal to the row's true K-th smallest whenever no lane
// holds more than KL of the row's K smallest. Every lane of the warp must call it.
template <int KL>
__device__ __forceinline__ float tc_quad_kth(const float (&l)[KL], int K) {
    const int base = (threadIdx.x % 32) & ~3;
    int less[KL], upto[KL];
#pragma unroll
    for (int s = 0; s < KL; ++s) less[s] = upto[s] = 0;
#pragma unroll
    for (int o = 0; o < 4; ++o) {
#pragma unroll
        for (int t = 0; t < KL; ++t) {
            const float x = __shfl_sync(0xffffffffu, l[t], base + o);
#pragma unroll
            for (int s = 0; s < KL; ++s) {
                less[s] += x < l[s];
                upto[s] += x <= l[s];
            }
        }
    }
    float kth = -INFINITY;  // the value v with #{< v} < K <= #{<= v}: one lane at least has it
#pragma unroll
    for (int s = 0; s < KL; ++s)
        if (less[s] < K && upto[s] >= K) kth = l[s];
    kth = fmaxf(kth, __shfl_xor_sync(0xffffffffu, kth, 1));
    return fmaxf(kth, __shfl_xor_sync(0xffffffffu, kth, 2));
}

// ------------------------------------------------------------------------------------------
// CUDA kernels

// Per point (the B * M queries, then the B * N refs): {n_p, s_p, w_p, 1 if the point is the
// brute force's}. A ref above the limit marks its cloud (bad[b]); invalid refs do not count.
// A warp a point, grid-stride: the lanes read the row coalesced (lane l: coordinates l, l + 32,
// ...), each sums its squares in order, and a butterfly of shuffles adds the 32 partial sums
// (float addition commutes, so every lane ends with the same bits). The bound's term (c) holds
// for any order of summation of the D rounded squares, so this order is as good as any.
constexpr int kTcNormWarps = 4;
__global__ void __launch_bounds__(kTcNormWarps * 32)
    tc_norms_kernel(const float* __restrict__ query, const float* __restrict__ ref,
                    const int64_t* __restrict__ ref_lengths, int64_t B, int64_t M, int64_t N,
                    int64_t D, TcBound bound, float4* __restrict__ qinfo,
                    float4* __restrict__ rinfo, int* __restrict__ bad) {
    const int lane = threadIdx.x % 32;
    const int64_t total = B * M + B * N;
    for (int64_t t = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; t < total;
         t += (int64_t)gridDim.x * (blockDim.x / 32)) {
        const bool is_ref = t >= B * M;
        const int64_t p = is_ref ? t - B * M : t;
        const float* x = (is_ref ? ref : query) + p * D;
        float n = 0.0f;
        for (int64_t d = lane; d < D; d += 32) n = knn_nd_dot_step_f32(n, x[d], x[d]);
#pragma unroll
        for (int o = 16; o > 0; o /= 2) n = __fadd_rn(n, __shfl_xor_sync(0xffffffffu, n, o));
        if (lane != 0) continue;
        const bool ok = n <= kTcNormLimit;  // false for +inf and NaN
        const float s = __fsqrt_rn(n);
        const float w = bound.b * n + 0x1p-100f * (0.5f + n);
        const float4 info = make_float4(n, s, w, ok ? 0.0f : 1.0f);
        if (is_ref) {
            rinfo[p] = info;
            const int64_t b = p / N;
            if (!ok && p % N < pcops_valid_length(ref_lengths, b, N)) atomicOr(&bad[b], 1);
        } else {
            qinfo[p] = info;
        }
    }
}

// The shortlists: a block per (cloud, tile of 64 queries), grid-stride. count[b * M + m]: the
// shortlist's length, C + 1 for a query the brute force takes, 0 for an invalid query;
// shortlist[(b * M + m) * C + i]: its refs (in no particular order), shortlo[same]: their
// d~ - e; taus[b * M + m]: the final tau of a query with a shortlist.
//
// One pass over the refs: after each tile, the running tau (an upper bound of the final tau,
// see the header) decides which of the tile's refs are appended; the re-rank drops those whose
// d~ - e lies above the final tau.
//
// The queries' coordinates live in dynamic shared memory, rows of qstride floats: the whole
// (padded) D when resident (D <= kTcResidentD, staged once per tile of queries), else two
// buffers of one chunk (staged with each chunk of refs).
template <int KL>
__global__ void __launch_bounds__(kTcThreads)
    tc_shortlist_kernel(const float* __restrict__ query, const float* __restrict__ ref,
                        const int64_t* __restrict__ query_lengths,
                        const int64_t* __restrict__ ref_lengths, int64_t B, int64_t M, int64_t N,
                        int64_t D, int64_t K, int64_t C, TcBound bound,
                        const float4* __restrict__ qinfo,
                        const float4* __restrict__ rinfo, const int* __restrict__ bad,
                        int* __restrict__ count, int* __restrict__ shortlist,
                        float* __restrict__ shortlo, float* __restrict__ taus) {
    extern __shared__ float qs[];  // [kTcQueries][qstride], two buffers unless resident
    __shared__ float rs[2][kTcRefs][kTcStride];  // two buffers: see the steps below
    __shared__ float4 rinfo_s[2][kTcRefs];
    __shared__ float qn_s[kTcQueries], qa_s[kTcQueries], qw_s[kTcQueries];
    __shared__ int qbad_s[kTcQueries], cnt_s[kTcQueries];

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, j = lane % 4;
    const int row0 = warp * 16 + g, row1 = row0 + 8;  // this lane's two query rows
    const int64_t tiles = (M + kTcQueries - 1) / kTcQueries;
    const int64_t padded = (D + kTcChunk - 1) / kTcChunk * kTcChunk;
    const bool resident = padded <= kTcResidentD;
    const int64_t qcols = resident ? padded : kTcChunk, qstride = qcols + 4;

    for (int64_t blk = blockIdx.x; blk < B * tiles; blk += gridDim.x) {
        const int64_t b = blk / tiles, q0 = (blk % tiles) * kTcQueries;
        const int64_t Lq = pcops_valid_length(query_lengths, b, M);
        const int64_t L = pcops_valid_length(ref_lengths, b, N);
        const int cloud_bad = bad[b] || !kTcHasMma;
        __syncthreads();  // the previous tile is done with the shared arrays
        if (tid < kTcQueries) {
            const int64_t q = q0 + tid;
            float4 info = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (q < Lq) info = qinfo[b * M + q];
            qn_s[tid] = info.x;
            qa_s[tid] = bound.a * info.y;
            qw_s[tid] = info.z;
            qbad_s[tid] = info.w != 0.0f || cloud_bad;
            cnt_s[tid] = 0;
        }
        __syncthreads();  // the rows' norms and flags above are read by every warp below
        if (q0 < Lq && !cloud_bad && L > 0) {
            const float qn[2] = {qn_s[row0], qn_s[row1]};
            const float qa[2] = {qa_s[row0], qa_s[row1]};
            const float qw[2] = {qw_s[row0], qw_s[row1]};
            const bool live[2] = {q0 + row0 < Lq, q0 + row1 < Lq};
            float tau[2] = {INFINITY, INFINITY};
            if (resident) {  // the tile's queries, all coordinates, once
                for (int64_t e = tid; e < kTcQueries * qcols; e += kTcThreads) {
                    const int64_t r = e / qcols, d = e % qcols, q = q0 + r;
                    qs[r * qstride + d] =
                        (q < Lq && d < D) ? tc_round(query[(b * M + q) * D + d]) : 0.0f;
                }
            }
            // The (ref tile, chunk) steps, software-pipelined: step s + 1's rows are
            // loaded into registers before step s's products and stored into the other buffer
            // after them, so a step costs one barrier (which also orders the buffers' reuse:
            // buffer s & 1 is written in step s - 1, read in step s, and written again in step
            // s + 1, each a barrier apart; the tiles' rinfo_s alike, by tile parity).
            const int64_t nch = padded / kTcChunk;
            const int64_t steps = (L + kTcRefs - 1) / kTcRefs * nch;
            float rv[16], qv[16];
            float4 iv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            auto load = [&](int64_t s1) {  // step s1's elements of this thread, raw
                const int64_t r0 = s1 / nch * kTcRefs, d = s1 % nch * kTcChunk + lane;
#pragma unroll
                for (int k = 0; k < 16; ++k) {
                    const int64_t n = r0 + warp + 4 * k;
                    rv[k] = (n < L && d < D) ? ref[(b * N + n) * D + d] : 0.0f;
                }
                if (!resident) {
#pragma unroll
                    for (int k = 0; k < 16; ++k) {
                        const int64_t q = q0 + warp + 4 * k;
                        qv[k] = (q < Lq && d < D) ? query[(b * M + q) * D + d] : 0.0f;
                    }
                }
                if (s1 % nch == 0 && tid < kTcRefs)
                    iv = r0 + tid < L ? rinfo[b * N + r0 + tid]
                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            };
            auto store = [&](int64_t s1) {  // into buffer s1 & 1, rounded to TF32
                const int buf = (int)(s1 & 1);
#pragma unroll
                for (int k = 0; k < 16; ++k) rs[buf][warp + 4 * k][lane] = tc_round(rv[k]);
                if (!resident) {
#pragma unroll
                    for (int k = 0; k < 16; ++k)
                        qs[(buf * kTcQueries + warp + 4 * k) * qstride + lane] = tc_round(qv[k]);
                }
                if (s1 % nch == 0 && tid < kTcRefs) rinfo_s[(s1 / nch) & 1][tid] = iv;
            };
            float keep[2][KL];
#pragma unroll
            for (int s = 0; s < KL; ++s) keep[0][s] = keep[1][s] = INFINITY;
            const int kq = (int)((K + 3) / 4);  // ceil(K / 4) <= KL
            float acc[8][4];
            load(0);
            store(0);
            __syncthreads();  // step 0's buffers (and, resident, the queries above)
            for (int64_t st = 0; st < steps; ++st) {
                const int64_t r0 = st / nch * kTcRefs, ci = st % nch, d0 = ci * kTcChunk;
                const int buf = (int)(st & 1);
                if (ci == 0) {
#pragma unroll
                    for (int c = 0; c < 8; ++c)
#pragma unroll
                        for (int h = 0; h < 4; ++h) acc[c][h] = 0.0f;
                }
                if (st + 1 < steps) load(st + 1);
                const float* qb = resident ? qs + d0 : qs + buf * kTcQueries * qstride;
#pragma unroll
                for (int kk = 0; kk < kTcChunk; kk += 8) {
                    const float* q0row = qb + row0 * qstride + kk + j;
                    const float* q1row = qb + row1 * qstride + kk + j;
                    uint32_t a[4];
                    a[0] = __float_as_uint(q0row[0]);
                    a[1] = __float_as_uint(q1row[0]);
                    a[2] = __float_as_uint(q0row[4]);
                    a[3] = __float_as_uint(q1row[4]);
#pragma unroll
                    for (int c = 0; c < 8; ++c)
                        tc_mma(acc[c], a, __float_as_uint(rs[buf][c * 8 + g][kk + j]),
                               __float_as_uint(rs[buf][c * 8 + g][kk + j + 4]));
                }
                if (st + 1 < steps) store(st + 1);
                if (ci == nch - 1) {  // warp-uniform
                    // the tile's pairs: d~ + e into the lists, d~ - e kept (in acc) ...
                    const float4* tinfo = rinfo_s[(st / nch) & 1];
#pragma unroll
                    for (int c = 0; c < 8; ++c) {
#pragma unroll
                        for (int h = 0; h < 4; ++h) {
                            const int col = c * 8 + 2 * j + (h & 1), rr = h >> 1;
                            const float4 ri = tinfo[col];
                            const float approx =
                                __fsub_rn(__fadd_rn(qn[rr], ri.x), 2.0f * acc[c][h]);
                            const float e = qa[rr] * ri.y + (qw[rr] + ri.z);
                            if (r0 + col < L && live[rr]) tc_keep<KL>(keep[rr], approx + e);
                            acc[c][h] = approx - e;
                        }
                    }
                    // ... the running tau: the largest of the quad's kq-th kept values (at
                    // least 4 kq >= K refs at or below it; never below the final tau) ...
#pragma unroll
                    for (int rr = 0; rr < 2; ++rr) {
                        float t = INFINITY;
#pragma unroll
                        for (int s = 0; s < KL; ++s)  // t = keep[rr][kq - 1], in registers
                            if (s == kq - 1) t = keep[rr][s];
                        t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, 1));
                        tau[rr] = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, 2));
                    }
                    // ... and the tile's refs with d~ - e <= tau appended, with d~ - e
#pragma unroll
                    for (int c = 0; c < 8; ++c) {
#pragma unroll
                        for (int h = 0; h < 4; ++h) {
                            const int col = c * 8 + 2 * j + (h & 1), rr = h >> 1;
                            const int64_t n = r0 + col;
                            if (n >= L || !live[rr] || !(acc[c][h] <= tau[rr])) continue;
                            const int row = rr ? row1 : row0;
                            const int pos = atomicAdd(&cnt_s[row], 1);
                            if (pos < C) {
                                shortlist[(b * M + q0 + row) * C + pos] = (int)n;
                                shortlo[(b * M + q0 + row) * C + pos] = acc[c][h];
                            }
                        }
                    }
                }
                __syncthreads();  // step st's buffers are read; step st + 1's are stored
            }
            // the final tau, for the re-rank's filter (the quad's lanes agree on it)
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
                tau[rr] = tc_quad_kth<KL>(keep[rr], (int)K);
                if (j == 0 && live[rr]) taus[b * M + q0 + (rr ? row1 : row0)] = tau[rr];
            }
        }
        __syncthreads();
        if (tid < kTcQueries && q0 + tid < M) {
            const int64_t q = q0 + tid;
            int n = 0;
            if (q < Lq) n = qbad_s[tid] || cnt_s[tid] > C ? (int)C + 1 : cnt_s[tid];
            count[b * M + q] = n;
        }
    }
}

// The exact re-rank: a warp a (cloud, query), grid-stride. Valid queries whose count is at
// most C get their K smallest keys (exact distance, index) from the shortlist; invalid
// queries an empty row; the others are left to the brute force.
//
// The exact distances: lane l of the warp takes candidate i0 + l of each group of 32 and runs
// its sum exactly as the brute force does (knn_nd_l2_step_f32 over d = 0 .. D - 1 from +0),
// fed chunk by chunk of 32 coordinates: the warp loads the chunk of the 32 candidates' rows
// coalesced (a row a load instruction) into a padded 32 x 33 tile, and the query's chunk into
// a row, so a lane reads its candidate's coordinates from shared memory in order.
__global__ void __launch_bounds__(kTcRerankWarps * 32)
    tc_rerank_kernel(const float* __restrict__ query, const float* __restrict__ ref,
                     const int64_t* __restrict__ query_lengths, int64_t B, int64_t M, int64_t N,
                     int64_t D, int64_t K, int64_t C, const int* __restrict__ count,
                     const int* __restrict__ shortlist, const float* __restrict__ shortlo,
                     const float* __restrict__ taus, float* __restrict__ dist,
                     int64_t* __restrict__ idx) {
    constexpr int kMaxC = 2 * (8 * 16 + 64);  // tc_capacity(kTcMaxK)
    __shared__ float sd[kTcRerankWarps][kMaxC];
    __shared__ int si[kTcRerankWarps][kMaxC];
    __shared__ float tile[kTcRerankWarps][32][33];  // [candidate][coordinate of the chunk]
    __shared__ float qrow[kTcRerankWarps][32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int64_t t = (int64_t)blockIdx.x * kTcRerankWarps + warp; t < B * M;
         t += (int64_t)gridDim.x * kTcRerankWarps) {
        const int64_t b = t / M, m = t % M;
        float* qd = dist + t * K;
        int64_t* qi = idx + t * K;
        if (m >= pcops_valid_length(query_lengths, b, M)) {
            for (int64_t s = lane; s < K; s += 32) {
                qd[s] = INFINITY;
                qi[s] = -1;
            }
            continue;
        }
        const int cnt = count[t];
        if (cnt > C) continue;
        // the shortlist's refs with d~ - e <= the final tau, packed in order into si: a
        // superset of the K nearest (the header's argument), so their ranks among it are
        // their ranks among all refs
        int c = 0;
        if (cnt > 0) {
            const float tau = taus[t];
            for (int i0 = 0; i0 < cnt; i0 += 32) {  // warp-uniform: cnt is the warp's
                const int i = i0 + lane;
                const bool take = i < cnt && shortlo[t * C + i] <= tau;
                const unsigned mask = __ballot_sync(0xffffffffu, take);
                if (take) si[warp][c + __popc(mask & ((1u << lane) - 1u))] = shortlist[t * C + i];
                c += __popc(mask);
            }
        }
        __syncwarp();  // si is written
        const float* q = query + t * D;
        const float* cloud = ref + b * N * D;
        for (int i0 = 0; i0 < c; i0 += 32) {  // warp-uniform: c is the warp's
            const int i = i0 + lane;
            const int n = i < c ? si[warp][i] : 0;
            float acc = 0.0f;
            for (int64_t d0 = 0; d0 < D; d0 += 32) {
                const int64_t d = d0 + lane;
                const int width = D - d0 < 32 ? (int)(D - d0) : 32;
#pragma unroll
                for (int rr = 0; rr < 32; ++rr) {
                    const int nr = __shfl_sync(0xffffffffu, n, rr);
                    tile[warp][rr][lane] = (i0 + rr < c && d < D) ? cloud[nr * D + d] : 0.0f;
                }
                qrow[warp][lane] = d < D ? q[d] : 0.0f;
                __syncwarp();
                for (int dd = 0; dd < width; ++dd)
                    acc = knn_nd_l2_step_f32(acc, qrow[warp][dd], tile[warp][lane][dd]);
                __syncwarp();  // the tile is read before the next chunk overwrites it
            }
            if (i < c) sd[warp][i] = acc;
        }
        __syncwarp();
        for (int i = lane; i < c; i += 32) {
            const float di = sd[warp][i];
            const int ni = si[warp][i];
            int rank = 0;
            for (int jj = 0; jj < c; ++jj) {
                const float dj = sd[warp][jj];
                rank += dj < di || (dj == di && si[warp][jj] < ni);
            }
            if (rank < K) {
                qd[rank] = di;
                qi[rank] = ni;
            }
        }
        for (int64_t s = c + lane; s < K; s += 32) {
            qd[s] = INFINITY;
            qi[s] = -1;
        }
        __syncwarp();  // the warp's shared rows are free for its next query
    }
}

// ------------------------------------------------------------------------------------------
// kernel launchers

// The workspace of the path: per-point norms, the clouds' flags, the counts, the shortlists.
struct TcWorkspace {
    float4* qinfo;
    float4* rinfo;
    int* bad;
    int* count;
    int* shortlist;
    float* shortlo;
    float* taus;
};

inline void tc_layout(pcops_carver* w, int64_t B, int64_t M, int64_t N, int64_t C,
                      TcWorkspace* ws) {
    ws->qinfo = (float4*)pcops_carve(w, B * M, sizeof(float4));
    ws->rinfo = (float4*)pcops_carve(w, B * N, sizeof(float4));
    ws->bad = (int*)pcops_carve(w, B, sizeof(int));
    ws->count = (int*)pcops_carve(w, B * M, sizeof(int));
    ws->shortlist = (int*)pcops_carve(w, B * M * C, sizeof(int));
    ws->shortlo = (float*)pcops_carve(w, B * M * C, sizeof(float));
    ws->taus = (float*)pcops_carve(w, B * M, sizeof(float));
}

inline size_t tc_workspace_bytes(int64_t B, int64_t M, int64_t N, int64_t K) {
    pcops_carver w = pcops_carver_init(nullptr);
    TcWorkspace ws;
    tc_layout(&w, B, M, N, tc_capacity(K), &ws);
    return pcops_carver_bytes(&w);
}

// Dynamic shared memory of the shortlist kernel: its queries' rows (see the kernel).
inline size_t tc_query_smem_bytes(int64_t D) {
    const int64_t padded = (D + kTcChunk - 1) / kTcChunk * kTcChunk;
    const bool resident = padded <= kTcResidentD;
    const int64_t cols = resident ? padded : kTcChunk, buffers = resident ? 1 : 2;
    return (size_t)(buffers * kTcQueries) * (size_t)(cols + 4) * sizeof(float);
}

template <int KL>
cudaError_t launch_shortlist(unsigned grid, size_t smem, cudaStream_t stream, const float* query,
                             const float* ref, const int64_t* query_lengths,
                             const int64_t* ref_lengths, int64_t B, int64_t M, int64_t N,
                             int64_t D, int64_t K, int64_t C, TcBound bound,
                             const TcWorkspace& ws) {
    // above 48 KiB a kernel must opt in (the resident rows: 66.5 KiB at D = 256; every sm_80+
    // device allows it, with the static 20.5 KiB)
    cudaError_t err = cudaFuncSetAttribute(tc_shortlist_kernel<KL>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
    tc_shortlist_kernel<KL><<<grid, kTcThreads, smem, stream>>>(
        query, ref, query_lengths, ref_lengths, B, M, N, D, K, C, bound, ws.qinfo, ws.rinfo,
        ws.bad, ws.count, ws.shortlist, ws.shortlo, ws.taus);
    return cudaGetLastError();
}

// Steps 1-3 of the header; the queries left with count C + 1 are the caller's (the brute
// force over `count`, knn_nd.cu). Returns the workspace's counts through *count_out.
inline cudaError_t launch_tc(const float* query, const float* ref, const int64_t* query_lengths,
                             const int64_t* ref_lengths, int64_t B, int64_t M, int64_t N,
                             int64_t D, int64_t K, void* workspace, float* dist, int64_t* idx,
                             const int** count_out, cudaStream_t stream) {
    const int64_t C = tc_capacity(K);
    pcops_carver w = pcops_carver_init(workspace);
    TcWorkspace ws;
    tc_layout(&w, B, M, N, C, &ws);
    *count_out = ws.count;
    const TcBound bound = tc_bound(D);
    cudaError_t err = cudaMemsetAsync(ws.bad, 0, (size_t)B * sizeof(int), stream);
    if (err != cudaSuccess) return err;
    tc_norms_kernel<<<pcops_grid_stride_blocks(B * (M + N), kTcNormWarps), kTcNormWarps * 32, 0,
                      stream>>>(
        query, ref, ref_lengths, B, M, N, D, bound, ws.qinfo, ws.rinfo, ws.bad);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    const int64_t blocks = B * ((M + kTcQueries - 1) / kTcQueries);
    const unsigned grid = (unsigned)(blocks < INT32_MAX ? blocks : INT32_MAX);
    const int kl = tc_lane_k(K);
    const size_t smem = tc_query_smem_bytes(D);
    auto shortlist = [&](auto lanes) {
        return launch_shortlist<decltype(lanes)::value>(grid, smem, stream, query, ref,
                                                        query_lengths, ref_lengths, B, M, N, D,
                                                        K, C, bound, ws);
    };
    switch (kl) {
        case 1: err = shortlist(std::integral_constant<int, 1>{}); break;
        case 2: err = shortlist(std::integral_constant<int, 2>{}); break;
        case 4: err = shortlist(std::integral_constant<int, 4>{}); break;
        case 8: err = shortlist(std::integral_constant<int, 8>{}); break;
        default: err = shortlist(std::integral_constant<int, 16>{}); break;
    }
    if (err != cudaSuccess) return err;
    tc_rerank_kernel<<<pcops_grid_stride_blocks(B * M, kTcRerankWarps), kTcRerankWarps * 32, 0,
                       stream>>>(query, ref, query_lengths, B, M, N, D, K, C, ws.count,
                                 ws.shortlist, ws.shortlo, ws.taus, dist, idx);
    return cudaGetLastError();
}

}  // namespace
