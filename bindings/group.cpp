// group.cpp -- bindings of group and group_backward: checks, allocation, dispatch to
// kernels/group.*.
#include <torch/library.h>

#include "utils.h"

namespace pcops {
namespace {

constexpr const char* kGroup = "group";
constexpr const char* kBackward = "group_backward";

// idx holds values in [-1, n) (`n_name` says what n is); one host sync on CUDA, skipped while
// capturing a CUDA graph (the kernels treat any value outside [0, n) as -1).
void check_idx_values(const char* op, const at::Tensor& idx, int64_t n, const char* n_name) {
    if (idx.numel() == 0 || !check_values_now(idx)) return;
    auto [lo, hi] = value_range(idx);
    TORCH_CHECK_VALUE(lo >= -1 && hi < n, "pcops.", op,
                      ": argument 'idx' must hold values in [-1, ", n_name, ") = [-1, ", n,
                      "), got values in [", lo, ", ", hi, "]");
}

struct GroupCall {
    at::Tensor features;  // [B,N,C], contiguous, any of the four float dtypes
    at::Tensor idx;       // [B,M,S] int64, contiguous
    at::Tensor out;       // [B,M,S,C], features' dtype
    int64_t B, N, C, M, S;
};

GroupCall prepare_group(const at::Tensor& features, const at::Tensor& idx) {
    check_float_tensor(kGroup, "features", features, 3, -1, "[B, N, C]");
    check_float_dtype(kGroup, "features", features);
    check_index_tensor(kGroup, "idx", idx, 3, "[B, M, S]");
    check_same_device(kGroup, "idx", idx, "features", features);
    GroupCall c;
    c.B = features.size(0);
    c.N = features.size(1);
    c.C = features.size(2);
    c.M = idx.size(1);
    c.S = idx.size(2);
    check_size(kGroup, "idx", idx, 0, c.B, "the batch size B of 'features'");
    check_idx_values(kGroup, idx, c.N, "N");
    c.features = features.contiguous();
    c.idx = idx.contiguous();
    c.out = at::empty({c.B, c.M, c.S, c.C}, features.options());
    return c;
}

struct BackwardCall {
    at::Tensor grad_out;       // [B,M,S,C], contiguous
    at::Tensor idx;            // [B,M,S] int64, contiguous
    at::Tensor grad_features;  // [B,num_points,C]: grad_out's dtype, or float32 sums (CPU, half)
    int64_t B, N, C, M, S;
};

// The kernels read grad_out in its own dtype and add in float32 (float64 for float64). The
// CPU kernel returns the float32 sums for half types (`float_sums_for_half`), which the
// binding rounds once; the CUDA kernel rounds them itself.
BackwardCall prepare_backward(const at::Tensor& grad_out, const at::Tensor& idx,
                              int64_t num_points, bool float_sums_for_half) {
    check_float_tensor(kBackward, "grad_out", grad_out, 4, -1, "[B, M, S, C]");
    check_float_dtype(kBackward, "grad_out", grad_out);
    check_index_tensor(kBackward, "idx", idx, 3, "[B, M, S]");
    check_same_device(kBackward, "idx", idx, "grad_out", grad_out);
    check_size(kBackward, "idx", idx, 0, grad_out.size(0), "the batch size B of 'grad_out'");
    check_size(kBackward, "idx", idx, 1, grad_out.size(1), "M, dimension 1 of 'grad_out'");
    check_size(kBackward, "idx", idx, 2, grad_out.size(2), "S, dimension 2 of 'grad_out'");
    TORCH_CHECK_VALUE(num_points >= 0, "pcops.", kBackward,
                      ": argument 'num_points' must be >= 0, got ", num_points);
    check_idx_values(kBackward, idx, num_points, "num_points");
    BackwardCall c;
    c.B = grad_out.size(0);
    c.M = grad_out.size(1);
    c.S = grad_out.size(2);
    c.C = grad_out.size(3);
    c.N = num_points;
    c.grad_out = grad_out.contiguous();
    c.idx = idx.contiguous();
    const auto type = grad_out.scalar_type();
    const bool half = type == at::kHalf || type == at::kBFloat16;
    const auto out_type = float_sums_for_half && half ? at::kFloat : type;
    c.grad_features = at::empty({c.B, c.N, c.C}, grad_out.options().dtype(out_type));
    return c;
}

at::Tensor group_cpu(const at::Tensor& features, const at::Tensor& idx) {
    GroupCall c = prepare_group(features, idx);
    check_status(kGroup, pcops_group_cpu(to_pcops_dtype(c.features.scalar_type()),
                                         c.features.data_ptr(), c.idx.data_ptr<int64_t>(), c.B,
                                         c.N, c.C, c.M, c.S, c.out.data_ptr()));
    return c.out;
}

at::Tensor group_backward_cpu(const at::Tensor& grad_out, const at::Tensor& idx,
                              int64_t num_points) {
    BackwardCall c = prepare_backward(grad_out, idx, num_points, /*float_sums_for_half=*/true);
    check_status(kBackward,
                 pcops_group_backward_cpu(to_pcops_dtype(c.grad_out.scalar_type()),
                                          c.grad_out.data_ptr(), c.idx.data_ptr<int64_t>(), c.B,
                                          c.N, c.C, c.M, c.S, c.grad_features.data_ptr()));
    return c.grad_features.scalar_type() == grad_out.scalar_type()
               ? c.grad_features
               : c.grad_features.to(grad_out.scalar_type());
}

#ifdef PCOPS_WITH_CUDA
at::Tensor group_cuda(const at::Tensor& features, const at::Tensor& idx) {
    check_cuda_tensor(kGroup, "features", features);
    c10::cuda::CUDAGuard guard(features.device());
    GroupCall c = prepare_group(features, idx);
    check_cuda(kGroup, pcops_group_cuda(to_pcops_dtype(c.features.scalar_type()),
                                        c.features.data_ptr(), c.idx.data_ptr<int64_t>(), c.B,
                                        c.N, c.C, c.M, c.S, c.out.data_ptr(),
                                        at::cuda::getCurrentCUDAStream()));
    return c.out;
}

at::Tensor group_backward_cuda(const at::Tensor& grad_out, const at::Tensor& idx,
                               int64_t num_points) {
    check_cuda_tensor(kBackward, "grad_out", grad_out);
    c10::cuda::CUDAGuard guard(grad_out.device());
    BackwardCall c = prepare_backward(grad_out, idx, num_points, /*float_sums_for_half=*/false);
    at::Tensor workspace = at::empty(
        {(int64_t)pcops_group_backward_cuda_workspace_bytes(c.B, c.N, c.M, c.S)},
        c.grad_out.options().dtype(at::kByte));
    check_cuda(kBackward,
               pcops_group_backward_cuda(to_pcops_dtype(c.grad_out.scalar_type()),
                                         c.grad_out.data_ptr(), c.idx.data_ptr<int64_t>(), c.B,
                                         c.N, c.C, c.M, c.S, workspace.data_ptr(),
                                         c.grad_features.data_ptr(),
                                         at::cuda::getCurrentCUDAStream()));
    return c.grad_features;
}
#endif

}  // namespace

TORCH_LIBRARY_IMPL(pcops, CPU, m) {
    m.impl("group", &group_cpu);
    m.impl("group_backward", &group_backward_cpu);
}

#ifdef PCOPS_WITH_CUDA
TORCH_LIBRARY_IMPL(pcops, CUDA, m) {
    m.impl("group", &group_cuda);
    m.impl("group_backward", &group_backward_cuda);
}
#endif

}  // namespace pcops
