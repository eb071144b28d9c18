/*
 * fps/pruned.cuh -- BLOCK_PRUNED: the block path with the cloud's points dealt to the warps by
 * space, so that a step skips every warp the new sample cannot change.
 *
 * One block a cloud. The block first bins its cloud into the 16^3 cells of its box, in Morton
 * order of the cells (a counting sort in shared memory), and warp w takes the w-th run of
 * 32 * PPT points of that order: a compact region, whose box the warp keeps. A step skips a
 * warp when the squared distance from the sample to the warp's box (computed with fps_dist2's
 * operations on the box gaps: every rounded operation is monotone, so it is <= the distance
 * computed to any point of the box) is > 0 and >= the warp's largest temp: no temp of the warp
 * can change (min(temp, d) = temp), and the chosen point is not in the warp (its box would
 * contain the sample: distance 0). The warp's farthest point then stays what it was. Float
 * clouds past 8192 points (up to 24 warps of 16 a thread) keep the points in shared memory
 * instead (kSmem: float4 x, y, z, index, each lane reading back only its own slots; the temps
 * stay in registers), so that the block can have more, smaller warp regions than registers
 * allow; the others keep a copy of the cloud there by index for the step's sample lookup.
 *
 * When it wins: clouds one block can hold (up to 8192 float / 4096 double points in
 * registers, 12288 float points in shared memory) that are large enough for pruning to pay:
 * late in a run a sample changes the temps of a few neighbours only, so most warps skip most
 * steps, while BLOCK updates every point every step. Past the registers (float), only while
 * few samples are asked: with many, BUCKET_ROUNDS takes several samples a round. AUTO takes it
 * above block_max_points_f32 / _f64 (kernels/fps/plan.cuh) up to the registers' reach, and
 * float clouds up to 12288 points below pruned_shared_max_samples samples.
 *
 * Invariants: each thread's slots hold its points in ascending index order (a sorting network
 * at the start), so fps_visit's strict > keeps the lower index of a tie as in RegisterPoints;
 * the warps combine by the full key. Same bits as BLOCK. Clouds of at most 65535 points (16-bit
 * sorted indices; the plan keeps far below); pruned_smem_bytes plus the kernel's __shared__ box
 * within the device's opt-in limit (up to about 197 KiB: the plan refuses clouds past the
 * device's, and AUTO then takes the next path).
 */
#pragma once

#include <algorithm>
#include <mutex>

#include "common.cuh"

namespace {

// ------------------------------------------------------------------------------------------
// kernel

constexpr int kPrunedCellBits = 4;  // 16 cells an axis
constexpr int64_t kPrunedMaxFloat = 24 * 32 * 16;  // float points a block takes (plan_pruned)
constexpr int kPrunedCells = 1 << (3 * kPrunedCellBits);

// A point's coordinates by index in shared memory (the register kernel's copy of the cloud,
// read once a step for the new sample: a shared load is shorter than an L1 hit, and this
// kernel's large shared memory leaves little L1).
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

// Static shared memory of fps_pruned_kernel (its box reduction), counted against the opt-in limit.
template <typename T>
__host__ __device__ constexpr size_t pruned_static_smem() {
    return (size_t)6 * 32 * sizeof(T);
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
    static_assert(sizeof(box_red) == pruned_static_smem<T>(), "the plan's count");
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
            xyz_s[i].x = staged_x(q[0], q[1], q[2]);
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
        const T py = valid ? row.cloud[3 * (int64_t)id[p] + 1] : T(0);
        const T pz = valid ? row.cloud[3 * (int64_t)id[p] + 2] : T(0);
        const T px = staged_x(valid ? row.cloud[3 * (int64_t)id[p] + 0] : T(0), py, pz);
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
        // the sample's squared distance to the warp's box, as fps_dist2 rounds (and saturates)
        // it
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
// launcher

// Shape of a BLOCK_PRUNED plan: 8 points a thread (16 for float clouds past 4096 points), as
// many warps as that takes (2 to 16 in registers; float up to 24 with the points in shared
// memory); false past that or past the device's shared memory. Smaller warp regions skip more
// often than the block path's 16 points a thread.
template <typename T>
bool plan_pruned(pcops_fps_cuda_plan* p, const Device& d, int64_t B, int64_t N) {
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
    const size_t bytes = pruned_smem_bytes<T>(p->warps_per_cloud, N, p->warps_per_cloud > 16, ppt);
    p->smem_bytes = bytes + pruned_static_smem<T>();
    return smem_fits(d, bytes, pruned_static_smem<T>());
}

// Launches one BLOCK_PRUNED kernel. Above 48 KB of shared memory a kernel opts in, per kernel
// and device, to the bytes the launch takes: only when they exceed what it opted in to before
// (a static per instantiation) -- a driver call on every launch would add to the small clouds'
// latency. The opt-in only grows, under a lock, so that a launch never lowers it below what
// another thread's launch of the same kernel took.
template <typename T, int PPT, bool kSmem>
cudaError_t launch_pruned_kernel(const pcops_fps_cuda_plan* p, size_t smem, const T* xyz,
                                 const int64_t* lengths, const int64_t* start, int64_t B,
                                 int64_t N, int64_t npoint, int64_t* idx, T* dist2,
                                 cudaStream_t stream) {
    auto kernel = fps_pruned_kernel<T, PPT, kSmem>;
    if (smem > 48 * 1024) {
        constexpr int kDevices = 64;
        static std::mutex lock;
        static size_t opted[kDevices] = {};  // bytes opted in to on each device
        int device = 0;
        cudaError_t err = cudaGetDevice(&device);
        if (err != cudaSuccess) return err;
        std::lock_guard<std::mutex> guard(lock);
        const bool known = device >= 0 && device < kDevices;
        if (!known || opted[device] < smem) {
            err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem);
            if (err != cudaSuccess) return err;
            if (known) opted[device] = smem;
        }
    }
    kernel<<<(unsigned)p->blocks, p->threads, smem, stream>>>(xyz, lengths, start, B, N, npoint,
                                                             idx, dist2, p->warps_per_cloud);
    return cudaGetLastError();
}

template <typename T>
cudaError_t launch_pruned(const pcops_fps_cuda_plan* p, const T* xyz, const int64_t* lengths,
                          const int64_t* start, int64_t B, int64_t N, int64_t npoint,
                          int64_t* idx, T* dist2, cudaStream_t stream) {
    const bool smem_points = p->warps_per_cloud > 16;
    const size_t smem =
        pruned_smem_bytes<T>(p->warps_per_cloud, N, smem_points, p->points_per_thread);
    switch (p->points_per_thread) {
        case 8: return launch_pruned_kernel<T, 8, false>(p, smem, xyz, lengths, start, B, N,
                                                         npoint, idx, dist2, stream);
        case 16:
            if constexpr (sizeof(T) == 4) {
                if (smem_points)
                    return launch_pruned_kernel<T, 16, true>(p, smem, xyz, lengths, start, B, N,
                                                             npoint, idx, dist2, stream);
                return launch_pruned_kernel<T, 16, false>(p, smem, xyz, lengths, start, B, N,
                                                          npoint, idx, dist2, stream);
            }
            return cudaErrorInvalidValue;
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace
