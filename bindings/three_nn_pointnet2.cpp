// three_nn_pointnet2.cpp -- binding of three_nn_pointnet2 (pointnet2_ops's three_nn in one op):
// checks, allocation, dispatch to kernels/knn.* (k = 3, through its plan) and
// kernels/three_nn_pointnet2.* (sqrt of dist2 in place, int64 -> int32 indices with -1 -> 0).
//
// Per CUDA call: three allocations from the caching allocator (the kNN's dist2, converted in
// place into dist; the kNN's int64 idx, a temporary; the int32 idx), a workspace only where the
// kNN plan asks for one, the kNN launch and one conversion launch; no host synchronisation. Half inputs compute
// in float32 (as knn) and dist is rounded to the input dtype at the end.
//
// Autograd: pointnet2_ops's three_nn is not differentiable; a fallthrough for the Autograd key
// keeps the call in C++ (inputs that require grad are accepted, the outputs come back without
// grad_fn).
#include <torch/library.h>

#include "utils.h"

namespace pcops {
namespace {

constexpr const char* kOp = "three_nn_pointnet2";
constexpr int64_t kK = 3;

struct ThreeNnCall {
    QueryRef q;          // unknown [B,n,3] (query), known [B,m,3] (ref): contiguous, compute dtype
    at::Tensor dist;     // [B,n,3] compute dtype: the kNN's dist2, then sqrt in place
    at::Tensor idx64;    // [B,n,3] int64: the kNN's idx (a temporary)
    at::Tensor idx;      // [B,n,3] int32: the output
    pcops_dtype dtype;
};

ThreeNnCall prepare(const at::Tensor& unknown, const at::Tensor& known) {
    ThreeNnCall c;
    c.q = check_query_ref(kOp, unknown, known, std::nullopt, std::nullopt, "unknown", "known");
    check_output_elements(kOp, "unknown", {c.q.B, c.q.M, kK}, c.q.query.element_size() + 8 + 4,
                          unknown);
    c.dtype = to_pcops_dtype(c.q.query.scalar_type());
    c.dist = allocate(kOp, "unknown", {c.q.B, c.q.M, kK}, c.q.query.options());
    c.idx64 = allocate(kOp, "unknown", {c.q.B, c.q.M, kK}, unknown.options().dtype(at::kLong));
    c.idx = allocate(kOp, "unknown", {c.q.B, c.q.M, kK}, unknown.options().dtype(at::kInt));
    return c;
}

// The kNN's workspace on the device of `like`: none (an undefined tensor) for 0 bytes, which is
// most calls (one allocation fewer).
at::Tensor allocate_workspace(size_t bytes, const at::Tensor& like) {
    if (bytes == 0) return at::Tensor();
    return allocate(kOp, nullptr, {(int64_t)bytes}, like.options().dtype(at::kByte));
}

void* data_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

std::tuple<at::Tensor, at::Tensor> finish(const ThreeNnCall& c, const at::Tensor& unknown) {
    if (c.dist.scalar_type() == unknown.scalar_type()) return {c.dist, c.idx};
    return {to_dist_dtype(kOp, "unknown", c.dist, unknown.scalar_type()), c.idx};
}

std::tuple<at::Tensor, at::Tensor> three_nn_pointnet2_cpu(const at::Tensor& unknown,
                                                          const at::Tensor& known) {
    ThreeNnCall c = prepare(unknown, known);
    const QueryRef& q = c.q;
    at::Tensor workspace = allocate_workspace(
        pcops_knn_cpu_workspace_bytes(c.dtype, q.B, q.M, q.N, kK, PCOPS_KNN_AUTO), q.query);
    check_status(kOp, pcops_knn_cpu_path(c.dtype, q.query.data_ptr(), q.ref.data_ptr(),
                                            nullptr, nullptr, q.B, q.M, q.N, kK,
                                            PCOPS_KNN_AUTO, data_or_null(workspace),
                                            c.dist.data_ptr(), c.idx64.data_ptr<int64_t>()));
    check_status(kOp, pcops_three_nn_pointnet2_cpu(c.dtype, c.dist.data_ptr(),
                                                 c.idx64.data_ptr<int64_t>(), c.dist.numel(),
                                                 c.dist.data_ptr(), c.idx.data_ptr<int32_t>()));
    return finish(c, unknown);
}

#ifdef PCOPS_WITH_CUDA
std::tuple<at::Tensor, at::Tensor> three_nn_pointnet2_cuda(const at::Tensor& unknown,
                                                           const at::Tensor& known) {
    check_cuda_tensor(kOp, "unknown", unknown);
    c10::cuda::CUDAGuard guard(unknown.device());
    ThreeNnCall c = prepare(unknown, known);
    const QueryRef& q = c.q;
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    pcops_knn_cuda_plan plan;
    check_cuda(kOp, pcops_knn_cuda_plan_make(c.dtype, q.B, q.M, q.N, kK, PCOPS_KNN_AUTO,
                                             &plan));
    at::Tensor workspace = allocate_workspace(plan.workspace_bytes, q.query);
    check_cuda(kOp, pcops_knn_cuda_run(&plan, q.query.data_ptr(), q.ref.data_ptr(), nullptr,
                                       nullptr, data_or_null(workspace), c.dist.data_ptr(),
                                       c.idx64.data_ptr<int64_t>(), stream));
    check_cuda(kOp, pcops_three_nn_pointnet2_cuda(c.dtype, c.dist.data_ptr(),
                                                c.idx64.data_ptr<int64_t>(), c.dist.numel(),
                                                c.dist.data_ptr(), c.idx.data_ptr<int32_t>(),
                                                stream));
    return finish(c, unknown);
}
#endif

}  // namespace

TORCH_LIBRARY_IMPL(pcops, CPU, m) {
    m.impl("three_nn_pointnet2", &three_nn_pointnet2_cpu);
}

#ifdef PCOPS_WITH_CUDA
TORCH_LIBRARY_IMPL(pcops, CUDA, m) {
    m.impl("three_nn_pointnet2", &three_nn_pointnet2_cuda);
}
#endif

TORCH_LIBRARY_IMPL(pcops, Autograd, m) {
    m.impl("three_nn_pointnet2", torch::CppFunction::makeFallthrough());
}

}  // namespace pcops
