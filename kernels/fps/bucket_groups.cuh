/*
 * fps/bucket_groups.cuh -- BUCKET_GROUPS (float): the buckets of BUCKET (kernels/fps/bucket.cuh),
 * with the flagged ones of a step shared out over the block's warps.
 *
 * One block per cloud. Lane `lane` of warp w keeps the group g = lane * W + w of G consecutive
 * (Morton-ordered, so nearby) buckets, G = 1, 2, 4 or 8 (the fewest that leave at most 512
 * groups): their boxes and farthest candidates in registers and the group's box. A step:
 *   1. each lane tests its group's box first (the bucket rule: a box at m >= the group's
 *      largest temp keeps every temp), and only the lanes whose group fails test their G
 *      buckets; the flagged buckets go to a list in shared memory (a shared atomic a lane);
 *   2. barrier; warp w updates buckets w, w + W, ... of the list (one bucket a warp, its points
 *      a lane, the loads in flight together) and writes each one's farthest to shared memory;
 *      meanwhile the farthest of the buckets that kept their temps is a warp reduction;
 *   3. each warp's farthest of both to shared memory, barrier, every warp reduces the warps'.
 * The owners read their updated buckets' candidates back at the next step.
 *
 * When it wins: BUCKET updates its flagged buckets in the warps that own them, one after the
 * other, so a step waits for the warp with the most; here it waits for about one bucket update,
 * and a skipped group costs one box test instead of G. AUTO's path for float clouds past
 * BLOCK_PRUNED's reach, up to one block's 4096 buckets of 256 points (2**20), when fewer
 * samples are asked than BUCKET_ROUNDS needs to pay off (rounds_min_samples in plan.cuh).
 *
 * Invariants: at most 4096 buckets a cloud, and no more than the device's shared memory holds
 * (the candidates and the list: 24 bytes a bucket; 4096 need 96 KiB, past sm_75's limit, where
 * the plan takes larger buckets); B * N <= 2**31 - 1 (the sort's). The group helpers here (group_setup,
 * farthest_kept) are BUCKET_ROUNDS' too.
 */
#pragma once

#include <algorithm>

#include "bucket.cuh"

namespace {

// ------------------------------------------------------------------------------------------
// kernel

constexpr int kMaxBucketGroups = 512;  // 16 warps of 32 lanes, a group a lane
// The buckets a block of the grouped paths takes (512 groups of 8), and so the points (buckets
// of at most 32 * 8): the reach of BUCKET_GROUPS and of a BUCKET_ROUNDS block.
constexpr int64_t kMaxGroupedBuckets = 4096;
constexpr int64_t kGroupedBlockMaxPoints = kMaxGroupedBuckets * 32 * 8;  // 2**20

// A lane's group before the first step (BUCKET_GROUPS, BUCKET_ROUNDS): its buckets k0 ..
// k0 + G - 1 of `buckets` (sorted points pts[0, L), S a bucket) cleared, and where the lane has
// a group and the bucket exists, set (box; candidate: the lowest index, its coordinates and
// +inf temp to s_at[k], its index to s_index[k]); the group's box, the union of its buckets'.
template <int G>
__device__ __forceinline__ void group_setup(Bucket<float> (&bk)[G], bool has_group, int k0,
                                            int buckets, const BucketPoint<float>* pts, int L,
                                            int S, float4* s_at, int* s_index, float& glx,
                                            float& gly, float& glz, float& ghx, float& ghy,
                                            float& ghz) {
    glx = gly = glz = INFINITY;
    ghx = ghy = ghz = -INFINITY;
#pragma unroll
    for (int s = 0; s < G; ++s) {
        const int k = k0 + s;
        Bucket<float>& u = bk[s];
        bucket_clear(u);
        if (!has_group || k >= buckets) continue;
        float4 at = make_float4(0.f, 0.f, 0.f, INFINITY);
        bucket_set(u, pts, k * S, min(L, (k + 1) * S), at.x, at.y, at.z);
        s_at[k] = at;
        s_index[k] = u.best.index;
        glx = fminf(glx, u.lx), gly = fminf(gly, u.ly), glz = fminf(glz, u.lz);
        ghx = fmaxf(ghx, u.hx), ghy = fmaxf(ghy, u.hy), ghz = fmaxf(ghz, u.hz);
    }
}

// The farthest of a lane's G buckets, skipping those in `skip` (a tree of depth log2 G, no
// branches), and the bucket it is in (offset by k0; -1 for none: slots past the last bucket
// hold no candidate, and their k0 + s would index past the buckets' shared memory).
template <int G>
__device__ __forceinline__ Candidate<float> farthest_kept(const Bucket<float> (&bk)[G],
                                                         unsigned skip, int k0, int& at) {
    Candidate<float> c[G];
    int k[G];
#pragma unroll
    for (int s = 0; s < G; ++s) {
        const bool kept = !(skip & (1u << s)) && bk[s].best.index != INT_MAX;
        c[s] = kept ? bk[s].best : no_candidate<float>();
        k[s] = kept ? k0 + s : -1;
    }
#pragma unroll
    for (int half = G / 2; half > 0; half /= 2)
#pragma unroll
        for (int s = 0; s < half; ++s) {
            const bool o = farther(c[s + half], c[s]);
            c[s] = o ? c[s + half] : c[s];
            k[s] = o ? k[s + half] : k[s];
        }
    at = k[0];
    return c[0];
}

// Static shared memory of fps_bucket_groups_kernel (its arrays and their alignment: 656 bytes
// on sm_90), and its dynamic shared memory a bucket; counted against the opt-in limit.
constexpr size_t kGroupsStaticSmem = 1024;
constexpr size_t kGroupsSmemPerBucket = sizeof(float4) + 2 * sizeof(int);

template <int G, int PPL>
__global__ void __launch_bounds__(512)
fps_bucket_groups_kernel(const float* __restrict__ xyz, const int64_t* __restrict__ lengths,
                         const int64_t* __restrict__ start, int64_t N, int64_t npoint,
                         const BucketPoint<float>* __restrict__ sorted,
                         float* __restrict__ temp_ws, int64_t* __restrict__ idx,
                         float* __restrict__ dist2) {
    constexpr int S = 32 * PPL;  // points per bucket
    extern __shared__ __align__(16) unsigned char fps_smem[];
    __shared__ Sample<float> samples[2][16];  // the warps' candidates, by step parity
    __shared__ int flagged_count[2];          // list lengths, by step parity
    static_assert(sizeof(samples) + sizeof(flagged_count) + 2 * 16 <= kGroupsStaticSmem,
                  "the plan's count, with room for each array's alignment");
    const int warps = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t b = blockIdx.x;
    const CloudRow<float> row(xyz, lengths, b, N, npoint, idx, dist2);
    const BucketPoint<float>* pts = sorted + b * N;
    float* temp = temp_ws + b * N;
    pad_row(row.idx, row.dist2, row.n_out, npoint, threadIdx.x, blockDim.x);
    if (row.n_out == 0) return;
    const int buckets = (row.L + S - 1) / S;
    const int groups = (buckets + G - 1) / G;
    // per bucket: its farthest point (x, y, z, temp) and that point's index; the step's list
    float4* s_at = reinterpret_cast<float4*>(fps_smem);
    int* s_index = reinterpret_cast<int*>(s_at + buckets);
    int* list = s_index + buckets;

    for (int p = threadIdx.x; p < row.L; p += blockDim.x) temp[p] = INFINITY;
    if (threadIdx.x < 2) flagged_count[threadIdx.x] = 0;
    const int g = lane * warps + w;
    const int k0 = g * G;  // this lane's first bucket
    Bucket<float> bk[G];
    float glx, gly, glz, ghx, ghy, ghz;  // the group's box
    group_setup<G>(bk, g < groups, k0, buckets, pts, row.L, S, s_at, s_index, glx, gly, glz, ghx,
                   ghy, ghz);
    // the group's farthest candidate and its bucket
    int gbest_k;
    Candidate<float> gbest = farthest_kept<G>(bk, 0u, k0, gbest_k);
    __syncthreads();  // the temps, the buckets' candidates and the counts are set

    int cur = start ? (int)pcops_positive_mod(start[b], row.L) : 0;
    float cx, cy, cz;
    load_point(row.cloud, cur, cx, cy, cz);
    if (threadIdx.x == 0) {
        row.idx[0] = cur;
        row.dist2[0] = 0.f;
    }
    unsigned mine = 0;  // this lane's buckets updated by the last step
    for (int64_t j = 1; j < row.n_out; ++j) {
        const int parity = (int)(j & 1);
        if (mine) {  // read back their candidates (the last step's final barrier ordered them)
#pragma unroll
            for (int s = 0; s < G; ++s)
                if (mine & (1u << s)) bk[s].best = {s_at[k0 + s].w, s_index[k0 + s]};
            gbest = farthest_kept<G>(bk, 0u, k0, gbest_k);
        }
        // 1. the group's box, then its buckets' boxes where it fails (one box when G = 1)
        const float m = fps_dist2(fminf(fmaxf(cx, glx), ghx), fminf(fmaxf(cy, gly), ghy),
                                  fminf(fmaxf(cz, glz), ghz), cx, cy, cz);
        const bool active = g < groups && (!(m >= gbest.value) || m == 0.f);
        mine = 0;
        Candidate<float> own = gbest;  // the farthest of this lane's buckets that keep their temps
        int own_k = gbest_k;
        if constexpr (G == 1) {
            if (active) mine = 1u, own = no_candidate<float>(), own_k = -1;
        } else if (active) {
            float mb[G];
#pragma unroll
            for (int s = 0; s < G; ++s) mb[s] = bk[s].dist2_to(cx, cy, cz);
#pragma unroll
            for (int s = 0; s < G; ++s)
                mine |= (unsigned)(k0 + s < buckets &&
                                   (!(mb[s] >= bk[s].best.value) || mb[s] == 0.f)) << s;
            own = farthest_kept<G>(bk, mine, k0, own_k);
        }
        if (mine) {
            int at = atomicAdd(&flagged_count[parity], __popc(mine));
#pragma unroll
            for (int s = 0; s < G; ++s)
                if (mine & (1u << s)) list[at++] = k0 + s;
        }
        own_k = __shfl_sync(0xffffffffu, own_k, warp_argmax(own));
        named_barrier(0, blockDim.x);  // the list is complete

        // 2. this warp's share of the list
        const int flagged = flagged_count[parity];
        if (threadIdx.x == 0) flagged_count[parity ^ 1] = 0;  // the next step's (read before
                                                               // the last step's final barrier)
        Candidate<float> best = own;
        int best_k = own_k;
        for (int i = w; i < flagged; i += warps) {
            const int k = list[i];
            BucketPoint<float> q[PPL];
            float t[PPL];
#pragma unroll
            for (int u = 0; u < PPL; ++u) {
                const int p = k * S + lane + 32 * u;
                if (p < row.L) q[u] = pts[p], t[u] = temp[p];
            }
            Candidate<float> c = no_candidate<float>();
            float px = 0.f, py = 0.f, pz = 0.f;
#pragma unroll
            for (int u = 0; u < PPL; ++u) {
                const int p = k * S + lane + 32 * u;
                if (p < row.L) {
                    const float d = fps_dist2(q[u].x, q[u].y, q[u].z, cx, cy, cz);
                    float tu = q[u].idx == cur ? -1.f : t[u];
                    tu = d < tu ? d : tu;
                    temp[p] = tu;
                    const Candidate<float> o = {tu, q[u].idx};
                    if (farther(o, c)) c = o, px = q[u].x, py = q[u].y, pz = q[u].z;
                }
            }
            if (lane == warp_argmax(c)) {
                s_at[k] = make_float4(px, py, pz, c.value);
                s_index[k] = c.index;
            }
            if (farther(c, best)) best = c, best_k = k;
        }
        // 3. the warp's farthest (its coordinates: s_at, written by this warp or before the
        // last barrier), the block's
        __syncwarp();
        cur = bucket_step_winner(samples, j, best, [&](float& x, float& y, float& z) {
                  const float4 a = best_k >= 0 ? s_at[best_k] : make_float4(0.f, 0.f, 0.f, 0.f);
                  x = a.x, y = a.y, z = a.z;
              }, row, cx, cy, cz).index;
    }
}

// ------------------------------------------------------------------------------------------
// launcher

// Shape of a BUCKET_GROUPS plan (float only): buckets of 32 * ppl points (ppl 1, 2, 4 or 8),
// at most 4096 per cloud (24 bytes of shared memory each: fewer where the device's shared
// memory holds fewer), so at most 512 groups of 8: one a lane, the groups spread over up to 16
// warps. False for double, past that many buckets, or when B * N > INT_MAX.
template <typename T>
bool plan_bucket_groups(pcops_fps_cuda_plan* p, const Device& d, int64_t B, int64_t N) {
    if (sizeof(T) != 4 || B * N > INT_MAX) return false;
    const int64_t max_buckets = std::min<int64_t>(
        kMaxGroupedBuckets, smem_units(d, kGroupsStaticSmem, kGroupsSmemPerBucket));
    const int64_t Np = N > 0 ? N : 1;
    int64_t ppl = 1;
    while (ppl < 8 && (Np + 32 * ppl - 1) / (32 * ppl) > max_buckets) ppl *= 2;
    const int64_t buckets = (Np + 32 * ppl - 1) / (32 * ppl);
    if (buckets > max_buckets) return false;
    // buckets a lane: the fewest that leave at most 512 groups, over as many warps as there
    // are groups, up to 16 (fewer warps with more buckets a lane are slower: the list of a
    // step is shared out over fewer warps)
    int group = 1;
    while ((buckets + group - 1) / group > kMaxBucketGroups) group *= 2;
    const int64_t groups = (buckets + group - 1) / group;
    const int warps = (int)std::min<int64_t>(16, groups);
    p->points_per_thread = (int)ppl;
    p->bucket_slots = group;
    p->warps_per_cloud = warps;
    p->threads = 32 * warps;
    p->clouds_per_block = 1;
    p->blocks_per_cloud = 1;
    p->blocks = B;
    p->smem_bytes = buckets * kGroupsSmemPerBucket + kGroupsStaticSmem;
    return true;
}


// Launches BUCKET_GROUPS on the sorted points (sort_into_buckets) and the workspace's temps.
template <typename T>
cudaError_t launch_bucket_groups(const pcops_fps_cuda_plan* p, const BucketPoint<T>* sorted,
                                 T* temp, const T* xyz, const int64_t* lengths,
                                 const int64_t* start, int64_t B, int64_t N, int64_t npoint,
                                 int64_t* idx, T* dist2, cudaStream_t stream) {
    if constexpr (sizeof(T) == 4) {
        const int64_t S = 32 * (int64_t)p->points_per_thread;
        // each bucket's farthest point and index, the list: <= 96 KiB (4096 buckets; the plan
        // keeps within the device's limit)
        const size_t smem = (size_t)((N + S - 1) / S) * kGroupsSmemPerBucket;
        auto launch = [&](auto kernel) {
            cudaError_t err = cudaFuncSetAttribute(
                kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            if (err != cudaSuccess) return err;
            kernel<<<(unsigned)B, p->threads, smem, stream>>>(xyz, lengths, start, N, npoint,
                                                              sorted, temp, idx, dist2);
            return cudaGetLastError();
        };
        // the plan's (group size, points per lane): see plan_bucket_groups
        switch (p->bucket_slots * 16 + p->points_per_thread) {
            case 1 * 16 + 1: return launch(fps_bucket_groups_kernel<1, 1>);
            case 2 * 16 + 1: return launch(fps_bucket_groups_kernel<2, 1>);
            case 4 * 16 + 1: return launch(fps_bucket_groups_kernel<4, 1>);
            case 8 * 16 + 1: return launch(fps_bucket_groups_kernel<8, 1>);
            case 8 * 16 + 2: return launch(fps_bucket_groups_kernel<8, 2>);
            case 8 * 16 + 4: return launch(fps_bucket_groups_kernel<8, 4>);
            case 8 * 16 + 8: return launch(fps_bucket_groups_kernel<8, 8>);
            default: return cudaErrorInvalidValue;
        }
    }
    return cudaErrorInvalidValue;  // float only
}

}  // namespace
