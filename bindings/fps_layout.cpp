// fps_layout.cpp -- binding of _fps_layout (what torch_cluster's fps over a batch vector needs
// before its one host synchronisation): checks, allocation, dispatch to kernels/fps_layout.*.
// No synchronisation: the caller reads `stats` (pcops.compat.torch_cluster.fps, one .tolist()).
#include <torch/library.h>

#include <tuple>

#include "utils.h"

namespace pcops {
namespace {

constexpr const char* kOp = "_fps_layout";

using Layout = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// Values need no check: ids only decide the outputs' values, never an address (the binary
// searches and runs stay inside [0, N)); a bad vector shows in stats[0].
Layout prepare(const at::Tensor& batch, double ratio, at::ScalarType dtype, int64_t batch_size,
               pcops_dtype* code) {
    check_index_tensor(kOp, "batch", batch, 1, "[N]");
    TORCH_CHECK_VALUE(batch.scalar_type() == at::kLong, "pcops.", kOp,
                      ": argument 'batch' must be int64, got ", describe(batch));
    TORCH_CHECK_VALUE(ratio > 0 && ratio <= 1, "pcops.", kOp,
                      ": argument 'ratio' must be in (0, 1], got ", ratio);
    TORCH_CHECK_VALUE(batch_size >= -1, "pcops.", kOp,
                      ": argument 'batch_size' must be >= 0 (or -1: no limit), got ", batch_size);
    TORCH_CHECK_VALUE(dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kFloat ||
                          dtype == at::kDouble,
                      "pcops.", kOp,
                      ": argument 'dtype' must be float16, bfloat16, float32 or float64, got ",
                      c10::toString(dtype));
    *code = to_pcops_dtype(dtype);
    const int64_t N = batch.size(0);
    return {allocate(kOp, "batch", {PCOPS_FPS_LAYOUT_STATS}, batch.options()),
            allocate(kOp, "batch", {N}, batch.options()),
            allocate(kOp, "batch", {N}, batch.options())};
}

Layout fps_layout_cpu(const at::Tensor& batch, double ratio, at::ScalarType dtype,
                      int64_t batch_size) {
    pcops_dtype code;
    Layout out = prepare(batch, ratio, dtype, batch_size, &code);
    const at::Tensor b = contiguous(kOp, "batch", batch);
    check_status(kOp, pcops_fps_layout_cpu(b.data_ptr<int64_t>(), b.size(0), ratio, code,
                                           batch_size, std::get<0>(out).data_ptr<int64_t>(),
                                           std::get<1>(out).data_ptr<int64_t>(),
                                           std::get<2>(out).data_ptr<int64_t>()));
    return out;
}

#ifdef PCOPS_WITH_CUDA
Layout fps_layout_cuda(const at::Tensor& batch, double ratio, at::ScalarType dtype,
                       int64_t batch_size) {
    check_cuda_tensor(kOp, "batch", batch);  // before the guard: it needs a CUDA device
    c10::cuda::CUDAGuard guard(batch.device());
    pcops_dtype code;
    Layout out = prepare(batch, ratio, dtype, batch_size, &code);
    TORCH_CHECK_VALUE(batch.size(0) <= INT32_MAX, "pcops.", kOp,
                      ": argument 'batch' may hold at most 2**31 - 1 points on CUDA, got ",
                      describe(batch));
    const at::Tensor b = contiguous(kOp, "batch", batch);
    check_cuda(kOp, pcops_fps_layout_cuda(b.data_ptr<int64_t>(), b.size(0), ratio, code,
                                          batch_size, std::get<0>(out).data_ptr<int64_t>(),
                                          std::get<1>(out).data_ptr<int64_t>(),
                                          std::get<2>(out).data_ptr<int64_t>(),
                                          at::cuda::getCurrentCUDAStream()));
    return out;
}
#endif

}  // namespace

TORCH_LIBRARY_IMPL(pcops, CPU, m) { m.impl("_fps_layout", &fps_layout_cpu); }

#ifdef PCOPS_WITH_CUDA
TORCH_LIBRARY_IMPL(pcops, CUDA, m) { m.impl("_fps_layout", &fps_layout_cuda); }
#endif

}  // namespace pcops
