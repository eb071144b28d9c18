// fps.cpp -- binding of furthest_point_sample: checks, allocation, dispatch to kernels/fps.*.
#include <torch/library.h>

#include <cstdlib>

#include "utils.h"

namespace pcops {
namespace {

constexpr const char* kOp = "furthest_point_sample";

// Checked, contiguous inputs and allocated outputs, shared by the CPU and CUDA paths.
struct FpsCall {
    at::Tensor xyz;  // [B,N,3], float32 or float64 (half types upcast)
    std::optional<at::Tensor> lengths;
    std::optional<at::Tensor> start;
    at::Tensor idx;    // [B,npoint] int64
    at::Tensor dist2;  // [B,npoint], in the compute dtype
    int64_t B, N, npoint;
};

FpsCall prepare(const at::Tensor& xyz, int64_t npoint, const std::optional<at::Tensor>& lengths,
                const std::optional<at::Tensor>& start, bool random_start) {
    check_float_tensor(kOp, "xyz", xyz, 3, 3, "[B, N, 3]");
    check_positive(kOp, "npoint", npoint);
    FpsCall c;
    c.B = xyz.size(0);
    c.N = xyz.size(1);
    c.npoint = npoint;
    c.lengths = check_lengths(kOp, "lengths", lengths, c.B, c.N, xyz);
    const bool has_start = start.has_value() && start->defined();
    TORCH_CHECK_VALUE(!(has_start && random_start), "pcops.", kOp,
                      ": pass either 'start' or random_start=True, not both");
    if (has_start) {
        const at::Tensor& s = *start;
        check_index_tensor(kOp, "start", s, 1, "[B]");
        check_size(kOp, "start", s, 0, c.B, "the batch size B of 'xyz'");
        check_same_device(kOp, "start", s, "xyz", xyz);
        if (c.B > 0 && check_values_now(s)) {
            // start[b] must index a valid point of cloud b (any value is fine for an empty cloud).
            at::Tensor len = c.lengths ? *c.lengths : at::full({c.B}, c.N, s.options());
            at::Tensor bad = (s < 0).logical_or(s >= len).logical_and(len > 0);
            if (bad.any().item<bool>()) {
                int64_t b = bad.nonzero().select(1, 0)[0].item<int64_t>();
                TORCH_CHECK_VALUE(false, "pcops.", kOp, ": argument 'start' must hold, for each b, ",
                                  "a value in [0, lengths[b]) (lengths[b] = N = ", c.N,
                                  " without 'lengths'), got start[", b, "] = ", s[b].item<int64_t>(),
                                  " with lengths[", b, "] = ", len[b].item<int64_t>());
            }
        }
        c.start = s.contiguous();
    } else if (random_start) {
        // Uniform in [0, 2**62); the kernels take it modulo lengths[b]. Drawn on the device from
        // torch's default generator: no host synchronisation, and capturable in a CUDA graph.
        c.start = at::randint(0, int64_t(1) << 62, {c.B}, xyz.options().dtype(at::kLong));
    }
    c.xyz = to_compute_dtype(xyz);
    c.idx = at::empty({c.B, npoint}, xyz.options().dtype(at::kLong));
    c.dist2 = at::empty({c.B, npoint}, c.xyz.options());
    return c;
}

std::tuple<at::Tensor, at::Tensor> fps_cpu(const at::Tensor& xyz, int64_t npoint,
                                           const std::optional<at::Tensor>& lengths,
                                           const std::optional<at::Tensor>& start,
                                           bool random_start) {
    FpsCall c = prepare(xyz, npoint, lengths, start, random_start);
    pcops_dtype dtype = to_pcops_dtype(c.xyz.scalar_type());
    at::Tensor workspace = at::empty(
        {(int64_t)pcops_fps_workspace_bytes(dtype, c.B, c.N)}, c.xyz.options().dtype(at::kByte));
    check_status(kOp, pcops_fps_cpu(dtype, c.xyz.data_ptr(), ptr_or_null(c.lengths),
                                    ptr_or_null(c.start), c.B, c.N, c.npoint,
                                    workspace.data_ptr(), c.idx.data_ptr<int64_t>(),
                                    c.dist2.data_ptr()));
    return {c.idx, c.dist2.to(xyz.scalar_type())};
}

#ifdef PCOPS_WITH_CUDA
std::tuple<at::Tensor, at::Tensor> fps_cuda(const at::Tensor& xyz, int64_t npoint,
                                            const std::optional<at::Tensor>& lengths,
                                            const std::optional<at::Tensor>& start,
                                            bool random_start) {
    check_cuda_tensor(kOp, "xyz", xyz);
    c10::cuda::CUDAGuard guard(xyz.device());
    FpsCall c = prepare(xyz, npoint, lengths, start, random_start);
    pcops_dtype dtype = to_pcops_dtype(c.xyz.scalar_type());
    at::Tensor workspace =
        at::empty({(int64_t)pcops_fps_cuda_workspace_bytes(dtype, c.B, c.N)},
                  c.xyz.options().dtype(at::kByte));
    // PCOPS_FPS_VARIANT=1|2 forces a kernel (benchmarks compare them); results are identical.
    const char* variant = std::getenv("PCOPS_FPS_VARIANT");
    check_cuda(kOp, pcops_fps_cuda_variant(dtype, c.xyz.data_ptr(), ptr_or_null(c.lengths),
                                           ptr_or_null(c.start), c.B, c.N, c.npoint,
                                           workspace.data_ptr(), c.idx.data_ptr<int64_t>(),
                                           c.dist2.data_ptr(), variant ? std::atoi(variant) : 0,
                                           at::cuda::getCurrentCUDAStream()));
    return {c.idx, c.dist2.to(xyz.scalar_type())};
}
#endif

}  // namespace

TORCH_LIBRARY_IMPL(pcops, CPU, m) { m.impl("furthest_point_sample", &fps_cpu); }

#ifdef PCOPS_WITH_CUDA
TORCH_LIBRARY_IMPL(pcops, CUDA, m) { m.impl("furthest_point_sample", &fps_cuda); }
#endif

}  // namespace pcops
