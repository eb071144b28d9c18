/*
 * fps.cu -- furthest point sampling on CUDA.
 *
 * B = batch, N = points per cloud, L = valid points of a cloud (lengths[b] clamped to [0, N]),
 * npoint = samples. xyz[B,N,3] -> idx[B,npoint] (int64), dist2[B,npoint].
 *
 * Same algorithm and arithmetic as fps.c (temp distance buffer starting at +inf, chosen points
 * set to -1, the squared distance of kernels/geometry.h, ties to the lower index), so every
 * path here and on the CPU chooses bitwise the same indices.
 *
 * A step is the same everywhere: every thread lowers the temps of the points it owns with the
 * distance to the newest sample and keeps its farthest (temp, index) -- fps_visit, the only
 * place the update and the arg-max are written, and RegisterPoints::step_key, the same for
 * float WARP and BLOCK on temp keys (group_farthest_keys) -- and then the candidates are
 * reduced over the threads that share the cloud. The paths differ in who shares a cloud and
 * where the points live (top to bottom in this file):
 *
 *   SIMPLE   one block per cloud, temp in the workspace, coordinates from xyz (any N; the
 *            reference path).
 *   WARP     several clouds per block, a few warps per cloud, points and temps in registers;
 *            one named barrier per step among the cloud's warps (none with one warp). Float
 *            clouds in registers (WARP, BLOCK) hold runs of points and meet in a tree over
 *            the warps' slots (group_farthest_keys). AUTO up to 128 float points (512 double).
 *   BLOCK    the same kernel with one cloud per block and up to 32 warps.
 *   BLOCK_PRUNED  the block path with the cloud dealt to the warps by space (a counting sort
 *            of its points into Morton-ordered cells, in shared memory, at the start); each
 *            warp keeps the box of its points and skips a step when the new sample is as far
 *            from the box as the warp's farthest temp: late steps update a few warps. Float
 *            clouds of 8193-12288 points keep their points in shared memory; the others keep a
 *            copy there by index for the step's sample lookup (this kernel's large shared
 *            memory leaves little L1, so a global load went to L2). AUTO from 1025
 *            float points (2048 double) to the block path's cap, and for float clouds up to 12288 points with
 *            fewer than 2048 samples.
 *   CLUSTER  (sm_90) a thread-block cluster per cloud; each block holds a slice of the cloud
 *            (in registers, or temp in the workspace for clouds too large for them) and
 *            publishes its candidate in shared memory; after one cluster barrier every warp
 *            reads the cluster's candidates (distributed shared memory) and picks the winner.
 *   GRID     a cooperative grid on one cloud at a time (huge single clouds): each block
 *            publishes its candidate in the workspace, one grid barrier per step, then every
 *            block reads them all.
 *   BUCKET   a block per cloud, the points sorted into spatial buckets (cub sort on Morton
 *            codes) with a box each; a step updates only the buckets the new sample can change
 *            (a bucket whose box is as far as its largest temp keeps every temp), so late steps
 *            touch a few buckets whatever the cloud's size. Large clouds.
 *   BUCKET_GROUPS  (float) the same buckets, G to a lane behind a group box tested first; a
 *            step lists its flagged buckets in shared memory and shares them out over the
 *            warps (a warp a bucket) instead of each warp updating its own one after the
 *            other. AUTO's path for float clouds past the block path when fewer than 2048
 *            samples are asked.
 *   BUCKET_ROUNDS  (float) the grouped buckets, several samples a round: every bucket whose
 *            farthest temp is near the last sample's is a candidate, and the round takes, in
 *            (temp, index) order, the candidates it can prove are the next samples (none lowered
 *            by a farther one, none passed by what an earlier one leaves in its own bucket);
 *            late in a run ~15 a round, two barriers a round. AUTO from 2048 samples.
 *   BUCKET_ROUNDS_CLUSTER  (sm_90, float) the same on a cluster of 2-8 blocks per cloud, each
 *            block a range of the buckets; the candidates and their buckets' leftovers are
 *            read through distributed shared memory, two cluster barriers a round. AUTO for
 *            clouds of >= 32k points when the batch leaves SMs for 8 blocks a cloud.
 * Warp reductions are two redux on sm_80+ (float) and shuffles otherwise; candidate slots are
 * double-buffered by step parity, so one barrier per level and step suffices.
 *
 * The launch plan (pcops_fps_cuda_make_plan) picks the path and its shape from the sizes and
 * the device once; pcops_fps_cuda_run launches it.
 */
#include <cooperative_groups.h>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "geometry.h"
#include "warp.cuh"

namespace {

namespace cg = cooperative_groups;

template <typename T>
struct Candidate {
    T value;
    int index;
};

template <typename T>
__device__ __forceinline__ Candidate<T> no_candidate() {
    return {T(-INFINITY), INT_MAX};
}

__device__ __forceinline__ float fps_dist2(float x, float y, float z, float cx, float cy,
                                           float cz) {
    return pcops_dist2_f32(x, y, z, cx, cy, cz);
}
__device__ __forceinline__ double fps_dist2(double x, double y, double z, double cx, double cy,
                                            double cz) {
    return pcops_dist2_f64(x, y, z, cx, cy, cz);
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
    // group_farthest_keys: the largest key, ties to the lowest slot, i.e. the lowest index); the
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
            fps_visit(cloud[3 * (int64_t)n + 0], cloud[3 * (int64_t)n + 1],
                      cloud[3 * (int64_t)n + 2], t, n, cx, cy, cz, best);
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
// reductions

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
    const uint32_t top = __reduce_max_sync(0xffffffffu, key);
    const uint32_t index =
        __reduce_min_sync(0xffffffffu, key == top ? (uint32_t)c.index : 0xffffffffu);
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
// sm_90) inside the loop, after the warp's reduction and before the slot's store: ~40 cycles on
// the step's chain. The addresses below are computed once, before the loop.
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
// and {2, 6} it kept 4 over 2.) One compare and two selects a level, against the two redux (46
// cycles each on the H100) of lane q < warps reading slot q before (stop 30, H100, F1's kernel:
// 0.140 ms -> 0.129 in lab/fps_step.cu; the same tree on strided points needs the full (key,
// index) order, three instructions deep a level: 0.147). Slots: [parity][kSlots keys, kSlots
// indices] of int32 at `at` (this step's parity); the slots of warps >= warps hold INT_MIN keys
// (fps_group_kernel writes them once).
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
// 64-bit count of scalars took three dependent instructions before the loads).
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
}

template <typename T>
__device__ __forceinline__ void load_point(const T* cloud, int n, T& x, T& y, T& z) {
    x = __ldg(cloud + 3 * (int64_t)n + 0);
    y = __ldg(cloud + 3 * (int64_t)n + 1);
    z = __ldg(cloud + 3 * (int64_t)n + 2);
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
// SIMPLE, WARP and BLOCK: `warps` warps per cloud, `clouds` clouds per block (<= 15: cloud g
// of the block syncs on named barrier 1 + g). Dynamic shared memory: the slots (slot_bytes).
// kSlots > 0 (float in registers: WARP and BLOCK, kSlots >= warps) deals each thread a run of
// PPT points and reduces on temp keys (group_farthest_keys); SIMPLE and double clouds deal the
// points by stride and reduce warp_farthest's (temp, index) pairs (clouds * 2 * warps
// candidates). A step is one chain of latencies (the sample's coordinates, the update, two
// redux, the barrier, the slots' tree): its slots are addressed by 32-bit shared-window
// addresses computed before the loop, row j is written by predicated stores, and the sample's
// address is one multiply-add (stop 27, H100, F1's kernel: 158 us -> 144 with those, -> 132 with
// the keys; stop 30: -> ~121 with the runs and the tree).

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
// BLOCK_PRUNED: the block path with the cloud's points dealt to the warps by space, so that a
// step skips every warp the new sample cannot change. The block first bins its cloud into the
// 16^3 cells of its box, in Morton order of the cells (a counting sort in shared memory), and
// warp w takes the w-th run of 32 * PPT points of that order: a compact region, whose box the
// warp keeps. A step then skips a warp when the squared distance from the sample to the
// warp's box (computed with fps_dist2's operations on the box gaps: every rounded operation is
// monotone, so it is <= the distance computed to any point of the box) is > 0 and >= the
// warp's largest temp: no temp of the warp can change (min(temp, d) = temp), and the chosen
// point is not in the warp (its box would contain the sample: distance 0). The warp's farthest
// point then stays what it was. Late in a run a sample changes the temps of a few neighbours
// only, so most warps skip most steps. Each thread's slots hold its points in ascending index
// order (a sorting network at the start), so fps_visit's strict > keeps the lower index of a
// tie as in RegisterPoints; the warps combine by the full key. Same bits as BLOCK. Float clouds
// past 8192 points (up to 24 warps of 16 a thread) keep the points in shared memory instead
// (kSmem: float4 x, y, z, index, each lane reading back only its own slots; the temps stay in
// registers), so that the block can have more, smaller warp regions than registers allow.

constexpr int kPrunedCellBits = 4;  // 16 cells an axis
constexpr int64_t kPrunedMaxFloat = 24 * 32 * 16;  // float points a block takes (plan_pruned)
constexpr int kPrunedCells = 1 << (3 * kPrunedCellBits);

// A point's coordinates by index in shared memory (the register kernel's copy of the cloud,
// read once a step for the new sample: a shared load is ~10 cycles shorter than an L1 hit).
template <typename T>
struct alignas(16) PrunedXyz {
    T x, y, z, pad;
};

// Where the PrunedXyz copy starts: after `head` bytes (slots and scratch), 16-byte aligned.
template <typename T>
__host__ __device__ size_t pruned_xyz_offset(size_t head) {
    return (head + alignof(PrunedXyz<T>) - 1) / alignof(PrunedXyz<T>) * alignof(PrunedXyz<T>);
}

// Dynamic shared memory of BLOCK_PRUNED: the slots (2 * warps candidates), the cell counts, each
// point's (cell, rank) and the sorted order (16-bit indices: clouds of at most 65535 points).
// kSmem (float): the points (x, y, z, index) live in shared memory as float4, 16 bytes a slot of
// the block (warps * 32 * PPT slots), over the sort's scratch; only the temps are registers.
// Otherwise the coordinates by index follow (PrunedXyz, N of them), for the sample's lookup.
template <typename T>
__host__ __device__ size_t pruned_smem_bytes(int warps, int64_t N, bool smem_points = false,
                                              int ppt = 0) {
    const size_t n = (size_t)(N > 0 ? N : 1);
    const size_t scratch = (size_t)(kPrunedCells + 1) * 4 + n * (4 + 2);
    const size_t points = smem_points ? (size_t)warps * 32 * ppt * 16 : 0;
    const size_t head =
        (size_t)2 * warps * sizeof(Candidate<T>) + (scratch > points ? scratch : points);
    return smem_points ? head : pruned_xyz_offset<T>(head) + n * sizeof(PrunedXyz<T>);
}

// The cell (Morton order) of a coordinate triple in the box [lo, lo + 16 / inv).
template <typename T>
__device__ __forceinline__ uint32_t pruned_cell(T x, T y, T z, const T lo[3], const T inv[3]) {
    const T v[3] = {x, y, z};
    uint32_t code = 0;
#pragma unroll
    for (int a = 0; a < 3; ++a) {
        T t = (v[a] - lo[a]) * inv[a];
        int c = t >= T(1) ? (int)fmin(t, T((1 << kPrunedCellBits) - 1)) : 0;  // NaN: 0
#pragma unroll
        for (int bit = 0; bit < kPrunedCellBits; ++bit)
            code |= (uint32_t)((c >> bit) & 1) << (3 * bit + a);
    }
    return code;
}

// At most 16 warps (plan_pruned): 128 registers a thread for the five arrays of PPT (x, y, z,
// temp, index; 16 float slots: 128 registers, no spills on sm_90); 32 float slots: 10 warps.
template <typename T, int PPT, bool kSmem>
constexpr int pruned_max_threads() {
    return kSmem ? 768 : PPT * (int)sizeof(T) <= 64 ? 512 : 320;
}

// (The register kernels ask for one block an SM: without it ptxas held the float, 8-slot one to
// 64 registers and spilled; kSmem leaves the count open, 0, as before.)
template <typename T, int PPT, bool kSmem = false>
__global__ void __launch_bounds__(pruned_max_threads<T, PPT, kSmem>(), kSmem ? 0 : 1)
fps_pruned_kernel(const T* __restrict__ xyz, const int64_t* __restrict__ lengths,
                  const int64_t* __restrict__ start, int64_t B, int64_t N, int64_t npoint,
                  int64_t* __restrict__ idx, T* __restrict__ dist2, int warps) {
    static_assert(!kSmem || sizeof(T) == 4, "shared-memory points are float4");
    extern __shared__ __align__(16) unsigned char fps_smem[];
    Candidate<T>* slots = reinterpret_cast<Candidate<T>*>(fps_smem);
    uint32_t* counts = reinterpret_cast<uint32_t*>(slots + 2 * warps);  // [kPrunedCells + 1]
    uint32_t* packed = counts + kPrunedCells + 1;  // [N]: cell << 16 | rank in the cell
    uint16_t* order = reinterpret_cast<uint16_t*>(packed + (N > 0 ? N : 1));  // [N]
    PrunedXyz<T>* xyz_s = nullptr;  // !kSmem: [N] the coordinates by index
    if constexpr (!kSmem) {
        const size_t head = pruned_smem_bytes<T>(warps, N, true, 0);  // slots and scratch
        xyz_s = reinterpret_cast<PrunedXyz<T>*>(fps_smem + pruned_xyz_offset<T>(head));
    }
    __shared__ T box_red[6][32];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int threads = warps * 32;
    const int64_t b = blockIdx.x;
    const CloudRow<T> row(xyz, lengths, b, N, npoint, idx, dist2);
    pad_row(row.idx, row.dist2, row.n_out, npoint, tid, threads);
    if (row.n_out == 0) return;  // the whole block: its lengths are the block's
    const int L = row.L;

    // the box of the cloud (NaN ignored; infinities stretch it, the cells clamp)
    T v[6] = {T(INFINITY), T(INFINITY), T(INFINITY), T(-INFINITY), T(-INFINITY), T(-INFINITY)};
    for (int i = tid; i < L; i += threads) {
        const T* q = row.cloud + 3 * (int64_t)i;
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            v[a] = fmin(v[a], q[a]);
            v[3 + a] = fmax(v[3 + a], q[a]);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int a = 0; a < 6; ++a) {
            const T other = __shfl_xor_sync(0xffffffffu, v[a], o);
            v[a] = a < 3 ? fmin(v[a], other) : fmax(v[a], other);
        }
    if (lane == 0)
#pragma unroll
        for (int a = 0; a < 6; ++a) box_red[a][w] = v[a];
    for (int c = tid; c <= kPrunedCells; c += threads) counts[c] = 0;
    __syncthreads();
    T lo[3], inv[3];
#pragma unroll
    for (int a = 0; a < 3; ++a) {
        T mn = box_red[a][0], mx = box_red[3 + a][0];
        for (int k = 1; k < warps; ++k) {
            mn = fmin(mn, box_red[a][k]);
            mx = fmax(mx, box_red[3 + a][k]);
        }
        const T ext = mx - mn;
        lo[a] = mn;
        inv[a] = ext > T(0) && ext < T(INFINITY) ? T(1 << kPrunedCellBits) / ext : T(0);
    }
    // counting sort by cell: ranks by atomics, an exclusive scan, the order
    for (int i = tid; i < L; i += threads) {
        const T* q = row.cloud + 3 * (int64_t)i;
        const uint32_t cell = pruned_cell(q[0], q[1], q[2], lo, inv);
        packed[i] = cell << 16 | atomicAdd(&counts[cell], 1u);
        if constexpr (!kSmem) {
            xyz_s[i].x = q[0];
            xyz_s[i].y = q[1];
            xyz_s[i].z = q[2];
        }
    }
    __syncthreads();
    {
        const int per = (kPrunedCells + threads - 1) / threads;
        const int c0 = min(tid * per, kPrunedCells), c1 = min(c0 + per, kPrunedCells);
        uint32_t run = 0;
        for (int c = c0; c < c1; ++c) run += counts[c];
        uint32_t incl = run;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const uint32_t up = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += up;
        }
        // the warps' totals through the (not yet used) slots' memory
        uint32_t* warp_sums = reinterpret_cast<uint32_t*>(box_red);
        __syncthreads();  // box_red was read above
        if (lane == 31) warp_sums[w] = incl;
        __syncthreads();
        uint32_t offset = incl - run;
        for (int k = 0; k < w; ++k) offset += warp_sums[k];
        for (int c = c0; c < c1; ++c) {
            const uint32_t n = counts[c];
            counts[c] = offset;
            offset += n;
        }
    }
    __syncthreads();
    for (int i = tid; i < L; i += threads) {
        const uint32_t pk = packed[i];
        order[counts[pk >> 16] + (pk & 0xffffu)] = (uint16_t)i;
    }
    __syncthreads();

    // the thread's points: sorted positions w * 32 * PPT + p * 32 + lane, then by index
    constexpr int R = kSmem ? 1 : PPT;  // coordinate registers
    T x[R], y[R], z[R], temp[PPT];
    int id[PPT];
#pragma unroll
    for (int p = 0; p < PPT; ++p) {
        const int s = w * 32 * PPT + p * 32 + lane;
        id[p] = s < L ? (int)order[s] : INT_MAX;
    }
    float4* spts = reinterpret_cast<float4*>(counts);  // kSmem: over the sort's scratch
    if (kSmem) __syncthreads();  // every thread has read its part of order
#pragma unroll
    for (int r = 0; r < PPT; ++r)  // odd-even transposition sort of the indices
#pragma unroll
        for (int p = r & 1; p + 1 < PPT; p += 2) {
            const int a = id[p], c = id[p + 1];
            id[p] = min(a, c);
            id[p + 1] = max(a, c);
        }
    T wlo[3] = {T(INFINITY), T(INFINITY), T(INFINITY)};
    T whi[3] = {T(-INFINITY), T(-INFINITY), T(-INFINITY)};
#pragma unroll
    for (int p = 0; p < PPT; ++p) {
        const bool valid = id[p] != INT_MAX;
        const T px = valid ? row.cloud[3 * (int64_t)id[p] + 0] : T(0);
        const T py = valid ? row.cloud[3 * (int64_t)id[p] + 1] : T(0);
        const T pz = valid ? row.cloud[3 * (int64_t)id[p] + 2] : T(0);
        if constexpr (kSmem) {
            spts[w * 32 * PPT + p * 32 + lane] =
                make_float4(px, py, pz, __int_as_float(id[p]));
        } else {
            x[p] = px;
            y[p] = py;
            z[p] = pz;
        }
        temp[p] = valid ? T(INFINITY) : T(-INFINITY);
        if (valid) {
            wlo[0] = fmin(wlo[0], px);
            wlo[1] = fmin(wlo[1], py);
            wlo[2] = fmin(wlo[2], pz);
            whi[0] = fmax(whi[0], px);
            whi[1] = fmax(whi[1], py);
            whi[2] = fmax(whi[2], pz);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            wlo[a] = fmin(wlo[a], __shfl_xor_sync(0xffffffffu, wlo[a], o));
            whi[a] = fmax(whi[a], __shfl_xor_sync(0xffffffffu, whi[a], o));
        }

    int cur = start ? (int)pcops_positive_mod(start[b], L) : 0;
    if (tid == 0) {
        row.idx[0] = cur;
        row.dist2[0] = T(0);
    }
    Candidate<T> wbest = no_candidate<T>();  // the warp's farthest, every lane
    for (int64_t j = 1; j < row.n_out; ++j) {
        T cx, cy, cz;
        if constexpr (kSmem) {
            load_point(row.cloud, cur, cx, cy, cz);
        } else {
            cx = xyz_s[cur].x;
            cy = xyz_s[cur].y;
            cz = xyz_s[cur].z;
        }
        // the sample's squared distance to the warp's box, as fps_dist2 rounds it
        const T gx = fmax(fmax(wlo[0] - cx, cx - whi[0]), T(0));
        const T gy = fmax(fmax(wlo[1] - cy, cy - whi[1]), T(0));
        const T gz = fmax(fmax(wlo[2] - cz, cz - whi[2]), T(0));
        const T gap = fps_dist2(gx, gy, gz, T(0), T(0), T(0));
        if (j == 1 || !(gap > T(0) && gap >= wbest.value)) {
            Candidate<T> c = no_candidate<T>();
#pragma unroll
            for (int p = 0; p < PPT; ++p) {
                if constexpr (kSmem) {  // each lane reads back only the slots it wrote
                    const float4 v = spts[w * 32 * PPT + p * 32 + lane];
                    const int n = __float_as_int(v.w);
                    if (n == cur) temp[p] = T(-1);
                    fps_visit(T(v.x), T(v.y), T(v.z), temp[p], n, cx, cy, cz, c);
                } else {
                    if (id[p] == cur) temp[p] = T(-1);
                    fps_visit(x[p], y[p], z[p], temp[p], id[p], cx, cy, cz, c);
                }
            }
            wbest = warp_farthest(c);
        }
        if (lane == 0) slots[(j & 1) * warps + w] = wbest;
        named_barrier(0, threads);
        Candidate<T> c = lane < warps ? slots[(j & 1) * warps + lane] : no_candidate<T>();
        c = warp_farthest(c);
        if (tid == 0) {
            row.idx[j] = c.index;
            row.dist2[j] = c.value;
        }
        cur = c.index;
    }
}

// ------------------------------------------------------------------------------------------
// CLUSTER: gridDim.x = B * cluster size; block `rank` of a cluster owns the slice
// [rank * chunk, (rank + 1) * chunk) of its cloud.

template <typename T, class Points>
__global__ void __launch_bounds__(max_threads<Points, T>())
fps_cluster_kernel(const T* __restrict__ xyz, const int64_t* __restrict__ lengths,
                   const int64_t* __restrict__ start, int64_t B, int64_t N, int64_t npoint,
                   T* __restrict__ workspace, int64_t* __restrict__ idx, T* __restrict__ dist2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ Candidate<T> warp_slots[2 * 32];
    __shared__ Candidate<T> block_slot[2];  // this block's candidate, by step parity

    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    const int blocks = (int)cluster.num_blocks();
    const int warps = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t b = blockIdx.x / blocks;
    const CloudRow<T> row(xyz, lengths, b, N, npoint, idx, dist2);
    if (rank == 0) pad_row(row.idx, row.dist2, row.n_out, npoint, threadIdx.x, blockDim.x);
    if (row.n_out == 0) return;  // the whole cluster returns here: no shared memory was shared

    const int chunk = (int)(((int64_t)row.L + blocks - 1) / blocks);
    const int lo = (int)min((int64_t)row.L, (int64_t)rank * chunk);
    const int hi = (int)min((int64_t)row.L, (int64_t)lo + chunk);
    Points pts;
    pts.load(row.cloud, workspace ? workspace + b * N : nullptr, lo + threadIdx.x, hi, blockDim.x);
    int cur = start ? (int)pcops_positive_mod(start[b], row.L) : 0;
    if (rank == 0 && threadIdx.x == 0) {
        row.idx[0] = cur;
        row.dist2[0] = T(0);
    }
    for (int64_t j = 1; j < row.n_out; ++j) {
        const int parity = (int)(j & 1);
        T cx, cy, cz;
        load_point(row.cloud, cur, cx, cy, cz);
        Candidate<T> c = pts.step(cur, cx, cy, cz);
        c = group_farthest(c, warp_slots, parity, warps, w, 0);
        if (threadIdx.x == 0) block_slot[parity] = c;
        cluster.sync();  // every block's candidate of step j is visible cluster-wide
        c = lane < blocks ? *cluster.map_shared_rank(&block_slot[parity], lane) : no_candidate<T>();
        c = warp_farthest(c);
        if (rank == 0 && threadIdx.x == 0) {
            row.idx[j] = c.index;
            row.dist2[j] = c.value;
        }
        cur = c.index;
    }
    cluster.sync();  // no block may exit while another can still read its shared memory
#endif
}

// ------------------------------------------------------------------------------------------
// GRID: a cooperative launch of gridDim.x co-resident blocks works on cloud 0, then 1, ...
// Block r owns the slice [r * chunk, (r + 1) * chunk). slots: 2 * gridDim.x candidates in the
// workspace, by step parity (the parity runs on across clouds).

template <typename T, class Points>
__global__ void __launch_bounds__(max_threads<Points, T>())
fps_grid_kernel(const T* __restrict__ xyz, const int64_t* __restrict__ lengths,
                const int64_t* __restrict__ start, int64_t B, int64_t N, int64_t npoint,
                T* __restrict__ workspace, int64_t* __restrict__ idx, T* __restrict__ dist2,
                Candidate<T>* __restrict__ slots) {
    __shared__ Candidate<T> warp_slots[2 * 32];
    __shared__ Candidate<T> s_winner;
    cg::grid_group grid = cg::this_grid();
    const int blocks = gridDim.x, rank = blockIdx.x;
    const int warps = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t steps = 0;
    for (int64_t b = 0; b < B; ++b) {
        const CloudRow<T> row(xyz, lengths, b, N, npoint, idx, dist2);
        if (rank == 0) pad_row(row.idx, row.dist2, row.n_out, npoint, threadIdx.x, blockDim.x);
        if (row.n_out == 0) continue;
        const int chunk = (int)(((int64_t)row.L + blocks - 1) / blocks);
        const int lo = (int)min((int64_t)row.L, (int64_t)rank * chunk);
        const int hi = (int)min((int64_t)row.L, (int64_t)lo + chunk);
        Points pts;
        pts.load(row.cloud, workspace ? workspace + b * N : nullptr, lo + threadIdx.x, hi,
                 blockDim.x);
        int cur = start ? (int)pcops_positive_mod(start[b], row.L) : 0;
        if (rank == 0 && threadIdx.x == 0) {
            row.idx[0] = cur;
            row.dist2[0] = T(0);
        }
        for (int64_t j = 1; j < row.n_out; ++j, ++steps) {
            const int parity = (int)(steps & 1);
            T cx, cy, cz;
            load_point(row.cloud, cur, cx, cy, cz);
            Candidate<T> c = pts.step(cur, cx, cy, cz);
            c = group_farthest(c, warp_slots, parity, warps, w, 0);
            if (threadIdx.x == 0) {
                slots[parity * blocks + rank].value = c.value;
                slots[parity * blocks + rank].index = c.index;
            }
            grid.sync();  // every block's candidate of this step is visible grid-wide
            if (w == 0) {
                Candidate<T> best = no_candidate<T>();
                for (int r = lane; r < blocks; r += 32) {
                    Candidate<T> o = {__ldcg(&slots[parity * blocks + r].value),
                                      __ldcg(&slots[parity * blocks + r].index)};
                    if (farther(o, best)) best = o;
                }
                best = warp_farthest(best);
                if (lane == 0) s_winner = best;
            }
            __syncthreads();  // s_winner is visible; it is rewritten only after the next grid.sync
            c = s_winner;
            if (rank == 0 && threadIdx.x == 0) {
                row.idx[j] = c.index;
                row.dist2[j] = c.value;
            }
            cur = c.index;
        }
    }
}

// ------------------------------------------------------------------------------------------
// BUCKET: the points of each cloud are sorted along a Morton curve (a cub radix sort on
// (cloud, Morton code of the point in the cloud's box) keys, stable) and cut into buckets of
// S = 32 * ppl consecutive sorted points, each with its bounding box and its farthest
// (temp, index). One block per cloud; bucket k belongs to warp k % W, lane (k / W) % 32,
// slot k / (32 W) of that lane (neighbouring buckets go to different warps). A step only
// updates the buckets the new sample c can change: a bucket whose box is at squared distance
// m >= its largest temp from c keeps every temp (each point's distance is >= m: the rounded
// distance of kernels/geometry.h is monotone in |dx|, |dy|, |dz|), and its candidate. The
// bucket that holds c (m == 0) is always updated (the chosen point's temp becomes -1), and so
// is any bucket when m is NaN (non-finite c or box). Late in the run a step touches a few
// buckets, so the cost of a step is the block's reduction, not the cloud's size.

// A sorted point: coordinates and its index in the cloud (16 bytes for float).
template <typename T>
struct alignas(sizeof(T) == 4 ? 16 : 32) BucketPoint {
    T x, y, z;
    int idx;
};

// 10 bits of v spread to every third bit (bits 0, 3, ..., 27).
__device__ __forceinline__ uint32_t spread_bits(uint32_t v) {
    v &= 0x3ffu;
    v = (v | (v << 16)) & 0x030000ffu;
    v = (v | (v << 8)) & 0x0300f00fu;
    v = (v | (v << 4)) & 0x030c30c3u;
    v = (v | (v << 2)) & 0x09249249u;
    return v;
}

// One block per cloud: the box of its valid finite points, as (lo, 1023.99 / largest extent)
// into boxes[b * 4 .. b * 4 + 3] (scale 0 for an empty or flat box).
template <typename T>
__global__ void bucket_box_kernel(const T* __restrict__ xyz, const int64_t* __restrict__ lengths,
                                  int64_t N, T* __restrict__ boxes) {
    __shared__ T part[6][32];
    const int64_t b = blockIdx.x;
    const T* cloud = xyz + b * N * 3;
    const int64_t L = pcops_valid_length(lengths, b, N);
    T lo[3] = {T(INFINITY), T(INFINITY), T(INFINITY)}, hi[3] = {-T(INFINITY), -T(INFINITY), -T(INFINITY)};
    for (int64_t n = threadIdx.x; n < L; n += blockDim.x) {
        const T p[3] = {cloud[3 * n], cloud[3 * n + 1], cloud[3 * n + 2]};
        if (!(isfinite(p[0]) && isfinite(p[1]) && isfinite(p[2]))) continue;
        for (int a = 0; a < 3; ++a) {
            lo[a] = fmin(lo[a], p[a]);
            hi[a] = fmax(hi[a], p[a]);
        }
    }
    for (int off = 16; off > 0; off /= 2)
        for (int a = 0; a < 3; ++a) {
            lo[a] = fmin(lo[a], __shfl_xor_sync(0xffffffffu, lo[a], off));
            hi[a] = fmax(hi[a], __shfl_xor_sync(0xffffffffu, hi[a], off));
        }
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    if (lane == 0)
        for (int a = 0; a < 3; ++a) {
            part[a][w] = lo[a];
            part[3 + a][w] = hi[a];
        }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int v = 1; v < warps; ++v)
            for (int a = 0; a < 3; ++a) {
                lo[a] = fmin(lo[a], part[a][v]);
                hi[a] = fmax(hi[a], part[3 + a][v]);
            }
        T extent = 0;
        for (int a = 0; a < 3; ++a) extent = hi[a] > lo[a] ? fmax(extent, hi[a] - lo[a]) : extent;
        const bool ok = extent > 0 && isfinite(extent);
        for (int a = 0; a < 3; ++a) boxes[b * 4 + a] = ok ? lo[a] : T(0);
        boxes[b * 4 + 3] = ok ? T(1023.99) / extent : T(0);
    }
}

// key[i] = (b << 32) | Morton code for the valid finite point i = b * N + n; non-finite points
// after them (0xfffffffe), padding last (0xffffffff). vals[i] = n.
template <typename T>
__global__ void bucket_key_kernel(const T* __restrict__ xyz, const int64_t* __restrict__ lengths,
                                  int64_t B, int64_t N, const T* __restrict__ boxes,
                                  uint64_t* __restrict__ keys, int32_t* __restrict__ vals) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < B * N;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / N, n = i - b * N;
        uint32_t code = 0xffffffffu;
        if (n < pcops_valid_length(lengths, b, N)) {
            const T* p = xyz + 3 * i;
            const T* box = boxes + 4 * b;
            code = 0xfffffffeu;
            if (isfinite(p[0]) && isfinite(p[1]) && isfinite(p[2])) {
                uint32_t q[3];
                for (int a = 0; a < 3; ++a) {
                    const T v = (p[a] - box[a]) * box[3];  // in [0, 1024) for a finite point
                    q[a] = v > T(0) ? (uint32_t)fmin(v, T(1023)) : 0u;
                }
                code = spread_bits(q[0]) | (spread_bits(q[1]) << 1) | (spread_bits(q[2]) << 2);
            }
        }
        keys[i] = ((uint64_t)b << 32) | code;
        vals[i] = (int32_t)n;
    }
}

template <typename T>
__global__ void bucket_gather_kernel(const T* __restrict__ xyz, int64_t B, int64_t N,
                                     const int32_t* __restrict__ order,
                                     BucketPoint<T>* __restrict__ pts) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < B * N;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / N;
        const int n = order[i];
        const T* p = xyz + (b * N + n) * 3;
        pts[i] = {p[0], p[1], p[2], n};
    }
}

// A bucket a lane keeps: its box [lo, hi] and its farthest (temp, index).
template <typename T>
struct Bucket {
    T lx, ly, lz, hx, hy, hz;
    Candidate<T> best;

    // Squared distance from c to the box: the distance to the box's point nearest c, by the
    // same formula as the points' distances (NaN when c or the box is not finite).
    __device__ __forceinline__ T dist2_to(T cx, T cy, T cz) const {
        return fps_dist2(fmin(fmax(cx, lx), hx), fmin(fmax(cy, ly), hy), fmin(fmax(cz, lz), hz),
                         cx, cy, cz);
    }
};

// A warp's farthest candidate with its coordinates: what the block reduces at each step.
template <typename T>
struct Sample {
    Candidate<T> c;
    T x, y, z;
};

// A bucket before the first step: no box, no candidate; then set() from its sorted points
// [p0, p1): the box (fmin / fmax pass over NaN coordinates) and the point with the lowest index
// (every temp starts at +inf: that is its farthest), whose coordinates go to (fx, fy, fz).
template <typename T>
__device__ __forceinline__ void bucket_clear(Bucket<T>& u) {
    u.best = no_candidate<T>();
    u.lx = u.ly = u.lz = T(INFINITY);
    u.hx = u.hy = u.hz = -T(INFINITY);
}
template <typename T>
__device__ __forceinline__ void bucket_set(Bucket<T>& u, const BucketPoint<T>* pts, int p0,
                                           int p1, T& fx, T& fy, T& fz) {
    for (int p = p0; p < p1; ++p) {
        const BucketPoint<T> q = pts[p];
        u.lx = fmin(u.lx, q.x), u.hx = fmax(u.hx, q.x);
        u.ly = fmin(u.ly, q.y), u.hy = fmax(u.hy, q.y);
        u.lz = fmin(u.lz, q.z), u.hz = fmax(u.hz, q.z);
        if (q.idx < u.best.index) u.best.index = q.idx, fx = q.x, fy = q.y, fz = q.z;
    }
    u.best.value = T(INFINITY);
}

// The end of a step of the bucket kernels: lane 0 of each warp publishes the warp's farthest
// (best, coordinates from at(), called in lane 0 only), one barrier (samples are
// double-buffered by step parity, see group_farthest), every warp reduces the warps'; thread 0
// writes sample j. Returns the winner; (cx, cy, cz) become its coordinates.
template <typename T, class At>
__device__ __forceinline__ Candidate<T> bucket_step_winner(Sample<T> (&samples)[2][16],
                                                           int64_t j, Candidate<T> best, At at,
                                                           const CloudRow<T>& row, T& cx,
                                                           T& cy, T& cz) {
    const int warps = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int parity = (int)(j & 1);
    if (lane == 0) {
        T x, y, z;
        at(x, y, z);
        samples[parity][w] = {best, x, y, z};
    }
    named_barrier(0, blockDim.x);
    Candidate<T> c = lane < warps ? samples[parity][lane].c : no_candidate<T>();
    const Sample<T>& win = samples[parity][warp_argmax(c)];
    cx = win.x, cy = win.y, cz = win.z;
    if (threadIdx.x == 0) {
        row.idx[j] = c.index;
        row.dist2[j] = c.value;
    }
    return c;
}

// Dynamic shared memory: the coordinates of each bucket's candidate (3 * buckets T), written
// and read only by the warp that owns the bucket. (Updating several flagged buckets of a warp
// together, their loads in flight at once, measured slower on the H100 for KITTI: registers.)
template <typename T, int SLOTS>
__global__ void __launch_bounds__(512)
fps_bucket_kernel(const T* __restrict__ xyz, const int64_t* __restrict__ lengths,
                  const int64_t* __restrict__ start, int64_t N, int64_t npoint,
                  const BucketPoint<T>* __restrict__ sorted, T* __restrict__ temp_ws, int ppl,
                  int64_t* __restrict__ idx, T* __restrict__ dist2) {
    extern __shared__ __align__(16) unsigned char fps_smem[];
    __shared__ Sample<T> samples[2][16];  // the warps' candidates, by step parity
    T* bucket_xyz = reinterpret_cast<T*>(fps_smem);
    const int warps = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t b = blockIdx.x;
    const CloudRow<T> row(xyz, lengths, b, N, npoint, idx, dist2);
    const BucketPoint<T>* pts = sorted + b * N;
    T* temp = temp_ws + b * N;
    pad_row(row.idx, row.dist2, row.n_out, npoint, threadIdx.x, blockDim.x);
    if (row.n_out == 0) return;
    const int S = 32 * ppl;  // points per bucket; sorted positions < L are the valid points
    const int buckets = (row.L + S - 1) / S;

    for (int p = threadIdx.x; p < row.L; p += blockDim.x) temp[p] = T(INFINITY);
    Bucket<T> bk[SLOTS];
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
        const int k = (s * 32 + lane) * warps + w;
        bucket_clear(bk[s]);
        if (k >= buckets) continue;
        bucket_set(bk[s], pts, k * S, min(row.L, (k + 1) * S), bucket_xyz[3 * k],
                   bucket_xyz[3 * k + 1], bucket_xyz[3 * k + 2]);
    }
    __syncthreads();  // the temps are set

    int cur = start ? (int)pcops_positive_mod(start[b], row.L) : 0;
    T cx, cy, cz;
    load_point(row.cloud, cur, cx, cy, cz);
    if (threadIdx.x == 0) {
        row.idx[0] = cur;
        row.dist2[0] = T(0);
    }
    for (int64_t j = 1; j < row.n_out; ++j) {
        // the buckets c can change, one at a time (every lane checks its own; the warp updates
        // the flagged ones together, a point a lane), then this lane's farthest candidate
        Candidate<T> best = no_candidate<T>();
        int best_k = -1;
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
            const int k = (s * 32 + lane) * warps + w;
            const T m = bk[s].dist2_to(cx, cy, cz);
            const bool update = k < buckets && (!(m >= bk[s].best.value) || m == T(0));
            for (unsigned mask = __ballot_sync(0xffffffffu, update); mask; mask &= mask - 1) {
                const int owner = __ffs(mask) - 1;
                const int ko = (s * 32 + owner) * warps + w;
                Candidate<T> c = no_candidate<T>();
                T px = 0, py = 0, pz = 0;
                for (int p = ko * S + lane; p < (ko + 1) * S && p < row.L; p += 32) {
                    // both loads issued before either is used: the temp is read whatever q.idx
                    // holds (`q.idx == cur ? -1 : temp[p]` made the temp load wait for the
                    // point's, two L2 round trips a bucket in a row on large clouds)
                    const BucketPoint<T> q = pts[p];
                    T t = temp[p];
                    const T d = fps_dist2(q.x, q.y, q.z, cx, cy, cz);
                    t = q.idx == cur ? T(-1) : t;
                    t = d < t ? d : t;
                    temp[p] = t;
                    const Candidate<T> o = {t, q.idx};
                    if (farther(o, c)) c = o, px = q.x, py = q.y, pz = q.z;
                }
                if (lane == warp_argmax(c))
                    bucket_xyz[3 * ko] = px, bucket_xyz[3 * ko + 1] = py, bucket_xyz[3 * ko + 2] = pz;
                if (lane == owner) bk[s].best = c;
            }
            if (farther(bk[s].best, best)) best = bk[s].best, best_k = k;
        }
        best_k = __shfl_sync(0xffffffffu, best_k, warp_argmax(best));
        __syncwarp();  // this warp's bucket_xyz writes are visible to lane 0
        cur = bucket_step_winner(samples, j, best, [&](T& x, T& y, T& z) {
                  x = best_k >= 0 ? bucket_xyz[3 * best_k] : T(0);
                  y = best_k >= 0 ? bucket_xyz[3 * best_k + 1] : T(0);
                  z = best_k >= 0 ? bucket_xyz[3 * best_k + 2] : T(0);
              }, row, cx, cy, cz).index;
    }
}

// ------------------------------------------------------------------------------------------
// BUCKET_GROUPS (float): the buckets of BUCKET, with the flagged ones of a step shared out over
// the block's warps. Lane `lane` of warp w keeps the group g = lane * W + w of G consecutive
// (Morton-ordered, so nearby) buckets, G = 1, 2, 4 or 8 (the fewest that leave at most 512
// groups): their boxes and farthest candidates in registers and the group's box. A step:
//   1. each lane tests its group's box first (the bucket rule: a box at m >= the group's
//      largest temp keeps every temp), and only the lanes whose group fails test their G
//      buckets; the flagged buckets go to a list in shared memory (a shared atomic a lane);
//   2. barrier; warp w updates buckets w, w + W, ... of the list (one bucket a warp, its points
//      a lane, the loads in flight together) and writes each one's farthest to shared memory;
//      meanwhile the farthest of the buckets that kept their temps is a warp reduction;
//   3. each warp's farthest of both to shared memory, barrier, every warp reduces the warps'.
// The owners read their updated buckets' candidates back at the next step. BUCKET updates its
// flagged buckets in the warps that own them, one after the other, so a step waits for the warp
// with the most; here it waits for about one bucket update, and a skipped group costs one box
// test instead of G.

constexpr int kMaxBucketGroups = 512;  // 16 warps of 32 lanes, a group a lane

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
// BUCKET_ROUNDS (float): the buckets of BUCKET_GROUPS, several samples a round. FPS's temps
// are nearly level late in a run: many buckets hold a candidate close to the farthest, and
// most of those lie far apart, so the next samples can be read off the buckets' farthest
// points without a pass between them. A round:
//   X. every bucket whose farthest temp is >= theta (kept in a list during the last round;
//      theta = rho * the last sample's temp, rho adapted so the list holds a few to 32) is a
//      candidate, sorted by (temp, index): c_0 > c_1 > ... > c_{n-1}. Every bucket the
//      candidates can change is flagged (group and bucket boxes as in BUCKET_GROUPS, behind a
//      box per warp; a warp's lanes hold consecutive groups) with the candidates' bits; the
//      farthest temp of each candidate's own bucket after that candidate alone is computed
//      (newkey_a), and the candidates are sorted.
//   Y. c_0 .. c_{J-1} are the next J samples, exactly, where J is the first rank r at which
//      (a) an earlier candidate lowers c_r's temp (!(d2(c_r, c_i) < temp(c_r)) fails), or
//      (b) an earlier candidate's own bucket keeps a temp >= c_r after it was chosen
//          (newkey_i > c_r).
//      Why: with c_0 .. c_{r-1} chosen, c_r's temp is unchanged by (a); every point of a
//      bucket outside the list is below theta <= c_r; of a listed bucket of a later rank below
//      its farthest < c_r; of c_r's bucket below c_r; of an earlier candidate i's bucket at
//      most its temp after c_i alone (more samples only lower it), < c_r by (b). So c_r is
//      the farthest point, as the one-sample step would find. The flagged buckets are then
//      updated with every chosen candidate that flagged them (min is order-free), their
//      farthest points re-found, and the list for the next round is built.
// When the list is empty or overflows, the round takes the farthest point alone (the warps'
// farthest, published every round), as a BUCKET_GROUPS step does. Two block barriers a round;
// on the KITTI scan (16 384 of 115 384) about 15 samples a round (float32 replay).

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
// launch plans

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
};

cudaError_t current_device(Device* d) {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&d->sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&d->major, cudaDevAttrComputeCapabilityMajor, device);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&d->cooperative, cudaDevAttrCooperativeLaunch, device);
    return err;
}

// Whether a cluster kernel can run: the device has clusters (compute capability 9.0+) AND the
// kernel was built from sm_90 (or newer) code. Its body only exists for __CUDA_ARCH__ >= 900,
// so a build without sm_90 code (JIT-compiled by the driver for an H100) holds an empty kernel
// that must never be launched: it would leave idx unwritten.
template <typename T, class Points>
bool cluster_kernel_usable(const Device& d) {
    if (d.major < 9) return false;
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, fps_cluster_kernel<T, Points>) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return attr.ptxVersion >= 90;
}

// The smallest register slot count (of 2, 4, 8, 16) with which `threads_max`-capped blocks
// hold `points` points; 0 when none does.
template <typename T>
int fit_points_per_thread(int64_t points, int prefer) {
    for (int ppt = prefer; ppt <= max_points_per_thread<T>(); ppt *= 2)
        if (points <= (int64_t)ppt * max_threads_for<T>(ppt)) return ppt;
    return 0;
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

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

// BUCKET_GROUPS (float only): buckets of 32 * ppl points (ppl 1, 2, 4 or 8), at most 4096 per
// cloud (24 bytes of shared memory each), so at most 512 groups of 8: one a lane, the groups
// spread over up to 16 warps.
template <typename T>
bool plan_bucket_groups(pcops_fps_cuda_plan* p, int64_t B, int64_t N) {
    if (sizeof(T) != 4 || B * N > INT_MAX) return false;
    const int64_t Np = N > 0 ? N : 1;
    int64_t ppl = 1;
    while (ppl < 8 && (Np + 32 * ppl - 1) / (32 * ppl) > 4096) ppl *= 2;
    const int64_t buckets = (Np + 32 * ppl - 1) / (32 * ppl);
    if (buckets > 4096) return false;
    // buckets a lane: the fewest that leave at most 512 groups, over as many warps as there
    // are groups, up to 16 (on the H100 fewer warps with more buckets a lane were slower: F5
    // 9.8 ms with 16 warps, 11.8 with 8, 14.0 with 4)
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
    return true;
}

// BUCKET_ROUNDS (float only): buckets of 32 * ppl points as in BUCKET_GROUPS, `blocks` blocks a
// cloud (1, or a cluster of 2, 4 or 8 on sm_90: BUCKET_ROUNDS_CLUSTER) holding a contiguous
// range of at most 4096 of them each, in groups of 1-8 (<= 512 groups a block, 32 a warp), at
// least 2 warps a block.
template <typename T>
bool plan_bucket_rounds(pcops_fps_cuda_plan* p, const Device& d, int64_t B, int64_t N,
                        int variant) {
    if (sizeof(T) != 4 || B * N > INT_MAX) return false;
    const int64_t Np = N > 0 ? N : 1;
    int64_t blocks = 1;
    if (variant == PCOPS_FPS_BUCKET_ROUNDS_CLUSTER) {
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
    int64_t ppl = 1;
    auto per_block = [&](int64_t q) {
        return ((Np + 32 * q - 1) / (32 * q) + blocks - 1) / blocks;
    };
    while (ppl < 8 && per_block(ppl) > 4096) ppl *= 2;
    const int64_t buckets = per_block(ppl);
    if (buckets > 4096 || B * blocks > INT_MAX) return false;
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
    return true;
}

// BUCKET: buckets of 32 * ppl points, at most 4096 per cloud (16 warps of 32 lanes with 8
// slots each; 2048 and 4 for double); 1 to 16 warps, 1, 2, 4 or 8 slots per lane. Sorted positions are int and cub
// sorts an int count of items: B * N <= INT_MAX.
template <typename T>
bool plan_bucket(pcops_fps_cuda_plan* p, int64_t B, int64_t N) {
    if (B * N > INT_MAX) return false;
    const int max_slots = sizeof(T) == 4 ? 8 : 4;  // without spilling (-Xptxas -v, sm_90)
    const int64_t Np = N > 0 ? N : 1;
    int64_t ppl = 1;
    while ((Np + 32 * ppl - 1) / (32 * ppl) > 16 * 32 * max_slots) ppl *= 2;
    const int64_t buckets = (Np + 32 * ppl - 1) / (32 * ppl);
    const int warps = (int)std::min<int64_t>(16, (buckets + 31) / 32);
    int slots = 1;
    while ((int64_t)slots * 32 * warps < buckets) slots *= 2;
    if (slots > max_slots) return false;
    p->points_per_thread = (int)ppl;
    p->bucket_slots = slots;
    p->warps_per_cloud = warps;
    p->threads = 32 * warps;
    p->clouds_per_block = 1;
    p->blocks_per_cloud = 1;
    p->blocks = B;
    return true;
}

// Fills the shape of a SIMPLE / WARP / BLOCK plan for clouds of N points.
//   SIMPLE: 8 warps per cloud, temp in the workspace.
//   WARP:   1 warp per cloud up to 256 points, else 2 (up to 64 * 16 points), 8 warps a block.
//   BLOCK:  4 points per thread up to 2048 points, else the most registers hold (16 float,
//           8 double), 2 to 32 warps, one cloud per block. A step is a chain of latencies:
//           on the H100 (L2 flushed) 1024 points x32 run best with 8 warps of 4 (0.160 ms
//           for 512 samples; 4 warps of 8: 0.208), 4096 x16 with 8 warps of 16 (0.527 ms for
//           1024; 16 warps of 8: 0.610, 32 of 4: 0.760).
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

// BLOCK_PRUNED: 8 points a thread (16 for float clouds past 4096 points), as many warps as
// that takes (2 to 16): smaller warp regions skip more often than the block path's 16 a thread
// (H100, L2 flushed, ms, B x N -> npoint: 16 x 4096 -> 1024: 8 a thread 0.511, 16 a thread
// 0.512 with 8 warps, the block path 0.600; 32 x 2048 -> 1024: 0.434 / 0.468 / 0.491; 8 x 8192
// -> 2048: 16 a thread 1.19, the block path 1.80). With the sample read from shared memory
// (stop 22): 16 x 4096 -> 1024 0.447, 32 x 2048 -> 1024 0.362, 8 x 8192 -> 2048 1.077.
template <typename T>
bool plan_pruned(pcops_fps_cuda_plan* p, int64_t B, int64_t N) {
    const int64_t Np = N > 0 ? N : 1;
    int ppt = 8;
    if (Np > 16 * 32 * 8) {
        if (sizeof(T) != 4) return false;
        ppt = 16;
    }
    const int64_t warps = std::max<int64_t>(2, (Np + 32LL * ppt - 1) / (32LL * ppt));
    // past 16 warps (float, > 8192 points) the points move to shared memory: up to 24 warps
    if (warps > (sizeof(T) == 4 ? 24 : 16)) return false;
    p->points_per_thread = ppt;
    p->warps_per_cloud = (int)warps;
    p->clouds_per_block = 1;
    p->threads = 32 * (int)warps;
    p->blocks_per_cloud = 1;
    p->blocks = B;
    return pruned_smem_bytes<T>(p->warps_per_cloud, N, p->warps_per_cloud > 16, ppt) <=
           200 * 1024;
}

// Launches one BLOCK_PRUNED kernel. Above 48 KB of shared memory a kernel opts in, per kernel
// and device: once (a static per instantiation), to the most plan_pruned allows -- a driver
// call on every launch cost the small clouds' latency.
template <typename T, int PPT, bool kSmem>
cudaError_t launch_pruned(const pcops_fps_cuda_plan* p, size_t smem, const T* xyz,
                          const int64_t* lengths, const int64_t* start, int64_t B, int64_t N,
                          int64_t npoint, int64_t* idx, T* dist2, cudaStream_t stream) {
    auto kernel = fps_pruned_kernel<T, PPT, kSmem>;
    if (smem > 48 * 1024) {
        static std::atomic<uint64_t> opted{0};  // bit d: done on device d
        int device = 0;
        cudaError_t err = cudaGetDevice(&device);
        if (err != cudaSuccess) return err;
        const uint64_t bit = device < 64 ? 1ull << device : 0;
        if (!(opted.load() & bit)) {
            err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       200 * 1024);
            if (err != cudaSuccess) return err;
            opted.fetch_or(bit);
        }
    }
    kernel<<<(unsigned)p->blocks, p->threads, smem, stream>>>(xyz, lengths, start, B, N, npoint,
                                                             idx, dist2, p->warps_per_cloud);
    return cudaGetLastError();
}

template <typename T>
bool plan_cluster(pcops_fps_cuda_plan* p, const Device& d, int64_t B, int64_t N, int blocks) {
    if (d.major < 9 || B > INT_MAX / 8) return false;
    const int64_t Np = N > 0 ? N : 1;
    plan_slice<T>(p, (Np + blocks - 1) / blocks, 4);
    p->blocks_per_cloud = blocks;
    p->blocks = B * blocks;
    // the kernel was built for clusters, and a cluster of this shape fits the device
    int clusters = 0;
    cudaError_t err = with_points<T>(p->points_per_thread, [&](auto pts) -> cudaError_t {
        using Points = decltype(pts);
        if (!cluster_kernel_usable<T, Points>(d)) return cudaErrorInvalidValue;
        cudaLaunchConfig_t config = {};
        config.gridDim = dim3((unsigned)blocks);
        config.blockDim = dim3(p->threads);
        cudaLaunchAttribute attribute[1];
        attribute[0].id = cudaLaunchAttributeClusterDimension;
        attribute[0].val.clusterDim.x = blocks;
        attribute[0].val.clusterDim.y = 1;
        attribute[0].val.clusterDim.z = 1;
        config.attrs = attribute;
        config.numAttrs = 1;
        return cudaOccupancyMaxActiveClusters(&clusters, fps_cluster_kernel<T, Points>, &config);
    });
    if (err != cudaSuccess) (void)cudaGetLastError();
    return err == cudaSuccess && clusters > 0;
}

template <typename T>
bool plan_grid(pcops_fps_cuda_plan* p, const Device& d, int64_t N) {
    if (!d.cooperative) return false;
    const int64_t Np = N > 0 ? N : 1;
    // blocks: about one per SM, fewer when the cloud is small (each block >= 1024 points)
    int blocks = (int)std::min<int64_t>(d.sms, (Np + 1023) / 1024);
    if (blocks < 1) blocks = 1;
    plan_slice<T>(p, (Np + blocks - 1) / blocks, 2);
    const int ppt = p->points_per_thread;
    // every block must be co-resident
    int per_sm = 0;
    cudaError_t err = with_points<T>(ppt, [&](auto pts) {
        return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, fps_grid_kernel<T, decltype(pts)>, p->threads, 0);
    });
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    if ((int64_t)per_sm * d.sms < blocks) return false;
    p->blocks_per_cloud = blocks;
    p->blocks = blocks;
    return true;
}

template <typename T>
cudaError_t make_plan(int64_t B, int64_t N, int64_t npoint, int variant,
                      pcops_fps_cuda_plan* p) {
    Device d;
    cudaError_t err = current_device(&d);
    if (err != cudaSuccess) return err;
    if (variant == PCOPS_FPS_AUTO) {
        // Small clouds: a warp or two each, several per block (latency of one warp's shuffles).
        // Clouds that fit one block's registers: a block each, from 2048 points (float: 1025)
        // with the warps skipping what a sample cannot change (BLOCK_PRUNED). Float, H100, stop
        // 30 (runs and the slot tree), ms, warp / block / block_pruned: 64 x 128 -> 64 0.014 /
        // 0.017 / 0.034; 128 x 256 -> 128 0.033 / 0.031 / 0.054; 64 x 512 -> 256 0.085 / 0.058
        // / 0.095; 32 x 1024 -> 512 - / 0.135 / 0.171; 16 x 1500 -> 700 - / 0.294 / 0.243;
        // 8 x 2000 -> 1000 - / 0.513 / 0.348. Float clouds up to 12288 points
        // with fewer than 2048 samples too, their points in shared memory (6 x 10000 -> 1000:
        // 0.93 ms against BUCKET_GROUPS' 1.31; 6 x 12288 -> 2000: 1.89 against 2.49; with more
        // samples the rounds catch up: 6 x 10240 -> 2000, 2.03 against 1.98). Larger clouds: the buckets, a
        // block each (on the H100, FPS 16384 of 16384 points x8: 5.9 ms vs 9.4 for clusters of
        // 8; 16384 of the KITTI scan: 31 ms vs 44 for the grid, and 36 ms vs 326 for 8 scans);
        // float32 up to 2**20 points: the grouped buckets, faster than BUCKET on every size
        // measured (F3-F5 6-17 %, 200k -> 20k 43 ms vs 50, and the grid's 52; 1M -> 100k 284
        // ms vs the grid's 305); double, one huge cloud: the whole grid (200k -> 20k: 51 ms vs
        // 56). Clusters and the grid also take what the buckets cannot (B * N > 2**31 - 1).
        // float32 past the block path, since the rounds (H100, ms, groups / rounds / rounds on
        // clusters of 8): few clouds of >= 32k points on clusters (KITTI -> 16384 29.6 / 17.7 /
        // 8.7; 8 scans 29.8 / 19.5 / 10.9; F6 44.3 / 31.5 / 12.2; F7 292 / 235 / 69), smaller
        // clouds or many of them in rounds on a block each from 2048 samples (F3 4.69 / 2.98 /
        // 4.79, F5 9.66 / 5.68 / 7.94), the groups below (F4, 1000 samples: 1.27 / 1.34 / 1.94).
        const int64_t block_cap = sizeof(T) == 4 ? 8192 : 4096;  // see plan_group
        const bool f32 = sizeof(T) == 4 && B * N <= INT_MAX;
        if (N <= (sizeof(T) == 4 ? 128 : 512)) variant = PCOPS_FPS_WARP;
        else if (N < (sizeof(T) == 4 ? 1025 : 2048)) variant = PCOPS_FPS_BLOCK;
        else if (N <= block_cap) variant = PCOPS_FPS_BLOCK_PRUNED;
        else if (f32 && N <= kPrunedMaxFloat && npoint < 2048) variant = PCOPS_FPS_BLOCK_PRUNED;
        else if (f32 && d.major >= 9 && N >= 32768 && B * 8 <= d.sms && N <= 8 * 4096 * 256)
            variant = PCOPS_FPS_BUCKET_ROUNDS_CLUSTER;
        else if (f32 && N <= kMaxBucketGroups * 8 * 256)
            variant = npoint >= 2048 ? PCOPS_FPS_BUCKET_ROUNDS : PCOPS_FPS_BUCKET_GROUPS;
        else if (B * N <= INT_MAX && !(B == 1 && N > 150000)) variant = PCOPS_FPS_BUCKET;
        else if (d.major >= 9 && (N <= 8 * block_cap || B * 8 >= d.sms)) variant = PCOPS_FPS_CLUSTER;
        else variant = PCOPS_FPS_GRID;
        pcops_fps_cuda_plan q = *p;
        q.path = variant;
        bool ok = false;
        switch (variant) {
            case PCOPS_FPS_WARP:
            case PCOPS_FPS_BLOCK: ok = plan_group<T>(&q, B, N, variant); break;
            case PCOPS_FPS_BLOCK_PRUNED:
                ok = plan_pruned<T>(&q, B, N);
                if (!ok) {
                    q.path = PCOPS_FPS_BLOCK;
                    ok = plan_group<T>(&q, B, N, PCOPS_FPS_BLOCK);
                }
                break;
            case PCOPS_FPS_CLUSTER: ok = plan_cluster<T>(&q, d, B, N, 8); break;
            case PCOPS_FPS_GRID: ok = plan_grid<T>(&q, d, N); break;
            case PCOPS_FPS_BUCKET: ok = plan_bucket<T>(&q, B, N); break;
            case PCOPS_FPS_BUCKET_GROUPS: ok = plan_bucket_groups<T>(&q, B, N); break;
            case PCOPS_FPS_BUCKET_ROUNDS:
            case PCOPS_FPS_BUCKET_ROUNDS_CLUSTER:
                ok = plan_bucket_rounds<T>(&q, d, B, N, variant);
                break;
        }
        if (!ok && variant == PCOPS_FPS_BUCKET_ROUNDS_CLUSTER && N <= kMaxBucketGroups * 8 * 256) {
            q.path = PCOPS_FPS_BUCKET_ROUNDS;  // e.g. a build without sm_90 code
            ok = plan_bucket_rounds<T>(&q, d, B, N, PCOPS_FPS_BUCKET_ROUNDS);
        }
        if (!ok) {  // e.g. no clusters on this device: the reference path takes any size
            q.path = PCOPS_FPS_SIMPLE;
            ok = plan_group<T>(&q, B, N, PCOPS_FPS_SIMPLE);
        }
        *p = q;
        return ok ? cudaSuccess : cudaErrorInvalidValue;
    }
    p->path = variant;
    bool ok = false;
    switch (variant) {
        case PCOPS_FPS_SIMPLE:
        case PCOPS_FPS_WARP:
        case PCOPS_FPS_BLOCK: ok = plan_group<T>(p, B, N, variant); break;
        case PCOPS_FPS_BLOCK_PRUNED: ok = plan_pruned<T>(p, B, N); break;
        case PCOPS_FPS_CLUSTER: {
            // the fewest of 2, 4, 8 blocks per cloud that hold it in registers; 8 otherwise
            int blocks = 2;
            while (blocks < 8 && N > (int64_t)blocks * 640 * (sizeof(T) == 4 ? 8 : 4)) blocks *= 2;
            ok = plan_cluster<T>(p, d, B, N, blocks);
            break;
        }
        case PCOPS_FPS_GRID: ok = plan_grid<T>(p, d, N); break;
        case PCOPS_FPS_BUCKET: ok = plan_bucket<T>(p, B, N); break;
        case PCOPS_FPS_BUCKET_GROUPS: ok = plan_bucket_groups<T>(p, B, N); break;
        case PCOPS_FPS_BUCKET_ROUNDS:
        case PCOPS_FPS_BUCKET_ROUNDS_CLUSTER:
            ok = plan_bucket_rounds<T>(p, d, B, N, variant);
            break;
    }
    return ok ? cudaSuccess : cudaErrorInvalidValue;
}

// The workspace of a plan. Described once; with base NULL it only counts. Returns the bytes.
template <typename T>
struct Scratch {
    T* temp;               // [B, N] temps when the points live in global memory (and BUCKET's)
    Candidate<T>* slots;   // GRID: the blocks' candidates, by step parity
    T* boxes;              // BUCKET: [B, 4] the Morton frame of each cloud
    uint64_t* keys_in;     // BUCKET: [B * N] sort keys and the point index of each
    uint64_t* keys_out;
    int32_t* order_in;
    int32_t* order_out;    //         the point index of each sorted position
    BucketPoint<T>* sorted;  //       [B * N] the points in sorted order
    void* sort_temp;       //         cub's temporary storage
    size_t sort_bytes;
    int sort_bits;         //         key bits to sort: 32 + bits of B - 1
};

template <typename T>
size_t plan_layout(const pcops_fps_cuda_plan* p, void* base, Scratch<T>* s) {
    *s = {};
    pcops_carver w = pcops_carver_init(base);
    const int64_t items = p->B * p->N;
    const bool bucket = p->path == PCOPS_FPS_BUCKET ||
                        p->path == PCOPS_FPS_BUCKET_GROUPS ||
                        p->path == PCOPS_FPS_BUCKET_ROUNDS ||
                        p->path == PCOPS_FPS_BUCKET_ROUNDS_CLUSTER;
    if (p->points_per_thread == 0 || bucket) s->temp = (T*)pcops_carve(&w, items, sizeof(T));
    if (p->path == PCOPS_FPS_GRID)
        s->slots = (Candidate<T>*)pcops_carve(&w, 2 * p->blocks, sizeof(Candidate<T>));
    if (bucket) {
        s->sort_bits = 32;
        while (s->sort_bits < 64 && ((int64_t)1 << (s->sort_bits - 32)) < p->B) ++s->sort_bits;
        // size only: cub returns the temp size when the temp pointer is NULL
        cub::DeviceRadixSort::SortPairs(nullptr, s->sort_bytes, (const uint64_t*)nullptr,
                                        (uint64_t*)nullptr, (const int32_t*)nullptr,
                                        (int32_t*)nullptr, (int)(items > 0 ? items : 1), 0,
                                        s->sort_bits);
        s->boxes = (T*)pcops_carve(&w, 4 * p->B, sizeof(T));
        s->keys_in = (uint64_t*)pcops_carve(&w, items, sizeof(uint64_t));
        s->keys_out = (uint64_t*)pcops_carve(&w, items, sizeof(uint64_t));
        s->order_in = (int32_t*)pcops_carve(&w, items, sizeof(int32_t));
        s->order_out = (int32_t*)pcops_carve(&w, items, sizeof(int32_t));
        s->sorted = (BucketPoint<T>*)pcops_carve(&w, items, sizeof(BucketPoint<T>));
        s->sort_temp = pcops_carve(&w, (int64_t)s->sort_bytes, 1);
    }
    return pcops_carver_bytes(&w);
}

// BUCKET: sort the points of every cloud into Morton order, then one block per cloud.
template <typename T>
cudaError_t run_bucket(const pcops_fps_cuda_plan* p, const Scratch<T>& s, const T* xyz,
                       const int64_t* lengths, const int64_t* start, int64_t B, int64_t N,
                       int64_t npoint, int64_t* idx, T* dist2, cudaStream_t stream) {
    const int64_t items = B * N;
    if (items > 0) {
        bucket_box_kernel<T><<<(unsigned)B, 256, 0, stream>>>(xyz, lengths, N, s.boxes);
        const unsigned blocks = pcops_grid_stride_blocks(items, 256);
        bucket_key_kernel<T><<<blocks, 256, 0, stream>>>(xyz, lengths, B, N, s.boxes,
                                                         s.keys_in, s.order_in);
        size_t bytes = s.sort_bytes;
        cudaError_t err = cub::DeviceRadixSort::SortPairs(
            s.sort_temp, bytes, s.keys_in, s.keys_out, s.order_in, s.order_out, (int)items, 0,
            s.sort_bits, stream);
        if (err != cudaSuccess) return err;
        bucket_gather_kernel<T><<<blocks, 256, 0, stream>>>(xyz, B, N, s.order_out, s.sorted);
    }
    const int64_t S = 32 * (int64_t)p->points_per_thread;
    if constexpr (sizeof(T) == 4) {
        if (p->path == PCOPS_FPS_BUCKET_GROUPS) {
            // each bucket's farthest point and index, the list: <= 96 KiB (4096 buckets)
            const size_t smem = (size_t)((N + S - 1) / S) * (sizeof(float4) + 2 * sizeof(int));
            auto launch = [&](auto kernel) {
                cudaError_t err = cudaFuncSetAttribute(
                    kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
                if (err != cudaSuccess) return err;
                kernel<<<(unsigned)B, p->threads, smem, stream>>>(xyz, lengths, start, N, npoint,
                                                              s.sorted, s.temp, idx, dist2);
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
        if (p->path == PCOPS_FPS_BUCKET_ROUNDS ||
            p->path == PCOPS_FPS_BUCKET_ROUNDS_CLUSTER) {
            // a block's buckets: each one's farthest point, index and flagged-list slot
            // (<= 112 KiB)
            const int64_t blocks = p->blocks_per_cloud;
            const size_t smem = (size_t)(((N + S - 1) / S + blocks - 1) / blocks) *
                                (sizeof(float4) + sizeof(int2) + sizeof(int));
            auto launch = [&](auto kernel) {
                cudaError_t err = cudaFuncSetAttribute(
                    kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
                if (err != cudaSuccess) return err;
                if (blocks == 1) {
                    kernel<<<(unsigned)p->blocks, p->threads, smem, stream>>>(
                        xyz, lengths, start, N, npoint, s.sorted, s.temp, idx, dist2);
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
                return cudaLaunchKernelEx(&config, kernel, xyz, lengths, start, N, npoint,
                                          (const BucketPoint<float>*)s.sorted, s.temp, idx, dist2);
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
    }
    const size_t smem = (size_t)3 * ((N + S - 1) / S) * sizeof(T);  // <= 48 KiB (4096 float buckets)
    auto launch = [&](auto kernel) {
        // with the kernel's static shared memory, 48 KiB of dynamic needs the opt-in
        cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)smem);
        if (err != cudaSuccess) return err;
        kernel<<<(unsigned)B, p->threads, smem, stream>>>(xyz, lengths, start, N, npoint, s.sorted,
                                                      s.temp, p->points_per_thread, idx, dist2);
        return cudaGetLastError();
    };
    switch (p->bucket_slots) {
        case 1: return launch(fps_bucket_kernel<T, 1>);
        case 2: return launch(fps_bucket_kernel<T, 2>);
        case 4: return launch(fps_bucket_kernel<T, 4>);
        case 8:
            if constexpr (sizeof(T) == 4) return launch(fps_bucket_kernel<T, 8>);
            return cudaErrorInvalidValue;
        default: return cudaErrorInvalidValue;
    }
}

template <typename T>
cudaError_t run_plan(const pcops_fps_cuda_plan* p, const T* xyz, const int64_t* lengths,
                     const int64_t* start, int64_t B, int64_t N, int64_t npoint, void* workspace,
                     int64_t* idx, T* dist2, cudaStream_t stream) {
    Scratch<T> s;
    plan_layout<T>(p, workspace, &s);
    if (p->workspace_bytes > 0 && workspace == nullptr) return cudaErrorInvalidValue;
    if (p->path == PCOPS_FPS_BUCKET || p->path == PCOPS_FPS_BUCKET_GROUPS ||
        p->path == PCOPS_FPS_BUCKET_ROUNDS || p->path == PCOPS_FPS_BUCKET_ROUNDS_CLUSTER)
        return run_bucket<T>(p, s, xyz, lengths, start, B, N, npoint, idx, dist2, stream);
    if (p->path == PCOPS_FPS_BLOCK_PRUNED) {
        const bool smem_points = p->warps_per_cloud > 16;
        const size_t smem =
            pruned_smem_bytes<T>(p->warps_per_cloud, N, smem_points, p->points_per_thread);
        switch (p->points_per_thread) {
            case 8: return launch_pruned<T, 8, false>(p, smem, xyz, lengths, start, B, N, npoint,
                                                      idx, dist2, stream);
            case 16:
                if constexpr (sizeof(T) == 4) {
                    if (smem_points)
                        return launch_pruned<T, 16, true>(p, smem, xyz, lengths, start, B, N,
                                                          npoint, idx, dist2, stream);
                    return launch_pruned<T, 16, false>(p, smem, xyz, lengths, start, B, N,
                                                       npoint, idx, dist2, stream);
                }
                return cudaErrorInvalidValue;
            default: return cudaErrorInvalidValue;
        }
    }
    T* temp = s.temp;
    Candidate<T>* slots = s.slots;
    return with_points<T>(p->points_per_thread, [&](auto pts) -> cudaError_t {
        using Points = decltype(pts);
        switch (p->path) {
            case PCOPS_FPS_SIMPLE:
            case PCOPS_FPS_WARP:
            case PCOPS_FPS_BLOCK: {
                const int warps = p->warps_per_cloud, clouds = p->clouds_per_block;
                if constexpr (sizeof(T) == 4 && Points::kPerThread > 0) {
                    // plan_group: 9-16 warps only with 4 points a thread (N <= 2048) or 16
                    constexpr int kWide =
                        Points::kPerThread == 4 || Points::kPerThread == 16 ? 16 : 8;
                    if (warps <= 8)
                        fps_group_kernel<T, Points, 8>
                            <<<(unsigned)p->blocks, p->threads,
                               slot_bytes<T, 8>(warps, clouds), stream>>>(
                                xyz, lengths, start, B, N, npoint, temp, idx, dist2, warps,
                                clouds);
                    else if (kWide == 16 && warps <= 16)
                        fps_group_kernel<T, Points, kWide>
                            <<<(unsigned)p->blocks, p->threads,
                               slot_bytes<T, kWide>(warps, clouds), stream>>>(
                                xyz, lengths, start, B, N, npoint, temp, idx, dist2, warps,
                                clouds);
                    else
                        return cudaErrorInvalidValue;  // plan_group: no more warps of float
                } else {
                    fps_group_kernel<T, Points>
                        <<<(unsigned)p->blocks, p->threads, slot_bytes<T>(warps, clouds),
                           stream>>>(xyz, lengths, start, B, N, npoint, temp, idx, dist2, warps,
                                     clouds);
                }
                return cudaGetLastError();
            }
            case PCOPS_FPS_CLUSTER: {
                cudaLaunchConfig_t config = {};
                config.gridDim = dim3((unsigned)p->blocks);
                config.blockDim = dim3(p->threads);
                config.dynamicSmemBytes = 0;
                config.stream = stream;
                cudaLaunchAttribute attribute[1];
                attribute[0].id = cudaLaunchAttributeClusterDimension;
                attribute[0].val.clusterDim.x = p->blocks_per_cloud;
                attribute[0].val.clusterDim.y = 1;
                attribute[0].val.clusterDim.z = 1;
                config.attrs = attribute;
                config.numAttrs = 1;
                return cudaLaunchKernelEx(&config, fps_cluster_kernel<T, Points>, xyz, lengths,
                                          start, B, N, npoint, temp, idx, dist2);
            }
            case PCOPS_FPS_GRID: {
                void* args[] = {(void*)&xyz, (void*)&lengths, (void*)&start, (void*)&B,
                                (void*)&N,   (void*)&npoint,  (void*)&temp,  (void*)&idx,
                                (void*)&dist2, (void*)&slots};
                return cudaLaunchCooperativeKernel((const void*)fps_grid_kernel<T, Points>,
                                                   dim3((unsigned)p->blocks), dim3(p->threads),
                                                   args, 0, stream);
            }
            default: return cudaErrorInvalidValue;
        }
    });
}

}  // namespace

extern "C" cudaError_t pcops_fps_cuda_make_plan(pcops_dtype dtype, int64_t B, int64_t N,
                                                int64_t npoint, int variant,
                                                pcops_fps_cuda_plan* plan) {
    if (!plan || B < 0 || N < 0 || N > INT_MAX || npoint < 1) return cudaErrorInvalidValue;
    if (variant < PCOPS_FPS_AUTO || variant > PCOPS_FPS_BLOCK_PRUNED ||
        variant == PCOPS_FPS_TREE)
        return cudaErrorInvalidValue;
    pcops_fps_cuda_plan p = {};
    p.dtype = dtype;
    p.B = B;
    p.N = N;
    cudaError_t err;
    if (dtype == PCOPS_FLOAT32) err = make_plan<float>(B, N, npoint, variant, &p);
    else if (dtype == PCOPS_FLOAT64) err = make_plan<double>(B, N, npoint, variant, &p);
    else return cudaErrorInvalidValue;
    if (err != cudaSuccess) return err;
    if (p.blocks > INT_MAX) return cudaErrorInvalidValue;
    if (dtype == PCOPS_FLOAT32) {
        Scratch<float> s;
        p.workspace_bytes = plan_layout<float>(&p, nullptr, &s);
    } else {
        Scratch<double> s;
        p.workspace_bytes = plan_layout<double>(&p, nullptr, &s);
    }
    if (p.workspace_bytes == SIZE_MAX) return cudaErrorInvalidValue;
    *plan = p;
    return cudaSuccess;
}

extern "C" cudaError_t pcops_fps_cuda_run(const pcops_fps_cuda_plan* plan, pcops_dtype dtype,
                                          const void* xyz, const int64_t* lengths,
                                          const int64_t* start, int64_t B, int64_t N,
                                          int64_t npoint, void* workspace, int64_t* idx,
                                          void* dist2, cudaStream_t stream) {
    if (!plan || plan->dtype != dtype || plan->B != B || plan->N != N || npoint < 1)
        return cudaErrorInvalidValue;
    if (B == 0) return cudaSuccess;
    return pcops_dispatch_float(dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        return run_plan<T>(plan, (const T*)xyz, lengths, start, B, N, npoint, workspace, idx,
                           (T*)dist2, stream);
    });
}
