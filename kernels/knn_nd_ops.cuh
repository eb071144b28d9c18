/*
 * knn_nd_ops.cuh -- the distance steps of knn_nd.h and the selection helpers of geometry.h as
 * one C++ type per dtype, NdOps<float> / NdOps<double>, for the CUDA kernels of any dimension
 * (knn_nd.cu, fps_nd.cu, ball_query_nd.cu), so that a kernel template written once calls the
 * _f32 or _f64 function of its T. Each member is the C function of that suffix, nothing more.
 * Not part of the public C API.
 */
#pragma once

#include <cstdint>

#include "geometry.h"
#include "knn_nd.h"

namespace {

template <typename T>
struct NdOps;

#define PCOPS_DEFINE_ND_OPS(T, SUF)                                                            \
    template <>                                                                                \
    struct NdOps<T> {                                                                          \
        /* one coordinate's step of a distance sum (knn_nd.h) */                               \
        static __device__ __forceinline__ T l2(T acc, T a, T b) {                              \
            return knn_nd_l2_step_##SUF(acc, a, b);                                            \
        }                                                                                      \
        static __device__ __forceinline__ T l1(T acc, T a, T b) {                              \
            return knn_nd_l1_step_##SUF(acc, a, b);                                            \
        }                                                                                      \
        static __device__ __forceinline__ T dot(T acc, T a, T b) {                             \
            return knn_nd_dot_step_##SUF(acc, a, b);                                           \
        }                                                                                      \
        static __device__ __forceinline__ T cosine(T dot, T na, T nb) {                        \
            return knn_nd_cosine_##SUF(dot, na, nb);                                           \
        }                                                                                      \
        /* the whole L2 distance of two points of D coordinates */                             \
        static __device__ __forceinline__ T l2(const T* a, const T* b, int64_t D) {            \
            return knn_nd_l2_##SUF(a, b, D);                                                   \
        }                                                                                      \
        static __device__ __forceinline__ bool within(T d) {                                   \
            return d <= PCOPS_DIST2_MAX_##SUF;                                                 \
        }                                                                                      \
        static __device__ __forceinline__ int finite(const T* p, int64_t D) {                  \
            return knn_nd_finite_##SUF(p, D);                                                  \
        }                                                                                      \
        static __device__ __forceinline__ T ruled(T d, int finite) {                           \
            return knn_nd_ruled_##SUF(d, finite);                                              \
        }                                                                                      \
        static constexpr T kMax = PCOPS_DIST2_MAX_##SUF;                                       \
        /* the kept neighbours: a sorted list or a heap (geometry.h) */                        \
        static __device__ __forceinline__ void sorted_insert(T* d, int64_t* i, int64_t cap,    \
                                                             T dn, int64_t n) {                \
            pcops_sorted_insert_##SUF(d, i, cap, dn, n);                                       \
        }                                                                                      \
        static __device__ __forceinline__ int heap_keep(T* d, int64_t* i, int64_t cap,         \
                                                        int64_t* count, T dn, int64_t n) {     \
            return pcops_heap_keep_##SUF(d, i, 1, cap, count, dn, n);                          \
        }                                                                                      \
        static __device__ __forceinline__ void heap_sort(T* d, int64_t* i, int64_t count) {    \
            pcops_heap_sort_##SUF(d, i, 1, count);                                             \
        }                                                                                      \
    };

PCOPS_DEFINE_ND_OPS(float, f32)
PCOPS_DEFINE_ND_OPS(double, f64)
#undef PCOPS_DEFINE_ND_OPS

}  // namespace
