// circle_nms.cpp -- bindings of circle_nms and circle_nms_mask: checks, allocation, dispatch to
// kernels/circle_nms.* (which also compute the visiting order from the scores).
//
// Per CUDA call: circle_nms allocates keep_idx (N int64), launches one kernel (N <= 4096: the
// dataflow path's cooperative kernel, a block per 32 boxes) whose
// count goes straight into a pinned, device-mapped host slot, and waits for that count (its one
// host synchronisation: the output size depends on the data; no copy is queued after the
// kernel). The kernel writes the count before its outputs, and the host polls the slot, so the
// call returns while the kernel finishes keep_idx (stream order covers every later use); past
// kPollUs it falls back to cudaStreamSynchronize (long kernels: the runtime's own wait).
// circle_nms_mask allocates keep_mask and launches, nothing else. A small workspace (the
// dataflow path's, N <= 4096) shares the output's allocation; the grid path's (N > 4096) is a
// second one. N = 0 launches nothing. Half
// inputs are upcast first (exact: same order, same ties).
//
// Under torch.cuda.set_sync_debug_mode (read by pcops' call hook, utils.h) circle_nms raises
// before launching in mode "error" and waits through torch's stream synchronisation, which
// warns, in mode "warn".
//
// Autograd: the outputs are int64 / bool, so nothing is differentiable; a fallthrough for the
// Autograd key (registered in pcops/_loader.py) keeps the call in C++ (inputs that require
// grad are accepted, the outputs come back without grad_fn).
#include <algorithm>

#include "utils.h"

#ifdef PCOPS_WITH_CUDA
#include <chrono>
#endif

namespace pcops {
namespace {

// Checked, contiguous inputs in the compute dtypes.
struct NmsInputs {
    Tensor centers = undefined_tensor();  // [N,D], D in {2, 3}, float32 or float64
    Tensor scores = undefined_tensor();  // [N] float32 or float64
    std::optional<Tensor> groups;  // [N] int64
    int64_t N, D;
    double radius2;
};

NmsInputs prepare(const char* op, const Tensor& centers, const Tensor& scores, double radius,
                  const std::optional<Tensor>& groups) {
    check_float_tensor(op, "centers", centers, 2, -1, "[N, 2] or [N, 3]");
    PCOPS_CHECK_VALUE(centers.size(1) == 2 || centers.size(1) == 3, "pcops.", op,
                      ": argument 'centers' must be a tensor of shape [N, 2] or [N, 3], got ",
                      describe(centers));
    NmsInputs c;
    c.N = centers.size(0);
    c.D = centers.size(1);
    check_float_tensor(op, "scores", scores, 1, -1, "[N]");
    check_size(op, "scores", scores, 0, c.N, "the number of boxes N of 'centers'");
    check_same_device(op, "scores", scores, "centers", centers);
    check_radius(op, "radius", radius);
    c.radius2 = radius * radius;
    if (groups.has_value() && groups->defined()) {
        const Tensor& g = *groups;
        check_index_tensor(op, "groups", g, 1, "[N]");
        check_size(op, "groups", g, 0, c.N, "the number of boxes N of 'centers'");
        check_same_device(op, "groups", g, "centers", centers);
        c.groups = contiguous(op, "groups", g);
    }
    c.centers = to_compute_dtype(op, "centers", centers);
    c.scores = to_compute_dtype(op, "scores", scores);
    return c;
}

// ------------------------------------------------------------------------------------------
// CPU

// Workspaces up to this size share the output's allocation (on CUDA the dataflow path's: 4.4
// bytes a box, 18 KB at 4096; on the CPU small inputs', where an allocation costs more than the
// NMS); larger ones (CUDA's grid path, about 120 bytes a box) get their own, so the output does
// not hold them.
constexpr size_t kSharedWorkspaceMax = 64 * 1024;

// The allocation `base` of the output (its first N elements of `dtype`) and the workspace (every
// path but 1 and 4): ONE allocation when the workspace is small (it starts at the first
// 256-byte boundary past the output), else its own in `ws`. Returns the workspace (or null).
// The output is output_view(base, size).
void* output_and_workspace(const char* op, Tensor& base, Tensor& ws, const NmsInputs& c, ScalarType dtype,
                           size_t workspace_bytes) {
    if (workspace_bytes == 0 || workspace_bytes > kSharedWorkspaceMax) {
        base = allocate(op, "centers", {c.N}, dtype, c.centers);
        if (workspace_bytes == 0) return nullptr;
        ws = workspace_tensor(op, workspace_bytes, c.centers);
        return ws.data_ptr();
    }
    const int64_t elem = dtype == ScalarType::Bool ? 1 : 8;  // bool keep_mask or int64 keep_idx
    const int64_t offset = (c.N * elem + 255) / 256 * 256;
    base = allocate(op, "centers", {(offset + (int64_t)workspace_bytes + elem - 1) / elem}, dtype, c.centers);
    return (char*)base.data_ptr() + offset;
}

// The first `size` elements of `base` as a tensor of shape [size] (no dispatch, no autograd
// view): `base` itself when that is all of it.
Tensor output_view(const Tensor& base, int64_t size) {
    return base.numel() == size ? base : reshaped_view(base, {size});
}

// keep_mask (when wanted), keep_idx (when wanted), the count.
struct NmsCpuResult {
    Tensor keep_mask = undefined_tensor(), keep_idx = undefined_tensor();
    int64_t num_kept = 0;
};

NmsCpuResult run_cpu(const char* op, const NmsInputs& c, bool want_mask, bool want_idx) {
    NmsCpuResult r;
    pcops_dtype dtype = to_pcops_dtype(dtype_of(c.centers));
    const size_t workspace_bytes = pcops_circle_nms_workspace_bytes(dtype, c.N);
    Tensor workspace = undefined_tensor();
    void* ws = nullptr;
    if (want_mask != want_idx) {
        // One output (the public ops): a small workspace shares its allocation. keep_idx stays
        // the whole allocation (circle_nms returns a view of its first K elements).
        Tensor base = undefined_tensor();
        ws = output_and_workspace(op, base, workspace, c,
                                  want_mask ? ScalarType::Bool : ScalarType::Long, workspace_bytes);
        if (want_mask) r.keep_mask = output_view(base, c.N);
        else r.keep_idx = base;
    } else {
        if (want_mask) r.keep_mask = allocate(op, "centers", {c.N}, ScalarType::Bool, c.centers);
        if (want_idx) r.keep_idx = allocate(op, "centers", {c.N}, ScalarType::Long, c.centers);
        workspace = workspace_tensor(op, workspace_bytes, c.centers);
        ws = workspace_ptr(workspace);
    }
    check_status(op, pcops_circle_nms_cpu(
                         dtype, c.centers.data_ptr(), c.D, to_pcops_dtype(dtype_of(c.scores)),
                         c.scores.data_ptr(), ptr_or_null(c.groups), c.N, c.radius2,
                         ws, want_mask ? data<bool>(r.keep_mask) : nullptr,
                         want_idx ? data<int64_t>(r.keep_idx) : nullptr, &r.num_kept));
    return r;
}

// keep_idx[:K], K = num_kept capped at max_out when max_out > 0.
int64_t output_size(int64_t num_kept, int64_t max_out) {
    return max_out > 0 ? std::min(num_kept, max_out) : num_kept;
}

Tensor circle_nms_cpu(const Tensor& centers, const Tensor& scores, double radius, int64_t max_out,
                      const std::optional<Tensor>& groups) {
    NmsCpuResult r = run_cpu("circle_nms", prepare("circle_nms", centers, scores, radius, groups),
                             false, true);
    return reshaped_view(r.keep_idx, {output_size(r.num_kept, max_out)});  // keep_idx[:K]
}

Tensor circle_nms_mask_cpu(const Tensor& centers, const Tensor& scores, double radius,
                           const std::optional<Tensor>& groups) {
    return run_cpu("circle_nms_mask",
                   prepare("circle_nms_mask", centers, scores, radius, groups), true, false)
        .keep_mask;
}

// _circle_nms_path: the whole result of one path (kernels/circle_nms_paths.h), for the tests.
constexpr const char* kPathOp = "_circle_nms_path";

std::tuple<Tensor, Tensor, Tensor> circle_nms_path_cpu(const Tensor& centers, const Tensor& scores,
                                                       double radius,
                                                       const std::optional<Tensor>& groups,
                                                       int64_t path) {
    NmsInputs c = prepare(kPathOp, centers, scores, radius, groups);
    if (path != PCOPS_CIRCLE_NMS_AUTO)
        check_path(kPathOp, "circle_nms", path, false, to_pcops_dtype(dtype_of(c.centers)));
    NmsCpuResult r = run_cpu(kPathOp, c, true, true);
    Tensor num_kept = allocate(kPathOp, "centers", {1}, ScalarType::Long, c.centers);
    *data<int64_t>(num_kept) = r.num_kept;
    return {r.keep_mask, r.keep_idx, num_kept};
}

// ------------------------------------------------------------------------------------------
// CUDA

#ifdef PCOPS_WITH_CUDA
// The workspace bytes of `path` (AUTO: by size) for the inputs; a forced path that cannot take
// them raises.
size_t cuda_workspace_bytes(const char* op, const NmsInputs& c, int64_t path) {
    PCOPS_CHECK_VALUE(c.N <= PCOPS_CIRCLE_NMS_CUDA_MAX, "pcops.", op,
                      ": argument 'centers' must hold at most ", PCOPS_CIRCLE_NMS_CUDA_MAX,
                      " boxes on CUDA, got ", describe(c.centers));
    if (path != PCOPS_CIRCLE_NMS_AUTO) {
        const char* name =
            check_path(op, "circle_nms", path, true, to_pcops_dtype(dtype_of(c.centers)));
        const bool fits =
            (path != PCOPS_CIRCLE_NMS_BLOCK || c.N <= PCOPS_CIRCLE_NMS_CUDA_BLOCK_MAX) &&
            (path != PCOPS_CIRCLE_NMS_FLOW || c.N <= PCOPS_CIRCLE_NMS_CUDA_FLOW_MAX);
        if (!fits) forced_path_refused(op, name, "N = " + std::to_string(c.N));
    }
    return pcops_circle_nms_cuda_workspace_bytes(
        to_pcops_dtype(dtype_of(c.centers)), to_pcops_dtype(dtype_of(c.scores)), c.N, (int)path);
}

// Launches the NMS of `path` on the current stream with `workspace` (cuda_workspace_bytes of
// it). Any of the three output pointers may be null. No host synchronisation.
void launch_cuda(const char* op, const NmsInputs& c, int64_t path, void* workspace,
                 bool* keep_mask, int64_t* keep_idx, int64_t* num_kept) {
    check_cuda(
        op, pcops_circle_nms_cuda_path(to_pcops_dtype(dtype_of(c.centers)), c.centers.data_ptr(),
                                       c.D, to_pcops_dtype(dtype_of(c.scores)), c.scores.data_ptr(),
                                       ptr_or_null(c.groups), c.N, c.radius2, workspace, keep_mask,
                                       keep_idx, num_kept, (int)path, current_stream(c.centers)));
}

NmsInputs prepare_cuda(const char* op, const Tensor& centers, const Tensor& scores, double radius,
                       const std::optional<Tensor>& groups) {
    check_cuda_tensor(op, "centers", centers);
    return prepare(op, centers, scores, radius, groups);
}

// A pinned host slot per thread for the count, mapped into the device address space (portable:
// every device's kernels can write it). A call returns once its kernel has written the count,
// and the kernel writes it once, so one slot per thread is never written by two calls.
struct CountSlot {
    int64_t* host = nullptr;
    int64_t* device = nullptr;
};

CountSlot pinned_count_slot() {
    struct Slot {
        CountSlot s;
        ~Slot() {
            if (s.host) (void)cudaFreeHost(s.host);  // at exit the runtime may be gone
        }
    };
    thread_local Slot slot;
    if (!slot.s.device) {
        if (!slot.s.host)
            check_cuda("circle_nms", cudaHostAlloc((void**)&slot.s.host, sizeof(int64_t),
                                                   cudaHostAllocMapped | cudaHostAllocPortable));
        check_cuda("circle_nms", cudaHostGetDevicePointer((void**)&slot.s.device, slot.s.host, 0));
    }
    return slot.s;
}

// How long circle_nms polls the count before it hands the wait to the runtime (microseconds):
// the single-block path (N <= 4096) on an idle stream ends well within it; a large N, or a
// kernel queued behind other work, waits in cudaStreamSynchronize.
constexpr int64_t kPollUs = 200;

// Waits for the count the kernels write into the slot (set to -1 before the launch). Polls the
// slot, checking the clock every 64 polls; past kPollUs it synchronises the stream the usual
// way, which also raises the error of a kernel that failed (and so never wrote the count). In
// sync debug mode "warn" it synchronises at once, through torch (which warns).
int64_t wait_for_count(const char* op, volatile int64_t* slot, cudaStream_t stream,
                       const Tensor& like) {
    const auto t0 = std::chrono::steady_clock::now();
    for (uint32_t i = 1; call_state().sync_debug_mode == 0; ++i) {
        const int64_t v = *slot;
        if (v >= 0) return v;
        if ((i & 63) == 0 && std::chrono::steady_clock::now() - t0 >
                                 std::chrono::microseconds(kPollUs))
            break;
    }
    synchronize(op, stream, like);
    const int64_t v = *slot;
    PCOPS_CHECK(v >= 0, "pcops.", op, ": the kernel ended without writing the count");
    return v;
}

Tensor circle_nms_cuda(const Tensor& centers, const Tensor& scores, double radius, int64_t max_out,
                       const std::optional<Tensor>& groups) {
    const char* op = "circle_nms";
    check_cuda_tensor(op, "centers", centers);  // before the guard: it needs a CUDA device
    DeviceGuard guard(centers);
    NmsInputs c = prepare_cuda(op, centers, scores, radius, groups);
    Tensor base = undefined_tensor(), ws = undefined_tensor();
    void* workspace =
        output_and_workspace(op, base, ws, c, ScalarType::Long, cuda_workspace_bytes(op, c, 0));
    if (c.N == 0) return output_view(base, 0);
    const cudaStream_t stream = current_stream(centers);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check_cuda(op, cudaStreamIsCapturing(stream, &capture));
    PCOPS_CHECK(capture == cudaStreamCaptureStatusNone, "pcops.", op,
                ": cannot be captured in a CUDA graph (its output size depends on the data); "
                "use pcops.circle_nms_mask there");
    check_sync_allowed(op);  // sync debug mode "error": raise before launching
    const CountSlot count = pinned_count_slot();
    *count.host = -1;  // the previous call read its count: no kernel writes this slot now
    launch_cuda(op, c, 0, workspace, nullptr, data<int64_t>(base), count.device);
    // The one host synchronisation: the output size depends on the data.
    const int64_t kept = wait_for_count(op, count.host, stream, centers);
    return output_view(base, output_size(kept, max_out));  // keep_idx[:K]
}

Tensor circle_nms_mask_cuda(const Tensor& centers, const Tensor& scores, double radius,
                            const std::optional<Tensor>& groups) {
    const char* op = "circle_nms_mask";
    check_cuda_tensor(op, "centers", centers);  // before the guard: it needs a CUDA device
    DeviceGuard guard(centers);
    NmsInputs c = prepare_cuda(op, centers, scores, radius, groups);
    Tensor base = undefined_tensor(), ws = undefined_tensor();
    void* workspace =
        output_and_workspace(op, base, ws, c, ScalarType::Bool, cuda_workspace_bytes(op, c, 0));
    launch_cuda(op, c, 0, workspace, data<bool>(base), nullptr, nullptr);
    return output_view(base, c.N);
}

std::tuple<Tensor, Tensor, Tensor> circle_nms_path_cuda(const Tensor& centers, const Tensor& scores,
                                                        double radius,
                                                        const std::optional<Tensor>& groups,
                                                        int64_t path) {
    const char* op = kPathOp;
    check_cuda_tensor(op, "centers", centers);  // before the guard: it needs a CUDA device
    DeviceGuard guard(centers);
    NmsInputs c = prepare_cuda(op, centers, scores, radius, groups);
    Tensor keep_mask = allocate(op, "centers", {c.N}, ScalarType::Bool, c.centers);
    Tensor keep_idx = allocate(op, "centers", {c.N}, ScalarType::Long, c.centers);
    Tensor num_kept = allocate(op, "centers", {1}, ScalarType::Long, c.centers);
    Tensor workspace = workspace_tensor(op, cuda_workspace_bytes(op, c, path), c.centers);
    launch_cuda(op, c, path, workspace_ptr(workspace), data<bool>(keep_mask),
                data<int64_t>(keep_idx), data<int64_t>(num_kept));
    return {keep_mask, keep_idx, num_kept};
}
#endif

}  // namespace
}  // namespace pcops

STABLE_TORCH_LIBRARY_IMPL(pcops, CPU, m) {
    m.impl("circle_nms", TORCH_BOX(&pcops::circle_nms_cpu));
    m.impl("circle_nms_mask", TORCH_BOX(&pcops::circle_nms_mask_cpu));
    m.impl("_circle_nms_path", TORCH_BOX(&pcops::circle_nms_path_cpu));
}

#ifdef PCOPS_WITH_CUDA
STABLE_TORCH_LIBRARY_IMPL(pcops, CUDA, m) {
    m.impl("circle_nms", TORCH_BOX(&pcops::circle_nms_cuda));
    m.impl("circle_nms_mask", TORCH_BOX(&pcops::circle_nms_mask_cuda));
    m.impl("_circle_nms_path", TORCH_BOX(&pcops::circle_nms_path_cuda));
}
#endif
