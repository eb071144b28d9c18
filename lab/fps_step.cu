/*
 * fps_step.cu -- the latency of one FPS step on small clouds (32 clouds of 1024 points -> 512
 * samples by default), the register block path against variants of its reduction: where the
 * candidates meet (slots and a second pair of redux, a 64-bit shared atomic max, or every thread
 * reading every slot) and where the sample's coordinates come from (global memory or a shared
 * copy of the cloud). Each variant is checked bit for bit against the library's path. Built on
 * the library's internal FPS header (kernels/fps/common.cuh: the point sets, the candidates and
 * their reductions) and linked with the kernels library for the library's own path; needs a
 * GPU to run (CUDA only, not part of `make -C lab run`):
 *
 *   make -C lab step                  -> lab/build/cuda/fps_step
 *   lab/build/cuda/fps_step [B N npoint]
 */
#include "fps/common.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

// (key, index) of a float temp as one word whose unsigned order is farther()'s: the key's sign
// flipped (negative keys, -1 and -inf, below every temp >= 0), the index complemented (ties to
// the lower index).
__device__ __forceinline__ unsigned long long pack_key(int key, int index) {
    return ((unsigned long long)((uint32_t)key ^ 0x80000000u) << 32) |
           (unsigned long long)(0xffffffffu - (uint32_t)index);
}

// Block b's cloud and output rows (one cloud a block, every cloud N points).
struct LabRow {
    const float* cloud;
    int64_t* idx;
    float* dist2;
    int L, n_out;
    __device__ LabRow(const float* xyz, int64_t N, int64_t npoint, int64_t* idx_all,
                      float* dist2_all)
        : cloud(xyz + (int64_t)blockIdx.x * N * 3), idx(idx_all + (int64_t)blockIdx.x * npoint),
          dist2(dist2_all + (int64_t)blockIdx.x * npoint), L((int)N),
          n_out((int)(npoint < N ? npoint : N)) {}
};

// The library's earlier reduction (kept here as the lab's baseline): lane 0 stores
// the warp's (key, index) to its slot, one barrier, lane q < warps reads slot q, two redux.
__device__ __forceinline__ Candidate<float> slots_two_redux(int key, int index, uint32_t write_at,
                                                            uint32_t read_at, bool reads,
                                                            int warps, int barrier_id) {
    const int top = pcops_warp::max_i32(key);
    const uint32_t id = pcops_warp::min_u32(key == top ? (uint32_t)index : 0xffffffffu);
    if (warps == 1) return {__int_as_float(top), (int)id};
    asm volatile("{\n\t.reg .pred p;\n\tsetp.eq.u32 p, %0, 0;\n\t"
                 "@p st.shared.v2.b32 [%1], {%2, %3};\n\t}" ::"r"(threadIdx.x & 31),
                 "r"(write_at), "r"(top), "r"(id)
                 : "memory");
    named_barrier(barrier_id, warps * 32);
    int kq = INT_MIN;
    uint32_t iq = 0xffffffffu;
    if (reads)
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(kq), "=r"(iq) : "r"(read_at) : "memory");
    const int top2 = pcops_warp::max_i32(kq);
    const uint32_t id2 = pcops_warp::min_u32(kq == top2 ? iq : 0xffffffffu);
    return {__int_as_float(top2), (int)id2};
}

// MODE: 0 the library's earlier reduction (slots, barrier, two redux), coordinates from global
//         memory
//       1 the same, coordinates from a shared float4 copy of the cloud
//       2 one redux (the warp's largest key); the lanes holding it do a 64-bit shared atomic max
//         of the packed (key, index) into one of three words; barrier; every thread reads it.
//         Coordinates from the shared copy.
//       3 as 2, coordinates from global memory
//       4 two redux; lane 0 stores the packed word in the warp's slot; barrier; every thread
//         reads all slots and takes the largest. Coordinates from the shared copy.
//       5 as 2, but two redux and lane 0's atomic (one atomic a warp)
template <int PPT, int MODE>
__global__ void __launch_bounds__(max_threads<RegisterPoints<float, PPT>, float>())
step_kernel(const float* __restrict__ xyz, int64_t N, int64_t npoint, int64_t* __restrict__ idx,
            float* __restrict__ dist2) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int warps = blockDim.x >> 5;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const LabRow row(xyz, N, npoint, idx, dist2);
    const float* cloud = row.cloud;
    int64_t* row_idx = row.idx;
    float* row_d = row.dist2;
    const int L = row.L, n_out = row.n_out;
    RegisterPoints<float, PPT> pts;
    pts.load(cloud, nullptr, threadIdx.x, L, blockDim.x);
    // shared: [0, 64) words/slots; [64, ...) the cloud as float4
    unsigned long long* words = reinterpret_cast<unsigned long long*>(smem);
    float4* pts4 = reinterpret_cast<float4*>(smem + 64 * 8);
    if (MODE == 1 || MODE == 2 || MODE == 4 || MODE == 5)
        for (int n = threadIdx.x; n < L; n += blockDim.x)
            pts4[n] = make_float4(cloud[3 * n], cloud[3 * n + 1], cloud[3 * n + 2], 0.f);
    if (threadIdx.x < 64) words[threadIdx.x] = 0ull;
    __syncthreads();
    int cur = 0;
    if (threadIdx.x == 0) {
        row_idx[0] = 0;
        row_d[0] = 0.f;
    }
    const uint32_t slots = shared_address(smem);
    const uint32_t write0 = slots + (uint32_t)w * 8, read0 = slots + (uint32_t)lane * 8;
    const uint32_t half = (uint32_t)warps * 8;
    const bool reads = lane < warps;
    const uint32_t pts_at = shared_address(pts4);
    float cx, cy, cz;
    if (MODE == 0 || MODE == 3) {
        load_point_at(cloud, cur, cx, cy, cz);
    } else {
        float4 p = pts4[cur];
        cx = p.x, cy = p.y, cz = p.z;
    }
    for (int j = 1; j < n_out; ++j) {
        int key, index;
        pts.step_key(cur, cx, cy, cz, key, index);
        Candidate<float> c;
        if constexpr (MODE == 0 || MODE == 1) {
            const uint32_t flip = (j & 1) ? half : 0u;
            c = slots_two_redux(key, index, write0 + flip, read0 + flip, reads, warps, 1);
        } else if constexpr (MODE == 2 || MODE == 3 || MODE == 5) {
            const int s = j % 3;
            if (threadIdx.x == 0) words[(j + 1) % 3] = 0ull;  // read two steps ago
            const int top = pcops_warp::max_i32(key);
            if constexpr (MODE == 5) {
                const uint32_t id =
                    pcops_warp::min_u32(key == top ? (uint32_t)index : 0xffffffffu);
                if (lane == 0) atomicMax(&words[s], pack_key(top, (int)id));
            } else {
                if (key == top) atomicMax(&words[s], pack_key(key, index));
            }
            named_barrier(1, blockDim.x);
            const unsigned long long v = *(volatile unsigned long long*)&words[s];
            c.index = (int)(0xffffffffu - (uint32_t)v);
            c.value = __int_as_float((int)((uint32_t)(v >> 32) ^ 0x80000000u));
        } else {  // MODE 4
            const uint32_t flip = (j & 1) ? 32u : 0u;
            const int top = pcops_warp::max_i32(key);
            const uint32_t id = pcops_warp::min_u32(key == top ? (uint32_t)index : 0xffffffffu);
            if (lane == 0) words[flip + w] = pack_key(top, (int)id);
            named_barrier(1, blockDim.x);
            // warps <= 8 (run_variant): slots past `warps` hold 0 (never written)
            const ulonglong2* q2 = reinterpret_cast<const ulonglong2*>(words + flip);
            const ulonglong2 a0 = q2[0], a1 = q2[1], a2 = q2[2], a3 = q2[3];
            auto mx = [](unsigned long long u, unsigned long long v) { return u > v ? u : v; };
            unsigned long long m[1] = {
                mx(mx(mx(a0.x, a0.y), mx(a1.x, a1.y)), mx(mx(a2.x, a2.y), mx(a3.x, a3.y)))};
            c.index = (int)(0xffffffffu - (uint32_t)m[0]);
            c.value = __int_as_float((int)((uint32_t)(m[0] >> 32) ^ 0x80000000u));
        }
        store_sample(threadIdx.x == 0, row_idx + j, row_d + j, c);
        cur = c.index;
        if (MODE == 0 || MODE == 3) {
            load_point_at(cloud, cur, cx, cy, cz);
        } else {
            float4 p;
            asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(p.x), "=f"(p.y), "=f"(p.z), "=f"(p.w)
                         : "r"(pts_at + 16u * (uint32_t)cur)
                         : "memory");
            cx = p.x, cy = p.y, cz = p.z;
        }
    }
    for (int64_t j = n_out + threadIdx.x; j < npoint; j += blockDim.x) {
        row_idx[j] = -1;
        row_d[j] = 0.f;
    }
}


// Cycles of each part of a step of the library's reduction (mode 0), lane 0 of every warp of
// block 0, summed over the steps: a value is "ready" when a shared store of it has issued
// (the store waits for its register), then the clock is read.
__device__ __forceinline__ void sink(uint32_t at, uint32_t v) {
    asm volatile("st.volatile.shared.u32 [%0], %1;" ::"r"(at), "r"(v) : "memory");
}
__device__ __forceinline__ long long now() {
    long long t;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
    return t;
}
template <int PPT>
__global__ void __launch_bounds__(max_threads<RegisterPoints<float, PPT>, float>())
phase_kernel(const float* __restrict__ xyz, int64_t N, int64_t npoint, int64_t* __restrict__ idx,
             float* __restrict__ dist2, long long* __restrict__ cycles) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int warps = blockDim.x >> 5;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const LabRow row(xyz, N, npoint, idx, dist2);
    const float* cloud = row.cloud;
    int64_t* row_idx = row.idx;
    float* row_d = row.dist2;
    const int L = row.L, n_out = row.n_out;
    RegisterPoints<float, PPT> pts;
    pts.load(cloud, nullptr, threadIdx.x, L, blockDim.x);
    const uint32_t sinkat = shared_address(smem) + 1024u + 4u * threadIdx.x;
    __syncthreads();
    int cur = 0;
    const uint32_t slots = shared_address(smem);
    const uint32_t write0 = slots + (uint32_t)w * 8, read0 = slots + (uint32_t)lane * 8;
    const uint32_t half = (uint32_t)warps * 8;
    const bool reads = lane < warps;
    long long acc[6] = {0, 0, 0, 0, 0, 0};
    float cx, cy, cz;
    load_point_at(cloud, cur, cx, cy, cz);
    for (int j = 1; j < n_out; ++j) {
        sink(sinkat, __float_as_uint(cx) ^ __float_as_uint(cy) ^ __float_as_uint(cz));
        const long long t0 = now();
        int key, index;
        pts.step_key(cur, cx, cy, cz, key, index);
        sink(sinkat, (uint32_t)(key ^ index));
        const long long t1 = now();
        const uint32_t flip = (j & 1) ? half : 0u;
        const int top = pcops_warp::max_i32(key);
        const uint32_t id = pcops_warp::min_u32(key == top ? (uint32_t)index : 0xffffffffu);
        sink(sinkat, id);
        const long long t2 = now();
        asm volatile("{\n\t.reg .pred p;\n\tsetp.eq.u32 p, %0, 0;\n\t"
                     "@p st.shared.v2.b32 [%1], {%2, %3};\n\t}" ::"r"(lane),
                     "r"(write0 + flip), "r"(top), "r"(id)
                     : "memory");
        named_barrier(1, warps * 32);
        const long long t3 = now();
        int kq = INT_MIN;
        uint32_t iq = 0xffffffffu;
        if (reads)
            asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];"
                         : "=r"(kq), "=r"(iq)
                         : "r"(read0 + flip)
                         : "memory");
        sink(sinkat, (uint32_t)kq ^ iq);
        const long long t4 = now();
        const int top2 = pcops_warp::max_i32(kq);
        const uint32_t id2 = pcops_warp::min_u32(kq == top2 ? iq : 0xffffffffu);
        sink(sinkat, id2);
        const long long t5 = now();
        Candidate<float> c = {__int_as_float(top2), (int)id2};
        store_sample(threadIdx.x == 0, row_idx + j, row_d + j, c);
        cur = c.index;
        load_point_at(cloud, cur, cx, cy, cz);
        acc[0] += t1 - t0;
        acc[1] += t2 - t1;
        acc[2] += t3 - t2;
        acc[3] += t4 - t3;
        acc[4] += t5 - t4;
        acc[5] += now() - t0;
    }
    if (blockIdx.x == 0 && lane == 0)
        for (int q = 0; q < 6; ++q) cycles[w * 6 + q] = acc[q] / (n_out - 1);
}

// Dependent chains: 256 threads, `reps` links each; cycles per link for lane 0 of warp 0.
__global__ void latency_kernel(long long* out, int reps, const float* g) {
    __shared__ uint32_t sh[1024];
    const int lane = threadIdx.x & 31;
    sh[threadIdx.x] = threadIdx.x & 7;
    __syncthreads();
    uint32_t v = threadIdx.x;
    long long t0 = now();
    for (int r = 0; r < reps; ++r) v = __reduce_max_sync(0xffffffffu, v) + lane;
    long long t1 = now();
    for (int r = 0; r < reps; ++r) v = __shfl_sync(0xffffffffu, v, (v + 1) & 31);
    long long t2 = now();
    for (int r = 0; r < reps; ++r) v = sh[v & 7];
    long long t3 = now();
    for (int r = 0; r < reps; ++r) {
        v += threadIdx.x;
        __syncthreads();
    }
    long long t4 = now();
    float f = 0.f;
    for (int r = 0; r < reps; ++r) f = __ldg(g + ((__float_as_uint(f) + v) & 7));
    long long t5 = now();
    for (int r = 0; r < reps; ++r) v = __ballot_sync(0xffffffffu, (v >> lane) & 1) + lane;
    long long t6 = now();
    if (threadIdx.x == 0) {
        out[0] = (t1 - t0) / reps;
        out[1] = (t2 - t1) / reps;
        out[2] = (t3 - t2) / reps;
        out[3] = (t4 - t3) / reps;
        out[4] = (t5 - t4) / reps;
        out[5] = (t6 - t5) / reps;
        out[6] = v + (int)f;
    }
}

void phases(const float* dx, int64_t B, int64_t N, int64_t npoint, int64_t* di, float* dd) {
    long long* dc;
    cudaMalloc(&dc, 8 * 6 * 32);
    const int threads = (int)((N + 127) / 128) * 32;
    phase_kernel<4><<<(unsigned)B, threads, 4096>>>(dx, N, npoint, di, dd, dc);
    long long h[6 * 32];
    cudaMemcpy(h, dc, sizeof(h), cudaMemcpyDeviceToHost);
    printf("phases (cycles a step, lane 0 of each warp, block 0): update / warp redux / "
           "store+barrier / slot load / redux2 / whole step\n");
    for (int w = 0; w < threads / 32; ++w)
        printf("  warp %d: %lld %lld %lld %lld %lld  step %lld\n", w, h[w * 6], h[w * 6 + 1],
               h[w * 6 + 2], h[w * 6 + 3], h[w * 6 + 4], h[w * 6 + 5]);
    latency_kernel<<<1, 256>>>(dc, 1000, dx);
    cudaMemcpy(h, dc, 7 * 8, cudaMemcpyDeviceToHost);
    printf("latency a link (cycles): redux %lld, shfl %lld, lds %lld, syncthreads(256) %lld, "
           "ldg L1 %lld, ballot %lld\n", h[0], h[1], h[2], h[3], h[4], h[5]);
    cudaFree(dc);
}


// Blocked (thread t owns points t * PPT .. t * PPT + PPT - 1, so lane order and warp order are
// index order) or strided (the library's) assignment, and two ways for each reduction level:
//   MODE 6: blocked; warp: redux max + ballot, the lowest lane holding the max writes its
//           (key, index); block: every thread reads the 8 slots (4 x LDS.128) and takes the
//           first largest key by a pairwise tree
//   MODE 7: blocked; warp: two redux, lane 0 writes; block: the tree of MODE 6
//   MODE 8: blocked; warp: redux + ballot (MODE 6); block: lane q reads slot q, two redux
//   MODE 9: strided; warp: two redux; block: a tree with the full (key, -index) order
// Slots: [parity][keys 8][indices 8] ints; slots of absent warps hold (INT_MIN, INT_MAX).
template <int PPT, int MODE>
__global__ void __launch_bounds__(max_threads<RegisterPoints<float, PPT>, float>())
tree_kernel(const float* __restrict__ xyz, int64_t N, int64_t npoint, int64_t* __restrict__ idx,
            float* __restrict__ dist2) {
    __shared__ __align__(16) int sl[2][16];
    const int warps = blockDim.x >> 5;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const LabRow row(xyz, N, npoint, idx, dist2);
    const float* cloud = row.cloud;
    int64_t* row_idx = row.idx;
    float* row_d = row.dist2;
    const int L = row.L, n_out = row.n_out;
    constexpr bool kBlocked = MODE != 9;
    RegisterPoints<float, PPT> pts;
    if (kBlocked) pts.load(cloud, nullptr, threadIdx.x * PPT, L, 1);
    else pts.load(cloud, nullptr, threadIdx.x, L, blockDim.x);
    if (threadIdx.x < 32) (&sl[0][0])[threadIdx.x] = (threadIdx.x & 8) ? INT_MAX : INT_MIN;
    __syncthreads();
    int cur = 0;
    if (threadIdx.x == 0) {
        row_idx[0] = 0;
        row_d[0] = 0.f;
    }
    const uint32_t base = shared_address(&sl[0][0]);
    for (int j = 1; j < n_out; ++j) {
        float cx, cy, cz;
        load_point_at(cloud, cur, cx, cy, cz);
        int key, index;
        pts.step_key(cur, cx, cy, cz, key, index);
        const uint32_t par = base + ((j & 1) ? 64u : 0u);
        const int top = pcops_warp::max_i32(key);
        if constexpr (MODE == 6 || MODE == 8) {
            const uint32_t bal = __ballot_sync(0xffffffffu, key == top);
            const bool writer = lane == __ffs(bal) - 1;
            asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %0, 0;\n\t"
                         "@p st.shared.b32 [%1], %2;\n\t@p st.shared.b32 [%1+32], %3;\n\t}" ::"r"(
                             (unsigned)writer),
                         "r"(par + 4u * w), "r"(top), "r"(index)
                         : "memory");
        } else {
            const uint32_t id = pcops_warp::min_u32(key == top ? (uint32_t)index : 0xffffffffu);
            asm volatile("{\n\t.reg .pred p;\n\tsetp.eq.u32 p, %0, 0;\n\t"
                         "@p st.shared.b32 [%1], %2;\n\t@p st.shared.b32 [%1+32], %3;\n\t}" ::"r"(
                             lane),
                         "r"(par + 4u * w), "r"(top), "r"(id)
                         : "memory");
        }
        named_barrier(1, warps * 32);
        Candidate<float> c;
        if constexpr (MODE == 8) {
            int kq = INT_MIN;
            uint32_t iq = 0xffffffffu;
            if (lane < 8)
                asm volatile("ld.shared.b32 %0, [%2];\n\tld.shared.b32 %1, [%2+32];"
                             : "=r"(kq), "=r"(iq)
                             : "r"(par + 4u * lane)
                             : "memory");
            const int top2 = pcops_warp::max_i32(kq);
            const uint32_t id2 = pcops_warp::min_u32(kq == top2 ? iq : 0xffffffffu);
            c = {__int_as_float(top2), (int)id2};
        } else {
            int k[8], i[8];
            asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%8];\n\t"
                         "ld.shared.v4.b32 {%4, %5, %6, %7}, [%8+16];"
                         : "=r"(k[0]), "=r"(k[1]), "=r"(k[2]), "=r"(k[3]), "=r"(k[4]),
                           "=r"(k[5]), "=r"(k[6]), "=r"(k[7])
                         : "r"(par)
                         : "memory");
            asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%8+32];\n\t"
                         "ld.shared.v4.b32 {%4, %5, %6, %7}, [%8+48];"
                         : "=r"(i[0]), "=r"(i[1]), "=r"(i[2]), "=r"(i[3]), "=r"(i[4]),
                           "=r"(i[5]), "=r"(i[6]), "=r"(i[7])
                         : "r"(par)
                         : "memory");
#pragma unroll
            for (int h = 1; h < 8; h *= 2)  // adjacent runs: a tie keeps the lower run
#pragma unroll
                for (int q = 0; q < 8; q += 2 * h) {
                    // slot q (lower indices in the blocked order) against slot q + h
                    const bool later = kBlocked ? k[q + h] > k[q]
                                                : (k[q + h] > k[q] || (k[q + h] == k[q] && i[q + h] < i[q]));
                    k[q] = later ? k[q + h] : k[q];
                    i[q] = later ? i[q + h] : i[q];
                }
            c = {__int_as_float(k[0]), i[0]};
        }
        store_sample(threadIdx.x == 0, row_idx + j, row_d + j, c);
        cur = c.index;
    }
    for (int64_t j = n_out + threadIdx.x; j < npoint; j += blockDim.x) {
        row_idx[j] = -1;
        row_d[j] = 0.f;
    }
}

struct Timer {
    void* flush = nullptr;
    cudaEvent_t a, b;
    Timer() {
        cudaMalloc(&flush, size_t(256) << 20);
        cudaEventCreate(&a);
        cudaEventCreate(&b);
    }
    template <class F>
    float median_ms(F f, int reps = 30) {
        std::vector<float> t;
        for (int r = 0; r < reps + 2; ++r) {
            cudaMemsetAsync(flush, 0, size_t(256) << 20);
            cudaEventRecord(a);
            f();
            cudaEventRecord(b);
            cudaEventSynchronize(b);
            float ms = 0;
            cudaEventElapsedTime(&ms, a, b);
            if (r >= 2) t.push_back(ms);
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    }
};

template <int PPT, int MODE>
void run_variant(Timer& tm, const float* dx, int64_t B, int64_t N, int64_t npoint, int64_t* di,
                 float* dd, const std::vector<int64_t>& ref_i, const std::vector<float>& ref_d) {
    const int threads = (int)((N + 32 * PPT - 1) / (32 * PPT)) * 32;
    if (threads > 1024 || threads < 64 || (MODE == 4 && threads > 256)) return;
    const size_t smem = 64 * 8 + (size_t)N * 16;
    auto k = MODE >= 6 ? tree_kernel<PPT, MODE> : step_kernel<PPT, MODE>;
    if (MODE >= 6 && threads > 256) return;
    if (smem > 48 * 1024) cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    cudaMemset(di, 0xff, sizeof(int64_t) * B * npoint);
    auto go = [&] { k<<<(unsigned)B, threads, smem>>>(dx, N, npoint, di, dd); };
    go();
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("PPT %d mode %d: %s\n", PPT, MODE, cudaGetErrorString(e));
        exit(1);
    }
    std::vector<int64_t> hi(B * npoint);
    std::vector<float> hd(B * npoint);
    cudaMemcpy(hi.data(), di, sizeof(int64_t) * B * npoint, cudaMemcpyDeviceToHost);
    cudaMemcpy(hd.data(), dd, sizeof(float) * B * npoint, cudaMemcpyDeviceToHost);
    const bool same = hi == ref_i && memcmp(hd.data(), ref_d.data(), sizeof(float) * hd.size()) == 0;
    const float ms = tm.median_ms(go);
    printf("  PPT %2d warps %2d mode %d: %.4f ms  %s\n", PPT, threads / 32, MODE, ms,
           same ? "identical" : "DIFFERENT");
}

}  // namespace

int main(int argc, char** argv) {
    int64_t B = 32, N = 1024, npoint = 512;
    if (argc == 4) {
        B = atoll(argv[1]);
        N = atoll(argv[2]);
        npoint = atoll(argv[3]);
    }
    std::vector<float> x(B * N * 3);
    srand(9);
    for (auto& v : x) v = (float)(rand() % 16) / 16;  // a coarse grid: many tied distances
    for (int64_t b = 0; b < B; ++b)  // some duplicates
        for (int n = 0; n < 8; ++n)
            for (int a = 0; a < 3; ++a) x[(b * N + N - 1 - n) * 3 + a] = x[(b * N + n) * 3 + a];
    float *dx, *dd;
    int64_t* di;
    cudaMalloc(&dx, sizeof(float) * x.size());
    cudaMalloc(&dd, sizeof(float) * B * npoint);
    cudaMalloc(&di, sizeof(int64_t) * B * npoint);
    cudaMemcpy(dx, x.data(), sizeof(float) * x.size(), cudaMemcpyHostToDevice);
    Timer tm;
    pcops_fps_cuda_plan plan;
    if (pcops_fps_cuda_make_plan(PCOPS_FLOAT32, B, N, npoint, 0, &plan) != cudaSuccess) return 1;
    void* ws = nullptr;
    if (plan.workspace_bytes) cudaMalloc(&ws, plan.workspace_bytes);
    auto lib = [&] {
        pcops_fps_cuda_run(&plan, PCOPS_FLOAT32, dx, nullptr, nullptr, B, N, npoint, ws, di, dd,
                           0);
    };
    lib();
    cudaDeviceSynchronize();
    std::vector<int64_t> ref_i(B * npoint);
    std::vector<float> ref_d(B * npoint);
    cudaMemcpy(ref_i.data(), di, sizeof(int64_t) * B * npoint, cudaMemcpyDeviceToHost);
    cudaMemcpy(ref_d.data(), dd, sizeof(float) * B * npoint, cudaMemcpyDeviceToHost);
    printf("B %lld N %lld npoint %lld: library (variant %d, %d warps x %d a thread): %.4f ms\n",
           (long long)B, (long long)N, (long long)npoint, plan.path, plan.warps_per_cloud,
           plan.points_per_thread, tm.median_ms(lib));
#define VARIANTS(PPT)                                                          \
    run_variant<PPT, 0>(tm, dx, B, N, npoint, di, dd, ref_i, ref_d);          \
    run_variant<PPT, 1>(tm, dx, B, N, npoint, di, dd, ref_i, ref_d);          \
    run_variant<PPT, 2>(tm, dx, B, N, npoint, di, dd, ref_i, ref_d);          \
    run_variant<PPT, 3>(tm, dx, B, N, npoint, di, dd, ref_i, ref_d);          \
    run_variant<PPT, 4>(tm, dx, B, N, npoint, di, dd, ref_i, ref_d);          \
    run_variant<PPT, 5>(tm, dx, B, N, npoint, di, dd, ref_i, ref_d);          \
    run_variant<PPT, 6>(tm, dx, B, N, npoint, di, dd, ref_i, ref_d);          \
    run_variant<PPT, 7>(tm, dx, B, N, npoint, di, dd, ref_i, ref_d);          \
    run_variant<PPT, 8>(tm, dx, B, N, npoint, di, dd, ref_i, ref_d);          \
    run_variant<PPT, 9>(tm, dx, B, N, npoint, di, dd, ref_i, ref_d);
    if (argc == 1) phases(dx, B, N, npoint, di, dd);
    VARIANTS(2)
    VARIANTS(4)
    VARIANTS(8)
    VARIANTS(16)
    printf("library again: %.4f ms\n", tm.median_ms(lib));
    return 0;
}
