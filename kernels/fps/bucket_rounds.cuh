/*
 * fps/bucket_rounds.cuh -- BUCKET_ROUNDS (float) and BUCKET_ROUNDS_CLUSTER (sm_90+, float): the
 * grouped buckets of BUCKET_GROUPS (kernels/fps/bucket_groups.cuh), several samples a round.
 *
 * FPS's temps are nearly level late in a run: many buckets hold a candidate close to the
 * farthest, and most of those lie far apart, so the next samples can be read off the buckets'
 * farthest points without a pass between them. A round:
 *   X. every bucket whose farthest temp is >= theta (kept in a list during the last round;
 *      theta = rho * the last sample's temp, rho adapted so the list holds a few to 32) is a
 *      candidate, sorted by (temp, index): c_0 > c_1 > ... > c_{n-1}. Every bucket the
 *      candidates can change is flagged (group and bucket boxes as in BUCKET_GROUPS, behind a
 *      box per warp; a warp's lanes hold consecutive groups) with the candidates' bits; the
 *      farthest temp of each candidate's own bucket after that candidate alone is computed
 *      (newkey_a), and the candidates are sorted.
 *   Y. c_0 .. c_{J-1} are the next J samples, exactly, where J is the first rank r at which
 *      (a) an earlier candidate lowers c_r's temp (!(d2(c_r, c_i) < temp(c_r)) fails), or
 *      (b) an earlier candidate's own bucket keeps a temp >= c_r after it was chosen
 *          (newkey_i > c_r).
 *      Why: with c_0 .. c_{r-1} chosen, c_r's temp is unchanged by (a); every point of a
 *      bucket outside the list is below theta <= c_r; of a listed bucket of a later rank below
 *      its farthest < c_r; of c_r's bucket below c_r; of an earlier candidate i's bucket at
 *      most its temp after c_i alone (more samples only lower it), < c_r by (b). So c_r is
 *      the farthest point, as the one-sample step would find. The flagged buckets are then
 *      updated with every chosen candidate that flagged them (min is order-free), their
 *      farthest points re-found, and the list for the next round is built.
 * When the list is empty or overflows, the round takes the farthest point alone (the warps'
 * farthest, published every round), as a BUCKET_GROUPS step does. Two block barriers a round,
 * however many samples it takes; late in a run of a large scan a round takes over ten.
 *
 * Who shares a cloud: one block (BUCKET_ROUNDS, BlockScope), or a thread-block cluster of 2-8
 * blocks (BUCKET_ROUNDS_CLUSTER, ClusterScope), each block a contiguous range of the cloud's
 * buckets, reading the others' lists and newkeys through distributed shared memory; the same
 * kernel, two cluster barriers a round.
 *
 * When it wins: float clouds past BLOCK_PRUNED's reach (up to 2**20 points a block) when
 * many samples are asked (from rounds_min_samples in kernels/fps/plan.cuh: the temps level out
 * late in a run, where a round takes many samples; over a short run a round's extra work does
 * not pay and BUCKET_GROUPS wins). On clusters (sm_90+) for large clouds (from
 * rounds_cluster_min_points) when the batch leaves 8 SMs for each cloud: a cluster of 8 blocks
 * then works on each cloud, whatever the number of samples.
 *
 * Invariants: at most 4096 buckets a block, and no more than the device's shared memory holds
 * (28 bytes a bucket: 4096 need 112 KiB, past the 99 KiB of sm_86, sm_89 and sm_120, where the
 * plan takes larger buckets), at most 32
 * candidates a round (a lane each); B * N <= 2**31 - 1 (the sort's); the cluster kernel's body
 * exists only in sm_90+ code (the plan checks the build, as for CLUSTER).
 */
#pragma once

#include <algorithm>

#include "bucket_groups.cuh"

namespace {

// ------------------------------------------------------------------------------------------
// kernel

constexpr int kRoundCap = 32;  // candidates a round: a lane each

struct alignas(16) RoundCand {
    float4 at;   // coordinates and temp of the bucket's farthest point
    int index;   // that point's index in the cloud
    int bucket;  // its bucket (-1: the start sample)
    int pad[2];
};

// (temp, index) as one integer whose order is farther()'s: the order-preserving bits of the
// temp, then the complement of the index (ties to the lower index).
__device__ __forceinline__ uint64_t round_key(float v, int index) {
    const uint32_t u = __float_as_uint(v);
    const uint32_t o = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)o << 32) | (uint32_t)(~(uint32_t)index);
}

using pcops_warp::max_u32;
using pcops_warp::or_u32;

__device__ __forceinline__ float box_dist2(float lx, float ly, float lz, float hx, float hy,
                                           float hz, float cx, float cy, float cz) {
    return fps_dist2(fminf(fmaxf(cx, lx), hx), fminf(fmaxf(cy, ly), hy),
                     fminf(fmaxf(cz, lz), hz), cx, cy, cz);
}

// The box rule of the bucket paths: a box at squared distance m from c keeps every temp when
// m >= its largest temp (see fps_bucket_kernel); a box that holds c (m == 0) is always flagged.
__device__ __forceinline__ bool box_flags(float m, float largest) {
    return !(m >= largest) || m == 0.f;
}

// Who shares a cloud in BUCKET_ROUNDS: one block (BlockScope), or a thread-block cluster
// (ClusterScope, sm_90), each block holding a contiguous range of the cloud's buckets and
// reading the others' lists and newkeys through distributed shared memory.
struct BlockScope {
    __device__ __forceinline__ unsigned size() const { return 1; }
    __device__ __forceinline__ unsigned rank() const { return 0; }
    __device__ __forceinline__ void sync() const { __syncthreads(); }
    template <typename V>
    __device__ __forceinline__ V* at(V* p, unsigned) const { return p; }
};
struct ClusterScope {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __device__ __forceinline__ unsigned size() const { return cg::this_cluster().num_blocks(); }
    __device__ __forceinline__ unsigned rank() const { return cg::this_cluster().block_rank(); }
    __device__ __forceinline__ void sync() const { cg::this_cluster().sync(); }
    template <typename V>
    __device__ __forceinline__ V* at(V* p, unsigned r) const {
        return cg::this_cluster().map_shared_rank(p, r);
    }
#else  // never launched: the plan needs a device of compute capability 9.0
    __device__ __forceinline__ unsigned size() const { return 1; }
    __device__ __forceinline__ unsigned rank() const { return 0; }
    __device__ __forceinline__ void sync() const { __trap(); }
    template <typename V>
    __device__ __forceinline__ V* at(V* p, unsigned) const { return p; }
#endif
};

// Static shared memory of fps_bucket_rounds_kernel (its arrays and their alignment: 4512 bytes
// on sm_90), and its dynamic shared memory a bucket; counted against the opt-in limit.
constexpr size_t kRoundsStaticSmem = 5 * 1024;
constexpr size_t kRoundsSmemPerBucket = sizeof(float4) + sizeof(int2) + sizeof(int);

// The buckets a BUCKET_ROUNDS block takes on device d: 4096, or as many as its shared memory
// holds where that is fewer.
inline int64_t rounds_block_max_buckets(const Device& d) {
    return std::min<int64_t>(kMaxGroupedBuckets,
                             smem_units(d, kRoundsStaticSmem, kRoundsSmemPerBucket));
}

template <int G, int PPL, class Scope>
__global__ void __launch_bounds__(512)
fps_bucket_rounds_kernel(const float* __restrict__ xyz, const int64_t* __restrict__ lengths,
                         const int64_t* __restrict__ start, int64_t N, int64_t npoint,
                         const BucketPoint<float>* __restrict__ sorted,
                         float* __restrict__ temp_ws, int64_t* __restrict__ idx,
                         float* __restrict__ dist2) {
    constexpr int S = 32 * PPL;  // points per bucket
    constexpr int U = PPL >= 4 || G >= 8 ? 1 : 4 / PPL;  // buckets a warp loads at once
    extern __shared__ __align__(16) unsigned char fps_smem[];
    __shared__ RoundCand list[2][kRoundCap];  // this block's candidates, by round parity
    __shared__ RoundCand cands[kRoundCap];    // the round's candidates, by list position
    __shared__ RoundCand wbest[2][16];        // each warp's farthest, by round parity
    __shared__ int list_count[2], entry_count[2];
    __shared__ uint64_t newkey[kRoundCap];    // by list position (its bucket's block)
    __shared__ int order[kRoundCap];          // list position of each rank
    __shared__ unsigned bad_pos[2];           // candidates whose temp a farther one lowers
                                              // (bits by list position), by round parity
    static_assert(sizeof(list) + sizeof(cands) + sizeof(wbest) + sizeof(list_count) +
                          sizeof(entry_count) + sizeof(newkey) + sizeof(order) +
                          sizeof(bad_pos) + 8 * 16 <= kRoundsStaticSmem,
                  "the plan's count, with room for each array's alignment");
    const Scope scope;
    const unsigned C = scope.size(), rank = scope.rank();
    const int warps = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t b = blockIdx.x / C;
    const CloudRow<float> row(xyz, lengths, b, N, npoint, idx, dist2);
    if (rank == 0) pad_row(row.idx, row.dist2, row.n_out, npoint, threadIdx.x, blockDim.x);
    if (row.n_out == 0) return;  // the same in every block of the cluster
    // this block's buckets: [kb0, kb0 + buckets) of the cloud's, its points from lp (Lc valid)
    const int all_buckets = (row.L + S - 1) / S;
    const int per_block = (all_buckets + (int)C - 1) / (int)C;
    const int kb0 = min(all_buckets, (int)rank * per_block);
    const int buckets = min(all_buckets - kb0, per_block);
    const int Lc = max(0, min(row.L - kb0 * S, buckets * S));
    const BucketPoint<float>* lp = sorted + b * N + (int64_t)kb0 * S;
    float* lt = temp_ws + b * N + (int64_t)kb0 * S;
    const int groups = (buckets + G - 1) / G;
    // per bucket: its farthest point (x, y, z, temp), the flagged list (bucket, candidate
    // bits) of a round, and the farthest point's index
    float4* s_at = reinterpret_cast<float4*>(fps_smem);
    int2* entries = reinterpret_cast<int2*>(s_at + per_block);
    int* s_index = reinterpret_cast<int*>(entries + per_block);

    for (int p = threadIdx.x; p < Lc; p += blockDim.x) lt[p] = INFINITY;
    if (threadIdx.x < 2)
        list_count[threadIdx.x] = 0, entry_count[threadIdx.x] = 0, bad_pos[threadIdx.x] = 0;
    const int g = w * 32 + lane;  // a warp's lanes hold consecutive groups
    const int k0 = g * G;
    Bucket<float> bk[G];
    float glx, gly, glz, ghx, ghy, ghz;  // the group's box
    group_setup<G>(bk, g < groups, k0, buckets, lp, Lc, S, s_at, s_index, glx, gly, glz, ghx,
                   ghy, ghz);
    // the warp's box: the union of its groups' (fmin / fmax skip the empty lanes' +-inf)
    float wlx = glx, wly = gly, wlz = glz, whx = ghx, why = ghy, whz = ghz;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
        wlx = fminf(wlx, __shfl_xor_sync(0xffffffffu, wlx, off));
        wly = fminf(wly, __shfl_xor_sync(0xffffffffu, wly, off));
        wlz = fminf(wlz, __shfl_xor_sync(0xffffffffu, wlz, off));
        whx = fmaxf(whx, __shfl_xor_sync(0xffffffffu, whx, off));
        why = fmaxf(why, __shfl_xor_sync(0xffffffffu, why, off));
        whz = fmaxf(whz, __shfl_xor_sync(0xffffffffu, whz, off));
    }
    int gbest_k;
    Candidate<float> gbest = farthest_kept<G>(bk, 0u, k0, gbest_k);
    scope.sync();  // the temps, the buckets' candidates and the counts are set

    const int first = start ? (int)pcops_positive_mod(start[b], row.L) : 0;
    RoundCand single;  // the one candidate of a round without a list (uniform)
    load_point(row.cloud, first, single.at.x, single.at.y, single.at.z);
    single.at.w = 0.f;
    single.index = first;
    single.bucket = -1;
    if (rank == 0 && threadIdx.x == 0) {
        row.idx[0] = first;
        row.dist2[0] = 0.f;
    }
    int64_t j = 0;         // samples written
    float rho = 0.9f;      // theta = rho * the last sample's temp
    unsigned flagged = 0;  // this lane's buckets flagged by the last round
    for (int round = 0; j < row.n_out; ++round) {
        const int par = round & 1;
        // ---------------------------------------------------------------- X
        if (flagged) {  // their candidates, written by the warps that updated them
#pragma unroll
            for (int s = 0; s < G; ++s)
                if (flagged & (1u << s)) bk[s].best = {s_at[k0 + s].w, s_index[k0 + s]};
            gbest = farthest_kept<G>(bk, 0u, k0, gbest_k);
        }
        // the blocks' lists, one after the other (every block sees the same order)
        int n = 0, mine_from = 0, from = 0;  // mine_from: this lane's block; from: its first
        if (round > 0) {
            const int cnt = lane < (int)C ? *scope.at(&list_count[par], lane) : 0;
            int incl = cnt;
#pragma unroll
            for (int off = 1; off < 8; off <<= 1) {
                const int o = __shfl_up_sync(0xffffffffu, incl, off);
                if (lane >= off) incl += o;
            }
            n = __shfl_sync(0xffffffffu, incl, 7);  // C <= 8
            bool over = __any_sync(0xffffffffu, cnt > kRoundCap);
            if (over) n = kRoundCap + 1;
            for (int r = 0; r < (int)C; ++r) {
                const int end = __shfl_sync(0xffffffffu, incl, r);
                if (end <= lane) mine_from = r + 1, from = end;
            }
        }
        if (threadIdx.x == 0)
            list_count[par ^ 1] = 0, entry_count[par ^ 1] = 0, bad_pos[par ^ 1] = 0;
        const bool listed = n >= 1 && n <= kRoundCap && row.n_out - j >= 2;
        if (round >= 2) {  // aim at a list of 16-32 (the same arithmetic in every thread)
            if (n > kRoundCap) rho = 1.f - (1.f - rho) * 0.5f;
            else if (n == 0) rho = fmaxf(0.5f, 1.f - (1.f - rho) * 2.f);
            else if (n < 16) rho = fmaxf(0.5f, 1.f - (1.f - rho) * 1.25f);
        }
        RoundCand c = single;  // lane a: candidate a (bit a of the flags)
        bool has_c = lane == 0;
        if (listed) {
            has_c = lane < n;
            if (has_c) c = *scope.at(&list[par][lane - from], mine_from);
            if (w == 0 && has_c) cands[lane] = c;
        } else if (round > 0) {  // the farthest of every warp's farthest
            Candidate<float> wc = no_candidate<float>();
            int at = -1;
            for (int e = lane; e < (int)C * warps; e += 32) {
                const RoundCand& o = *scope.at(&wbest[par][e % warps], e / warps);
                const Candidate<float> oc = {o.at.w, o.index};
                if (farther(oc, wc)) wc = oc, at = e;
            }
            at = __shfl_sync(0xffffffffu, at, warp_argmax(wc));
            single = *scope.at(&wbest[par][at % warps], at / warps);
            c = single;
        }
        // the warp's largest temp (an upper bound for its box: keys only go down)
        float wmax = g < groups ? gbest.value : -INFINITY;
        {
            const uint32_t u = __float_as_uint(wmax);
            const uint32_t top = max_u32((u & 0x80000000u) ? ~u : (u | 0x80000000u));
            wmax = __uint_as_float((top & 0x80000000u) ? (top & 0x7fffffffu) : ~top);
        }
        const bool hit = has_c && box_flags(box_dist2(wlx, wly, wlz, whx, why, whz, c.at.x,
                                                      c.at.y, c.at.z), wmax);
        unsigned bits[G];
#pragma unroll
        for (int s = 0; s < G; ++s) bits[s] = 0;
        for (unsigned h = __ballot_sync(0xffffffffu, hit); h; h &= h - 1) {
            const int a = __ffs(h) - 1;
            const float cx = __shfl_sync(0xffffffffu, c.at.x, a);
            const float cy = __shfl_sync(0xffffffffu, c.at.y, a);
            const float cz = __shfl_sync(0xffffffffu, c.at.z, a);
            if (g < groups &&
                box_flags(box_dist2(glx, gly, glz, ghx, ghy, ghz, cx, cy, cz), gbest.value)) {
#pragma unroll
                for (int s = 0; s < G; ++s)
                    bits[s] |= (unsigned)(k0 + s < buckets &&
                                          box_flags(bk[s].dist2_to(cx, cy, cz),
                                                    bk[s].best.value)) << a;
            }
        }
        flagged = 0;
#pragma unroll
        for (int s = 0; s < G; ++s) flagged |= (unsigned)(bits[s] != 0) << s;
        if (flagged) {
            int at = atomicAdd(&entry_count[par], __popc(flagged));
#pragma unroll
            for (int s = 0; s < G; ++s)
                if (bits[s]) entries[at++] = make_int2(k0 + s, (int)bits[s]);
        }
        if (listed) {
            // candidate a, a warp each: its rank (the candidates farther than it), whether a
            // farther one lowers its temp, and (in the block that holds its bucket) its own
            // bucket's farthest after it alone
            const uint64_t my_key = has_c ? round_key(c.at.w, c.index) : 0ull;
            for (int a0 = w; a0 < n; a0 += warps * U) {
                int kb[U];
                BucketPoint<float> q[U][PPL];
                float t[U][PPL];
#pragma unroll
                for (int i = 0; i < U; ++i) {
                    const int a = a0 + i * warps;
                    kb[i] = __shfl_sync(0xffffffffu, c.bucket, a < n ? a : 0) - kb0;
                    const bool here = a < n && kb[i] >= 0 && kb[i] < buckets;
#pragma unroll
                    for (int u = 0; u < PPL; ++u) {
                        const int p = kb[i] * S + lane + 32 * u;
                        if (here && p < Lc) q[i][u] = lp[p], t[i][u] = lt[p];
                    }
                }
#pragma unroll
                for (int i = 0; i < U; ++i) {
                    const int a = a0 + i * warps;
                    if (a >= n) break;
                    const uint64_t ka = __shfl_sync(0xffffffffu, my_key, a);
                    const float ax = __shfl_sync(0xffffffffu, c.at.x, a);
                    const float ay = __shfl_sync(0xffffffffu, c.at.y, a);
                    const float az = __shfl_sync(0xffffffffu, c.at.z, a);
                    const float av = __shfl_sync(0xffffffffu, c.at.w, a);
                    const int ai = __shfl_sync(0xffffffffu, c.index, a);
                    const bool ahead = has_c && my_key > ka;
                    const unsigned farther_ones = __ballot_sync(0xffffffffu, ahead);
                    const unsigned lowering = __ballot_sync(
                        0xffffffffu, ahead && fps_dist2(c.at.x, c.at.y, c.at.z, ax, ay, az) < av);
                    if (lane == 0) {
                        order[__popc(farther_ones)] = a;
                        if (lowering) atomicOr(&bad_pos[par], 1u << a);
                    }
                    if (kb[i] < 0 || kb[i] >= buckets) continue;  // another block's bucket
                    Candidate<float> best = no_candidate<float>();
#pragma unroll
                    for (int u = 0; u < PPL; ++u) {
                        const int p = kb[i] * S + lane + 32 * u;
                        if (p < Lc) {
                            const float d = fps_dist2(q[i][u].x, q[i][u].y, q[i][u].z, ax, ay, az);
                            float tu = q[i][u].idx == ai ? -1.f : t[i][u];
                            tu = d < tu ? d : tu;
                            const Candidate<float> o = {tu, q[i][u].idx};
                            if (farther(o, best)) best = o;
                        }
                    }
                    best = warp_farthest(best);
                    if (lane == 0) newkey[a] = round_key(best.value, best.index);
                }
            }
        }
        scope.sync();  // the flagged list, the newkeys, the order, the candidates

        // ---------------------------------------------------------------- Y
        int taken = 1;           // samples this round
        unsigned chosen = 1u;    // their candidate bits
        float last = single.at.w;
        if (listed) {
            const int pos = lane < n ? order[lane] : 0;
            const RoundCand cr = cands[pos];  // rank `lane`
            const uint64_t kr = round_key(cr.at.w, cr.index);
            uint64_t incl = lane < n ? *scope.at(&newkey[pos], (unsigned)(cr.bucket / per_block))
                                     : 0ull;  // prefix maximum over the ranks
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const uint64_t o = __shfl_up_sync(0xffffffffu, incl, off);
                if (lane >= off && o > incl) incl = o;
            }
            uint64_t before = __shfl_up_sync(0xffffffffu, incl, 1);
            const bool valid =
                lane < n && (lane == 0 || (!((bad_pos[par] >> pos) & 1u) && before < kr));
            const unsigned invalid = ~__ballot_sync(0xffffffffu, valid);
            taken = invalid ? __ffs(invalid) - 1 : 32;
            if (taken > row.n_out - j) taken = (int)(row.n_out - j);
            chosen = or_u32(lane < taken ? 1u << pos : 0u);
            if (rank == 0 && w == 0 && lane < taken) {
                row.idx[j + lane] = cr.index;
                row.dist2[j + lane] = cr.at.w;
            }
            last = __shfl_sync(0xffffffffu, cr.at.w, taken - 1);
        } else if (round > 0) {
            if (rank == 0 && threadIdx.x == 0) {
                row.idx[j] = single.index;
                row.dist2[j] = single.at.w;
            }
        } else {
            last = INFINITY;  // the start: the next round takes the farthest point
        }
        j += taken;
        const float theta = rho * last;
        const int nx = par ^ 1;
        // the flagged buckets, a warp each: every chosen candidate that flagged them
        const int E = entry_count[par];
        Candidate<float> upd = no_candidate<float>();  // the farthest of this warp's (uniform)
        int upd_k = -1;
        for (int e0 = w; e0 < E; e0 += warps * U) {  // U entries at once, loads first
            int ks[U];
            unsigned ms[U];
            BucketPoint<float> q[U][PPL];
            float t[U][PPL];
#pragma unroll
            for (int i = 0; i < U; ++i) {
                const int e = e0 + i * warps;
                const int2 en = e < E ? entries[e] : make_int2(-1, 0);
                ks[i] = en.x;
                ms[i] = (unsigned)en.y & chosen;
#pragma unroll
                for (int u = 0; u < PPL; ++u) {
                    const int p = ks[i] * S + lane + 32 * u;
                    if (ms[i] && p < Lc) q[i][u] = lp[p], t[i][u] = lt[p];
                }
            }
#pragma unroll
            for (int i = 0; i < U; ++i) {
                const int k = ks[i];
                if (k < 0) break;
                float4 at;
                Candidate<float> kc;
                if (ms[i]) {
                    Candidate<float> best = no_candidate<float>();
                    float px = 0.f, py = 0.f, pz = 0.f;
#pragma unroll
                    for (int u = 0; u < PPL; ++u) {
                        const int p = k * S + lane + 32 * u;
                        if (p < Lc) {
                            const BucketPoint<float>& qu = q[i][u];
                            float tu = t[i][u];
                            for (unsigned m = ms[i]; m; m &= m - 1) {
                                const float4 ca = listed ? cands[__ffs(m) - 1].at : single.at;
                                const int ci = listed ? cands[__ffs(m) - 1].index : single.index;
                                const float d = fps_dist2(qu.x, qu.y, qu.z, ca.x, ca.y, ca.z);
                                tu = qu.idx == ci ? -1.f : tu;
                                tu = d < tu ? d : tu;
                            }
                            lt[p] = tu;
                            const Candidate<float> o = {tu, qu.idx};
                            if (farther(o, best)) best = o, px = qu.x, py = qu.y, pz = qu.z;
                        }
                    }
                    const int wl = warp_argmax(best);
                    at = make_float4(__shfl_sync(0xffffffffu, px, wl),
                                     __shfl_sync(0xffffffffu, py, wl),
                                     __shfl_sync(0xffffffffu, pz, wl), best.value);
                    kc = best;
                    if (lane == 0) s_at[k] = at, s_index[k] = kc.index;
                } else {
                    at = s_at[k];
                    kc = {at.w, s_index[k]};
                }
                if (lane == 0 && at.w >= theta) {  // to the next round's list
                    const int p = atomicAdd(&list_count[nx], 1);
                    if (p < kRoundCap) list[nx][p] = {at, kc.index, kb0 + k, {0, 0}};
                }
                if (farther(kc, upd)) upd = kc, upd_k = k;
            }
        }
        // the buckets nobody flagged: this lane's own
        Candidate<float> own = no_candidate<float>();
        int own_k = -1;
#pragma unroll
        for (int s = 0; s < G; ++s) {
            const int k = k0 + s;
            const bool kept = g < groups && k < buckets && !(flagged & (1u << s));
            const bool want = kept && bk[s].best.value >= theta;
            const unsigned wants = __ballot_sync(0xffffffffu, want);
            if (wants) {  // to the next round's list, one atomic a warp
                const int leader = __ffs(wants) - 1;
                int p = 0;
                if (lane == leader) p = atomicAdd(&list_count[nx], __popc(wants));
                p = __shfl_sync(0xffffffffu, p, leader) + __popc(wants & ((1u << lane) - 1u));
                if (want && p < kRoundCap)
                    list[nx][p] = {s_at[k], bk[s].best.index, kb0 + k, {0, 0}};
            }
            if (kept && farther(bk[s].best, own)) own = bk[s].best, own_k = k;
        }
        own_k = __shfl_sync(0xffffffffu, own_k, warp_argmax(own));
        if (farther(upd, own)) own = upd, own_k = upd_k;
        __syncwarp();  // this warp's s_at writes are visible to lane 0
        if (lane == 0) {
            float4 at = own_k >= 0 ? s_at[own_k] : make_float4(0.f, 0.f, 0.f, 0.f);
            at.w = own.value;
            wbest[nx][w] = {at, own.index, own_k >= 0 ? kb0 + own_k : -1, {0, 0}};
        }
        scope.sync();  // the next round's lists, the warps' farthest, the updated buckets
    }
}

// ------------------------------------------------------------------------------------------
// launcher

// Shape of a BUCKET_ROUNDS plan (float only): buckets of 32 * ppl points as in BUCKET_GROUPS,
// `blocks` blocks a cloud (1, or a cluster of 2, 4 or 8 on sm_90: BUCKET_ROUNDS_CLUSTER)
// holding a contiguous range of at most 4096 of them each (fewer where the device's shared
// memory holds fewer), in groups of 1-8 (<= 512 groups a block, 32 a warp), at least 2 warps a
// block. False for double, past that many buckets a block,
// when B * N > INT_MAX, or (cluster) without clusters in the device or the build.
template <typename T>
bool plan_bucket_rounds(pcops_fps_cuda_plan* p, const Device& d, int64_t B, int64_t N,
                        int path) {
    if (sizeof(T) != 4 || B * N > INT_MAX) return false;
    const int64_t Np = N > 0 ? N : 1;
    int64_t blocks = 1;
    if (path == PCOPS_FPS_BUCKET_ROUNDS_CLUSTER) {
        // clusters, and the kernel built from sm_90 code (see cluster_kernel_usable)
        cudaFuncAttributes attr;
        if (d.major < 9 ||
            cudaFuncGetAttributes(&attr, fps_bucket_rounds_kernel<1, 1, ClusterScope>) !=
                cudaSuccess ||
            attr.ptxVersion < 90) {
            (void)cudaGetLastError();
            return false;
        }
        const int64_t buckets = (Np + 31) / 32;
        blocks = buckets >= 8 * 32 ? 8 : buckets >= 4 * 32 ? 4 : 2;
    }
    const int64_t max_buckets = rounds_block_max_buckets(d);
    int64_t ppl = 1;
    auto per_block = [&](int64_t q) {
        return ((Np + 32 * q - 1) / (32 * q) + blocks - 1) / blocks;
    };
    while (ppl < 8 && per_block(ppl) > max_buckets) ppl *= 2;
    const int64_t buckets = per_block(ppl);
    if (buckets > max_buckets || B * blocks > INT_MAX) return false;
    int group = 1;
    while ((buckets + group - 1) / group > kMaxBucketGroups) group *= 2;
    const int64_t groups = (buckets + group - 1) / group;
    const int warps = (int)std::max<int64_t>(2, (groups + 31) / 32);
    p->points_per_thread = (int)ppl;
    p->bucket_slots = group;
    p->warps_per_cloud = warps;
    p->threads = 32 * warps;
    p->clouds_per_block = 1;
    p->blocks_per_cloud = (int)blocks;
    p->blocks = B * blocks;
    p->smem_bytes = buckets * kRoundsSmemPerBucket + kRoundsStaticSmem;
    return true;
}

// Launches BUCKET_ROUNDS / BUCKET_ROUNDS_CLUSTER on the sorted points (sort_into_buckets) and
// the workspace's temps.
template <typename T>
cudaError_t launch_bucket_rounds(const pcops_fps_cuda_plan* p, const BucketPoint<T>* sorted,
                                 T* temp, const T* xyz, const int64_t* lengths,
                                 const int64_t* start, int64_t N, int64_t npoint, int64_t* idx,
                                 T* dist2, cudaStream_t stream) {
    if constexpr (sizeof(T) == 4) {
        const int64_t S = 32 * (int64_t)p->points_per_thread;
        // a block's buckets: each one's farthest point, index and flagged-list slot
        // (<= 112 KiB; the plan keeps within the device's limit)
        const int64_t blocks = p->blocks_per_cloud;
        const size_t smem =
            (size_t)(((N + S - 1) / S + blocks - 1) / blocks) * kRoundsSmemPerBucket;
        auto launch = [&](auto kernel) {
            cudaError_t err = cudaFuncSetAttribute(
                kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            if (err != cudaSuccess) return err;
            if (blocks == 1) {
                kernel<<<(unsigned)p->blocks, p->threads, smem, stream>>>(
                    xyz, lengths, start, N, npoint, sorted, temp, idx, dist2);
                return cudaGetLastError();
            }
            cudaLaunchConfig_t config = {};
            config.gridDim = dim3((unsigned)p->blocks);
            config.blockDim = dim3(p->threads);
            config.dynamicSmemBytes = smem;
            config.stream = stream;
            cudaLaunchAttribute attribute[1];
            attribute[0].id = cudaLaunchAttributeClusterDimension;
            attribute[0].val.clusterDim.x = (unsigned)blocks;
            attribute[0].val.clusterDim.y = 1;
            attribute[0].val.clusterDim.z = 1;
            config.attrs = attribute;
            config.numAttrs = 1;
            return cudaLaunchKernelEx(&config, kernel, xyz, lengths, start, N, npoint, sorted,
                                      temp, idx, dist2);
        };
        auto pick = [&](auto scope) -> cudaError_t {
            using Scope = decltype(scope);
            switch (p->bucket_slots * 16 + p->points_per_thread) {
                case 1 * 16 + 1: return launch(fps_bucket_rounds_kernel<1, 1, Scope>);
                case 2 * 16 + 1: return launch(fps_bucket_rounds_kernel<2, 1, Scope>);
                case 4 * 16 + 1: return launch(fps_bucket_rounds_kernel<4, 1, Scope>);
                case 8 * 16 + 1: return launch(fps_bucket_rounds_kernel<8, 1, Scope>);
                case 8 * 16 + 2: return launch(fps_bucket_rounds_kernel<8, 2, Scope>);
                case 8 * 16 + 4: return launch(fps_bucket_rounds_kernel<8, 4, Scope>);
                case 8 * 16 + 8: return launch(fps_bucket_rounds_kernel<8, 8, Scope>);
                default: return cudaErrorInvalidValue;
            }
        };
        return blocks == 1 ? pick(BlockScope{}) : pick(ClusterScope{});
    }
    return cudaErrorInvalidValue;  // float only
}

}  // namespace
