/*
 * fps/group.cuh -- SIMPLE, WARP and BLOCK: one kernel, fps_group_kernel, in three shapes.
 * `warps` warps share a cloud, `clouds` clouds share a block; every thread of a cloud owns some
 * of its points, and a step is the common one (kernels/fps/common.cuh): update, the warp's
 * farthest, the warps' slots, one barrier.
 *
 *   SIMPLE  8 warps a cloud, one cloud a block, temps in the workspace and coordinates read
 *           from xyz (GlobalPoints): any N. The reference every other path must match, and
 *           AUTO's last resort when the path it prefers cannot run.
 *   WARP    1 warp a cloud (up to 256 points), else 2; 8 warps a block, so 8 or 4 clouds a
 *           block, each syncing on its own named barrier (1 + its place in the block). Points
 *           and temps in registers. Wins on small clouds: a step is one or two warps' latency,
 *           with no block-wide barrier.
 *   BLOCK   one cloud a block, 2 to 16 warps of 4 points a thread (up to 2048 points), else
 *           of the most registers hold (16 float, 8 double). Wins while one block's registers
 *           hold the cloud and the cloud is too small for BLOCK_PRUNED's pruning to pay.
 *
 * Float clouds in registers (WARP, BLOCK) are dealt in runs (thread r holds points r * PPT ..
 * r * PPT + PPT - 1), so warp order is index order, and reduce on temp keys
 * (group_farthest_keys); SIMPLE and double clouds deal points by stride and reduce (temp,
 * index) pairs (group_farthest_at). A step is one chain of latencies (the sample's
 * coordinates, the update, two redux, the barrier, the slots' tree), kept short: the slots are
 * addressed by 32-bit shared-window addresses computed before the loop, row j is written by
 * predicated stores, and the sample's address is one multiply-add.
 *
 * Invariants: the plan gives a register point set (PPT > 0) at least ceil(L / threads) slots a
 * thread; at most 15 clouds a block (named barriers 1..15); float key slots hold kSlots >= warps
 * (8, or 16 for 4 or 16 points a thread); dynamic shared memory is slot_bytes.
 */
#pragma once

#include <algorithm>

#include "common.cuh"

namespace {

// ------------------------------------------------------------------------------------------
// kernel

// The step's reduction of float clouds in registers (WARP, BLOCK) on temp keys: a float temp's
// bits as an int32. A non-negative temp (a sum of squares, +inf) orders as its bits; the
// negative ones (-1 chosen, -inf padding) are below all of those (their order among themselves
// is not the floats', and never decides a step: while samples remain, the cloud has an unchosen
// valid point, temp >= 0). So the largest key, ties to the lowest index, is farther()'s winner,
// and a key needs no conversion either way (warp_farthest's order-preserving map costs three
// dependent instructions before each redux and two after).
//
// The cloud is dealt to the threads in runs (thread r of the cloud holds points r * PPT ..
// r * PPT + PPT - 1), so the order of the warps is the order of their indices. A warp reduces
// by two redux (the largest key, then the lowest index that holds it); with several warps lane
// 0 stores the key and the index to the warp's slots (predicated stores), one barrier, and
// every thread reads all kSlots slots (4 keys or indices a 16-byte load) and keeps the first
// largest key by a tree over adjacent runs of slots, the later run's winner only when strictly
// larger: the lower index on a tie, because a warp's points all precede the next warp's. (A tree
// pairing slot q with q + kSlots / 2 first would not: on a tie between the winners of {0, 4}
// and {2, 6} it kept 4 over 2.) One compare and two selects a level: shorter than a second
// pair of redux over the slots (lab/fps_step.cu times the alternatives); on points dealt by
// stride the same tree would need the full (key, index) order, three instructions a level.
// Slots: [parity][kSlots keys, kSlots indices] of int32 at `at` (this step's parity); the slots
// of warps >= warps hold INT_MIN keys (fps_group_kernel writes them once).
template <int kSlots>
__device__ __forceinline__ Candidate<float> group_farthest_keys(int key, int index, uint32_t at,
                                                                int w, int warps,
                                                                int barrier_id) {
    static_assert(kSlots == 8 || kSlots == 16, "slots a group");
    const int top = pcops_warp::max_i32(key);
    const uint32_t id = pcops_warp::min_u32(key == top ? (uint32_t)index : 0xffffffffu);
    if (warps == 1) return {__int_as_float(top), (int)id};
    asm volatile("{\n\t.reg .pred p;\n\tsetp.eq.u32 p, %0, 0;\n\t"
                 "@p st.shared.b32 [%1], %2;\n\t@p st.shared.b32 [%3], %4;\n\t}" ::"r"(
                     threadIdx.x & 31),
                 "r"(at + 4u * (uint32_t)w), "r"(top), "r"(at + 4u * (uint32_t)(kSlots + w)),
                 "r"(id)
                 : "memory");  // lane 0, predicated (no branch on the chain)
    named_barrier(barrier_id, warps * 32);
    int k[kSlots], i[kSlots];
#pragma unroll
    for (int q = 0; q < kSlots; q += 4) {
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(k[q]), "=r"(k[q + 1]), "=r"(k[q + 2]), "=r"(k[q + 3])
                     : "r"(at + 4u * q)
                     : "memory");
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(i[q]), "=r"(i[q + 1]), "=r"(i[q + 2]), "=r"(i[q + 3])
                     : "r"(at + 4u * (kSlots + q))
                     : "memory");
    }
    // level h: slot q (2h | q) holds the winner of slots q .. q + h - 1 and meets the winner of
    // the next h slots: adjacent runs, so a tie keeps the lower run
#pragma unroll
    for (int h = 1; h < kSlots; h *= 2)
#pragma unroll
        for (int q = 0; q < kSlots; q += 2 * h) {
            const bool later = k[q + h] > k[q];
            k[q] = later ? k[q + h] : k[q];
            i[q] = later ? i[q + h] : i[q];
        }
    return {__int_as_float(k[0]), i[0]};
}

// Dynamic shared memory of a block: its clouds' slots, two step parities each (kSlots keys and
// kSlots indices, or `warps` candidates).
template <typename T, int kSlots = 0>
__host__ __device__ constexpr size_t slot_bytes(int warps, int clouds) {
    return kSlots > 0 ? (size_t)clouds * 2 * 2 * kSlots * sizeof(int)
                      : (size_t)clouds * 2 * warps * sizeof(Candidate<T>);
}

template <typename T, class Points, int kSlots = 0>
__global__ void __launch_bounds__(max_threads<Points, T>())
fps_group_kernel(const T* __restrict__ xyz, const int64_t* __restrict__ lengths,
                 const int64_t* __restrict__ start, int64_t B, int64_t N, int64_t npoint,
                 T* __restrict__ workspace, int64_t* __restrict__ idx, T* __restrict__ dist2,
                 int warps, int clouds) {
    constexpr bool kKeys = kSlots > 0;
    static_assert(!kKeys || (sizeof(T) == 4 && Points::kPerThread > 0), "float registers");
    extern __shared__ __align__(16) unsigned char fps_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int group = warp / warps, w = warp % warps;
    const int rank = threadIdx.x - group * warps * 32;  // thread rank inside the cloud's group
    const int64_t b = (int64_t)blockIdx.x * clouds + group;
    if (group >= clouds || b >= B) return;  // whole groups leave: their barrier is their own
    const CloudRow<T> row(xyz, lengths, b, N, npoint, idx, dist2);
    pad_row(row.idx, row.dist2, row.n_out, npoint, rank, warps * 32);
    if (row.n_out == 0) return;
    const int n_out = (int)row.n_out;  // <= N <= INT_MAX (the plan)

    Points pts;
    if constexpr (kKeys)  // runs of PPT points: warp order is index order
        pts.load(row.cloud, nullptr, rank * Points::kPerThread, row.L, 1);
    else
        pts.load(row.cloud, workspace ? workspace + b * N : nullptr, rank, row.L, warps * 32);
    int cur = start ? (int)pcops_positive_mod(start[b], row.L) : 0;
    if (rank == 0) {
        row.idx[0] = cur;
        row.dist2[0] = T(0);
    }
    if constexpr (kKeys) {
        // [parity][kSlots keys, kSlots indices] of this group; absent warps' slots never win
        int* group_slots = reinterpret_cast<int*>(fps_smem) + group * 4 * kSlots;
        const int parity = rank / kSlots, q = rank % kSlots;
        if (rank < 2 * kSlots && q >= warps) {
            group_slots[parity * 2 * kSlots + q] = INT_MIN;
            group_slots[parity * 2 * kSlots + kSlots + q] = INT_MAX;
        }  // ordered before any read by the first step's barrier
        const uint32_t at0 = shared_address(group_slots);
        for (int j = 1; j < n_out; ++j) {
            T cx, cy, cz;
            load_point_at(row.cloud, cur, cx, cy, cz);
            int key, index;
            pts.step_key(cur, cx, cy, cz, key, index);
            const Candidate<T> c = group_farthest_keys<kSlots>(
                key, index, at0 + ((j & 1) ? 8u * kSlots : 0u), w, warps, 1 + group);
            store_sample(rank == 0, row.idx + j, row.dist2 + j, c);
            cur = c.index;
        }
        return;
    }
    // The step's slots: this warp's (write) and this lane's (read) of parity 0; parity 1 is
    // `half` bytes on.
    constexpr uint32_t kSlot = sizeof(Candidate<T>);
    const uint32_t slots = shared_address(fps_smem) + (uint32_t)(group * 2 * warps) * kSlot;
    const uint32_t write0 = slots + (uint32_t)w * kSlot, read0 = slots + (uint32_t)lane * kSlot;
    const uint32_t half = (uint32_t)warps * kSlot;
    const bool reads = lane < warps;
    for (int j = 1; j < n_out; ++j) {
        T cx, cy, cz;
        load_point_at(row.cloud, cur, cx, cy, cz);
        const uint32_t flip = (j & 1) ? half : 0u;
        Candidate<T> c = pts.step(cur, cx, cy, cz);
        c = group_farthest_at(c, write0 + flip, read0 + flip, reads, warps, 1 + group);
        store_sample(rank == 0, row.idx + j, row.dist2 + j, c);
        cur = c.index;
    }
}

// ------------------------------------------------------------------------------------------
// launcher

// Shape of a SIMPLE / WARP / BLOCK plan for clouds of N points; false when the registers
// cannot hold them.
//   SIMPLE: 8 warps per cloud, temp in the workspace.
//   WARP:   1 warp per cloud up to 256 points, else 2 (up to 64 * 16 points), 8 warps a block.
//   BLOCK:  4 points per thread up to 2048 points, else the most registers hold (16 float,
//           8 double), as many warps as that takes (2 to 16), one cloud per block. A step is a
//           chain of latencies: of the shapes that hold a cloud these give the shortest, a few
//           warps with a few points each (more warps lengthen the reduction, more points a
//           thread the update).
template <typename T>
bool plan_group(pcops_fps_cuda_plan* p, int64_t B, int64_t N, int variant) {
    const int64_t Np = N > 0 ? N : 1;
    int ppt = 0, warps = 8;
    if (variant == PCOPS_FPS_WARP) {
        warps = Np <= 32 * 8 ? 1 : 2;
        for (ppt = 2; ppt <= max_points_per_thread<T>() && Np > (int64_t)warps * 32 * ppt;) ppt *= 2;
        if (ppt > max_points_per_thread<T>()) return false;
    } else if (variant == PCOPS_FPS_BLOCK) {
        for (ppt = Np <= 2048 ? 4 : max_points_per_thread<T>(); ppt <= max_points_per_thread<T>();
             ppt *= 2) {
            warps = (int)std::max<int64_t>(2, (Np + 32LL * ppt - 1) / (32LL * ppt));
            if (warps <= 32 && warps * 32 <= max_threads_for<T>(ppt)) break;
        }
        if (ppt > max_points_per_thread<T>()) return false;
    }
    p->points_per_thread = ppt;
    p->warps_per_cloud = warps;
    p->clouds_per_block = variant == PCOPS_FPS_WARP ? 8 / warps : 1;
    p->threads = 32 * p->warps_per_cloud * p->clouds_per_block;
    p->blocks_per_cloud = 1;
    p->blocks = (B + p->clouds_per_block - 1) / p->clouds_per_block;
    return true;
}

// The most points one block holds in registers: the most register slots a thread, at the
// threads a block that many allow (8192 float, 4096 double). BLOCK's reach, and
// BLOCK_PRUNED's with its points in registers.
template <typename T>
constexpr int64_t block_max_points() {
    constexpr int kSlots = max_points_per_thread<T>();
    return (int64_t)kSlots * max_threads<RegisterPoints<T, kSlots>, T>();
}

// Launches a SIMPLE / WARP / BLOCK plan; `temp` is the workspace's temps (SIMPLE), else unused.
template <typename T>
cudaError_t launch_group(const pcops_fps_cuda_plan* p, const T* xyz, const int64_t* lengths,
                         const int64_t* start, int64_t B, int64_t N, int64_t npoint, T* temp,
                         int64_t* idx, T* dist2, cudaStream_t stream) {
    return with_points<T>(p->points_per_thread, [&](auto pts) -> cudaError_t {
        using Points = decltype(pts);
        const int warps = p->warps_per_cloud, clouds = p->clouds_per_block;
        if constexpr (sizeof(T) == 4 && Points::kPerThread > 0) {
            // plan_group: 9-16 warps only with 4 points a thread (N <= 2048) or 16
            constexpr int kWide = Points::kPerThread == 4 || Points::kPerThread == 16 ? 16 : 8;
            if (warps <= 8)
                fps_group_kernel<T, Points, 8>
                    <<<(unsigned)p->blocks, p->threads, slot_bytes<T, 8>(warps, clouds),
                       stream>>>(xyz, lengths, start, B, N, npoint, temp, idx, dist2, warps,
                                 clouds);
            else if (kWide == 16 && warps <= 16)
                fps_group_kernel<T, Points, kWide>
                    <<<(unsigned)p->blocks, p->threads, slot_bytes<T, kWide>(warps, clouds),
                       stream>>>(xyz, lengths, start, B, N, npoint, temp, idx, dist2, warps,
                                 clouds);
            else
                return cudaErrorInvalidValue;  // plan_group: no more warps of float
        } else {
            fps_group_kernel<T, Points>
                <<<(unsigned)p->blocks, p->threads, slot_bytes<T>(warps, clouds), stream>>>(
                    xyz, lengths, start, B, N, npoint, temp, idx, dist2, warps, clouds);
        }
        return cudaGetLastError();
    });
}

}  // namespace
