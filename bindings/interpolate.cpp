// interpolate.cpp -- binding of interpolate (weighted gather for PointNet++ feature
// propagation): checks, allocation, dispatch to kernels/interpolate.*.
#include "utils.h"

namespace pcops {
namespace {

constexpr const char* kOp = "interpolate";

struct InterpolateCall {
    // [B,N,C] contiguous, float32/float64 (half types as float32)
    Tensor features = undefined_tensor();
    Tensor idx = undefined_tensor();  // [B,M,K] int64 or int32 (read as is), contiguous
    Tensor weight = undefined_tensor();  // [B,M,K] contiguous, features' compute dtype
    Tensor out = undefined_tensor();  // [B,M,C] in the compute dtype
    int64_t B, N, C, M, K;
};

InterpolateCall prepare(const Tensor& features, const Tensor& idx, const Tensor& weight) {
    check_float_tensor(kOp, "features", features, 3, -1, "[B, N, C]");
    check_float_dtype(kOp, "features", features);
    check_index_tensor(kOp, "idx", idx, 3, "[B, M, K]", /*int32_ok=*/true);
    check_float_tensor(kOp, "weight", weight, 3, -1, "[B, M, K]");
    PCOPS_CHECK_TYPE(dtype_of(weight) == dtype_of(features), "pcops.", kOp,
                     ": argument 'weight' must have the dtype of 'features' (",
                     torch::headeronly::toString(dtype_of(features)), "), got ", describe(weight));
    check_same_device(kOp, "idx", idx, "features", features);
    check_same_device(kOp, "weight", weight, "features", features);
    InterpolateCall c;
    c.B = features.size(0);
    c.N = features.size(1);
    c.C = features.size(2);
    c.M = idx.size(1);
    c.K = idx.size(2);
    check_size(kOp, "idx", idx, 0, c.B, "the batch size B of 'features'");
    check_size(kOp, "weight", weight, 0, c.B, "the batch size B of 'features'");
    check_size(kOp, "weight", weight, 1, c.M, "M, dimension 1 of 'idx'");
    check_size(kOp, "weight", weight, 2, c.K, "K, dimension 2 of 'idx'");
    check_output_elements(kOp, "idx", {c.B, c.M, c.C}, features.element_size(), features);
    check_index_values(kOp, "idx", idx, -1, c.N, "[-1, N)");  // CPU; CUDA in debug mode
    c.features = to_compute_dtype(kOp, "features", features);
    c.weight = to_compute_dtype(kOp, "weight", weight);
    c.idx = contiguous(kOp, "idx", idx);
    c.out = allocate(kOp, "idx", {c.B, c.M, c.C}, dtype_of(c.features), c.features);
    return c;
}

Tensor finish(const InterpolateCall& c, const Tensor& features) {
    return to_dtype(kOp, "idx", c.out, dtype_of(features));
}

Tensor interpolate_cpu(const Tensor& features, const Tensor& idx, const Tensor& weight) {
    InterpolateCall c = prepare(features, idx, weight);
    check_status(kOp,
                 pcops_interpolate_cpu(to_pcops_dtype(dtype_of(c.features)), c.features.data_ptr(),
                                       c.idx.data_ptr(), to_index_dtype(c.idx), c.weight.data_ptr(),
                                       c.B, c.N, c.C, c.M, c.K, c.out.data_ptr()));
    return finish(c, features);
}

#ifdef PCOPS_WITH_CUDA
Tensor interpolate_cuda(const Tensor& features, const Tensor& idx, const Tensor& weight) {
    check_cuda_tensor(kOp, "features", features);
    DeviceGuard guard(features);
    InterpolateCall c = prepare(features, idx, weight);
    check_cuda(kOp, pcops_interpolate_cuda(
                        to_pcops_dtype(dtype_of(c.features)), c.features.data_ptr(),
                        c.idx.data_ptr(), to_index_dtype(c.idx), c.weight.data_ptr(), c.B, c.N, c.C,
                        c.M, c.K, c.out.data_ptr(), current_stream(features)));
    return finish(c, features);
}
#endif

}  // namespace
}  // namespace pcops

STABLE_TORCH_LIBRARY_IMPL(pcops, CPU, m) {
    m.impl("interpolate", TORCH_BOX(&pcops::interpolate_cpu));
}

#ifdef PCOPS_WITH_CUDA
STABLE_TORCH_LIBRARY_IMPL(pcops, CUDA, m) {
    m.impl("interpolate", TORCH_BOX(&pcops::interpolate_cuda));
}
#endif
