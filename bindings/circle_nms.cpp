// circle_nms.cpp -- bindings of circle_nms and circle_nms_mask: checks, the visiting order,
// allocation, dispatch to kernels/circle_nms.*.
//
// The visiting order is a stable descending sort of the scores, so equal scores are visited
// lower index first. NaN scores are accepted: the sort ranks NaN above every number, on the CPU
// and on CUDA alike, so boxes with a NaN score are visited first (documented in
// pcops/circle_nms.py). Rejecting them would cost circle_nms_mask a host synchronisation.
#include <torch/library.h>

#include <algorithm>

#include "utils.h"

namespace pcops {
namespace {

// The CUDA scan's grid has one block row per 64 boxes, at most 65535 of them.
constexpr int64_t kMaxCudaBoxes = int64_t(65535) * 64;

// Checked, contiguous inputs and allocated outputs, shared by both ops and both devices.
struct NmsCall {
    at::Tensor centers;                // [N,D], D in {2, 3}, float32 or float64 (half types upcast)
    at::Tensor order;                  // [N] int64, the visiting order
    std::optional<at::Tensor> groups;  // [N] int64
    at::Tensor keep_mask;              // [N] bool
    at::Tensor keep_idx;               // [N] int64
    at::Tensor num_kept;               // [1] int64, on the device of the inputs
    int64_t N, D;
    double radius2;
};

NmsCall prepare(const char* op, const at::Tensor& centers, const at::Tensor& scores,
                double radius, const std::optional<at::Tensor>& groups) {
    check_float_tensor(op, "centers", centers, 2, -1, "[N, 2] or [N, 3]");
    TORCH_CHECK_VALUE(centers.size(1) == 2 || centers.size(1) == 3, "pcops.", op,
                      ": argument 'centers' must be a tensor of shape [N, 2] or [N, 3], got ",
                      describe(centers));
    NmsCall c;
    c.N = centers.size(0);
    c.D = centers.size(1);
    check_float_tensor(op, "scores", scores, 1, -1, "[N]");
    check_size(op, "scores", scores, 0, c.N, "the number of boxes N of 'centers'");
    check_same_device(op, "scores", scores, "centers", centers);
    check_radius(op, "radius", radius);
    c.radius2 = radius * radius;
    if (groups.has_value() && groups->defined()) {
        const at::Tensor& g = *groups;
        check_index_tensor(op, "groups", g, 1, "[N]");
        check_size(op, "groups", g, 0, c.N, "the number of boxes N of 'centers'");
        check_same_device(op, "groups", g, "centers", centers);
        c.groups = g.contiguous();
    }
    c.centers = to_compute_dtype(centers);
    // Half scores are upcast first: exact, so the order and its ties are unchanged.
    c.order = std::get<1>(at::sort(to_compute_dtype(scores), /*stable=*/true, /*dim=*/0,
                                   /*descending=*/true));
    c.keep_mask = at::empty({c.N}, centers.options().dtype(at::kBool));
    c.keep_idx = at::empty({c.N}, centers.options().dtype(at::kLong));
    c.num_kept = at::empty({1}, centers.options().dtype(at::kLong));
    return c;
}

// keep_idx[:K], K = num_kept capped at max_out when max_out > 0.
at::Tensor first_kept(const NmsCall& c, int64_t num_kept, int64_t max_out) {
    int64_t K = max_out > 0 ? std::min(num_kept, max_out) : num_kept;
    return c.keep_idx.narrow(0, 0, K);
}

NmsCall run_cpu(const char* op, const at::Tensor& centers, const at::Tensor& scores,
                double radius, const std::optional<at::Tensor>& groups) {
    NmsCall c = prepare(op, centers, scores, radius, groups);
    pcops_dtype dtype = to_pcops_dtype(c.centers.scalar_type());
    at::Tensor workspace =
        at::empty({(int64_t)pcops_circle_nms_workspace_bytes(dtype, c.N)},
                  c.centers.options().dtype(at::kByte));
    check_status(op, pcops_circle_nms_cpu(dtype, c.centers.data_ptr(), c.D,
                                          c.order.data_ptr<int64_t>(), ptr_or_null(c.groups),
                                          c.N, c.radius2, workspace.data_ptr(),
                                          c.keep_mask.data_ptr<bool>(),
                                          c.keep_idx.data_ptr<int64_t>(),
                                          c.num_kept.data_ptr<int64_t>()));
    return c;
}

at::Tensor circle_nms_cpu(const at::Tensor& centers, const at::Tensor& scores, double radius,
                          int64_t max_out, const std::optional<at::Tensor>& groups) {
    NmsCall c = run_cpu("circle_nms", centers, scores, radius, groups);
    return first_kept(c, c.num_kept.data_ptr<int64_t>()[0], max_out);
}

at::Tensor circle_nms_mask_cpu(const at::Tensor& centers, const at::Tensor& scores,
                               double radius, const std::optional<at::Tensor>& groups) {
    return run_cpu("circle_nms_mask", centers, scores, radius, groups).keep_mask;
}

#ifdef PCOPS_WITH_CUDA
// Launches the whole NMS on the current stream; no host synchronisation.
NmsCall run_cuda(const char* op, const at::Tensor& centers, const at::Tensor& scores,
                 double radius, const std::optional<at::Tensor>& groups) {
    check_cuda_tensor(op, "centers", centers);
    c10::cuda::CUDAGuard guard(centers.device());
    NmsCall c = prepare(op, centers, scores, radius, groups);
    TORCH_CHECK_VALUE(c.N <= kMaxCudaBoxes, "pcops.", op,
                      ": argument 'centers' must hold at most ", kMaxCudaBoxes,
                      " boxes on CUDA (the suppression mask takes N**2/8 bytes), got ",
                      describe(centers));
    pcops_dtype dtype = to_pcops_dtype(c.centers.scalar_type());
    at::Tensor workspace =
        at::empty({(int64_t)pcops_circle_nms_cuda_workspace_bytes(dtype, c.N)},
                  c.centers.options().dtype(at::kByte));
    check_cuda(op, pcops_circle_nms_cuda(dtype, c.centers.data_ptr(), c.D,
                                         c.order.data_ptr<int64_t>(), ptr_or_null(c.groups),
                                         c.N, c.radius2, workspace.data_ptr(),
                                         c.keep_mask.data_ptr<bool>(),
                                         c.keep_idx.data_ptr<int64_t>(),
                                         c.num_kept.data_ptr<int64_t>(),
                                         at::cuda::getCurrentCUDAStream()));
    return c;
}

at::Tensor circle_nms_cuda(const at::Tensor& centers, const at::Tensor& scores, double radius,
                           int64_t max_out, const std::optional<at::Tensor>& groups) {
    NmsCall c = run_cuda("circle_nms", centers, scores, radius, groups);
    // The one host synchronisation: the output size depends on the data.
    return first_kept(c, c.num_kept.item<int64_t>(), max_out);
}

at::Tensor circle_nms_mask_cuda(const at::Tensor& centers, const at::Tensor& scores,
                                double radius, const std::optional<at::Tensor>& groups) {
    return run_cuda("circle_nms_mask", centers, scores, radius, groups).keep_mask;
}
#endif

}  // namespace

TORCH_LIBRARY_IMPL(pcops, CPU, m) {
    m.impl("circle_nms", &circle_nms_cpu);
    m.impl("circle_nms_mask", &circle_nms_mask_cpu);
}

#ifdef PCOPS_WITH_CUDA
TORCH_LIBRARY_IMPL(pcops, CUDA, m) {
    m.impl("circle_nms", &circle_nms_cuda);
    m.impl("circle_nms_mask", &circle_nms_mask_cuda);
}
#endif

}  // namespace pcops
