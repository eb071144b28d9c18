/*
 * fps_plan_dump.cpp -- the CUDA FPS plan (pcops_fps_cuda_make_plan) of AUTO and of every forced
 * path, for a grid of sizes on simulated devices, one line each, no GPU needed. The device
 * queries the plan makes (cudaGetDevice, cudaDeviceGetAttribute, cudaFuncGetAttributes and the
 * occupancy calculators) are answered by this file instead of the CUDA runtime (its
 * definitions take precedence over libcudart.so's), and each line names the kernels the plan
 * asked about. Where two trees' dumps are equal, their plans choose the same path and shape,
 * ask about the same kernels and size the same workspace for every size of the grid (chosen
 * around every threshold and limit of the plan): `lab/fps_plan_compare.sh OLD` diffs this
 * tree's plans against those of git revision OLD (run it after any change to
 * kernels/fps/plan.cuh or to a path's plan function).
 *
 * FPS_PLAN_SIMS=text limits the dump to the simulated devices whose name contains `text` (e.g.
 * "sm_90 "). `--check-smem` prints nothing but the plans whose shared memory (the plan's
 * smem_bytes, static and dynamic) exceeds their device's opt-in limit, and exits 1 if any does
 * (tests/test_fps_plan_smem.py runs it).
 *
 *   nvcc -std=c++17 -arch=sm_90 -Xptxas -O0 -Ikernels lab/fps_plan_dump.cpp kernels/fps.cu \
 *        -cudart shared -o /tmp/fps_plan_dump && /tmp/fps_plan_dump > plans.txt
 */
#define PCOPS_WITH_CUDA 1
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "pcops.h"

namespace {

// A simulated device and what its kernels answer.
struct Sim {
    const char* name;
    int major, sms, cooperative;
    int ptx_version;       // cudaFuncGetAttributes: 90 a build with sm_90 code, 80 without
    int clusters;          // cudaOccupancyMaxActiveClusters
    int grid_threads;      // co-resident blocks an SM: grid_threads / blockSize (0: none)
    int smem_optin_kib;    // cudaDevAttrMaxSharedMemoryPerBlockOptin, KiB
};
const Sim kSims[] = {
    {"sm_75 40 SMs", 7, 40, 1, 75, 0, 2048, 64},                   // T4
    {"sm_80 108 SMs", 8, 108, 1, 80, 0, 2048, 163},                // A100
    {"sm_86 28 SMs no coop", 8, 28, 0, 80, 0, 2048, 99},           // RTX 3090-class
    {"sm_90 132 SMs", 9, 132, 1, 90, 1, 2048, 227},                // H100, H200
    {"sm_90 114 SMs", 9, 114, 1, 90, 1, 1024, 227},
    {"sm_90 132 SMs, no sm_90 code", 9, 132, 1, 80, 1, 2048, 227},
    {"sm_90 132 SMs, no cluster fits", 9, 132, 1, 90, 0, 0, 227},
    {"sm_120 170 SMs", 12, 170, 1, 120, 1, 1536, 99},              // RTX 5090-class
    {"sm_120 30 SMs", 12, 30, 1, 120, 1, 1536, 99},
    {"sm_89 128 SMs", 8, 128, 1, 80, 0, 1536, 99},                 // RTX 4090
    {"sm_100 148 SMs", 10, 148, 1, 100, 1, 2048, 227},             // B200
};
const Sim* sim = &kSims[0];

std::map<uintptr_t, std::string> names;  // kernel address -> name (from nm)
std::string asked;                       // the kernels the current plan asked about

void load_names() {
    Dl_info info;
    if (!dladdr((void*)&load_names, &info)) return;
    const uintptr_t base = (uintptr_t)info.dli_fbase;
    char exe[2048] = {0}, cmd[4096];
    if (readlink("/proc/self/exe", exe, sizeof(exe) - 1) <= 0) return;
    snprintf(cmd, sizeof(cmd), "nm -C --defined-only '%s'", exe);
    FILE* f = popen(cmd, "r");
    if (!f) return;
    char line[8192];
    while (fgets(line, sizeof(line), f)) {
        unsigned long long a = 0;
        char type = 0;
        int off = 0;
        if (sscanf(line, "%llx %c %n", &a, &type, &off) < 2) continue;
        std::string n = line + off;
        while (!n.empty() && (n.back() == '\n')) n.pop_back();
        if (n.find("_kernel") == std::string::npos && n.find("Kernel") == std::string::npos)
            continue;
        for (size_t p; (p = n.find("(anonymous namespace)::")) != std::string::npos;)
            n.erase(p, 23);
        if (n.compare(0, 5, "void ") == 0) n.erase(0, 5);
        const size_t paren = n.find('(');
        if (paren != std::string::npos) n = n.substr(0, paren);
        names[base + a] = n;
    }
    pclose(f);
}

void note(const char* what, const void* func, int x) {
    auto it = names.find((uintptr_t)func);
    char buf[64];
    snprintf(buf, sizeof(buf), " %s(", what);
    asked += buf;
    asked += it == names.end() ? std::string("?") : it->second;
    snprintf(buf, sizeof(buf), ",%d)", x);
    asked += buf;
}

}  // namespace

// The runtime calls of the plan, answered for the simulated device.
extern "C" {
cudaError_t CUDARTAPI cudaGetDevice(int* device) {
    *device = 0;
    return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGetLastError(void) { return cudaSuccess; }
cudaError_t CUDARTAPI cudaPeekAtLastError(void) { return cudaSuccess; }
cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int) {
    switch (attr) {
        case cudaDevAttrMultiProcessorCount: *value = sim->sms; break;
        case cudaDevAttrComputeCapabilityMajor: *value = sim->major; break;
        case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
        case cudaDevAttrCooperativeLaunch: *value = sim->cooperative; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = sim->smem_optin_kib * 1024; break;
        case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = 228 * 1024; break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 * 1024; break;
        case cudaDevAttrMaxThreadsPerMultiProcessor: *value = 2048; break;
        case cudaDevAttrMaxGridDimX: *value = INT_MAX; break;
        case cudaDevAttrMaxGridDimY:
        case cudaDevAttrMaxGridDimZ: *value = 65535; break;
        case cudaDevAttrWarpSize: *value = 32; break;
        default: *value = 0; break;
    }
    return cudaSuccess;
}
cudaError_t CUDARTAPI cudaFuncGetAttributes(struct cudaFuncAttributes* attr, const void* func) {
    memset(attr, 0, sizeof(*attr));
    attr->ptxVersion = sim->ptx_version;
    attr->binaryVersion = sim->ptx_version;
    attr->maxThreadsPerBlock = 1024;
    note("attr", func, 0);
    return cudaSuccess;
}
cudaError_t CUDARTAPI cudaOccupancyMaxActiveClusters(int* clusters, const void* func,
                                                     const cudaLaunchConfig_t* config) {
    *clusters = sim->clusters;
    note("clusters", func, (int)(config->blockDim.x * 1000 + config->gridDim.x));
    return cudaSuccess;
}
cudaError_t CUDARTAPI cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks,
                                                                    const void* func,
                                                                    int block_size,
                                                                    size_t smem) {
    *blocks = sim->grid_threads / block_size;
    note("per_sm", func, block_size * 1000 + (int)smem);
    return cudaSuccess;
}
cudaError_t CUDARTAPI cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int* blocks, const void* func, int block_size, size_t smem, unsigned int) {
    *blocks = sim->grid_threads / block_size;
    note("per_sm_flags", func, block_size * 1000 + (int)smem);
    return cudaSuccess;
}
}

// The plan's shared memory where its pcops.h has the field (0 where it has not: an older tree).
template <class P>
auto smem_of(const P& p, int) -> decltype((size_t)p.smem_bytes) {
    return p.smem_bytes;
}
template <class P>
size_t smem_of(const P&, long) {
    return 0;
}

int main(int argc, char** argv) {
    const bool check_smem = argc > 1 && strcmp(argv[1], "--check-smem") == 0;
    const char* only = getenv("FPS_PLAN_SIMS");
    long over = 0, plans = 0;
    load_names();
    const int64_t Bs[] = {1, 2, 3, 4, 8, 13, 14, 16, 17, 21, 22, 32, 64, 100, 1000, 40000,
                          300000, 268435456, 268435457, (int64_t)INT_MAX + 1};
    const int64_t Ns[] = {0, 1, 2, 7, 31, 32, 33, 100, 127, 128, 129, 255, 256, 257, 511, 512,
                          513, 640, 1023, 1024, 1025, 1280, 2047, 2048, 2049, 2560, 4095, 4096,
                          4097, 5000, 5120, 8191, 8192, 8193, 10000, 10241, 12287, 12288, 12289,
                          16384, 20000, 20481, 32767, 32768, 32769, 40960, 40961, 65535, 65536,
                          65537, 100000, 131072, 150000, 150001, 200000, 262144, 524288,
                          1048575, 1048576, 1048577, 2000000, 8388607, 8388608, 8388609,
                          20000000, 536870912, INT_MAX, (int64_t)INT_MAX + 1};
    const int64_t Ps[] = {0, 1, 2, 100, 1000, 1999, 2047, 2048, 2049, 100000};
    const pcops_dtype dtypes[] = {PCOPS_FLOAT32, PCOPS_FLOAT64, PCOPS_FLOAT16};
    for (const Sim& s : kSims) {
        if (only && !strstr(s.name, only)) continue;
        sim = &s;
        if (!check_smem) printf("# %s\n", s.name);
        for (pcops_dtype dtype : dtypes)
            for (int64_t B : Bs)
                for (int64_t N : Ns)
                    for (int64_t npoint : Ps)
                        for (int path = -1; path <= PCOPS_FPS_PATH_END; ++path) {
                            if (dtype == PCOPS_FLOAT16 && path > 0) continue;
                            pcops_fps_cuda_plan p;
                            memset(&p, 0x5a, sizeof(p));
                            asked.clear();
                            const cudaError_t err =
                                pcops_fps_cuda_make_plan(dtype, B, N, npoint, path, &p);
                            if (check_smem) {
                                if (err != cudaSuccess) continue;
                                ++plans;
                                if (smem_of(p, 0) > (size_t)s.smem_optin_kib * 1024) {
                                    ++over;
                                    printf("%s: d%d B%lld N%lld n%lld path%d: path %d takes %zu "
                                           "bytes of shared memory\n",
                                           s.name, (int)dtype, (long long)B, (long long)N,
                                           (long long)npoint, path, p.path, smem_of(p, 0));
                                }
                                continue;
                            }
                            printf("d%d B%lld N%lld n%lld path%d: ", (int)dtype, (long long)B,
                                   (long long)N, (long long)npoint, path);
                            if (err != cudaSuccess) {
                                printf("error %d%s\n", (int)err, asked.c_str());
                                continue;
                            }
                            printf("path %d threads %d ppt %d slots %d warps %d clouds %d "
                                   "bpc %d blocks %lld dtype %d B %lld N %lld ws %zu%s\n",
                                   p.path, p.threads, p.points_per_thread, p.bucket_slots,
                                   p.warps_per_cloud, p.clouds_per_block, p.blocks_per_cloud,
                                   (long long)p.blocks, (int)p.dtype, (long long)p.B,
                                   (long long)p.N, p.workspace_bytes, asked.c_str());
                        }
    }
    if (check_smem)
        printf("fps_plan_dump: %ld of %ld plans past their device's shared memory\n", over, plans);
    return over > 0 ? 1 : 0;
}
