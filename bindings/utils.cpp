// utils.cpp -- input checks shared by every binding (see utils.h).
#include "utils.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>

// Torch headers before STABLE_TORCH_ERROR_CODE_CHECK (2.10, 2.11) have only the header-only
// check, whose message names the failed call but not the shim's error text.
#ifndef STABLE_TORCH_ERROR_CODE_CHECK
#define STABLE_TORCH_ERROR_CODE_CHECK(call) TORCH_ERROR_CODE_CHECK(call)
#endif

namespace pcops {

// ---- Errors ----------------------------------------------------------------------------------

void raise(ErrorKind kind, const std::string& message) {
    // The prefixes are read back by the call hook (bindings/module.cpp, translate_error).
    switch (kind) {
        case ErrorKind::Value:
            throw std::runtime_error("ValueError: " + message);
        case ErrorKind::Type:
            throw std::runtime_error("TypeError: " + message);
        case ErrorKind::OutOfMemory:
            throw std::runtime_error("OutOfMemoryError: " + message);
        default:
            throw std::runtime_error(message);
    }
}

// ---- Tensors through the stable ABI ---------------------------------------------------------

namespace {

// The shim's dtype codes of the dtypes pcops takes, read once.
struct DtypeCodes {
    int32_t f32, f64, f16, bf16, i64, i32, u8, b8;
};

const DtypeCodes& dtype_codes() {
    static const DtypeCodes codes{aoti_torch_dtype_float32(), aoti_torch_dtype_float64(),
                                  aoti_torch_dtype_float16(), aoti_torch_dtype_bfloat16(),
                                  aoti_torch_dtype_int64(),   aoti_torch_dtype_int32(),
                                  aoti_torch_dtype_uint8(),   aoti_torch_dtype_bool()};
    return codes;
}

int32_t dtype_code(ScalarType type) {
    const DtypeCodes& c = dtype_codes();
    switch (type) {
        case ScalarType::Float:
            return c.f32;
        case ScalarType::Double:
            return c.f64;
        case ScalarType::Half:
            return c.f16;
        case ScalarType::BFloat16:
            return c.bf16;
        case ScalarType::Long:
            return c.i64;
        case ScalarType::Int:
            return c.i32;
        case ScalarType::Byte:
            return c.u8;
        case ScalarType::Bool:
            return c.b8;
        default:
            return torch::stable::detail::to<int32_t>(torch::stable::detail::from(type));
    }
}

int32_t device_type_code(const Tensor& t) {
    int32_t type = 0;
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(t.get(), &type));
    return type;
}

// Contiguous strides of `sizes` (pcops' tensors have at most 4 dimensions).
constexpr size_t kMaxDims = 8;
std::array<int64_t, kMaxDims> contiguous_strides(IntArrayRef sizes) {
    PCOPS_CHECK(sizes.size() <= kMaxDims, "pcops: a tensor of ", sizes.size(), " dimensions");
    std::array<int64_t, kMaxDims> strides{};
    int64_t stride = 1;
    for (size_t i = sizes.size(); i-- > 0;) {
        strides[i] = stride;
        stride *= sizes[i] > 1 ? sizes[i] : 1;
    }
    return strides;
}

// An uninitialised tensor from the empty_strided shim (no dispatcher on the CPU: no
// deterministic fill there; at::empty_strided on CUDA).
Tensor shim_empty(IntArrayRef sizes, int32_t dtype, const Tensor& like) {
    const auto strides = contiguous_strides(sizes);
    AtenTensorHandle handle = nullptr;
    STABLE_TORCH_ERROR_CODE_CHECK(
        aoti_torch_empty_strided((int64_t)sizes.size(), sizes.data(), strides.data(), dtype,
                                 device_type_code(like), like.get_device_index(), &handle));
    return Tensor(handle);
}

}  // namespace

const Tensor& undefined_tensor() {
    static const Tensor* const undefined = new Tensor();  // never freed: no exit-time order
    return *undefined;
}

ScalarType dtype_of(const Tensor& t) {
    int32_t code = 0;
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(t.get(), &code));
    const DtypeCodes& c = dtype_codes();
    if (code == c.f32) return ScalarType::Float;
    if (code == c.i64) return ScalarType::Long;
    if (code == c.f64) return ScalarType::Double;
    if (code == c.f16) return ScalarType::Half;
    if (code == c.bf16) return ScalarType::BFloat16;
    if (code == c.i32) return ScalarType::Int;
    return t.scalar_type();
}

std::string device_string(const Tensor& t) {
    const int32_t type = device_type_code(t);
    const char* name = type == aoti_torch_device_type_cpu()    ? "cpu"
                       : type == aoti_torch_device_type_cuda() ? "cuda"
                       : type == aoti_torch_device_type_meta() ? "meta"
                                                               : nullptr;
    std::string s = name ? name : "device type " + std::to_string(type);
    const int32_t index = t.get_device_index();
    if (index >= 0 && type != aoti_torch_device_type_cpu()) s += ":" + std::to_string(index);
    return s;
}

std::string shape_string(IntArrayRef sizes) {
    std::ostringstream s;
    s << "[";
    for (size_t i = 0; i < sizes.size(); ++i) s << (i ? ", " : "") << sizes[i];
    s << "]";
    return s.str();
}

std::string describe(const Tensor& t) {
    if (!t.defined()) return "an undefined tensor";
    std::ostringstream s;
    s << "a " << t.dim() << "-D " << torch::headeronly::toString(dtype_of(t)) << " tensor of shape "
      << shape_string(t.sizes()) << " on " << device_string(t);
    return s.str();
}

Tensor as_contiguous(const Tensor& t) {
    return t.is_contiguous() ? t : torch::stable::contiguous(t);
}

Tensor to_dtype(const Tensor& t, ScalarType type) {
    return dtype_of(t) == type ? t : torch::stable::to(t, type);
}

Tensor new_output(IntArrayRef sizes, ScalarType type, const Tensor& like) {
    if (C10_UNLIKELY(call_state().fill_uninitialized))
        return torch::stable::empty(sizes, type, std::nullopt, like.device());
    return shim_empty(sizes, dtype_code(type), like);
}

Tensor reshaped_view(const Tensor& base, IntArrayRef sizes) {
    const auto strides = contiguous_strides(sizes);
    AtenTensorHandle handle = nullptr;
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch__reinterpret_tensor(
        base.get(), (int64_t)sizes.size(), sizes.data(), strides.data(), 0, &handle));
    return Tensor(handle);
}


// ---- Input checks ---------------------------------------------------------------------------

void check_float_dtype(const char* op, const char* name, const Tensor& t) {
    const ScalarType type = dtype_of(t);
    PCOPS_CHECK_TYPE(
        type == ScalarType::Float || type == ScalarType::Double || type == ScalarType::Half ||
            type == ScalarType::BFloat16,
        "pcops.", op, ": argument '", name,
        "' must be a floating point tensor (float32, float64, float16 or bfloat16), got ",
        describe(t));
}

void check_float_tensor(const char* op, const char* name, const Tensor& t, int64_t rank,
                        int64_t last_dim, const char* shape) {
    PCOPS_CHECK_VALUE(t.defined(), "pcops.", op, ": argument '", name,
                      "' must be a tensor of shape ", shape, ", got an undefined tensor");
    check_float_dtype(op, name, t);  // float8 and other exotic floating types are rejected too
    PCOPS_CHECK_VALUE(t.dim() == rank && (last_dim < 0 || t.size(-1) == last_dim), "pcops.", op,
                      ": argument '", name, "' must be a tensor of shape ", shape, ", got ",
                      describe(t));
}

void check_index_tensor(const char* op, const char* name, const Tensor& t, int64_t rank,
                        const char* shape, bool int32_ok) {
    PCOPS_CHECK_VALUE(t.defined(), "pcops.", op, ": argument '", name,
                      "' must be a tensor of shape ", shape, ", got an undefined tensor");
    const ScalarType type = dtype_of(t);
    PCOPS_CHECK_TYPE(type == ScalarType::Long || (int32_ok && type == ScalarType::Int), "pcops.",
                     op, ": argument '", name, "' must be an ",
                     int32_ok ? "int64 or int32" : "int64", " tensor, got ", describe(t));
    PCOPS_CHECK_VALUE(t.dim() == rank, "pcops.", op, ": argument '", name,
                      "' must be a tensor of shape ", shape, ", got ", describe(t));
}

void check_same_device(const char* op, const char* name, const Tensor& t, const char* ref_name,
                       const Tensor& ref) {
    PCOPS_CHECK_VALUE(device_type_code(t) == device_type_code(ref) &&
                          t.get_device_index() == ref.get_device_index(),
                      "pcops.", op, ": argument '", name, "' must be on the same device as '",
                      ref_name, "' (", device_string(ref), "), got ", describe(t));
}

void check_size(const char* op, const char* name, const Tensor& t, int64_t dim, int64_t expected,
                const char* what) {
    PCOPS_CHECK_VALUE(t.size(dim) == expected, "pcops.", op, ": argument '", name, "' must have ",
                      expected, " (", what, ") in dimension ", dim, ", got ", describe(t));
}

void check_positive(const char* op, const char* name, int64_t value) {
    PCOPS_CHECK_VALUE(value >= 1, "pcops.", op, ": argument '", name, "' must be >= 1, got ",
                      value);
}

void check_radius(const char* op, const char* name, double radius) {
    PCOPS_CHECK_VALUE(std::isfinite(radius) && radius > 0, "pcops.", op, ": argument '", name,
                      "' must be finite and > 0, got ", radius);
}

static std::atomic<bool> g_debug_checks{false};

bool debug_checks() { return g_debug_checks.load(); }

bool set_debug_checks(bool enabled) { return g_debug_checks.exchange(enabled); }

bool check_values_now(const Tensor& t) {
    if (!t.is_cuda()) return true;
    if (!debug_checks()) return false;
#ifdef PCOPS_WITH_CUDA
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check_cuda("value check", cudaStreamIsCapturing(current_stream(t), &capture));
    return capture == cudaStreamCaptureStatusNone;
#else
    return false;
#endif
}

Tensor to_host(const Tensor& t) {
    return t.is_cpu() ? t
                      : torch::stable::to(t, torch::stable::Device(torch::headeronly::DeviceType::CPU));
}

// The value of a 0-d integer tensor, copied to the host first when it is on a device.
static int64_t scalar_value(const Tensor& t) {
    const Tensor host = to_host(t);
    return dtype_of(host) == ScalarType::Int ? (int64_t)*data<const int32_t>(host)
                                             : *data<const int64_t>(host);
}

std::pair<int64_t, int64_t> value_range(const Tensor& t) {
    // An expanded input (stride 0) repeats its values: reduce one copy of them, since aminmax
    // would first materialise the expansion (2**40 elements of an expanded idx cost no memory).
    Tensor values = t;
    for (int64_t d = 0; d < values.dim(); ++d)
        if (values.stride(d) == 0 && values.size(d) > 1)
            values = torch::stable::narrow(values, d, 0, 1);
    // aten::aminmax(Tensor self, *, int? dim=None, bool keepdim=False) -> (Tensor min, Tensor max)
    std::array<StableIValue, 3> stack{torch::stable::detail::from(values),
                                      torch::stable::detail::from(std::optional<int64_t>()),
                                      torch::stable::detail::from(false)};
    STABLE_TORCH_ERROR_CODE_CHECK(
        torch_call_dispatcher("aten::aminmax", "", stack.data(), TORCH_ABI_VERSION));
    const Tensor min = torch::stable::detail::to<Tensor>(stack[0]);
    const Tensor max = torch::stable::detail::to<Tensor>(stack[1]);
    return {scalar_value(min), scalar_value(max)};
}

void check_index_values(const char* op, const char* name, const Tensor& t, int64_t lo, int64_t hi,
                        const char* range) {
    if (t.numel() == 0 || !check_values_now(t)) return;
    auto [min, max] = value_range(t);
    PCOPS_CHECK_VALUE(min >= lo && max < hi, "pcops.", op, ": argument '", name,
                      "' must hold values in ", range, " = [", lo, ", ", hi, "), got values in [",
                      min, ", ", max, "]");
}

void check_points_per_cloud(const char* op, const char* name, int64_t count, const char* letter) {
    PCOPS_CHECK_VALUE(count <= INT32_MAX, "pcops.", op, ": argument '", name, "' has ", letter,
                      " = ", count, " points per cloud; at most 2**31 - 1 = ", INT32_MAX,
                      " are supported");
}

#ifdef PCOPS_WITH_CUDA
// Bytes of global memory of CUDA device `device`, read once per device (a later call reads one
// atomic, no lock).
static double cuda_memory_bytes(int device) {
    constexpr int kMaxDevices = 64;
    static std::atomic<double> known[kMaxDevices];  // 0: not read yet
    const bool cached = device >= 0 && device < kMaxDevices;
    if (cached) {
        const double bytes = known[device].load(std::memory_order_relaxed);
        if (bytes > 0) return bytes;
    }
    cudaDeviceProp prop;
    check_cuda("memory size", cudaGetDeviceProperties(&prop, device));
    const double bytes = (double)prop.totalGlobalMem;
    if (cached) known[device].store(bytes, std::memory_order_relaxed);  // racing calls agree
    return bytes;
}
#endif

// Bytes of the host's physical memory, read once (sysconf(_SC_PHYS_PAGES) is a system call).
static double host_memory_bytes() {
    static const double bytes = [] {
        const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        return pages > 0 && page > 0 ? (double)pages * (double)page : 1e18;
    }();
    return bytes;
}

// Bytes of memory of `t`'s device: the GPU's global memory, or the host's physical memory.
static double device_memory_bytes([[maybe_unused]] const Tensor& t) {
#ifdef PCOPS_WITH_CUDA
    if (t.is_cuda()) return cuda_memory_bytes(t.get_device_index());
#endif
    return host_memory_bytes();
}

static std::string bytes_string(double bytes) {
    const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (bytes >= 1024 && u < 6) {
        bytes /= 1024;
        ++u;
    }
    std::ostringstream s;
    s.precision(3);
    s << bytes << " " << units[u];
    return s.str();
}

void check_output_elements(const char* op, const char* name, IntArrayRef shape, size_t elem_bytes,
                           const Tensor& like) {
    double elements = 1;  // in double: no overflow, and exact enough for a size check
    for (int64_t s : shape) elements *= (double)s;
    const double bytes = elements * (double)elem_bytes;
    const double memory = device_memory_bytes(like);
    PCOPS_CHECK_VALUE(bytes <= memory, "pcops.", op, ": argument '", name,
                      "' asks for an output of shape ", shape_string(shape), " (", elements,
                      " elements, ", bytes_string(bytes), "), more than the memory of ",
                      device_string(like), " (", bytes_string(memory), ")");
}

QueryRef check_query_ref(const char* op, const Tensor& query, const Tensor& ref,
                         const std::optional<Tensor>& query_lengths,
                         const std::optional<Tensor>& ref_lengths, const char* query_name,
                         const char* ref_name, bool any_dim) {
    if (any_dim) {
        check_float_tensor(op, query_name, query, 3, -1, "[B, M, D] with D >= 1");
        check_float_tensor(op, ref_name, ref, 3, -1, "[B, N, D] with D >= 1");
        PCOPS_CHECK_VALUE(query.size(2) >= 1, "pcops.", op, ": argument '", query_name,
                          "' must be a tensor of shape [B, M, D] with D >= 1, got ",
                          describe(query));
    } else {
        check_float_tensor(op, query_name, query, 3, 3, "[B, M, 3]");
        check_float_tensor(op, ref_name, ref, 3, 3, "[B, N, 3]");
    }
    check_same_device(op, ref_name, ref, query_name, query);
    PCOPS_CHECK_TYPE(dtype_of(ref) == dtype_of(query), "pcops.", op, ": argument '", ref_name,
                     "' must have the dtype of '", query_name, "' (",
                     torch::headeronly::toString(dtype_of(query)), "), got ", describe(ref));
    if (ref.size(0) != query.size(0)) {  // the message is built only on failure
        const std::string batch_of = std::string("the batch size B of '") + query_name + "'";
        check_size(op, ref_name, ref, 0, query.size(0), batch_of.c_str());
    }
    if (any_dim && ref.size(2) != query.size(2)) {
        const std::string dim_of = std::string("the point dimension D of '") + query_name + "'";
        check_size(op, ref_name, ref, 2, query.size(2), dim_of.c_str());
    }
    QueryRef q;
    q.B = query.size(0);
    q.M = query.size(1);
    q.N = ref.size(1);
    check_points_per_cloud(op, query_name, q.M, "M");
    check_points_per_cloud(op, ref_name, q.N, "N");
    q.query_lengths =
        check_lengths(op, "query_lengths", query_lengths, q.B, q.M, query, query_name, "M");
    q.ref_lengths = check_lengths(op, "ref_lengths", ref_lengths, q.B, q.N, query, query_name);
    q.query = to_compute_dtype(op, query_name, query);
    q.ref = to_compute_dtype(op, ref_name, ref);
    return q;
}

std::optional<Tensor> check_lengths(const char* op, const char* name,
                                    const std::optional<Tensor>& lengths, int64_t B, int64_t N,
                                    const Tensor& like, const char* like_name,
                                    const char* bound_name) {
    if (!lengths.has_value() || !lengths->defined()) return std::nullopt;
    const Tensor& t = *lengths;
    check_index_tensor(op, name, t, 1, "[B]");
    check_size(op, name, t, 0, B, "the batch size B");
    check_same_device(op, name, t, like_name, like);
    if (B > 0 && check_values_now(t)) {
        auto [lo, hi] = value_range(t);
        PCOPS_CHECK_VALUE(lo >= 0 && hi <= N, "pcops.", op, ": argument '", name,
                          "' must hold values in [0, ", bound_name, "] = [0, ", N,
                          "], got values in [", lo, ", ", hi, "]");
    }
    return contiguous(op, name, t);
}

// Bytes per element of the dtypes pcops allocates.
static size_t element_bytes(ScalarType type) {
    switch (type) {
        case ScalarType::Double:
        case ScalarType::Long:
            return 8;
        case ScalarType::Float:
        case ScalarType::Int:
            return 4;
        case ScalarType::Half:
        case ScalarType::BFloat16:
            return 2;
        default:
            return 1;
    }
}

// The allocator refused `sizes` of `type` on the device of `like` for `what` ("a tensor for
// argument 'k'"); `reason` is the allocator's message.
[[noreturn]] static void allocation_failed(const char* op, const std::string& what,
                                           IntArrayRef sizes, ScalarType type, const Tensor& like,
                                           const char* reason) {
    double elements = 1;
    for (int64_t s : sizes) elements *= (double)s;
    std::ostringstream s;
    s << "pcops." << op << ": out of memory: cannot allocate " << what << " ("
      << shape_string(sizes) << ", " << torch::headeronly::toString(type) << ", "
      << bytes_string(elements * (double)element_bytes(type)) << ") on "
      << device_string(like) << " (" << reason << ")";
    raise(ErrorKind::OutOfMemory, s.str());
}

// The allocator's own message: a stable-ABI error carries torch's text after a header line.
static const char* allocator_reason(const std::exception& e) { return e.what(); }

Tensor allocate(const char* op, const char* name, IntArrayRef sizes, ScalarType type,
                const Tensor& like) {
    try {
        return new_output(sizes, type, like);
    } catch (const std::exception& e) {
        allocation_failed(op, name ? std::string("a tensor for argument '") + name + "'"
                                   : std::string("a workspace"),
                          sizes, type, like, allocator_reason(e));
    }
}

Tensor workspace_tensor(const char* op, size_t bytes, const Tensor& like) {
    if (bytes == 0) return undefined_tensor();
    return allocate(op, nullptr, {(int64_t)bytes}, ScalarType::Byte, like);
}

// `t` converted to `type` and made contiguous (argument `name` when `input`, else a result
// sized by argument `name`).
static Tensor copy_as(const char* op, const char* name, const Tensor& t, ScalarType type,
                      bool input) {
    try {
        return as_contiguous(to_dtype(t, type));
    } catch (const std::exception& e) {
        const std::string what = input ? std::string("a contiguous ") +
                                             torch::headeronly::toString(type) +
                                             " copy of argument '" + name + "'"
                                       : std::string("a tensor for argument '") + name + "'";
        allocation_failed(op, what, t.sizes(), type, t, allocator_reason(e));
    }
}

Tensor contiguous(const char* op, const char* name, const Tensor& t) {
    if (t.is_contiguous()) return t;
    return copy_as(op, name, t, dtype_of(t), true);
}

Tensor to_compute_dtype(const char* op, const char* name, const Tensor& t) {
    const ScalarType type = dtype_of(t);
    if (type == ScalarType::Half || type == ScalarType::BFloat16)
        return copy_as(op, name, t, ScalarType::Float, true);
    return contiguous(op, name, t);
}

Tensor to_dtype(const char* op, const char* name, const Tensor& t, ScalarType type) {
    if (dtype_of(t) == type) return t;
    return copy_as(op, name, t, type, false);
}

Tensor to_dist_dtype(const char* op, const char* name, const Tensor& t, ScalarType type) {
    if (type == ScalarType::Half || type == ScalarType::BFloat16) {
        // the largest finite float16 (65504) and bfloat16 (0x7f7f: 3.3895313892515355e38),
        // both exact in float32; t is float32 here (half types compute in float32)
        const double top = type == ScalarType::Half ? 65504.0 : 3.3895313892515355e38;
        const double inf = std::numeric_limits<double>::infinity();
        if (t.is_cpu()) {
            float* p = data<float>(t);
            for (int64_t i = 0, n = t.numel(); i < n; ++i)
                if (p[i] > top && p[i] < inf) p[i] = (float)top;
        } else {
#ifdef PCOPS_WITH_CUDA
            check_cuda(op, pcops_dist_cap_cuda(data<float>(t), t.numel(), (float)top,
                                               current_stream(t)));
#endif
        }
    }
    return to_dtype(op, name, t, type);
}

pcops_dtype to_pcops_dtype(ScalarType type) {
    switch (type) {
        case ScalarType::Float:
            return PCOPS_FLOAT32;
        case ScalarType::Double:
            return PCOPS_FLOAT64;
        case ScalarType::Half:
            return PCOPS_FLOAT16;
        case ScalarType::BFloat16:
            return PCOPS_BFLOAT16;
        default:
            PCOPS_CHECK_TYPE(false, "pcops: unsupported dtype ", torch::headeronly::toString(type));
            return PCOPS_FLOAT32;  // not reached
    }
}

void check_status(const char* op, pcops_status status) {
    PCOPS_CHECK(status == PCOPS_SUCCESS, "pcops.", op,
                ": kernel failed: ", pcops_status_string(status));
}

const char* check_path(const char* op, const char* table, int64_t path, bool cuda,
                       pcops_dtype dtype) {
    int count = 0;
    const pcops_path_info* rows = pcops_path_table(table, &count);
    PCOPS_CHECK(rows != nullptr, "pcops: no path table named ", table);
    const int device = cuda ? PCOPS_ON_CUDA : PCOPS_ON_CPU;
    std::string here;  // the paths of this device and dtype, for the message
    const pcops_path_info* found = nullptr;
    for (int i = 0; i < count; ++i) {
        const bool runs = (rows[i].devices & device) && (rows[i].dtypes & (1 << dtype));
        if (runs) here += std::string(here.empty() ? "" : ", ") + rows[i].name;
        if (rows[i].id == path) found = &rows[i];
    }
    const char* dtype_name = dtype == PCOPS_FLOAT64 ? "float64" : "float32";
    PCOPS_CHECK_VALUE(found != nullptr, "pcops.", op, ": argument 'path' must be a path id of ",
                      table, " (0 to ", count - 1, "), got ", path);
    PCOPS_CHECK_VALUE((found->devices & device) && (found->dtypes & (1 << dtype)), "pcops.", op,
                      ": path '", found->name, "' does not run on ", cuda ? "CUDA" : "the CPU",
                      " for ", dtype_name, " inputs (the paths that do: ", here, ")");
    return found->name;
}

void forced_path_refused(const char* op, const char* name, const std::string& sizes) {
    detail::fail(ErrorKind::Value, "pcops.", op, ": path '", name, "' cannot take these inputs (",
                 sizes, ") on this device");
}

// ---- Host synchronisation ------------------------------------------------------------------

CallState& call_state() {
    static thread_local CallState state;
    return state;
}

#ifdef PCOPS_WITH_CUDA
void check_cuda_tensor(const char* op, const char* name, const Tensor& t) {
    PCOPS_CHECK_VALUE(t.defined() && t.is_cuda(), "pcops.", op,
                      ": all tensor arguments must be on one device, but '", name, "' is ",
                      describe(t), " while another argument is on CUDA");
}

void check_cuda(const char* op, cudaError_t err) {
    PCOPS_CHECK(err == cudaSuccess, "pcops.", op, ": CUDA error: ", cudaGetErrorString(err));
}

cudaStream_t current_stream(const Tensor& t) {
    void* stream = nullptr;
    STABLE_TORCH_ERROR_CODE_CHECK(
        aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream));
    return static_cast<cudaStream_t>(stream);
}

void check_sync_allowed(const char* op) {
    // torch's own message for the mode "error" is "called a synchronizing CUDA operation"
    PCOPS_CHECK(call_state().sync_debug_mode < 2, "pcops.", op,
                ": called a synchronizing CUDA operation (its output size depends on the data) "
                "while torch.cuda.set_sync_debug_mode is 'error'");
}

void synchronize(const char* op, cudaStream_t stream, const Tensor& like) {
    if (call_state().sync_debug_mode == 1) {  // torch's synchronisation warns in this mode
        STABLE_TORCH_ERROR_CODE_CHECK(
            torch_cuda_stream_synchronize(stream, like.get_device_index()));
        return;
    }
    check_cuda(op, cudaStreamSynchronize(stream));
}
#endif

}  // namespace pcops
