/*
 * knn/warp_select.cuh -- path "warp_select" (float32, N <= kSelectMaxN = 1024): a warp per
 * query holds all the query's keys in registers and selects the k smallest by their bits; no
 * list to insert into.
 *
 * What it does: lane l computes the keys of refs j = 32 i + l (i < R, R = N / 32 rounded up to
 * 8, 16 or 32): the float bits of the squared distance (non-negative, so their unsigned order
 * is the float order), kSelectNever for a ref that can never be a neighbour (j >= L, a distance
 * of +inf or NaN). The kk-th smallest valid key (kk = min(k, valid refs)) is found bit by bit
 * from the top: tau gains bit b when fewer than kk keys are below tau | 2^b (a warp sum of
 * per-lane counts a bit, 31 bits). The answer is then every key below tau and, among the keys
 * equal to tau, the ones of lowest index until there are kk (the ballots run in index order).
 * For kk <= 64 the search runs only on the keys at or below a bound taken from the lanes'
 * second smallest keys (select_filtered). The selected keys are gathered in the warp's shared
 * buffer as packed 64-bit (dist2 bits, idx) keys and written out sorted (write_selected: in
 * registers up to 32, else a bitonic sort in the buffer); slots past kk get (+inf, -1).
 *
 * When it wins: small float32 clouds (up to 1024 refs) from moderate k on: one launch, and its
 * cost barely grows with k, where a register list's insertion grows with k and the heap's
 * grows faster (knn/plan.cuh).
 *
 * Invariants: every step is a count or a compare of the same float bits the other paths
 * compare, and ties at tau go to the lowest indices: exactly the kk smallest (dist2, idx) keys,
 * the other paths' bits. The bit search and the gather (warp_kth_key, warp_gather_selected,
 * write_selected) are shared with the grid select (knn/grid_select.cuh).
 */
#pragma once

#include <climits>
#include <cstdint>

#include "../warp.cuh"
#include "common.cuh"

namespace {

using pcops_warp::max_u32;
using pcops_warp::sum_u32;

constexpr int kSelectWarps = 4;                  // queries (warps) per block
constexpr uint32_t kSelectNever = 0x7fffffffu;   // above every finite float's bits

__device__ __forceinline__ uint32_t lanes_below() {
    uint32_t m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

// Sorts buf[0, n) (n a power of two, n >= 2) ascending with the 32 lanes of the warp.
__device__ __forceinline__ void warp_bitonic_sort(unsigned long long* buf, int n) {
    const int lane = threadIdx.x & 31;
    for (int size = 2; size <= n; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = lane; t < (n >> 1); t += 32) {
                // the t-th position with bit `stride` clear (stride a power of two)
                const int i = ((t & ~(stride - 1)) << 1) | (t & (stride - 1));
                const int j = i + stride;
                const unsigned long long a = buf[i], b = buf[j];
                const bool up = (i & size) == 0;
                if ((a > b) == up) {
                    buf[i] = b;
                    buf[j] = a;
                }
            }
            __syncwarp();
        }
    }
}

// c + (key >= cand): the carry of key - cand added in (two instructions, where the compare and
// a select into a running count take three, in a chain).
__device__ __forceinline__ unsigned add_if_not_below(unsigned c, uint32_t key, uint32_t cand) {
    unsigned r;
    asm("{\n\t.reg .u32 diff;\n\tsub.cc.u32 diff, %1, %2;\n\taddc.u32 %0, %3, 0;\n\t}"
        : "=r"(r)
        : "r"(key), "r"(cand), "r"(c));
    return r;
}

// The kk-th smallest of the warp's keys (slots i < S of every lane: key_at(i); kk >= 1 and at
// most the number of keys below kSelectNever): tau takes bit b, from the top, when fewer than kk
// keys are below tau | 2^b.
template <int S, typename KeyAt>
__device__ __forceinline__ uint32_t warp_kth_key(KeyAt key_at, int kk) {
    uint32_t tau = 0;
    for (int bit = 30; bit >= 0; --bit) {
        const uint32_t cand = tau | (1u << bit);
        unsigned ge0 = 0, ge1 = 0;  // two counts: two independent chains
#pragma unroll
        for (int i = 0; i < S; i += 2) {
            ge0 = add_if_not_below(ge0, key_at(i), cand);
            if (i + 1 < S) ge1 = add_if_not_below(ge1, key_at(i + 1), cand);
        }
        const int below = 32 * S - (int)sum_u32(ge0 + ge1);
        if (below < kk) tau = cand;
    }
    return tau;
}

// Writes to buf[0, kk), in slot order (slot i of lane l before slot i of lane l + 1, before slot
// i + 1 of lane 0: the index order), entry_at(i) of every slot whose key is below tau, then of
// the first slots whose key equals tau until there are kk.
template <int S, typename KeyAt, typename EntryAt>
__device__ __forceinline__ void warp_gather_selected(KeyAt key_at, EntryAt entry_at,
                                                     uint32_t tau, int kk,
                                                     unsigned long long* buf) {
    int below = 0;
#pragma unroll
    for (int i = 0; i < S; ++i) below += key_at(i) < tau;
    const int need = kk - (int)sum_u32((unsigned)below);
    const uint32_t lt = lanes_below();
    int base = 0, ties = 0;
#pragma unroll
    for (int i = 0; i < S; ++i) {
        const uint32_t key = key_at(i);
        const bool eq = key == tau;
        const uint32_t be = __ballot_sync(0xffffffffu, eq);
        const bool sel = key < tau || (eq && ties + __popc(be & lt) < need);
        ties += __popc(be);
        const uint32_t bs = __ballot_sync(0xffffffffu, sel);
        if (sel) buf[base + __popc(bs & lt)] = entry_at(i);
        base += __popc(bs);
    }
}

// Slots of candidates the filtered select holds in registers (32 entries a slot).
constexpr int kSelectSlots = 8;

// The select for kk <= 64 with the keys filtered first: every lane's second smallest key, the
// ceil(kk / 2)-th smallest of those (U) has at least kk keys <= U below or at it (two in each of
// ceil(kk / 2) lanes), so the kk smallest keys are all <= U. The keys <= U (candidates) are
// gathered in index order into buf, read back as packed (key, index) entries, kSelectSlots per
// lane at most, and the bit search and the gather run on those few. Returns false (buf
// untouched: nothing written) where there are more candidates than that.
template <int R>
__device__ __forceinline__ bool select_filtered(const uint32_t (&key)[R], int kk,
                                                unsigned long long* buf) {
    const int lane = threadIdx.x & 31;
    uint32_t a0 = kSelectNever, a1 = kSelectNever;  // the lane's two smallest keys
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const uint32_t hi = max(a0, key[i]);
        a0 = min(a0, key[i]);
        a1 = min(a1, hi);
    }
    // the lanes' a1 sorted across the warp (bitonic, one value a lane)
    uint32_t v = a1;
#pragma unroll
    for (int size = 2; size <= 32; size <<= 1) {
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            const uint32_t other = __shfl_xor_sync(0xffffffffu, v, stride);
            const bool keep_min = ((lane & stride) == 0) == ((lane & size) == 0);
            v = keep_min ? min(v, other) : max(v, other);
        }
    }
    const uint32_t U = __shfl_sync(0xffffffffu, v, (kk + 1) / 2 - 1);
    if (U == kSelectNever) return false;  // a lane with fewer than two keys: no bound
    int c = 0;
#pragma unroll
    for (int i = 0; i < R; ++i) c += key[i] <= U;
    const int C = (int)sum_u32((unsigned)c);
    if (C > 32 * kSelectSlots) return false;
    const uint32_t lt = lanes_below();
    int base = 0;
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const bool sel = key[i] <= U;
        const uint32_t bs = __ballot_sync(0xffffffffu, sel);
        if (sel)
            buf[base + __popc(bs & lt)] =
                ((unsigned long long)key[i] << 32) | (unsigned)(32 * i + lane);
        base += __popc(bs);
    }
    __syncwarp();
    unsigned long long e[kSelectSlots];
#pragma unroll
    for (int i = 0; i < kSelectSlots; ++i) e[i] = 32 * i + lane < C ? buf[32 * i + lane] : ~0ull;
    __syncwarp();  // every entry is read before the gather below overwrites buf
    auto key_at = [&](int i) { return (uint32_t)(e[i] >> 32); };  // empty: 0xffffffff
    auto entry_at = [&](int i) { return e[i]; };
    if (C <= 32 * (kSelectSlots / 2)) {
        const uint32_t tau = warp_kth_key<kSelectSlots / 2>(key_at, kk);
        warp_gather_selected<kSelectSlots / 2>(key_at, entry_at, tau, kk, buf);
    } else {
        const uint32_t tau = warp_kth_key<kSelectSlots>(key_at, kk);
        warp_gather_selected<kSelectSlots>(key_at, entry_at, tau, kk, buf);
    }
    return true;
}

// Sorts the warp's 32 entries (one a lane) ascending across the lanes, in registers.
__device__ __forceinline__ unsigned long long warp_sort32(unsigned long long v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int size = 2; size <= 32; size <<= 1) {
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            const unsigned long long other = __shfl_xor_sync(0xffffffffu, v, stride);
            const bool keep_min = ((lane & stride) == 0) == ((lane & size) == 0);
            v = keep_min ? (other < v ? other : v) : (other > v ? other : v);
        }
    }
    return v;
}

// Writes a query's row: the kk packed (dist2 bits, idx) entries of buf sorted (in registers for
// kk <= 32, else by the bitonic sort in buf, which holds the next power of two >= max(kk, 64)
// entries), then (+inf, -1) up to k. buf's entries must be visible to the whole warp.
__device__ __forceinline__ void write_selected(unsigned long long* buf, int kk, int k,
                                               float* od, int64_t* oi) {
    const int lane = threadIdx.x & 31;
    if (kk > 0 && kk <= 32) {
        unsigned long long e = lane < kk ? buf[lane] : ~0ull;
        e = warp_sort32(e);
        if (lane < kk) {
            od[lane] = __uint_as_float((uint32_t)(e >> 32));
            oi[lane] = (int64_t)(uint32_t)e;
        }
    } else if (kk > 32) {
        int n = 64;
        while (n < kk) n <<= 1;
        for (int s = kk + lane; s < n; s += 32) buf[s] = ~0ull;
        __syncwarp();
        warp_bitonic_sort(buf, n);
        for (int s = lane; s < kk; s += 32) {
            const unsigned long long e = buf[s];
            od[s] = __uint_as_float((uint32_t)(e >> 32));
            oi[s] = (int64_t)(uint32_t)e;
        }
    }
    for (int s = kk + lane; s < k; s += 32) {
        od[s] = INFINITY;
        oi[s] = -1;
    }
}

// Grid: ceil(B * M / kSelectWarps) blocks of 32 * kSelectWarps threads; dynamic shared memory:
// buf_n entries per warp (select_buf_entries).
template <int R>
__global__ void __launch_bounds__(32 * kSelectWarps)
knn_warp_select_kernel(const float* __restrict__ query, const float* __restrict__ ref,
                       KnnParams p, int64_t B, int buf_n, float* __restrict__ out_d,
                       int64_t* __restrict__ out_i) {
    extern __shared__ unsigned long long select_buf[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int64_t t = (int64_t)blockIdx.x * kSelectWarps + warp;  // the query of this warp
    if (t >= B * p.M) return;  // warp-uniform
    unsigned long long* buf = select_buf + (int64_t)warp * buf_n;
    const int64_t b = t / p.M;
    const int64_t m = t - b * p.M;
    const int64_t L = pcops_valid_length(p.ref_lengths, b, p.N);
    const int k = p.k;
    float* od = out_d + t * k;
    int64_t* oi = out_i + t * k;
    int kk = 0;
    if (m < pcops_valid_length(p.query_lengths, b, p.M)) {
        const float* q = query + t * 3;
        const float qx = staged_x(q[0], q[1], q[2]), qy = q[1], qz = q[2];
        const float* cloud = ref + b * p.N * 3;
        uint32_t key[R];
        int valid = 0;
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const int64_t j = 32 * i + lane;
            // Only the loads are conditional (predicated, so that the R loads of a lane are in
            // flight together); the ref is staged as it is loaded (a non-finite one: NaN) and
            // the distance saturated, without a branch.
            float rx = 0.f, ry = 0.f, rz = 0.f;
            if (j < L) {
                const float* r = cloud + 3 * j;
                rx = r[0];
                ry = r[1];
                rz = r[2];
            }
            const float d = pcops_dist2_sat_f32(
                pcops_dist2_f32(qx, qy, qz, staged_x(rx, ry, rz), ry, rz));
            const uint32_t u = __float_as_uint(d);
            key[i] = j < L && u < 0x7f800000u ? u : kSelectNever;  // +inf, NaN: never neighbours
            valid += key[i] != kSelectNever;
        }
        valid = (int)sum_u32((unsigned)valid);
        kk = valid < k ? valid : k;
        if (kk > 0) {
            bool done = false;
            if constexpr (R >= 16) {
                // buf holds 256 entries where k <= 64 (select_buf_entries); where k > 64 but
                // kk <= 64 (fewer valid refs), at most kk <= 64 candidates are written
                if (kk <= 64) done = select_filtered<R>(key, kk, buf);
            }
            if (!done) {
                const uint32_t tau = warp_kth_key<R>([&](int i) { return key[i]; }, kk);
                warp_gather_selected<R>(
                    [&](int i) { return key[i]; },
                    [&](int i) {
                        return ((unsigned long long)key[i] << 32) | (unsigned)(32 * i + lane);
                    },
                    tau, kk, buf);
            }
            __syncwarp();
        }
    }
    write_selected(buf, kk, k, od, oi);
}

// ------------------------------------------------------------------------------------------
// kernel launchers

// The warp select holds a query's keys in registers: float32 clouds of at most 32 * 32 refs.
constexpr int64_t kSelectMaxN = 32 * 32;

// Entries of the warp select's shared buffer per warp: the sort of min(k, N) keys (the next
// power of two, at least 2) and, where the filtered select can run (N > 256, k <= 64), its
// candidates.
int select_buf_entries(int64_t K, int64_t N) {
    const int64_t cap = K < N ? K : N;
    int n = 2;
    while (n < cap) n <<= 1;
    if (N > 256 && K <= 64 && n < 32 * kSelectSlots) n = 32 * kSelectSlots;
    return n;
}

template <>
struct KnnPath<PCOPS_KNN_WARP_SELECT> {
    static constexpr bool kGrid = false;
    static bool takes(const KnnSizes& s) {
        return s.dtype == PCOPS_FLOAT32 && s.N <= kSelectMaxN;
    }
    template <typename T>
    static cudaError_t launch(const pcops_knn_cuda_plan& plan, const KnnArgs<T>& a) {
        if constexpr (std::is_same<T, float>::value) {
            const int64_t B = plan.B, M = plan.M, N = plan.N, K = plan.K;
            KnnParams p{};
            p.query_lengths = a.query_lengths;
            p.ref_lengths = a.ref_lengths;
            p.M = M;
            p.N = N;
            p.k = (int)K;
            const int64_t blocks = (B * M + kSelectWarps - 1) / kSelectWarps;
            if (blocks > INT_MAX) return cudaErrorInvalidValue;
            const int buf_n = select_buf_entries(K, N);
            const size_t smem = (size_t)kSelectWarps * buf_n * sizeof(unsigned long long);
            const unsigned g = (unsigned)blocks;
            constexpr int kT = 32 * kSelectWarps;
            const cudaStream_t stream = a.stream;
            if (N <= 256)
                knn_warp_select_kernel<8><<<g, kT, smem, stream>>>(a.query, a.ref, p, B, buf_n,
                                                                   a.dist2, a.idx);
            else if (N <= 512)
                knn_warp_select_kernel<16><<<g, kT, smem, stream>>>(a.query, a.ref, p, B, buf_n,
                                                                    a.dist2, a.idx);
            else
                knn_warp_select_kernel<32><<<g, kT, smem, stream>>>(a.query, a.ref, p, B, buf_n,
                                                                    a.dist2, a.idx);
            return cudaGetLastError();
        } else {
            return cudaErrorInvalidValue;  // float32 only (takes)
        }
    }
};

}  // namespace
