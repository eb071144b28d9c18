/*
 * group.cu -- group (gather neighbour features) and its deterministic backward, on CUDA.
 *
 * B = batch, N = points per cloud, C = channels, M = groups (queries), S = neighbours per
 * group, T = B*M*S slots. Same contract as group.c:
 *   forward   features[B,N,C], idx[B,M,S] -> out[B,M,S,C] = features[b, idx[b,m,s], :]
 *             (zeros where idx is -1 or outside [0, N));
 *   backward  grad_out[B,M,S,C], idx[B,M,S] -> grad_features[B,N,C], the rows of grad_out
 *             with idx == n added in ascending (m,s) order starting from 0.
 *
 * Forward: a pure copy, so it works on the element bytes. A row of C elements is moved as V
 * vectors of W bytes (W = 16, 8, 4 or 2: the widest that divides the row and the alignment of
 * both pointers). One thread per vector, grid-stride, consecutive threads on consecutive
 * vectors of the output: the writes are fully coalesced, each read is a contiguous piece of a
 * gathered row.
 *
 * Backward, deterministic and without floating-point atomics:
 *   1. group_keys_kernel: key[p] = b*N + idx[p] for the T slots (B*N, a sentinel sorted past
 *      every point, for -1 and out-of-range slots), position[p] = p.
 *   2. cub::DeviceRadixSort::SortPairs (stable) over the bits of B*N: the positions of each
 *      point come out grouped and, within a point, in ascending p, i.e. ascending (m,s).
 *   3. group_offsets_kernel: offsets[k] = the first sorted slot with key >= k, k in [0, B*N]
 *      (a binary search per point), so point k owns the sorted slots [offsets[k], offsets[k+1]).
 *   4. group_backward_kernel: one thread per (point, vector of VEC channels), grid-stride;
 *      the threads of a point read each of its grad_out rows together (coalesced over C) and
 *      add them in the sorted order, in float32 for float32/float16/bfloat16 and float64 for
 *      float64; every element of grad_features is written once (zeros for unreferenced
 *      points). The per-element summation order is the CPU's, so the bits are equal.
 * Keys, positions and offsets are 32-bit when B*N + 1 and T fit in int32, else 64-bit. All
 * scratch lives in the caller's workspace (pcops_group_backward_cuda_workspace_bytes, which
 * includes cub's temp storage), carved by one layout function (backward_layout, geometry.h).
 */
#include <cub/device/device_radix_sort.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "geometry.h"
#include "pcops.h"

namespace {

constexpr int kThreads = 256;

// VEC elements loaded or stored by one instruction in the backward (16 bytes at most).
template <typename Scalar, int VEC>
struct alignas(sizeof(Scalar) * VEC) Vec {
    Scalar v[VEC];
};

// Scalar storage and accumulation type of each dtype. Half types are handled as raw 16-bit
// patterns with explicit conversions (torch builds with __CUDA_NO_HALF_CONVERSIONS__), summed
// in float and rounded to nearest on the way back.
template <typename T>
struct Plain {
    using Storage = T;
    using Acc = T;
    static __device__ __forceinline__ T load(T x) { return x; }
    static __device__ __forceinline__ T store(T a) { return a; }
};
template <typename H>  // __half or __nv_bfloat16
struct Bits16 {
    static constexpr bool kHalf = std::is_same<H, __half>::value;
    using Storage = uint16_t;
    using Acc = float;
    static __device__ __forceinline__ float load(uint16_t x) {
        if constexpr (kHalf) return __half2float(__ushort_as_half(x));
        else return __bfloat162float(__ushort_as_bfloat16(x));
    }
    static __device__ __forceinline__ uint16_t store(float a) {
        if constexpr (kHalf) return __half_as_ushort(__float2half_rn(a));
        else return __bfloat16_as_ushort(__float2bfloat16_rn(a));
    }
};
using Float32 = Plain<float>;
using Float64 = Plain<double>;
using Float16 = Bits16<__half>;
using BFloat16 = Bits16<__nv_bfloat16>;

bool is_aligned(const void* p, size_t bytes) { return (uintptr_t)p % bytes == 0; }

// ------------------------------------------------------------------------------------------
// CUDA kernels

// out[i] for i in [0, B*M*S*V): vector v of output row r = (b, m, s) (I: the loop index type,
// 32-bit when the vector count and the loop's last step fit).
template <typename VecT, typename I, typename IdxT>
__global__ void __launch_bounds__(kThreads)
group_kernel(const VecT* __restrict__ features, const IdxT* __restrict__ idx, int64_t N, I V,
             I MS, I total, VecT* __restrict__ out) {
    for (I i = (I)blockIdx.x * kThreads + threadIdx.x; i < total; i += (I)gridDim.x * kThreads) {
        const I r = i / V;
        const I v = i - r * V;
        const I b = r / MS;
        const int64_t n = (int64_t)idx[r];
        VecT value{};  // zeros for -1 and anything outside [0, N)
        if (n >= 0 && n < N) value = features[((int64_t)b * N + n) * (int64_t)V + v];
        out[i] = value;
    }
}

// Step 1 of the backward: sort keys and positions of the T slots.
template <typename K, typename IdxT>
__global__ void __launch_bounds__(kThreads)
group_keys_kernel(const IdxT* __restrict__ idx, int64_t N, K MS, K total, K sentinel,
                  K* __restrict__ keys, K* __restrict__ positions) {
    for (K p = (K)blockIdx.x * kThreads + threadIdx.x; p < total; p += (K)gridDim.x * kThreads) {
        const K b = p / MS;
        const int64_t n = (int64_t)idx[p];
        keys[p] = (n >= 0 && n < N) ? (K)(b * (K)N + (K)n) : sentinel;
        positions[p] = p;
    }
}

// Step 3: offsets[k] = lower_bound(sorted_keys[0, total), k) for k in [0, num_keys).
template <typename K>
__global__ void __launch_bounds__(kThreads)
group_offsets_kernel(const K* __restrict__ sorted_keys, K total, K num_keys,
                     K* __restrict__ offsets) {
    for (K k = (K)blockIdx.x * kThreads + threadIdx.x; k < num_keys;
         k += (K)gridDim.x * kThreads) {
        K lo = 0, hi = total;
        while (lo < hi) {
            const K mid = lo + (hi - lo) / 2;
            if (sorted_keys[mid] < k) lo = mid + 1;
            else hi = mid;
        }
        offsets[k] = lo;
    }
}

// Step 4: grad_features[k, cv*VEC : (cv+1)*VEC] = sum over the sorted slots of point k, in
// order, for i = k*CV + cv in [0, B*N*CV).
template <typename D, int VEC, typename K>
__global__ void __launch_bounds__(kThreads)
group_backward_kernel(const typename D::Storage* __restrict__ grad_out,
                      const K* __restrict__ offsets, const K* __restrict__ positions, int64_t C,
                      int64_t CV, int64_t items, typename D::Storage* __restrict__ grad_features) {
    using Elem = typename D::Storage;
    using A = typename D::Acc;
    using V = Vec<Elem, VEC>;
    for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < items;
         i += (int64_t)gridDim.x * kThreads) {
        const int64_t k = i / CV;
        const int64_t c = (i - k * CV) * VEC;
        const K begin = offsets[k], end = offsets[k + 1];
        A acc[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] = A(0);
#pragma unroll 4
        for (K j = begin; j < end; ++j) {
            const V g = *reinterpret_cast<const V*>(grad_out + (int64_t)positions[j] * C + c);
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[e] += D::load(g.v[e]);  // adds only: nothing to contract
        }
        V result;
#pragma unroll
        for (int e = 0; e < VEC; ++e) result.v[e] = D::store(acc[e]);
        *reinterpret_cast<V*>(grad_features + k * C + c) = result;
    }
}

// ------------------------------------------------------------------------------------------
// kernel launchers

template <typename VecT, typename IdxT>
cudaError_t launch_group(const void* features, const IdxT* idx, int64_t B, int64_t N,
                         int64_t M, int64_t S, int64_t V, void* out, cudaStream_t stream) {
    const int64_t total = B * M * S * V;
    const unsigned grid = pcops_grid_stride_blocks(total, kThreads);
    // 32-bit loop indices when i + gridDim.x * kThreads cannot pass 2**32.
    if (total <= INT32_MAX)
        group_kernel<VecT, uint32_t, IdxT><<<grid, kThreads, 0, stream>>>(
            (const VecT*)features, idx, N, (uint32_t)V, (uint32_t)(M * S), (uint32_t)total,
            (VecT*)out);
    else
        group_kernel<VecT, uint64_t, IdxT><<<grid, kThreads, 0, stream>>>(
            (const VecT*)features, idx, N, (uint64_t)V, (uint64_t)(M * S), (uint64_t)total,
            (VecT*)out);
    return cudaGetLastError();
}

// The backward's buffers in the workspace, carved by backward_layout (geometry.h): the same
// code sizes the workspace (base NULL) and places the buffers in it.
struct BackwardLayout {
    bool wide;        // 64-bit keys, positions and offsets
    int end_bit;      // the sort looks at key bits [0, end_bit)
    void *keys[2], *positions[2], *offsets, *temp;
    size_t temp_bytes, total_bytes;
};

// The stable pair sort of step 2 (or, with temp == NULL, the size of its temp storage). The
// number of items is passed as int when it fits (cub's 32-bit offsets) and as int64_t
// otherwise, identically in the sizing and the real call.
template <typename K>
cudaError_t sort_pairs(void* temp, size_t& temp_bytes, cub::DoubleBuffer<K>& keys,
                       cub::DoubleBuffer<K>& positions, int64_t total, int end_bit,
                       cudaStream_t stream) {
    if (total <= INT32_MAX)
        return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, positions, (int)total, 0,
                                               end_bit, stream);
    return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, positions, total, 0, end_bit,
                                           stream);
}

cudaError_t backward_layout(int64_t B, int64_t N, int64_t M, int64_t S, void* workspace,
                            BackwardLayout* L) {
    const int64_t total = B * M * S;
    const int64_t num_keys = B * N + 1;  // the points and the sentinel B*N
    L->wide = !(num_keys <= INT32_MAX && total <= INT32_MAX);
    L->end_bit = 1;
    while (L->end_bit < 64 && (uint64_t)(B * N) >> L->end_bit) ++L->end_bit;
    const size_t elem = L->wide ? 8 : 4;
    pcops_carver w = pcops_carver_init(workspace);
    for (int i = 0; i < 2; ++i) L->keys[i] = pcops_carve(&w, total, elem);
    for (int i = 0; i < 2; ++i) L->positions[i] = pcops_carve(&w, total, elem);
    L->offsets = pcops_carve(&w, num_keys, elem);
    L->temp_bytes = 0;
    cudaError_t err = cudaSuccess;
    if (total > 0) {
        if (L->wide) {
            cub::DoubleBuffer<uint64_t> k(nullptr, nullptr), p(nullptr, nullptr);
            err = sort_pairs<uint64_t>(nullptr, L->temp_bytes, k, p, total, L->end_bit, 0);
        } else {
            cub::DoubleBuffer<uint32_t> k(nullptr, nullptr), p(nullptr, nullptr);
            err = sort_pairs<uint32_t>(nullptr, L->temp_bytes, k, p, total, L->end_bit, 0);
        }
    }
    L->temp = pcops_carve(&w, (int64_t)L->temp_bytes, 1);
    L->total_bytes = pcops_carver_bytes(&w);
    return err;
}

// Steps 3 and 4 for one dtype: the widest channel vector that divides C and both pointers'
// alignment (16 bytes at most).
template <typename D, typename K>
cudaError_t launch_backward_sum(const void* grad_out, const K* offsets, const K* positions,
                                int64_t B, int64_t N, int64_t C, void* grad_features,
                                cudaStream_t stream) {
    using Elem = typename D::Storage;
    constexpr int kMaxVec = 16 / (int)sizeof(Elem);
    int vec = kMaxVec;
    while (vec > 1 && (C % vec != 0 || !is_aligned(grad_out, vec * sizeof(Elem)) ||
                       !is_aligned(grad_features, vec * sizeof(Elem))))
        vec /= 2;
    const int64_t CV = C / vec;
    const int64_t items = B * N * CV;
    const unsigned grid = pcops_grid_stride_blocks(items, kThreads);
#define PCOPS_GROUP_BACKWARD(VEC)                                                              \
    group_backward_kernel<D, VEC, K><<<grid, kThreads, 0, stream>>>(                          \
        (const Elem*)grad_out, offsets, positions, C, CV, items, (Elem*)grad_features)
    switch (vec) {
        case 8: if constexpr (kMaxVec >= 8) PCOPS_GROUP_BACKWARD(8); break;
        case 4: if constexpr (kMaxVec >= 4) PCOPS_GROUP_BACKWARD(4); break;
        case 2: PCOPS_GROUP_BACKWARD(2); break;
        default: PCOPS_GROUP_BACKWARD(1); break;
    }
#undef PCOPS_GROUP_BACKWARD
    return cudaGetLastError();
}

template <typename K, typename IdxT>
cudaError_t launch_backward(pcops_dtype dtype, const void* grad_out, const IdxT* idx,
                            int64_t B, int64_t N, int64_t C, int64_t M, int64_t S,
                            const BackwardLayout& L, void* grad_features, cudaStream_t stream) {
    const int64_t total = B * M * S;
    const int64_t num_keys = B * N + 1;
    K* keys0 = (K*)L.keys[0];
    K* keys1 = (K*)L.keys[1];
    K* pos0 = (K*)L.positions[0];
    K* pos1 = (K*)L.positions[1];
    K* offsets = (K*)L.offsets;
    cub::DoubleBuffer<K> keys(keys0, keys1), positions(pos0, pos1);
    cudaError_t err;
    if (total > 0) {
        group_keys_kernel<K, IdxT><<<pcops_grid_stride_blocks(total, kThreads), kThreads, 0, stream>>>(
            idx, N, (K)(M * S), (K)total, (K)(B * N), keys0, pos0);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
        size_t temp_bytes = L.temp_bytes;
        err = sort_pairs<K>(L.temp, temp_bytes, keys, positions, total, L.end_bit,
                            stream);
        if (err != cudaSuccess) return err;
    }
    group_offsets_kernel<K><<<pcops_grid_stride_blocks(num_keys, kThreads), kThreads, 0, stream>>>(
        keys.Current(), (K)total, (K)num_keys, offsets);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    const K* sorted_positions = positions.Current();
    const auto sum = [&](auto dtype_tag) {
        return launch_backward_sum<decltype(dtype_tag), K>(grad_out, offsets, sorted_positions, B,
                                                           N, C, grad_features, stream);
    };
    switch (dtype) {
        case PCOPS_FLOAT32: return sum(Float32{});
        case PCOPS_FLOAT64: return sum(Float64{});
        case PCOPS_FLOAT16: return sum(Float16{});
        case PCOPS_BFLOAT16: return sum(BFloat16{});
    }
    return cudaErrorInvalidValue;
}


// The group launch for one channel-vector width, with the index type chosen at run time.
template <typename VecT>
cudaError_t launch_group_any(const void* features, const void* idx, pcops_index_dtype idx_dtype,
                             int64_t B, int64_t N, int64_t M, int64_t S, int64_t V, void* out,
                             cudaStream_t stream) {
    if (idx_dtype == PCOPS_INDEX_INT32)
        return launch_group<VecT>(features, (const int32_t*)idx, B, N, M, S, V, out, stream);
    return launch_group<VecT>(features, (const int64_t*)idx, B, N, M, S, V, out, stream);
}

}  // namespace

extern "C" cudaError_t pcops_group_cuda(pcops_dtype dtype, const void* features,
                                        const void* idx, pcops_index_dtype idx_dtype, int64_t B,
                                        int64_t N, int64_t C, int64_t M, int64_t S, void* out,
                                        cudaStream_t stream) {
    if (B < 0 || N < 0 || C < 0 || M < 0 || S < 0) return cudaErrorInvalidValue;
    if (idx_dtype != PCOPS_INDEX_INT64 && idx_dtype != PCOPS_INDEX_INT32)
        return cudaErrorInvalidValue;
    const size_t elem_bytes = pcops_dtype_size(dtype);
    if (elem_bytes == 0) return cudaErrorInvalidValue;
    if (B == 0 || M == 0 || S == 0 || C == 0) return cudaSuccess;
    const size_t row_bytes = (size_t)C * elem_bytes;
    int width = 16;
    while (width > 2 && (row_bytes % width != 0 || !is_aligned(features, width) ||
                         !is_aligned(out, width)))
        width /= 2;
    const int64_t V = (int64_t)(row_bytes / width);
    cudaError_t err;
    switch (width) {
        case 16:
            err = launch_group_any<uint4>(features, idx, idx_dtype, B, N, M, S, V, out, stream);
            break;
        case 8:
            err = launch_group_any<uint2>(features, idx, idx_dtype, B, N, M, S, V, out, stream);
            break;
        case 4:
            err = launch_group_any<uint32_t>(features, idx, idx_dtype, B, N, M, S, V, out, stream);
            break;
        default:
            err = launch_group_any<uint16_t>(features, idx, idx_dtype, B, N, M, S, V, out,
                                             stream);
            break;
    }
    return pcops_launch_tail(err, stream);
}

extern "C" size_t pcops_group_backward_cuda_workspace_bytes(int64_t B, int64_t N, int64_t M,
                                                            int64_t S) {
    if (B <= 0 || N <= 0 || M < 0 || S < 0) return 0;
    BackwardLayout L;
    if (backward_layout(B, N, M, S, nullptr, &L) != cudaSuccess) return 0;
    return L.total_bytes;
}

namespace {

// launch_backward with the index type chosen at run time.
template <typename K>
cudaError_t launch_backward_any(pcops_dtype dtype, const void* grad_out, const void* idx,
                                pcops_index_dtype idx_dtype, int64_t B, int64_t N, int64_t C,
                                int64_t M, int64_t S, const BackwardLayout& L,
                                void* grad_features, cudaStream_t stream) {
    if (idx_dtype == PCOPS_INDEX_INT32)
        return launch_backward<K>(dtype, grad_out, (const int32_t*)idx, B, N, C, M, S, L,
                                  grad_features, stream);
    return launch_backward<K>(dtype, grad_out, (const int64_t*)idx, B, N, C, M, S, L,
                              grad_features, stream);
}

}  // namespace

extern "C" cudaError_t pcops_group_backward_cuda(pcops_dtype dtype, const void* grad_out,
                                                 const void* idx, pcops_index_dtype idx_dtype,
                                                 int64_t B, int64_t N, int64_t C, int64_t M,
                                                 int64_t S, void* workspace,
                                                 void* grad_features, cudaStream_t stream) {
    if (B < 0 || N < 0 || C < 0 || M < 0 || S < 0) return cudaErrorInvalidValue;
    if (pcops_dtype_size(dtype) == 0) return cudaErrorInvalidValue;
    if (idx_dtype != PCOPS_INDEX_INT64 && idx_dtype != PCOPS_INDEX_INT32)
        return cudaErrorInvalidValue;
    if (B == 0 || N == 0 || C == 0) return cudaSuccess;
    BackwardLayout L;
    cudaError_t err = backward_layout(B, N, M, S, workspace, &L);
    if (err != cudaSuccess) return err;
    if (workspace == nullptr && L.total_bytes > 0) return cudaErrorInvalidValue;
    if (L.wide)
        err = launch_backward_any<uint64_t>(dtype, grad_out, idx, idx_dtype, B, N, C, M, S, L,
                                            grad_features, stream);
    else
        err = launch_backward_any<uint32_t>(dtype, grad_out, idx, idx_dtype, B, N, C, M, S, L,
                                            grad_features, stream);
    return pcops_launch_tail(err, stream);
}
