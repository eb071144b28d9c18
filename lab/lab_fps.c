/*
 * lab_fps.c -- furthest point sampling through the C API: CPU against a naive greedy loop
 * (bitwise) for every CPU path, CUDA against the CPU for every path through its launch plan,
 * a CUDA graph replay, and each path timed with L2 flushed (FPS steps per second).
 *
 * B batch, N points per cloud, P = npoint samples. float32, per-cloud lengths and starts.
 */
#include "lab.h"

enum { B = 4, N = 20000, P = 512 };

/* The contract (kernels/pcops.h): temp starts at +inf, chosen points are set negative, sample 0
 * is start mod L, sample j the largest temp (ties to the lower index), dist2[j] that temp. */
static void naive_fps(const float* xyz, const int64_t* lengths, const int64_t* start,
                      int64_t* idx, float* dist2) {
    float* temp = (float*)lab_malloc(sizeof(float) * N);
    for (int64_t b = 0; b < B; ++b) {
        const int64_t L = pcops_valid_length(lengths, b, N);
        const float* x = xyz + b * N * 3;
        for (int64_t n = 0; n < L; ++n) temp[n] = INFINITY;
        int64_t cur = L > 0 ? pcops_positive_mod(start[b], L) : -1;
        for (int64_t j = 0; j < P; ++j) {
            if (j >= L) {
                idx[b * P + j] = -1;
                dist2[b * P + j] = 0;
                continue;
            }
            float best_d = 0;
            if (j > 0) {
                cur = -1;
                for (int64_t n = 0; n < L; ++n)
                    if (cur < 0 || temp[n] > best_d) {
                        cur = n;
                        best_d = temp[n];
                    }
            }
            idx[b * P + j] = cur;
            dist2[b * P + j] = best_d;
            temp[cur] = -1;
            const float* c = x + cur * 3;
            for (int64_t n = 0; n < L; ++n) {
                if (temp[n] < 0) continue;
                const float d = pcops_dist2_f32(x[n * 3], x[n * 3 + 1], x[n * 3 + 2], c[0], c[1], c[2]);
                if (d < temp[n]) temp[n] = d;
            }
        }
    }
    free(temp);
}

#ifdef PCOPS_WITH_CUDA
typedef struct {
    const float* xyz;
    const int64_t *lengths, *start;
    void* workspace;
    int64_t* idx;
    float* dist2;
    pcops_fps_cuda_plan plan;
} FpsArgs;

static cudaError_t launch_fps(void* ctx, cudaStream_t stream) {
    const FpsArgs* a = (const FpsArgs*)ctx;
    return pcops_fps_cuda_run(&a->plan, PCOPS_FLOAT32, a->xyz, a->lengths, a->start, B, N, P,
                              a->workspace, a->idx, a->dist2, stream);
}
#endif

int main(int argc, char** argv) {
    lab_seed(argc, argv);
    const size_t nx = (size_t)B * N * 3, np = (size_t)B * P;
    float* xyz = (float*)lab_malloc(nx * sizeof(float));
    for (size_t i = 0; i < nx; ++i) xyz[i] = lab_uniform(-10, 10);
    int64_t lengths[B], start[B];
    for (int b = 0; b < B; ++b) {  /* one full cloud, one shorter than P, a negative start */
        lengths[b] = b == 0 ? N : b == 1 ? P / 3 : (int64_t)(lab_next() % (N + 1));
        start[b] = (int64_t)(lab_next() % 100000) - (b == 2 ? 200000 : 0);
    }

    int64_t* idx = (int64_t*)lab_malloc(np * sizeof(int64_t));
    int64_t* idx_want = (int64_t*)lab_malloc(np * sizeof(int64_t));
    float* dist2 = (float*)lab_malloc(np * sizeof(float));
    float* dist2_want = (float*)lab_malloc(np * sizeof(float));
    void* workspace = lab_malloc(pcops_fps_workspace_bytes(PCOPS_FLOAT32, B, N));
    naive_fps(xyz, lengths, start, idx_want, dist2_want);
    /* every CPU path (pcops_fps_variant: 1 simple, 2 tree), then the default, which stays in
     * idx / dist2 as the reference of the CUDA paths */
    const int cpu_variants[] = {PCOPS_FPS_SIMPLE, PCOPS_FPS_TREE, PCOPS_FPS_AUTO};
    for (int k = 0; k < 3; ++k) {
        const double t = lab_seconds();
        lab_require_status(pcops_fps_cpu_path(PCOPS_FLOAT32, xyz, lengths, start, B, N, P,
                                                 workspace, idx, dist2, cpu_variants[k]),
                           "pcops_fps_cpu_path");
        printf("cpu fps variant %d: %.3f ms\n", cpu_variants[k], 1e3 * (lab_seconds() - t));
        char what[64];
        snprintf(what, sizeof what, "cpu fps variant %d idx vs naive", cpu_variants[k]);
        lab_check_equal(idx, idx_want, np, sizeof(int64_t), what);
        snprintf(what, sizeof what, "cpu fps variant %d dist2 vs naive", cpu_variants[k]);
        lab_check_equal(dist2, dist2_want, np, sizeof(float), what);
    }

#ifdef PCOPS_WITH_CUDA
    if (lab_gpu()) {
        FpsArgs a;
        a.xyz = (const float*)lab_to_device(xyz, nx * sizeof(float));
        a.lengths = (const int64_t*)lab_to_device(lengths, sizeof lengths);
        a.start = (const int64_t*)lab_to_device(start, sizeof start);
        a.idx = (int64_t*)lab_to_device(NULL, np * sizeof(int64_t));
        a.dist2 = (float*)lab_to_device(NULL, np * sizeof(float));
        /* every CUDA path (pcops_fps_variant), through its launch plan; a path that cannot take
         * N on this device says so at planning time */
        const int variants[] = {PCOPS_FPS_AUTO, PCOPS_FPS_SIMPLE, PCOPS_FPS_WARP, PCOPS_FPS_BLOCK,
                                PCOPS_FPS_CLUSTER, PCOPS_FPS_GRID, PCOPS_FPS_BUCKET};
        for (int k = 0; k < (int)(sizeof variants / sizeof variants[0]); ++k) {
            if (pcops_fps_cuda_make_plan(PCOPS_FLOAT32, B, N, P, variants[k], &a.plan) !=
                cudaSuccess) {
                (void)cudaGetLastError();
                printf("cuda fps variant %d: cannot take N = %d here\n", variants[k], N);
                continue;
            }
            a.workspace = lab_to_device(NULL, a.plan.workspace_bytes);
            for (int graph = 0; graph < 2; ++graph) {
                LAB_CUDA(cudaMemset(a.idx, 0xff, np * sizeof(int64_t)));
                if (graph) lab_graph_replay(launch_fps, &a);
                else LAB_CUDA(launch_fps(&a, 0));
                LAB_CUDA(cudaDeviceSynchronize());
                int64_t* gi = (int64_t*)lab_to_host(a.idx, np * sizeof(int64_t));
                float* gd = (float*)lab_to_host(a.dist2, np * sizeof(float));
                char what[64];
                snprintf(what, sizeof what, "cuda fps variant %d%s idx", variants[k],
                         graph ? " (graph)" : "");
                lab_check_equal(gi, idx, np, sizeof(int64_t), what);
                snprintf(what, sizeof what, "cuda fps variant %d%s dist2", variants[k],
                         graph ? " (graph)" : "");
                lab_check_equal(gd, dist2, np, sizeof(float), what);
                free(gi);
                free(gd);
            }
            const double ms = lab_time_cold_l2(launch_fps, &a, 20);
            printf("cuda fps variant %d (plan: %d threads, %d points/thread, %d blocks/cloud; "
                   "cold L2): %.4f ms, %.0f steps/s per cloud\n",
                   variants[k], a.plan.threads, a.plan.points_per_thread,
                   a.plan.blocks_per_cloud, ms, P / ms * 1e3);
            cudaFree(a.workspace);
        }
        cudaFree((void*)a.xyz);
        cudaFree((void*)a.lengths);
        cudaFree((void*)a.start);
        cudaFree(a.idx);
        cudaFree(a.dist2);
    }
#endif
    free(xyz);
    free(idx);
    free(idx_want);
    free(dist2);
    free(dist2_want);
    free(workspace);
    return lab_finish("lab_fps");
}
