// utils.h -- input checks and small helpers shared by every binding in bindings/.
//
// Every check names the op and the argument and says what was expected and what came:
//   pcops.knn: argument 'query' must be a tensor of shape [B, M, 3], got a 2-D tensor of shape [5, 3]
// TORCH_CHECK_VALUE raises ValueError and TORCH_CHECK_TYPE raises TypeError in Python.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <string>
#include <utility>

#include "../kernels/pcops.h"

#ifdef PCOPS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace pcops {

// "a 3-D float32 tensor of shape [4, 5, 3] on cuda:0"
std::string describe(const at::Tensor& t);

// `t` is a floating point tensor of rank `rank` whose last dimension is `last_dim`
// (`last_dim` < 0: any). `shape` is the expected shape in words, e.g. "[B, N, 3]".
void check_float_tensor(const char* op, const char* name, const at::Tensor& t, int64_t rank,
                        int64_t last_dim, const char* shape);

// `t` is float32, float64, float16 or bfloat16 (check_float_tensor lets float8 types through;
// they would reach to_pcops_dtype and fail there with a message that names no op).
void check_float_dtype(const char* op, const char* name, const at::Tensor& t);

// `t` is an int64 tensor of rank `rank` ("[B, M, S]" in words).
void check_index_tensor(const char* op, const char* name, const at::Tensor& t, int64_t rank,
                        const char* shape);

// `t` lives on the same device as `ref` (named `ref_name`).
void check_same_device(const char* op, const char* name, const at::Tensor& t,
                       const char* ref_name, const at::Tensor& ref);

// size(dim) of `t` equals `expected` (named `what`, e.g. "the batch size B of 'xyz'").
void check_size(const char* op, const char* name, const at::Tensor& t, int64_t dim,
                int64_t expected, const char* what);

// An integer argument (npoint, k, nsample) is >= 1.
void check_positive(const char* op, const char* name, int64_t value);

// A radius is finite and > 0.
void check_radius(const char* op, const char* name, double radius);

// Optional per-batch lengths: int64 [B] on the device of `like`, values in [0, N]
// (values checked when check_values_now(like)). Returns the contiguous tensor or nullopt.
// `bound_name` names the upper bound in the message ("N"; "M" for query lengths).
std::optional<at::Tensor> check_lengths(const char* op, const char* name,
                                        const std::optional<at::Tensor>& lengths, int64_t B,
                                        int64_t N, const at::Tensor& like,
                                        const char* bound_name = "N");

// Whether value ranges of index tensors on `t`'s device can be checked now. Always on the
// CPU; on CUDA a check costs one host synchronisation, so it is skipped while the current
// stream is capturing a CUDA graph (the kernels stay in bounds whatever the values).
bool check_values_now(const at::Tensor& t);

// [min, max] of an integer tensor with one device-to-host copy; numel() must be > 0.
std::pair<int64_t, int64_t> value_range(const at::Tensor& t);

// Contiguous copy (or view) in the dtype the kernels compute in: float32 for float16/bfloat16,
// the dtype itself for float32/float64.
at::Tensor to_compute_dtype(const at::Tensor& t);

pcops_dtype to_pcops_dtype(at::ScalarType type);

// The data of an optional int64 tensor (lengths, start, groups), or NULL for the C API.
inline const int64_t* ptr_or_null(const std::optional<at::Tensor>& t) {
    return t ? t->data_ptr<int64_t>() : nullptr;
}

// Raises if a CPU kernel returned an error.
void check_status(const char* op, pcops_status status);

#ifdef PCOPS_WITH_CUDA
// Raises unless `t` is a CUDA tensor. A CUDA kernel is chosen when any argument is on CUDA,
// so this catches a CPU `t` mixed with CUDA arguments before a device guard is taken on it.
void check_cuda_tensor(const char* op, const char* name, const at::Tensor& t);

// Raises if a CUDA launcher returned an error.
void check_cuda(const char* op, cudaError_t err);
#endif

}  // namespace pcops
