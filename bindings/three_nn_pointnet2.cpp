// three_nn_pointnet2.cpp -- binding of three_nn_pointnet2 (pointnet2_ops's three_nn in one op):
// checks, allocation, dispatch to kernels/knn.* (k = 3, through its plan) and
// kernels/three_nn_pointnet2.* (sqrt of dist2 in place, int64 -> int32 indices with -1 -> 0).
//
// Per CUDA call: three allocations from the caching allocator (the kNN's dist2, converted in
// place into dist; the kNN's int64 idx, a temporary; the int32 idx), a workspace only where the
// kNN plan asks for one, the kNN launch and one conversion launch; no host synchronisation. Half
// inputs compute in float32 (as knn) and dist is rounded to the input dtype at the end.
//
// Autograd: pointnet2_ops's three_nn is not differentiable; a fallthrough for the Autograd key
// (registered in pcops/_loader.py) keeps the call in C++ (inputs that require grad are
// accepted, the outputs come back without grad_fn).
#include "utils.h"

namespace pcops {
namespace {

constexpr const char* kOp = "three_nn_pointnet2";
constexpr int64_t kK = 3;

struct ThreeNnCall {
    QueryRef q;          // unknown [B,n,3] (query), known [B,m,3] (ref): contiguous, compute dtype
    Tensor dist = undefined_tensor();  // [B,n,3] compute dtype: the kNN's dist2, then sqrt in place
    // [B,n,3] int64: the kNN's idx (a temporary: raw memory, undefined if empty)
    Tensor idx64 = undefined_tensor();
    Tensor idx = undefined_tensor();  // [B,n,3] int32: the output
    pcops_dtype dtype;
};

ThreeNnCall prepare(const Tensor& unknown, const Tensor& known) {
    ThreeNnCall c;
    c.q = check_query_ref(kOp, unknown, known, std::nullopt, std::nullopt, "unknown", "known");
    check_output_elements(kOp, "unknown", {c.q.B, c.q.M, kK}, c.q.query.element_size() + 8 + 4,
                          unknown);
    c.dtype = to_pcops_dtype(dtype_of(c.q.query));
    c.dist = allocate(kOp, "unknown", {c.q.B, c.q.M, kK}, dtype_of(c.q.query), c.q.query);
    c.idx64 = allocate(kOp, "unknown", {c.q.B, c.q.M, kK}, ScalarType::Long, unknown);
    c.idx = allocate(kOp, "unknown", {c.q.B, c.q.M, kK}, ScalarType::Int, unknown);
    return c;
}

std::tuple<Tensor, Tensor> finish(const ThreeNnCall& c, const Tensor& unknown) {
    if (dtype_of(c.dist) == dtype_of(unknown)) return {c.dist, c.idx};
    return {to_dist_dtype(kOp, "unknown", c.dist, dtype_of(unknown)), c.idx};
}

std::tuple<Tensor, Tensor> three_nn_pointnet2_cpu(const Tensor& unknown,
                                                          const Tensor& known) {
    ThreeNnCall c = prepare(unknown, known);
    const QueryRef& q = c.q;
    Tensor workspace = workspace_tensor(
        kOp, pcops_knn_cpu_workspace_bytes(c.dtype, q.B, q.M, q.N, kK, PCOPS_KNN_AUTO), q.query);
    check_status(
        kOp, pcops_knn_cpu_path(c.dtype, q.query.data_ptr(), q.ref.data_ptr(), nullptr, nullptr,
                                q.B, q.M, q.N, kK, PCOPS_KNN_AUTO, workspace_ptr(workspace),
                                c.dist.data_ptr(), data<int64_t>(c.idx64)));
    check_status(kOp, pcops_three_nn_pointnet2_cpu(
                          c.dtype, c.dist.data_ptr(), data<int64_t>(c.idx64),
                          c.dist.numel(), c.dist.data_ptr(), data<int32_t>(c.idx)));
    return finish(c, unknown);
}

#ifdef PCOPS_WITH_CUDA
std::tuple<Tensor, Tensor> three_nn_pointnet2_cuda(const Tensor& unknown, const Tensor& known) {
    check_cuda_tensor(kOp, "unknown", unknown);
    DeviceGuard guard(unknown);
    ThreeNnCall c = prepare(unknown, known);
    const QueryRef& q = c.q;
    const cudaStream_t stream = current_stream(unknown);
    pcops_knn_cuda_plan plan;
    check_cuda(kOp, pcops_knn_cuda_plan_make(c.dtype, q.B, q.M, q.N, kK, PCOPS_KNN_AUTO,
                                             &plan));
    Tensor workspace = workspace_tensor(kOp, plan.workspace_bytes, q.query);
    check_cuda(kOp, pcops_knn_cuda_run(&plan, q.query.data_ptr(), q.ref.data_ptr(), nullptr,
                                       nullptr, workspace_ptr(workspace), c.dist.data_ptr(),
                                       data<int64_t>(c.idx64), stream));
    check_cuda(kOp, pcops_three_nn_pointnet2_cuda(
                        c.dtype, c.dist.data_ptr(), data<int64_t>(c.idx64),
                        c.dist.numel(), c.dist.data_ptr(), data<int32_t>(c.idx), stream));
    return finish(c, unknown);
}
#endif

}  // namespace
}  // namespace pcops

STABLE_TORCH_LIBRARY_IMPL(pcops, CPU, m) {
    m.impl("three_nn_pointnet2", TORCH_BOX(&pcops::three_nn_pointnet2_cpu));
}

#ifdef PCOPS_WITH_CUDA
STABLE_TORCH_LIBRARY_IMPL(pcops, CUDA, m) {
    m.impl("three_nn_pointnet2", TORCH_BOX(&pcops::three_nn_pointnet2_cuda));
}
#endif
