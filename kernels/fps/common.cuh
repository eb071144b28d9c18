/*
 * fps/common.cuh -- what every CUDA path of furthest point sampling shares: the step, where a
 * thread's points live, the reductions of (temp, index) candidates, and the host helpers the
 * plans of several paths use. Internal to kernels/fps.cu (and the lab), not an API.
 *
 * B = batch, N = points per cloud, L = valid points of a cloud (lengths[b] clamped to [0, N]),
 * npoint = samples. xyz[B,N,3] -> idx[B,npoint] (int64), dist2[B,npoint].
 *
 * The algorithm and its arithmetic are fps.c's: every point has a temp, its squared distance
 * (kernels/geometry.h) to the nearest sample so far, +inf at the start; a chosen point's temp
 * becomes -1 so it is never chosen again (also among duplicates); sample j is the point of the
 * largest temp, ties to the lower index. So every path, here and on the CPU, chooses bitwise
 * the same indices.
 *
 * A step is the same everywhere: every thread lowers the temps of the points it owns with the
 * distance to the newest sample and keeps its farthest (temp, index) (fps_visit, the only place
 * the update and the arg-max are written; RegisterPoints::step_key is the same on temp keys),
 * then the candidates of the threads that share the cloud are reduced (warp_farthest, then
 * group_farthest over the warps). The paths differ in who shares a cloud and where the points
 * live; each has its own file beside this one (kernels/fps.cu lists them).
 *
 * Invariants every path keeps:
 *   - temps are never NaN and never -0: a sum of squares (+0 or more), +inf, -1 (chosen) or
 *     -inf (a padding slot, never a candidate against a real point); a NaN distance leaves the
 *     temp as it was (fmin);
 *   - a thread visits its points in ascending index, and every combination of candidates keeps
 *     the lower index on a tie (farther());
 *   - candidate slots in shared memory are double-buffered by step parity, so one barrier per
 *     level and step suffices;
 *   - a cloud of L valid points gets n_out = min(npoint, L) samples, the rest of its row -1 / 0.
 */
#pragma once

#include <cooperative_groups.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "../geometry.h"
#include "../warp.cuh"

namespace {

namespace cg = cooperative_groups;

// ------------------------------------------------------------------------------------------
// The candidate and the step

// A point's claim to be the next sample: its temp and its index (no_candidate: none).
template <typename T>
struct Candidate {
    T value;
    int index;
};

template <typename T>
__device__ __forceinline__ Candidate<T> no_candidate() {
    return {T(-INFINITY), INT_MAX};
}

// The squared distance of geometry.h, saturated by its overflow rule: every point is staged
// where it is loaded (staged_x: a non-finite one's x is NaN, so its distances are NaN and leave
// temps unchanged), so an overflow between finite points gives the max, never +inf.
__device__ __forceinline__ float fps_dist2(float x, float y, float z, float cx, float cy,
                                           float cz) {
    return pcops_dist2_sat_f32(pcops_dist2_f32(x, y, z, cx, cy, cz));
}
__device__ __forceinline__ double fps_dist2(double x, double y, double z, double cx, double cy,
                                            double cz) {
    return pcops_dist2_sat_f64(pcops_dist2_f64(x, y, z, cx, cy, cz));
}

// A point's x as it is staged (geometry.h): NaN when a coordinate is not finite.
__device__ __forceinline__ float staged_x(float x, float y, float z) {
    return pcops_staged_x_f32(x, y, z);
}
__device__ __forceinline__ double staged_x(double x, double y, double z) {
    return pcops_staged_x_f64(x, y, z);
}

// The key order of kernels/geometry.h on (temp, -index): the larger temp, ties to the lower index.
__device__ __forceinline__ bool farther(const Candidate<float>& a, const Candidate<float>& b) {
    return pcops_key_greater_f32(a.value, -(int64_t)a.index, b.value, -(int64_t)b.index);
}
__device__ __forceinline__ bool farther(const Candidate<double>& a, const Candidate<double>& b) {
    return pcops_key_greater_f64(a.value, -(int64_t)a.index, b.value, -(int64_t)b.index);
}

// One point of one step: lower its temp with the distance to the newest sample (cx, cy, cz)
// and keep the farther of (temp, n) and best. A thread visits its points in ascending n, so
// the strict > keeps its first maximum. A NaN distance leaves temp unchanged; a chosen point
// (temp -1) and a padding slot (temp -inf) never become a candidate against a real point.
template <typename T>
__device__ __forceinline__ void fps_visit(T x, T y, T z, T& temp, int n, T cx, T cy, T cz,
                                          Candidate<T>& best) {
    const T t = fmin(fps_dist2(x, y, z, cx, cy, cz), temp);  // = d < temp ? d : temp: d >= +0
    temp = t;
    if (t > best.value) best = {t, n};
}

// ------------------------------------------------------------------------------------------
// Where a thread's points live. Both have load() (temps to +inf) and step() (one step over
// the thread's points: first, first + stride, ... below end).

// Points and temps in registers: slot p holds point first + p * stride. Requires
// end - first <= PPT * stride (the plan guarantees it).
template <typename T, int PPT>
struct RegisterPoints {
    static constexpr int kPerThread = PPT;
    T x[PPT], y[PPT], z[PPT], temp[PPT];
    int first, stride;

    __device__ __forceinline__ void load(const T* cloud, T* /*temp_ws*/, int first_, int end,
                                         int stride_) {
        first = first_;
        stride = stride_;
#pragma unroll
        for (int p = 0; p < PPT; ++p) {
            const int n = first + p * stride;
            const bool valid = n < end;
            x[p] = valid ? cloud[3 * (int64_t)n + 0] : T(0);
            y[p] = valid ? cloud[3 * (int64_t)n + 1] : T(0);
            z[p] = valid ? cloud[3 * (int64_t)n + 2] : T(0);
            x[p] = staged_x(x[p], y[p], z[p]);
            temp[p] = valid ? T(INFINITY) : T(-INFINITY);  // padding slots never win
        }
    }

    __device__ __forceinline__ Candidate<T> step(int cur, T cx, T cy, T cz) {
        Candidate<T> best = no_candidate<T>();
#pragma unroll
        for (int p = 0; p < PPT; ++p) {
            const int n = first + p * stride;
            if (n == cur) temp[p] = T(-1);
            fps_visit(x[p], y[p], z[p], temp[p], n, cx, cy, cz, best);
        }
        return best;
    }

    // float: step() with this thread's farthest as a temp key (the temp's bits as an int32, see
    // group_farthest_keys in group.cuh: the largest key, ties to the lowest slot, i.e. the lowest index); the
    // largest key by a tree and its index by a select of its own, so that only the tree is on
    // the way to the warp's reduction.
    __device__ __forceinline__ void step_key(int cur, T cx, T cy, T cz, int& key, int& index) {
        static_assert(sizeof(T) == 4, "int keys of float temps");
        int k[PPT], m[PPT];
#pragma unroll
        for (int p = 0; p < PPT; ++p) {
            if (first + p * stride == cur) temp[p] = T(-1);
            temp[p] = fmin(fps_dist2(x[p], y[p], z[p], cx, cy, cz), temp[p]);  // as fps_visit
            k[p] = m[p] = __float_as_int(temp[p]);
        }
#pragma unroll
        for (int h = PPT / 2; h >= 1; h /= 2)
#pragma unroll
            for (int p = 0; p < h; ++p) m[p] = max(m[p], m[p + h]);
        key = m[0];
        index = first + (PPT - 1) * stride;
#pragma unroll
        for (int p = PPT - 2; p >= 0; --p) index = k[p] == key ? first + p * stride : index;
    }
};

// Temps in the workspace, coordinates read from xyz (L2-resident for clouds up to millions of
// points): any size. Each thread only touches its own temps, so load() needs no barrier.
template <typename T>
struct GlobalPoints {
    static constexpr int kPerThread = 0;
    const T* cloud;
    T* temp;
    int first, end, stride;

    __device__ __forceinline__ void load(const T* cloud_, T* temp_ws, int first_, int end_,
                                         int stride_) {
        cloud = cloud_;
        temp = temp_ws;
        first = first_;
        end = end_;
        stride = stride_;
        for (int n = first; n < end; n += stride) temp[n] = T(INFINITY);
    }

    __device__ __forceinline__ Candidate<T> step(int cur, T cx, T cy, T cz) {
        Candidate<T> best = no_candidate<T>();
        for (int n = first; n < end; n += stride) {
            T t = n == cur ? T(-1) : temp[n];
            const T* q = cloud + 3 * (int64_t)n;
            fps_visit(staged_x(q[0], q[1], q[2]), q[1], q[2], t, n, cx, cy, cz, best);
            temp[n] = t;
        }
        return best;
    }
};

// The most threads per block a point set can use without spilling (65536 registers per SM;
// four registers per float point, eight per double point, plus about 40 for the rest;
// checked with -Xptxas -v on sm_90: no spills).
template <typename Points, typename T>
constexpr int max_threads() {
    return Points::kPerThread * (int)sizeof(T) <= 16                       ? 1024
           : Points::kPerThread * (int)sizeof(T) <= 32 && sizeof(T) == 4 ? 1024
           : Points::kPerThread * (int)sizeof(T) <= 32                   ? 768
                                                                         : 512;
}

// ------------------------------------------------------------------------------------------
// Reductions of candidates: over a warp, then over the warps that share a cloud

// The farthest candidate of the warp, in every lane: five levels of (value, index) shuffles.
template <typename T>
__device__ __forceinline__ Candidate<T> warp_farthest_shuffles(Candidate<T> c) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
        Candidate<T> o = {__shfl_xor_sync(0xffffffffu, c.value, offset),
                          __shfl_xor_sync(0xffffffffu, c.index, offset)};
        if (farther(o, c)) c = o;
    }
    return c;
}
// float on sm_80+: two warp reductions (redux) on the order-preserving bits of the temp and then
// on the index of the lanes that hold the largest temp, instead of five levels of shuffles; the
// same order as farther() because temps are never NaN and never -0 (a sum of squares, +inf, -1
// for a chosen point, -inf for padding). Older architectures (no redux): the shuffles.
__device__ __forceinline__ Candidate<float> warp_farthest(Candidate<float> c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const uint32_t u = __float_as_uint(c.value);
    const uint32_t key = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    const uint32_t top = pcops_warp::max_u32(key);
    const uint32_t index = pcops_warp::min_u32(key == top ? (uint32_t)c.index : 0xffffffffu);
    return {__uint_as_float((top & 0x80000000u) ? (top & 0x7fffffffu) : ~top), (int)index};
#else
    return warp_farthest_shuffles(c);
#endif
}
__device__ __forceinline__ Candidate<double> warp_farthest(Candidate<double> c) {
    return warp_farthest_shuffles(c);
}

// warp_farthest, and the lowest lane that holds the winner (c becomes the winner).
template <typename T>
__device__ __forceinline__ int warp_argmax(Candidate<T>& c) {
    const Candidate<T> w = warp_farthest(c);
    const int lane =
        __ffs(__ballot_sync(0xffffffffu, c.value == w.value && c.index == w.index)) - 1;
    c = w;
    return lane;
}

// Barrier `id` (0: the whole block) among `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// The farthest candidate of `warps` warps (warp w of them passes w), in every thread of them:
// a warp reduction, lane 0 writes slots[parity * warps + w], one barrier, every warp reduces
// the slots. The slots are double-buffered by step parity: a warp can write slots of step
// j + 1 while another still reads those of step j, but not those of step j + 2 before it
// passed the barrier of step j + 1.
template <typename T>
__device__ __forceinline__ Candidate<T> group_farthest(Candidate<T> c, Candidate<T>* slots,
                                                       int parity, int warps, int w,
                                                       int barrier_id) {
    c = warp_farthest(c);
    if (warps == 1) return c;
    const int lane = threadIdx.x & 31;
    if (lane == 0) slots[parity * warps + w] = c;
    named_barrier(barrier_id, warps * 32);
    c = lane < warps ? slots[parity * warps + lane] : no_candidate<T>();
    return warp_farthest(c);
}

// Shared memory by its 32-bit address in the shared window. A step of the group kernel that
// indexed its slots through a generic pointer re-derived the window's base (S2R SR_CgaCtaId, on
// sm_90) inside the loop, after the warp's reduction and before the slot's store: on the step's
// chain. The addresses below are computed once, before the loop.
__device__ __forceinline__ uint32_t shared_address(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void st_shared(uint32_t a, Candidate<float> c) {
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};" ::"r"(a), "r"(__float_as_uint(c.value)),
                 "r"(c.index)
                 : "memory");
}
__device__ __forceinline__ void st_shared(uint32_t a, Candidate<double> c) {
    asm volatile("st.shared.f64 [%0], %1;\n\tst.shared.b32 [%0+8], %2;" ::"r"(a), "d"(c.value),
                 "r"(c.index)
                 : "memory");
}
__device__ __forceinline__ void ld_shared(uint32_t a, Candidate<float>& c) {
    uint32_t v;
    asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(v), "=r"(c.index) : "r"(a) : "memory");
    c.value = __uint_as_float(v);
}
__device__ __forceinline__ void ld_shared(uint32_t a, Candidate<double>& c) {
    asm volatile("ld.shared.f64 %0, [%2];\n\tld.shared.b32 %1, [%2+8];"
                 : "=d"(c.value), "=r"(c.index)
                 : "r"(a)
                 : "memory");
}

// group_farthest with the slots by address: this warp's slot of the step at `write_at`, the
// slot lane `lane` reads at `read_at` (when `reads`: lane < warps).
template <typename T>
__device__ __forceinline__ Candidate<T> group_farthest_at(Candidate<T> c, uint32_t write_at,
                                                          uint32_t read_at, bool reads,
                                                          int warps, int barrier_id) {
    c = warp_farthest(c);
    if (warps == 1) return c;
    if ((threadIdx.x & 31) == 0) st_shared(write_at, c);
    named_barrier(barrier_id, warps * 32);
    c = no_candidate<T>();
    if (reads) ld_shared(read_at, c);
    return warp_farthest(c);
}


// The step's sample into row j by one thread (`on`), as predicated stores: a branch around
// them put a convergence barrier and a branch on every step's chain.
__device__ __forceinline__ void store_sample(bool on, int64_t* idx, float* dist2,
                                             Candidate<float> c) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %0, 0;\n\t@p st.s64 [%1], %2;\n\t"
                 "@p st.f32 [%3], %4;\n\t}" ::"r"((unsigned)on), "l"(idx), "l"((int64_t)c.index),
                 "l"(dist2), "f"(c.value)
                 : "memory");
}
__device__ __forceinline__ void store_sample(bool on, int64_t* idx, double* dist2,
                                             Candidate<double> c) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %0, 0;\n\t@p st.s64 [%1], %2;\n\t"
                 "@p st.f64 [%3], %4;\n\t}" ::"r"((unsigned)on), "l"(idx), "l"((int64_t)c.index),
                 "l"(dist2), "d"(c.value)
                 : "memory");
}

// Point n of a cloud by one 32 x 32 -> 64-bit multiply-add for its address (the index as a
// 64-bit count of scalars took three dependent instructions before the loads), staged.
template <typename T>
struct PointXyz {
    T v[3];
};
template <typename T>
__device__ __forceinline__ void load_point_at(const T* cloud, int n, T& x, T& y, T& z) {
    const PointXyz<T>* p = reinterpret_cast<const PointXyz<T>*>(cloud) + n;
    x = __ldg(&p->v[0]);
    y = __ldg(&p->v[1]);
    z = __ldg(&p->v[2]);
    x = staged_x(x, y, z);
}

// Point n of a cloud, staged.
template <typename T>
__device__ __forceinline__ void load_point(const T* cloud, int n, T& x, T& y, T& z) {
    x = __ldg(cloud + 3 * (int64_t)n + 0);
    y = __ldg(cloud + 3 * (int64_t)n + 1);
    z = __ldg(cloud + 3 * (int64_t)n + 2);
    x = staged_x(x, y, z);
}

// Writes -1 / 0 to the slots [n_out, npoint) of one row, threads t0, t0 + step, ...
template <typename T>
__device__ void pad_row(int64_t* idx, T* dist2, int64_t n_out, int64_t npoint, int t0, int step) {
    for (int64_t j = n_out + t0; j < npoint; j += step) {
        idx[j] = -1;
        dist2[j] = T(0);
    }
}

// One cloud's row of a call: its points, its outputs, its valid length L and the samples it
// gets, n_out = min(npoint, L).
template <typename T>
struct CloudRow {
    const T* cloud;
    int64_t* idx;
    T* dist2;
    int L;
    int64_t n_out;

    __device__ __forceinline__ CloudRow(const T* xyz, const int64_t* lengths, int64_t b, int64_t N,
                                        int64_t npoint, int64_t* idx_all, T* dist2_all)
        : cloud(xyz + b * N * 3), idx(idx_all + b * npoint), dist2(dist2_all + b * npoint),
          L((int)pcops_valid_length(lengths, b, N)), n_out(npoint < L ? npoint : L) {}
};

// ------------------------------------------------------------------------------------------
// Host helpers of the plans (kernels/fps/plan.cuh and the paths' plan functions).

// The register slot counts a plan may use: 2, 4, 8, 16 for float, 2, 4, 8 for double.
template <typename T>
constexpr int max_points_per_thread() {
    return sizeof(T) == 4 ? 16 : 8;
}

// Calls f(Points{}) with the point set of `ppt` register slots (0: GlobalPoints).
template <typename T, typename F>
cudaError_t with_points(int ppt, F&& f) {
    switch (ppt) {
        case 0: return f(GlobalPoints<T>{});
        case 2: return f(RegisterPoints<T, 2>{});
        case 4: return f(RegisterPoints<T, 4>{});
        case 8: return f(RegisterPoints<T, 8>{});
        case 16:
            if constexpr (sizeof(T) == 4) return f(RegisterPoints<T, 16>{});
            return cudaErrorInvalidValue;
        default: return cudaErrorInvalidValue;
    }
}

template <typename T>
int max_threads_for(int ppt) {
    int m = 0;
    with_points<T>(ppt, [&](auto pts) {
        m = max_threads<decltype(pts), T>();
        return cudaSuccess;
    });
    return m;
}

struct Device {
    int sms = 0, major = 0, cooperative = 0;
    int smem_optin = 0;  // shared memory a block may opt in to, static and dynamic (bytes)
};

inline cudaError_t current_device(Device* d) {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&d->sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&d->major, cudaDevAttrComputeCapabilityMajor, device);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&d->cooperative, cudaDevAttrCooperativeLaunch, device);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&d->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                     device);
    return err;
}

// Whether a block with `static_bytes` of __shared__ arrays and `dynamic_bytes` of dynamic shared
// memory fits device d (cudaFuncSetAttribute refuses more than the opt-in limit).
inline bool smem_fits(const Device& d, size_t dynamic_bytes, size_t static_bytes) {
    return dynamic_bytes + static_bytes <= (size_t)d.smem_optin;
}

// The most dynamic shared memory a kernel with `static_bytes` of __shared__ arrays may take on
// device d, in units of `per` bytes (e.g. buckets of a bucket path).
inline int64_t smem_units(const Device& d, size_t static_bytes, size_t per) {
    return d.smem_optin > (int)static_bytes ? (int64_t)((d.smem_optin - static_bytes) / per) : 0;
}

// The smallest register slot count (of 2, 4, 8, 16) with which `threads_max`-capped blocks
// hold `points` points; 0 when none does.
template <typename T>
int fit_points_per_thread(int64_t points, int prefer) {
    for (int ppt = prefer; ppt <= max_points_per_thread<T>(); ppt *= 2)
        if (points <= (int64_t)ppt * max_threads_for<T>(ppt)) return ppt;
    return 0;
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The shape of a block that holds a slice of `per_block` points of a cloud (CLUSTER, GRID):
// the fewest register slots from `prefer` on that hold it (0: temp in the workspace, 1024
// threads), and the threads to match (at least 64).
template <typename T>
void plan_slice(pcops_fps_cuda_plan* p, int64_t per_block, int prefer) {
    const int ppt = fit_points_per_thread<T>(per_block, prefer);
    const int threads =
        ppt ? (int)std::min<int64_t>(max_threads_for<T>(ppt), round_up((per_block + ppt - 1) / ppt, 32))
            : 1024;
    p->points_per_thread = ppt;
    p->threads = threads < 64 ? 64 : threads;
    p->warps_per_cloud = p->threads / 32;
    p->clouds_per_block = 1;
}

}  // namespace
