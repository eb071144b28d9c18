/*
 * knn/grid_select.cuh -- path "grid_select" (float32, k <= kGridSelectMaxK = 128): the grid
 * path's rings (knn/grid.cuh) walked by a warp per query, whose candidates gather in a shared
 * buffer that the warp select's bit search (knn/warp_select.cuh) shrinks to the k best.
 *
 * What it does: the lanes load a run of refs 32 at a time; the refs whose packed key
 * (dist2 bits, idx) is below the current bound are appended to the warp's candidate buffer
 * (shared memory, ballots). When the buffer would overflow, and at the end of each ring once k
 * candidates are there, it is shrunk to exactly the kk smallest packed keys (the kk-th key by
 * the bit search, then, among the refs tied at it, the lowest indices by a second bit search
 * on the indices); the largest kept key becomes the bound (only smaller keys can still enter)
 * and its distance the walk's k-th distance. Its grid has fuller cells than the grid path's
 * (knn/plan.cuh, select_cell_*): a warp's 32 lanes take a run of refs at once.
 *
 * When it wins: float32 grids with long lists (k from 64 to 128), where every thread of the
 * grid path would keep a list too long for its registers (knn/plan.cuh).
 *
 * Invariants: the result is the kk smallest keys of every ref the walk can reach, as for
 * grid_walk's list: the same bits.
 */
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "grid.cuh"
#include "warp_select.cuh"

namespace {

constexpr int kGridSelectSlots = 16;                      // candidates a lane holds in a shrink
constexpr int kGridSelectCap = 32 * kGridSelectSlots;     // candidates per warp
constexpr int kGridSelectWarps = 4;
constexpr int kGridSelectMaxK = 128;

struct GridSelect {
    unsigned long long* buf;  // [kGridSelectCap]
    int count;                // candidates in buf (warp-uniform)
    int k;
    unsigned long long bound;  // a candidate enters iff its packed key is below this
    bool shrunk;               // the buffer was shrunk to k entries at least once

    // Keeps the kk = min(k, count) smallest entries of buf (exactly kk of them).
    __device__ void shrink() {
        const int lane = threadIdx.x & 31;
        __syncwarp();  // the entries other lanes appended are visible
        const int kk = count < k ? count : k;
        unsigned long long e[kGridSelectSlots];
#pragma unroll
        for (int i = 0; i < kGridSelectSlots; ++i)
            e[i] = 32 * i + lane < count ? buf[32 * i + lane] : ~0ull;
        __syncwarp();  // every entry is read before the compaction below overwrites buf
        auto key_at = [&](int i) { return (uint32_t)(e[i] >> 32); };
        const uint32_t tau = warp_kth_key<kGridSelectSlots>(key_at, kk);
        int below = 0, eq = 0;
#pragma unroll
        for (int i = 0; i < kGridSelectSlots; ++i) {
            below += key_at(i) < tau;
            eq += key_at(i) == tau;
        }
        below = (int)sum_u32((unsigned)below);
        eq = (int)sum_u32((unsigned)eq);
        const int need = kk - below;
        uint32_t id_tau = 0xffffffffu;  // ties at tau kept: index <= id_tau
        if (eq > need) {
            auto id_at = [&](int i) {
                return key_at(i) == tau ? (uint32_t)e[i] : 0xffffffffu;
            };
            id_tau = warp_kth_key<kGridSelectSlots>(id_at, need);
        }
        const uint32_t lt = lanes_below();
        int base = 0;
        uint32_t max_tie = 0;
#pragma unroll
        for (int i = 0; i < kGridSelectSlots; ++i) {
            const uint32_t key = key_at(i), id = (uint32_t)e[i];
            const bool sel = key < tau || (key == tau && id <= id_tau);
            if (sel && key == tau) max_tie = max(max_tie, id);
            const uint32_t bs = __ballot_sync(0xffffffffu, sel);
            if (sel) buf[base + __popc(bs & lt)] = e[i];
            base += __popc(bs);
        }
        __syncwarp();
        count = base;  // == kk
        if (kk == k) {
            max_tie = max_u32(max_tie);
            // the largest kept entry, plus one: equal keys cannot come again (indices are
            // unique), and a key below it still enters
            bound = (((unsigned long long)tau << 32) | max_tie) + 1ull;
            shrunk = true;
        }
    }

    // Offers the refs pts[j0, j1) (their packed keys) to the buffer.
    __device__ void offer_run(const Point4<float>* __restrict__ pts, int32_t j0, int32_t j1,
                              float qx, float qy, float qz) {
        const int lane = threadIdx.x & 31;
        const uint32_t lt = lanes_below();
        for (int32_t j = j0; j < j1; j += 32) {
            unsigned long long e = ~0ull;
            if (j + lane < j1) {
                const Point4<float> r = pts[j + lane];
                const float d = finite_distance(qx, qy, qz, r);
                const uint32_t u = __float_as_uint(d);
                if (u < 0x7f800000u)  // +inf and NaN are never neighbours
                    e = ((unsigned long long)u << 32) | (uint32_t)point_id(r);
            }
            const bool take = e < bound;
            const uint32_t bs = __ballot_sync(0xffffffffu, take);
            if (bs == 0u) continue;
            if (count + __popc(bs) > kGridSelectCap) shrink();  // warp-uniform
            const bool take2 = e < bound;  // the bound may have dropped
            const uint32_t b2 = __ballot_sync(0xffffffffu, take2);
            if (take2) buf[count + __popc(b2 & lt)] = e;
            count += __popc(b2);
        }
        __syncwarp();
    }
    // grid_walk's list interface: the k-th distance, once k candidates were kept
    __device__ bool full() const { return shrunk; }
    __device__ float threshold() const { return __uint_as_float((uint32_t)(bound >> 32)); }
};

// grid_walk's hooks for the grid select: a run of refs goes to the buffer, and a ring with k
// candidates ends with a shrink (its k-th distance then bounds the rest of the walk).
__device__ __forceinline__ void scan_run(const Point4<float>* __restrict__ pts, int32_t j,
                                         int32_t end, float qx, float qy, float qz,
                                         GridSelect& sel) {
    sel.offer_run(pts, j, end, qx, qy, qz);
}
__device__ __forceinline__ void ring_done(GridSelect& sel) {
    if (sel.count >= sel.k) sel.shrink();
}

// One warp per query (B * M warps, in the queries' cell order); dynamic shared memory:
// kGridSelectCap entries per warp.
__global__ void __launch_bounds__(32 * kGridSelectWarps)
knn_grid_select_kernel(const float* __restrict__ query, GridParams p,
                       const Point4<float>* __restrict__ pts, float* __restrict__ out_d,
                       int64_t* __restrict__ out_i, const int32_t* __restrict__ order) {
    extern __shared__ unsigned long long grid_select_buf[];
    const int warp = threadIdx.x >> 5;
    int64_t t = (int64_t)blockIdx.x * kGridSelectWarps + warp;
    if (t >= p.B * p.M) return;  // warp-uniform
    const int64_t b = t / p.M;
    t = b * p.M + order[t];
    const int64_t m = t % p.M;
    const int k = p.k;
    GridSelect sel{grid_select_buf + (int64_t)warp * kGridSelectCap, 0, k, ~0ull, false};
    const float* q = query + t * 3;
    const float qx = q[0], qy = q[1], qz = q[2];
    if (m < pcops_valid_length(p.query_lengths, b, p.M)) {
        grid_walk<float>(p, b, pts, qx, qy, qz, sel);
        if (sel.count > k) sel.shrink();
    }
    write_selected(sel.buf, sel.count, k, out_d + t * k, out_i + t * k);
}

// ------------------------------------------------------------------------------------------
// kernel launchers

template <>
struct KnnPath<PCOPS_KNN_GRID_SELECT> {
    static constexpr bool kGrid = true;
    static bool takes(const KnnSizes& s) {
        return s.dtype == PCOPS_FLOAT32 && s.K <= kGridSelectMaxK;
    }
    template <typename T>
    static cudaError_t launch(const pcops_knn_cuda_plan& plan, const KnnArgs<T>& a) {
        if constexpr (std::is_same<T, float>::value) {
            GridParams p;
            const Point4<T>* pts;
            const int32_t* order;
            cudaError_t err = build_grid<T>(plan, a, &p, &pts, &order);
            if (err != cudaSuccess) return err;
            const int64_t blocks = (plan.B * plan.M + kGridSelectWarps - 1) / kGridSelectWarps;
            if (blocks > INT_MAX) return cudaErrorInvalidValue;
            const size_t smem =
                (size_t)kGridSelectWarps * kGridSelectCap * sizeof(unsigned long long);
            knn_grid_select_kernel<<<(unsigned)blocks, 32 * kGridSelectWarps, smem, a.stream>>>(
                a.query, p, pts, a.dist2, a.idx, order);
            return cudaGetLastError();
        } else {
            return cudaErrorInvalidValue;  // float32 only (takes)
        }
    }
};

}  // namespace
