/*
 * ab_search.c -- A/B timing of the CUDA kNN and ball query of several builds of kernels/, in ONE
 * process, through the C API (no torch). benchmarks/ab_trees.sh builds each git tree's
 * kernels/knn.cu and kernels/ball_query.cu into a shared library and runs this program on them.
 *
 *   ab_search [--rounds R] [--flush-mb MB] [--rows K1,Q1,...] LABEL=lib.so [LABEL=lib.so ...]
 *
 * Each library is dlopen'ed on its own (RTLD_LOCAL; ab_trees.sh links them -Bsymbolic), so the
 * builds sit side by side in the process and see the same inputs, buffers, GPU state and clocks.
 * Give the same library twice under two names (two files: a copy) and their difference is the
 * noise floor of the method. The C API of the searches (pcops_knn_cuda_plan_make / _run,
 * pcops_ball_query_cuda_plan_make / _run and their plan structs) must be the same in every
 * build: it is, for kNN from 03c74c5 on, for the ball query from 807e8be on (its plan gained
 * order_bits there).
 *
 * Rows: the peer benchmark's kNN and ball-query sizes (../shared/peerbench/bench.py: K1-K5, K8,
 * Q1, Q2; float32, uniform points in [0, 1)^3, lengths absent, the AUTO variant) and two
 * float64 rows for the float64 heaps (D8: K8 in float64, the shared-memory heap kernel; DG: one
 * cloud of 100k points, k = 128, the GRID variant forced, the grid heap kernel).
 *
 * Method, per row:
 *   - every build is warmed up (3 calls) and its outputs are compared with the first build's,
 *     bit for bit (printed: "same bits" or the first difference);
 *   - R rounds; in a round every build is timed once in each of two modes, in an order that
 *     rotates with the round and reverses every other cycle, so each build runs equally often
 *     in every position;
 *       gpu:  flush, then events around plan + run, queued behind the flush: the time of the
 *             kernels on the device (the host's launch cost is hidden behind the flush);
 *       idle: flush, synchronise, then events around plan + run: what the peer benchmark
 *             measures (the host's launch cost, from an idle GPU, included);
 *     the flush writes `--flush-mb` MB (256, as the peer benchmark) so every call starts with a
 *     cold L2;
 *   - per build and mode: median, p10, p90, min over the rounds (ms); for every build after the
 *     first, the median of its per-round ratio to the first build, with a 95% interval (the
 *     order statistics of the sign test), and that median separately for the rounds where it
 *     ran before / after the first build (an order effect shows as a gap between the two).
 * Lines starting with "RESULT" carry the same numbers for benchmarks/ab_summary.py.
 */
#include "lab.h" /* first: it sets _POSIX_C_SOURCE */

#include <dlfcn.h>

#ifndef PCOPS_WITH_CUDA
#error "ab_search needs the CUDA build (make -C lab ab)"
#endif

typedef cudaError_t (*knn_plan_fn)(pcops_dtype, int64_t, int64_t, int64_t, int64_t,
                                   pcops_knn_path, pcops_knn_cuda_plan*);
typedef cudaError_t (*knn_run_fn)(const pcops_knn_cuda_plan*, const void*, const void*,
                                  const int64_t*, const int64_t*, void*, void*, int64_t*,
                                  cudaStream_t);
typedef cudaError_t (*bq_plan_fn)(pcops_dtype, int64_t, int64_t, int64_t, double, int64_t,
                                  pcops_ball_query_path, pcops_ball_query_cuda_plan*);
typedef cudaError_t (*bq_run_fn)(const pcops_ball_query_cuda_plan*, const void*, const void*,
                                 const int64_t*, const int64_t*, void*, int64_t*, int64_t*,
                                 cudaStream_t);

#define MAX_BUILDS 8

/* The path table of the first build that has one (kernels/paths.h), for the paths' names. */
typedef const pcops_path_info* (*path_table_fn)(const char*, int*);
static path_table_fn g_path_table = NULL;

/* One build of the kernels: its label and entry points. */
typedef struct Build {
    const char* label;
    knn_plan_fn knn_plan;
    knn_run_fn knn_run;
    bq_plan_fn bq_plan;
    bq_run_fn bq_run;
} Build;

/* A row of the benchmark. kind 'K': kNN (B, M, N, k); 'Q': ball query (B, M, N, radius, S).
 * max_rounds (0: no cap) keeps a slow row from taking the run's time. */
typedef struct Row {
    const char* id;
    char kind;
    pcops_dtype dtype;
    int64_t B, M, N, K;
    double radius;
    int path; /* an id of the kNN / ball-query path table (0: AUTO) */
    int max_rounds;
} Row;

static const Row kRows[] = {
    {"K1", 'K', PCOPS_FLOAT32, 32, 512, 1024, 32, 0, 0, 0},
    {"K2", 'K', PCOPS_FLOAT32, 16, 4096, 4096, 16, 0, 0, 0},
    {"K3", 'K', PCOPS_FLOAT32, 16, 4096, 4096, 64, 0, 0, 0},
    {"K4", 'K', PCOPS_FLOAT32, 8, 16384, 16384, 16, 0, 0, 0},
    {"K5", 'K', PCOPS_FLOAT32, 1, 100000, 100000, 16, 0, 0, 0},
    {"K8", 'K', PCOPS_FLOAT32, 16, 1024, 1024, 128, 0, 0, 0},
    {"Q1", 'Q', PCOPS_FLOAT32, 32, 512, 1024, 32, 0.2, 0, 0},
    {"Q2", 'Q', PCOPS_FLOAT32, 16, 1024, 4096, 64, 0.1, 0, 0},
    {"D8", 'K', PCOPS_FLOAT64, 16, 1024, 1024, 128, 0, 0, 0},
    {"DG", 'K', PCOPS_FLOAT64, 1, 100000, 100000, 128, 0, PCOPS_KNN_GRID, 20},
};

/* The device buffers of one row: shared inputs, outputs and workspace per build. */
typedef struct Bufs {
    void* query;
    void* ref;
    void* out_a[MAX_BUILDS]; /* kNN dist2 / ball-query idx */
    int64_t* out_b[MAX_BUILDS]; /* kNN idx / ball-query count */
    void* workspace[MAX_BUILDS];
    size_t bytes_a, bytes_b;
} Bufs;

static void* load_symbol(void* lib, const char* path, const char* name) {
    void* f = dlsym(lib, name);
    if (!f) {
        fprintf(stderr, "FATAL: %s: no %s (%s)\n", path, name, dlerror());
        exit(2);
    }
    return f;
}

static Build load_build(const char* spec) {
    const char* eq = strchr(spec, '=');
    lab_require(eq != NULL && eq != spec, "builds are given as LABEL=path/to/lib.so");
    Build b;
    char* label = (char*)lab_malloc((size_t)(eq - spec) + 1);
    memcpy(label, spec, (size_t)(eq - spec));
    label[eq - spec] = 0;
    b.label = label;
    const char* path = eq + 1;
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "FATAL: dlopen %s: %s\n", path, dlerror());
        exit(2);
    }
    b.knn_plan = (knn_plan_fn)load_symbol(lib, path, "pcops_knn_cuda_plan_make");
    b.knn_run = (knn_run_fn)load_symbol(lib, path, "pcops_knn_cuda_run");
    b.bq_plan = (bq_plan_fn)load_symbol(lib, path, "pcops_ball_query_cuda_plan_make");
    b.bq_run = (bq_run_fn)load_symbol(lib, path, "pcops_ball_query_cuda_run");
    if (!g_path_table) g_path_table = (path_table_fn)dlsym(lib, "pcops_path_table");
    return b;
}

static size_t scalar_bytes(pcops_dtype dtype) { return dtype == PCOPS_FLOAT64 ? 8 : 4; }

/* Uniform points in [0, 1)^3 (full precision, unlike lab_uniform's grid: a timing input). */
static void* random_points(int64_t count, pcops_dtype dtype) {
    void* p = lab_malloc((size_t)count * 3 * scalar_bytes(dtype));
    for (int64_t j = 0; j < count * 3; ++j) {
        const double u = (double)(lab_next() >> 11) / (double)(1ull << 53);
        if (dtype == PCOPS_FLOAT64) ((double*)p)[j] = u;
        else ((float*)p)[j] = (float)u;
    }
    return p;
}

/* The name of path `id` of a kNN ('K') or ball-query row (older trees have no path table: the
 * id is printed). */
static const char* path_name(char kind, int id) {
    static char buf[16];
    int count = 0;
    const pcops_path_info* rows =
        g_path_table ? g_path_table(kind == 'K' ? "knn" : "ball_query", &count) : NULL;
    for (int i = 0; i < count; ++i)
        if (rows[i].id == id) return rows[i].name;
    snprintf(buf, sizeof buf, "path %d", id);
    return buf;
}

/* One call of build b on row r: the plan (as a binding makes it on every call), then the run. */
static cudaError_t call(const Build* b, const Row* r, Bufs* bufs, int x, cudaStream_t stream,
                        size_t* workspace_bytes, int* chosen) {
    if (r->kind == 'K') {
        pcops_knn_cuda_plan plan;
        cudaError_t err = b->knn_plan(r->dtype, r->B, r->M, r->N, r->K, (pcops_knn_path)r->path, &plan);
        if (err != cudaSuccess) return err;
        if (workspace_bytes) *workspace_bytes = plan.workspace_bytes;
        if (chosen) *chosen = plan.path;
        if (!bufs) return cudaSuccess;
        return b->knn_run(&plan, bufs->query, bufs->ref, NULL, NULL, bufs->workspace[x],
                          bufs->out_a[x], bufs->out_b[x], stream);
    }
    pcops_ball_query_cuda_plan plan;
    cudaError_t err = b->bq_plan(r->dtype, r->B, r->M, r->N, r->radius * r->radius, r->K,
                                 (pcops_ball_query_path)r->path, &plan);
    if (err != cudaSuccess) return err;
    if (workspace_bytes) *workspace_bytes = plan.workspace_bytes;
    if (chosen) *chosen = plan.path;
    if (!bufs) return cudaSuccess;
    return b->bq_run(&plan, bufs->query, bufs->ref, NULL, NULL, bufs->workspace[x],
                     (int64_t*)bufs->out_a[x], bufs->out_b[x], stream);
}

/* The timing context: the stream, the events and the flush buffer. */
typedef struct Timer {
    cudaStream_t stream;
    cudaEvent_t start, stop;
    void* flush;
    size_t flush_bytes;
    int flushes;
} Timer;

/* One timed call in mode 0 (gpu: queued behind the flush) or 1 (idle: after a sync). */
static double time_call(Timer* t, const Build* b, const Row* r, Bufs* bufs, int x, int idle) {
    LAB_CUDA(cudaMemsetAsync(t->flush, (t->flushes++) & 0xff, t->flush_bytes, t->stream));
    if (idle) LAB_CUDA(cudaStreamSynchronize(t->stream));
    LAB_CUDA(cudaEventRecord(t->start, t->stream));
    LAB_CUDA(call(b, r, bufs, x, t->stream, NULL, NULL));
    LAB_CUDA(cudaEventRecord(t->stop, t->stream));
    LAB_CUDA(cudaEventSynchronize(t->stop));
    float ms = 0;
    LAB_CUDA(cudaEventElapsedTime(&ms, t->start, t->stop));
    return ms;
}

/* The q-quantile (0..1) of sorted values, nearest rank. */
static double quantile(const double* sorted, int n, double q) {
    int j = (int)(q * (n - 1) + 0.5);
    return sorted[j < 0 ? 0 : (j >= n ? n - 1 : j)];
}

static double* sorted_copy(const double* v, int n) {
    double* s = (double*)lab_malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    memcpy(s, v, sizeof(double) * (size_t)n);
    qsort(s, (size_t)n, sizeof(double), lab_compare_doubles);
    return s;
}

/* Median of the ratios and its 95% interval: the sorted ratios' order statistics
 * [lo, hi] = [k, n - 1 - k] with k = floor((n - 1.96 sqrt(n)) / 2) (the sign test). */
static void ratio_interval(const double* ratios, int n, double* med, double* lo, double* hi) {
    double* s = sorted_copy(ratios, n);
    *med = n ? (n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2])) : NAN;
    int k = (int)floor((n - 1.96 * sqrt((double)n)) / 2.0);
    if (k < 0) k = 0;
    *lo = n ? s[k] : NAN;
    *hi = n ? s[n - 1 - k] : NAN;
    free(s);
}

static double median_of(const double* v, int n) {
    if (n == 0) return NAN;
    double* s = sorted_copy(v, n);
    const double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    free(s);
    return m;
}

/* Compares build x's outputs with build 0's, bit for bit; prints the first difference. */
static int same_outputs(const Bufs* bufs, int x, const char* label0, const char* labelx) {
    char* a0 = (char*)lab_to_host(bufs->out_a[0], bufs->bytes_a);
    char* ax = (char*)lab_to_host(bufs->out_a[x], bufs->bytes_a);
    char* b0 = (char*)lab_to_host(bufs->out_b[0], bufs->bytes_b);
    char* bx = (char*)lab_to_host(bufs->out_b[x], bufs->bytes_b);
    const int same = memcmp(a0, ax, bufs->bytes_a) == 0 && memcmp(b0, bx, bufs->bytes_b) == 0;
    if (!same) printf("  outputs of %s and %s DIFFER\n", label0, labelx);
    free(a0);
    free(ax);
    free(b0);
    free(bx);
    return same;
}

static void run_row(const Row* r, const Build* builds, int nb, int rounds, Timer* t) {
    if (r->max_rounds > 0 && rounds > r->max_rounds) rounds = r->max_rounds;
    /* the row's inputs from its id alone: the same in every process, whatever rows run */
    lab_state = 0x5eed5eed5eedull;
    for (const char* c = r->id; *c; ++c) lab_state = lab_state * 0x100000001b3ull + (uint64_t)*c;
    Bufs bufs;
    memset(&bufs, 0, sizeof bufs);
    const size_t sb = scalar_bytes(r->dtype);
    void* hq = random_points(r->B * r->M, r->dtype);
    void* hr = random_points(r->B * r->N, r->dtype);
    bufs.query = lab_to_device(hq, (size_t)(r->B * r->M * 3) * sb);
    bufs.ref = lab_to_device(hr, (size_t)(r->B * r->N * 3) * sb);
    free(hq);
    free(hr);
    const size_t slots = (size_t)(r->B * r->M * r->K);
    bufs.bytes_a = r->kind == 'K' ? slots * sb : slots * sizeof(int64_t);
    bufs.bytes_b = r->kind == 'K' ? slots * sizeof(int64_t) : (size_t)(r->B * r->M) * sizeof(int64_t);
    int variant = 0;
    for (int x = 0; x < nb; ++x) {
        size_t ws = 0;
        int v;
        LAB_CUDA(call(&builds[x], r, NULL, x, t->stream, &ws, &v));
        if (x == 0) variant = v;
        if (v != variant) printf("  %s plans %s, %s plans %s\n", builds[0].label,
                                 path_name(r->kind, variant), builds[x].label, path_name(r->kind, v));
        bufs.out_a[x] = lab_to_device(NULL, bufs.bytes_a);
        bufs.out_b[x] = (int64_t*)lab_to_device(NULL, bufs.bytes_b);
        bufs.workspace[x] = lab_to_device(NULL, ws);
    }
    for (int x = 0; x < nb; ++x)
        for (int w = 0; w < 3; ++w) LAB_CUDA(call(&builds[x], r, &bufs, x, t->stream, NULL, NULL));
    LAB_CUDA(cudaStreamSynchronize(t->stream));
    int same = 1;
    for (int x = 1; x < nb; ++x) same &= same_outputs(&bufs, x, builds[0].label, builds[x].label);
    if (r->kind == 'K')
        printf("row %s: kNN %s B=%lld M=%lld N=%lld k=%lld, %s path; outputs: %s\n", r->id,
               r->dtype == PCOPS_FLOAT64 ? "float64" : "float32", (long long)r->B,
               (long long)r->M, (long long)r->N, (long long)r->K, path_name(r->kind, variant),
               same ? "the same bits in every build" : "DIFFERENT");
    else
        printf("row %s: ball query B=%lld M=%lld N=%lld r=%g S=%lld, %s path; outputs: %s\n",
               r->id, (long long)r->B, (long long)r->M, (long long)r->N, r->radius,
               (long long)r->K, path_name(r->kind, variant),
               same ? "the same bits in every build" : "DIFFERENT");

    /* ms[mode][build][round], and the position of each build in each round */
    double* ms[2][MAX_BUILDS];
    int* pos[MAX_BUILDS];
    for (int x = 0; x < nb; ++x) {
        ms[0][x] = (double*)lab_malloc(sizeof(double) * (size_t)rounds);
        ms[1][x] = (double*)lab_malloc(sizeof(double) * (size_t)rounds);
        pos[x] = (int*)lab_malloc(sizeof(int) * (size_t)rounds);
    }
    for (int k = 0; k < rounds; ++k) {
        int order[MAX_BUILDS];
        const int reverse = (k / nb) % 2;
        for (int j = 0; j < nb; ++j) {
            const int x = (j + k) % nb;
            order[reverse ? nb - 1 - j : j] = x;
        }
        for (int j = 0; j < nb; ++j) pos[order[j]][k] = j;
        for (int mode = 0; mode < 2; ++mode)
            for (int j = 0; j < nb; ++j) {
                const int x = order[j];
                ms[mode][x][k] = time_call(t, &builds[x], r, &bufs, x, mode);
            }
    }

    static const char* kModes[2] = {"gpu", "idle"};
    for (int mode = 0; mode < 2; ++mode) {
        printf("  %-4s %-10s %9s %9s %9s %9s   (ms, %d rounds)\n", kModes[mode], "build",
               "median", "p10", "p90", "min", rounds);
        for (int x = 0; x < nb; ++x) {
            double* s = sorted_copy(ms[mode][x], rounds);
            const double med = median_of(ms[mode][x], rounds);
            const double p10 = quantile(s, rounds, 0.1), p90 = quantile(s, rounds, 0.9);
            printf("  %-4s %-10s %9.4f %9.4f %9.4f %9.4f", kModes[mode], builds[x].label, med,
                   p10, p90, s[0]);
            double rmed = 1, lo = 1, hi = 1, before = NAN, after = NAN;
            if (x > 0) {
                double* ratio = (double*)lab_malloc(sizeof(double) * (size_t)rounds);
                double* rb = (double*)lab_malloc(sizeof(double) * (size_t)rounds);
                double* ra = (double*)lab_malloc(sizeof(double) * (size_t)rounds);
                int nbf = 0, naf = 0;
                for (int k = 0; k < rounds; ++k) {
                    ratio[k] = ms[mode][x][k] / ms[mode][0][k];
                    if (pos[x][k] < pos[0][k]) rb[nbf++] = ratio[k];
                    else ra[naf++] = ratio[k];
                }
                ratio_interval(ratio, rounds, &rmed, &lo, &hi);
                before = median_of(rb, nbf);
                after = median_of(ra, naf);
                printf("   %s/%s %.4f [%.4f, %.4f]; ran first %.4f, second %.4f", builds[x].label,
                       builds[0].label, rmed, lo, hi, before, after);
                free(ratio);
                free(rb);
                free(ra);
            }
            printf("\n");
            printf("RESULT %s %s %s %.5f %.5f %.5f %.5f %.5f %.5f %.5f %d %s\n", r->id,
                   kModes[mode], builds[x].label, med, p10, p90, s[0], rmed, lo, hi, rounds,
                   same ? "same" : "differ");
            free(s);
        }
    }
    for (int x = 0; x < nb; ++x) {
        free(ms[0][x]);
        free(ms[1][x]);
        free(pos[x]);
        LAB_CUDA(cudaFree(bufs.out_a[x]));
        LAB_CUDA(cudaFree(bufs.out_b[x]));
        LAB_CUDA(cudaFree(bufs.workspace[x]));
    }
    LAB_CUDA(cudaFree(bufs.query));
    LAB_CUDA(cudaFree(bufs.ref));
    fflush(stdout);
}

/* Whether row id is in the comma-separated list (NULL: every row). */
static int wanted(const char* list, const char* id) {
    if (!list) return 1;
    const size_t n = strlen(id);
    for (const char* p = list; (p = strstr(p, id)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return 1;
    return 0;
}

int main(int argc, char** argv) {
    int rounds = 60, flush_mb = 256;
    const char* rows = NULL;
    Build builds[MAX_BUILDS];
    int nb = 0;
    for (int a = 1; a < argc; ++a) {
        if (!strcmp(argv[a], "--rounds") && a + 1 < argc) rounds = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--flush-mb") && a + 1 < argc) flush_mb = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--rows") && a + 1 < argc) rows = argv[++a];
        else if (nb < MAX_BUILDS) builds[nb++] = load_build(argv[a]);
        else lab_require(0, "too many builds");
    }
    lab_require(nb >= 1 && rounds >= 1 && flush_mb >= 1,
                "usage: ab_search [--rounds R] [--flush-mb MB] [--rows K1,Q1] LABEL=lib.so ...");
    if (!lab_gpu()) return 0;
    int device = 0;
    struct cudaDeviceProp prop;
    LAB_CUDA(cudaGetDevice(&device));
    LAB_CUDA(cudaGetDeviceProperties(&prop, device));
    printf("device: %s (%d SMs); builds:", prop.name, prop.multiProcessorCount);
    for (int x = 0; x < nb; ++x) printf(" %s", builds[x].label);
    printf("; %d rounds, flush %d MB\n", rounds, flush_mb);

    Timer t;
    t.flush_bytes = (size_t)flush_mb << 20;
    t.flush = lab_to_device(NULL, t.flush_bytes);
    t.flushes = 0;
    LAB_CUDA(cudaStreamCreateWithFlags(&t.stream, cudaStreamNonBlocking));
    LAB_CUDA(cudaEventCreate(&t.start));
    LAB_CUDA(cudaEventCreate(&t.stop));
    for (size_t j = 0; j < sizeof kRows / sizeof kRows[0]; ++j)
        if (wanted(rows, kRows[j].id)) run_row(&kRows[j], builds, nb, rounds, &t);
    LAB_CUDA(cudaEventDestroy(t.start));
    LAB_CUDA(cudaEventDestroy(t.stop));
    LAB_CUDA(cudaStreamDestroy(t.stream));
    LAB_CUDA(cudaFree(t.flush));
    return 0;
}
