/*
 * lab.h -- helpers of the kernel lab: small C programs that call the C API of kernels/pcops.h
 * directly, with no torch. Each lab_<op>.c
 *   1. runs the CPU function on fresh random inputs and checks it against a naive reference
 *      written here, in the lab (bit for bit where the contract says so);
 *   2. if the build has CUDA and a GPU is visible at run time: runs the CUDA launcher on the
 *      same inputs and checks that it returns the CPU's bits, replays the launch captured in a
 *      CUDA graph and checks that again, and times the launcher with L2 flushed before every
 *      repetition (median of the repetitions; GB/s or steps/s printed). Without a GPU the CUDA
 *      half is skipped with a message, and the program still passes.
 * Exit status 0 when every check passed. The pytest suite stays the main test; the lab proves
 * the layer below torch and is a place to try a kernel variant quickly.
 */
#ifndef PCOPS_LAB_H
#define PCOPS_LAB_H

#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/geometry.h"
#include "../kernels/pcops.h"

/* ---- checks ------------------------------------------------------------------------------ */
static int lab_failures = 0;

static inline void lab_check(int ok, const char* fmt, ...) {
    if (ok) return;
    ++lab_failures;
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "FAIL: ");
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
}

/* Bitwise equality of two arrays; reports the first differing element. */
static inline void lab_check_equal(const void* got, const void* want, size_t count, size_t elem_bytes,
                            const char* what) {
    const char* g = (const char*)got;
    const char* w = (const char*)want;
    for (size_t i = 0; i < count; ++i) {
        if (memcmp(g + i * elem_bytes, w + i * elem_bytes, elem_bytes) != 0) {
            lab_check(0, "%s: element %zu of %zu differs", what, i, count);
            return;
        }
    }
}

/* Aborts the program on a failed C API call (a program, not a library: exiting is right). */
static inline void lab_require(int ok, const char* what) {
    if (!ok) {
        fprintf(stderr, "FATAL: %s\n", what);
        exit(2);
    }
}

static inline void lab_require_status(pcops_status s, const char* what) {
    if (s != PCOPS_SUCCESS) {
        fprintf(stderr, "FATAL: %s: %s\n", what, pcops_status_string(s));
        exit(2);
    }
}

static inline int lab_finish(const char* name) {
    printf("%s: %s\n", name, lab_failures ? "FAILED" : "ok");
    return lab_failures ? 1 : 0;
}

/* ---- inputs ------------------------------------------------------------------------------ */
/* xorshift64*: fresh inputs per seed; the seed is printed so that a failure can be replayed
 * (`lab_<op> <seed>`). */
static uint64_t lab_state = 0x9e3779b97f4a7c15ull;

static inline uint64_t lab_seed(int argc, char** argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    lab_state = seed * 0x9e3779b97f4a7c15ull + 1;
    printf("seed %llu\n", (unsigned long long)seed);
    return seed;
}

static inline uint64_t lab_next(void) {
    lab_state ^= lab_state >> 12;
    lab_state ^= lab_state << 25;
    lab_state ^= lab_state >> 27;
    return lab_state * 0x2545f4914f6cdd1dull;
}

/* Uniform in [lo, hi), on a grid of 2**-10 so that equal distances (ties) happen. */
static inline float lab_uniform(float lo, float hi) {
    const double u = (double)(lab_next() >> 40) / (double)(1ull << 24);
    return (float)(floor((lo + (hi - lo) * u) * 1024.0) / 1024.0);
}

static inline void* lab_malloc(size_t bytes) {
    void* p = malloc(bytes ? bytes : 1);
    lab_require(p != NULL, "out of host memory");
    return p;
}

static inline double lab_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- CUDA -------------------------------------------------------------------------------- */
#ifdef PCOPS_WITH_CUDA
#define LAB_CUDA(call) lab_require_cuda((call), #call)

static inline void lab_require_cuda(cudaError_t err, const char* what) {
    if (err != cudaSuccess) {
        fprintf(stderr, "FATAL: %s: %s\n", what, cudaGetErrorString(err));
        exit(2);
    }
}

/* Whether a GPU can be used now (a CUDA build may run where there is none, e.g. in CI). */
static inline int lab_gpu(void) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        printf("no GPU (%s): CUDA half skipped\n",
               err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return 0;
    }
    return 1;
}

static inline void* lab_to_device(const void* host, size_t bytes) {
    void* d = NULL;
    LAB_CUDA(cudaMalloc(&d, bytes ? bytes : 1));
    if (host && bytes) LAB_CUDA(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}

static inline void* lab_to_host(const void* device, size_t bytes) {
    void* h = lab_malloc(bytes);
    if (bytes) LAB_CUDA(cudaMemcpy(h, device, bytes, cudaMemcpyDeviceToHost));
    return h;
}

/* One launch of the op under test, on `stream`, with its arguments behind `ctx`. */
typedef cudaError_t (*lab_launch_fn)(void* ctx, cudaStream_t stream);

/* Captures one launch into a CUDA graph on a fresh stream, replays it and waits: the outputs
 * must then be what an eager launch writes (checked by the caller). */
static inline void lab_graph_replay(lab_launch_fn launch, void* ctx) {
    cudaStream_t stream;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    LAB_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    LAB_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const cudaError_t launched = launch(ctx, stream);
    LAB_CUDA(cudaStreamEndCapture(stream, &graph));
    LAB_CUDA(launched);
    LAB_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    LAB_CUDA(cudaGraphLaunch(exec, stream));
    LAB_CUDA(cudaStreamSynchronize(stream));
    LAB_CUDA(cudaGraphExecDestroy(exec));
    LAB_CUDA(cudaGraphDestroy(graph));
    LAB_CUDA(cudaStreamDestroy(stream));
}

static inline int lab_compare_doubles(const void* a, const void* b) {
    const double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

/* Median milliseconds of `reps` launches, each after writing a buffer of twice the L2 size (so
 * every launch starts from a cold L2, as in a real network step), timed with events around the
 * launch only; one warm-up launch first. */
static inline double lab_time_cold_l2(lab_launch_fn launch, void* ctx, int reps) {
    int device = 0, l2 = 0;
    LAB_CUDA(cudaGetDevice(&device));
    LAB_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    const size_t flush_bytes = 2 * (size_t)(l2 > 0 ? l2 : 1 << 20);
    void* flush = lab_to_device(NULL, flush_bytes);
    cudaStream_t stream;
    cudaEvent_t start, stop;
    LAB_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    LAB_CUDA(cudaEventCreate(&start));
    LAB_CUDA(cudaEventCreate(&stop));
    LAB_CUDA(launch(ctx, stream));
    double* ms = (double*)lab_malloc(sizeof(double) * (size_t)reps);
    for (int r = 0; r < reps; ++r) {
        LAB_CUDA(cudaMemsetAsync(flush, r & 0xff, flush_bytes, stream));
        LAB_CUDA(cudaEventRecord(start, stream));
        LAB_CUDA(launch(ctx, stream));
        LAB_CUDA(cudaEventRecord(stop, stream));
        LAB_CUDA(cudaEventSynchronize(stop));
        float t = 0;
        LAB_CUDA(cudaEventElapsedTime(&t, start, stop));
        ms[r] = t;
    }
    qsort(ms, (size_t)reps, sizeof(double), lab_compare_doubles);
    const double median = ms[reps / 2];
    free(ms);
    LAB_CUDA(cudaEventDestroy(start));
    LAB_CUDA(cudaEventDestroy(stop));
    LAB_CUDA(cudaStreamDestroy(stream));
    LAB_CUDA(cudaFree(flush));
    return median;
}
#endif /* PCOPS_WITH_CUDA */

#endif /* PCOPS_LAB_H */
