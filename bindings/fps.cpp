// fps.cpp -- binding of furthest_point_sample: shape/dtype/device/size checks, allocation,
// dispatch to kernels/fps.* (D = 3) or kernels/fps_nd.* (any other D >= 1). The values of
// `start` are checked exactly where that is free (on the CPU; on CUDA in debug mode): start[b]
// in [0, lengths[b]). Unchecked, on CUDA, the kernels take start modulo lengths[b], so no
// device read is needed (pcops/fps.py draws random_start=True within the lengths, on the
// device).
#include <climits>

#include "utils.h"

namespace pcops {
namespace {

constexpr const char* kOp = "furthest_point_sample";

// The coverage curve in the dtype of xyz (computed in float32 for half types): no dispatch when
// it already is.
Tensor dist2_in_input_dtype(const Tensor& dist2, const Tensor& xyz) {
    return to_dist_dtype(kOp, "npoint", dist2, dtype_of(xyz));
}

// Checked, contiguous inputs and allocated outputs, shared by the CPU and CUDA paths.
struct FpsCall {
    Tensor xyz = undefined_tensor();  // [B,N,D], float32 or float64 (half types upcast), contiguous
    std::optional<Tensor> lengths;
    std::optional<Tensor> start;
    Tensor idx = undefined_tensor();  // [B,npoint] int64
    Tensor dist2 = undefined_tensor();  // [B,npoint], in the compute dtype
    int64_t B, N, D, npoint;
};

// Outputs [B, npoint] of int64 and of the compute dtype; a ValueError naming npoint when they
// cannot fit in the device's memory (npoint = 2**40, say), checked before allocating.
void allocate_outputs(FpsCall& c, const Tensor& like) {
    check_output_elements(kOp, "npoint", {c.B, c.npoint}, 8 + c.xyz.element_size(), like);
    c.idx = allocate(kOp, "npoint", {c.B, c.npoint}, ScalarType::Long, like);
    c.dist2 = allocate(kOp, "npoint", {c.B, c.npoint}, dtype_of(c.xyz), c.xyz);
}

// start[b] in [0, lengths[b]) for every cloud with points (lengths[b] = N without lengths),
// when check_values_now: always on the CPU, on CUDA in debug mode (a copy to the host). The
// lengths are checked before (values in [0, N]).
void check_start_values(const FpsCall& c) {
    const Tensor& start = *c.start;
    if (c.B == 0 || !check_values_now(start)) return;
    const Tensor s = to_host(start);
    const Tensor lengths = c.lengths ? to_host(*c.lengths) : undefined_tensor();
    const int64_t* sp = data<int64_t>(s);
    const int64_t* lp = lengths.defined() ? data<int64_t>(lengths) : nullptr;
    for (int64_t b = 0; b < c.B; ++b) {
        const int64_t length = lp ? lp[b] : c.N;
        PCOPS_CHECK_VALUE(length <= 0 || (sp[b] >= 0 && sp[b] < length), "pcops.", kOp,
                          ": argument 'start' must hold, for each b, a value in [0, lengths[b]) "
                          "(lengths[b] = N = ", c.N, " without 'lengths'), got start[", b,
                          "] = ", sp[b], " with lengths[", b, "] = ", length);
    }
}

FpsCall prepare(const Tensor& xyz, int64_t npoint, const std::optional<Tensor>& lengths,
                const std::optional<Tensor>& start) {
    check_float_tensor(kOp, "xyz", xyz, 3, -1, "[B, N, D] with D >= 1");
    PCOPS_CHECK_VALUE(xyz.size(2) >= 1, "pcops.", kOp,
                      ": argument 'xyz' must be a tensor of shape [B, N, D] with D >= 1, got ",
                      describe(xyz));
    check_positive(kOp, "npoint", npoint);
    FpsCall c;
    c.B = xyz.size(0);
    c.N = xyz.size(1);
    c.D = xyz.size(2);
    c.npoint = npoint;
    check_points_per_cloud(kOp, "xyz", c.N, "N");  // before any contiguous copy
    c.lengths = check_lengths(kOp, "lengths", lengths, c.B, c.N, xyz, "xyz");
    if (start.has_value() && start->defined()) {
        const Tensor& s = *start;
        check_index_tensor(kOp, "start", s, 1, "[B]");
        check_size(kOp, "start", s, 0, c.B, "the batch size B of 'xyz'");
        check_same_device(kOp, "start", s, "xyz", xyz);
        c.start = contiguous(kOp, "start", s);
        check_start_values(c);
    }
    c.xyz = to_compute_dtype(kOp, "xyz", xyz);
    allocate_outputs(c, xyz);
    return c;
}

constexpr const char* kPathOp = "_furthest_point_sample_path";

// Points of D != 3 coordinates take the kernels of any dimension (kernels/fps_nd.c,
// fps_nd.cu): one path, the simple one. A forced path other than AUTO / SIMPLE cannot take
// them. D = 3 keeps the paths of the table (kernels/fps_paths.h).
void check_nd_path(const char* forced, int64_t path, const FpsCall& c) {
    if (forced != nullptr && path != PCOPS_FPS_SIMPLE)
        forced_path_refused(kPathOp, forced,
                            "B = " + std::to_string(c.B) + ", N = " + std::to_string(c.N) +
                                ", D = " + std::to_string(c.D) +
                                " (points of D != 3 take the simple path only)");
}

// path: a pcops_fps_path (0 = AUTO, by size). The public op passes AUTO; the private op
// _furthest_point_sample_path forces one for tests and benchmarks.
std::tuple<Tensor, Tensor> fps_cpu(const Tensor& xyz, int64_t npoint,
                                   const std::optional<Tensor>& lengths,
                                   const std::optional<Tensor>& start, int64_t path) {
    FpsCall c = prepare(xyz, npoint, lengths, start);
    pcops_dtype dtype = to_pcops_dtype(dtype_of(c.xyz));
    const char* forced = path == PCOPS_FPS_AUTO
                             ? nullptr
                             : check_path(kPathOp, "furthest_point_sample", path, false, dtype);
    if (c.D != 3) {
        check_nd_path(forced, path, c);
        Tensor workspace = workspace_tensor(
            kOp, pcops_fps_nd_workspace_bytes(dtype, c.B, c.N), c.xyz);
        check_status(kOp, pcops_fps_nd_cpu(dtype, c.xyz.data_ptr(), ptr_or_null(c.lengths),
                                           ptr_or_null(c.start), c.B, c.N, c.D, c.npoint,
                                           workspace_ptr(workspace), data<int64_t>(c.idx),
                                           c.dist2.data_ptr()));
        return {c.idx, dist2_in_input_dtype(c.dist2, xyz)};
    }
    const int64_t workspace_bytes = (int64_t)pcops_fps_workspace_bytes(dtype, c.B, c.N);
    Tensor workspace =
        allocate(kOp, nullptr, {workspace_bytes}, ScalarType::Byte, c.xyz);
    const pcops_status status = pcops_fps_cpu_path(
        dtype, c.xyz.data_ptr(), ptr_or_null(c.lengths), ptr_or_null(c.start), c.B, c.N, c.npoint,
        workspace_ptr(workspace), data<int64_t>(c.idx), c.dist2.data_ptr(), (int)path);
    if (status != PCOPS_SUCCESS && forced != nullptr)
        forced_path_refused(kPathOp, forced, "B = " + std::to_string(c.B) + ", N = " +
                                                 std::to_string(c.N));
    check_status(kOp, status);
    return {c.idx, dist2_in_input_dtype(c.dist2, xyz)};
}

std::tuple<Tensor, Tensor> fps_cpu_auto(const Tensor& xyz, int64_t npoint,
                                        const std::optional<Tensor>& lengths,
                                        const std::optional<Tensor>& start) {
    return fps_cpu(xyz, npoint, lengths, start, PCOPS_FPS_AUTO);
}

#ifdef PCOPS_WITH_CUDA
std::tuple<Tensor, Tensor> fps_cuda(const Tensor& xyz, int64_t npoint,
                                    const std::optional<Tensor>& lengths,
                                    const std::optional<Tensor>& start, int64_t path) {
    check_cuda_tensor(kOp, "xyz", xyz);
    DeviceGuard guard(xyz);
    FpsCall c = prepare(xyz, npoint, lengths, start);
    pcops_dtype dtype = to_pcops_dtype(dtype_of(c.xyz));
    const char* forced = path == PCOPS_FPS_AUTO
                             ? nullptr
                             : check_path(kPathOp, "furthest_point_sample", path, true, dtype);
    if (c.D != 3) {
        check_nd_path(forced, path, c);
        Tensor workspace = workspace_tensor(
            kOp, pcops_fps_nd_workspace_bytes(dtype, c.B, c.N), c.xyz);
        check_cuda(kOp, pcops_fps_nd_cuda(dtype, c.xyz.data_ptr(), ptr_or_null(c.lengths),
                                          ptr_or_null(c.start), c.B, c.N, c.D, c.npoint,
                                          workspace_ptr(workspace), data<int64_t>(c.idx),
                                          c.dist2.data_ptr(), current_stream(xyz)));
        return {c.idx, dist2_in_input_dtype(c.dist2, xyz)};
    }
    pcops_fps_cuda_plan plan;
    cudaError_t err = pcops_fps_cuda_make_plan(dtype, c.B, c.N, c.npoint, (int)path, &plan);
    if (err != cudaSuccess && forced != nullptr)
        forced_path_refused(kPathOp, forced, "B = " + std::to_string(c.B) + ", N = " +
                                                 std::to_string(c.N) + ", npoint = " +
                                                 std::to_string(c.npoint));
    check_cuda(kOp, err);
    Tensor workspace = workspace_tensor(kOp, plan.workspace_bytes, c.xyz);
    check_cuda(kOp, pcops_fps_cuda_run(&plan, dtype, c.xyz.data_ptr(), ptr_or_null(c.lengths),
                                       ptr_or_null(c.start), c.B, c.N, c.npoint,
                                       workspace_ptr(workspace), data<int64_t>(c.idx),
                                       c.dist2.data_ptr(), current_stream(xyz)));
    return {c.idx, dist2_in_input_dtype(c.dist2, xyz)};
}

std::tuple<Tensor, Tensor> fps_cuda_auto(const Tensor& xyz, int64_t npoint,
                                         const std::optional<Tensor>& lengths,
                                         const std::optional<Tensor>& start) {
    return fps_cuda(xyz, npoint, lengths, start, PCOPS_FPS_AUTO);
}
#endif

}  // namespace

}  // namespace pcops

STABLE_TORCH_LIBRARY_IMPL(pcops, CPU, m) {
    m.impl("furthest_point_sample", TORCH_BOX(&pcops::fps_cpu_auto));
    m.impl("_furthest_point_sample_path", TORCH_BOX(&pcops::fps_cpu));
}

#ifdef PCOPS_WITH_CUDA
STABLE_TORCH_LIBRARY_IMPL(pcops, CUDA, m) {
    m.impl("furthest_point_sample", TORCH_BOX(&pcops::fps_cuda_auto));
    m.impl("_furthest_point_sample_path", TORCH_BOX(&pcops::fps_cuda));
}
#endif

// Autograd: the outputs are indices and the coverage curve, neither differentiable (the
// curve's value is a distance, but it picks points: no gradient flows through a choice). The
// Autograd key falls through (registered in pcops/_loader.py: the stable ABI cannot register a
// fallthrough), so a call stays in C++; inputs that require grad are accepted and the outputs
// do not require it.
