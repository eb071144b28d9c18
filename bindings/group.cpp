// group.cpp -- bindings of group and group_backward: checks, allocation, dispatch to
// kernels/group.*.
#include "utils.h"

namespace pcops {
namespace {

constexpr const char* kGroup = "group";
constexpr const char* kBackward = "group_backward";

struct GroupCall {
    Tensor features = undefined_tensor();  // [B,N,C], contiguous, any of the four float dtypes
    Tensor idx = undefined_tensor();  // [B,M,S] int64 or int32 (read as is), contiguous
    Tensor out = undefined_tensor();  // [B,M,S,C], features' dtype
    int64_t B, N, C, M, S;
};

GroupCall prepare_group(const Tensor& features, const Tensor& idx) {
    check_float_tensor(kGroup, "features", features, 3, -1, "[B, N, C]");
    check_index_tensor(kGroup, "idx", idx, 3, "[B, M, S]", /*int32_ok=*/true);
    check_same_device(kGroup, "idx", idx, "features", features);
    GroupCall c;
    c.B = features.size(0);
    c.N = features.size(1);
    c.C = features.size(2);
    c.M = idx.size(1);
    c.S = idx.size(2);
    check_size(kGroup, "idx", idx, 0, c.B, "the batch size B of 'features'");
    check_output_elements(kGroup, "idx", {c.B, c.M, c.S, c.C}, features.element_size(), features);
    check_index_values(kGroup, "idx", idx, -1, c.N, "[-1, N)");  // CPU; CUDA in debug mode
    c.features = contiguous(kGroup, "features", features);
    c.idx = contiguous(kGroup, "idx", idx);
    c.out = allocate(kGroup, "idx", {c.B, c.M, c.S, c.C}, dtype_of(features), features);
    return c;
}

struct BackwardCall {
    Tensor grad_out = undefined_tensor();  // [B,M,S,C], contiguous
    Tensor idx = undefined_tensor();  // [B,M,S] int64 or int32 (read as is), contiguous
    // [B,num_points,C], grad_out's dtype (CPU and CUDA alike)
    Tensor grad_features = undefined_tensor();
    int64_t B, N, C, M, S;
};

// The kernels read grad_out in its own dtype, add in float32 (float64 for float64) and write
// grad_features in grad_out's dtype, rounding half types once.
BackwardCall prepare_backward(const Tensor& grad_out, const Tensor& idx, int64_t num_points) {
    check_float_tensor(kBackward, "grad_out", grad_out, 4, -1, "[B, M, S, C]");
    check_index_tensor(kBackward, "idx", idx, 3, "[B, M, S]", /*int32_ok=*/true);
    check_same_device(kBackward, "idx", idx, "grad_out", grad_out);
    check_size(kBackward, "idx", idx, 0, grad_out.size(0), "the batch size B of 'grad_out'");
    check_size(kBackward, "idx", idx, 1, grad_out.size(1), "M, dimension 1 of 'grad_out'");
    check_size(kBackward, "idx", idx, 2, grad_out.size(2), "S, dimension 2 of 'grad_out'");
    PCOPS_CHECK_VALUE(num_points >= 0, "pcops.", kBackward,
                      ": argument 'num_points' must be >= 0, got ", num_points);
    check_output_elements(kBackward, "num_points", {grad_out.size(0), num_points, grad_out.size(3)},
                          grad_out.element_size(), grad_out);
    check_index_values(kBackward, "idx", idx, -1, num_points, "[-1, num_points)");
    BackwardCall c;
    c.B = grad_out.size(0);
    c.M = grad_out.size(1);
    c.S = grad_out.size(2);
    c.C = grad_out.size(3);
    c.N = num_points;
    c.grad_out = contiguous(kBackward, "grad_out", grad_out);
    c.idx = contiguous(kBackward, "idx", idx);
    c.grad_features = allocate(kBackward, "num_points", {c.B, c.N, c.C}, dtype_of(grad_out), grad_out);
    return c;
}

Tensor group_cpu(const Tensor& features, const Tensor& idx) {
    GroupCall c = prepare_group(features, idx);
    check_status(kGroup,
                 pcops_group_cpu(to_pcops_dtype(dtype_of(c.features)), c.features.data_ptr(),
                                 c.idx.data_ptr(), to_index_dtype(c.idx), c.B, c.N, c.C, c.M, c.S,
                                 c.out.data_ptr()));
    return c.out;
}

Tensor group_backward_cpu(const Tensor& grad_out, const Tensor& idx, int64_t num_points) {
    BackwardCall c = prepare_backward(grad_out, idx, num_points);
    const pcops_dtype dtype = to_pcops_dtype(dtype_of(c.grad_out));
    const int64_t workspace_bytes =
        (int64_t)pcops_group_backward_cpu_workspace_bytes(dtype, c.B, c.N, c.C);
    Tensor workspace =
        allocate(kBackward, nullptr, {workspace_bytes}, ScalarType::Byte, c.grad_out);
    check_status(kBackward, pcops_group_backward_cpu(dtype, c.grad_out.data_ptr(),
                                                     c.idx.data_ptr(), to_index_dtype(c.idx),
                                                     c.B, c.N, c.C, c.M, c.S,
                                                     workspace.data_ptr(),
                                                     c.grad_features.data_ptr()));
    return c.grad_features;
}

#ifdef PCOPS_WITH_CUDA
Tensor group_cuda(const Tensor& features, const Tensor& idx) {
    check_cuda_tensor(kGroup, "features", features);
    DeviceGuard guard(features);
    GroupCall c = prepare_group(features, idx);
    check_cuda(kGroup, pcops_group_cuda(to_pcops_dtype(dtype_of(c.features)), c.features.data_ptr(),
                                        c.idx.data_ptr(), to_index_dtype(c.idx), c.B, c.N, c.C, c.M,
                                        c.S, c.out.data_ptr(), current_stream(features)));
    return c.out;
}

Tensor group_backward_cuda(const Tensor& grad_out, const Tensor& idx, int64_t num_points) {
    check_cuda_tensor(kBackward, "grad_out", grad_out);
    DeviceGuard guard(grad_out);
    BackwardCall c = prepare_backward(grad_out, idx, num_points);
    const size_t bytes = pcops_group_backward_cuda_workspace_bytes(c.B, c.N, c.M, c.S);
    const int64_t workspace_bytes = bytes > (size_t)INT64_MAX ? INT64_MAX : (int64_t)bytes;
    check_output_elements(kBackward, "idx", {workspace_bytes}, 1, grad_out);  // sort scratch
    Tensor workspace =
        allocate(kBackward, nullptr, {workspace_bytes}, ScalarType::Byte, c.grad_out);
    check_cuda(kBackward,
               pcops_group_backward_cuda(
                   to_pcops_dtype(dtype_of(c.grad_out)), c.grad_out.data_ptr(), c.idx.data_ptr(),
                   to_index_dtype(c.idx), c.B, c.N, c.C, c.M, c.S, workspace_ptr(workspace),
                   c.grad_features.data_ptr(), current_stream(grad_out)));
    return c.grad_features;
}
#endif

}  // namespace
}  // namespace pcops

STABLE_TORCH_LIBRARY_IMPL(pcops, CPU, m) {
    m.impl("group", TORCH_BOX(&pcops::group_cpu));
    m.impl("group_backward", TORCH_BOX(&pcops::group_backward_cpu));
}

#ifdef PCOPS_WITH_CUDA
STABLE_TORCH_LIBRARY_IMPL(pcops, CUDA, m) {
    m.impl("group", TORCH_BOX(&pcops::group_cuda));
    m.impl("group_backward", TORCH_BOX(&pcops::group_backward_cuda));
}
#endif
