/*
 * lab_fps.c -- furthest point sampling through the C API: CPU against a naive greedy loop
 * (bitwise), CUDA against the CPU for every kernel variant, a CUDA graph replay, and each
 * variant timed with L2 flushed (FPS steps per second).
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
    int variant;
} FpsArgs;

static cudaError_t launch_fps(void* ctx, cudaStream_t stream) {
    const FpsArgs* a = (const FpsArgs*)ctx;
    return pcops_fps_cuda_variant(PCOPS_FLOAT32, a->xyz, a->lengths, a->start, B, N, P,
                                  a->workspace, a->idx, a->dist2, a->variant, stream);
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
    const double t = lab_seconds();
    lab_require_status(pcops_fps_cpu(PCOPS_FLOAT32, xyz, lengths, start, B, N, P, workspace,
                                     idx, dist2),
                       "pcops_fps_cpu");
    printf("cpu fps: %.3f ms\n", 1e3 * (lab_seconds() - t));
    naive_fps(xyz, lengths, start, idx_want, dist2_want);
    lab_check_equal(idx, idx_want, np, sizeof(int64_t), "cpu fps idx vs naive");
    lab_check_equal(dist2, dist2_want, np, sizeof(float), "cpu fps dist2 vs naive");

#ifdef PCOPS_WITH_CUDA
    if (lab_gpu()) {
        FpsArgs a;
        a.xyz = (const float*)lab_to_device(xyz, nx * sizeof(float));
        a.lengths = (const int64_t*)lab_to_device(lengths, sizeof lengths);
        a.start = (const int64_t*)lab_to_device(start, sizeof start);
        a.workspace = lab_to_device(NULL, pcops_fps_cuda_workspace_bytes(PCOPS_FLOAT32, B, N));
        a.idx = (int64_t*)lab_to_device(NULL, np * sizeof(int64_t));
        a.dist2 = (float*)lab_to_device(NULL, np * sizeof(float));
        /* variant 0: by size; 1: a block per cloud; 2: a cluster per cloud (pcops.h) */
        for (a.variant = 0; a.variant <= 2; ++a.variant) {
            for (int graph = 0; graph < 2; ++graph) {
                LAB_CUDA(cudaMemset(a.idx, 0xff, np * sizeof(int64_t)));
                if (graph) lab_graph_replay(launch_fps, &a);
                else LAB_CUDA(launch_fps(&a, 0));
                LAB_CUDA(cudaDeviceSynchronize());
                int64_t* gi = (int64_t*)lab_to_host(a.idx, np * sizeof(int64_t));
                float* gd = (float*)lab_to_host(a.dist2, np * sizeof(float));
                char what[64];
                snprintf(what, sizeof what, "cuda fps variant %d%s idx", a.variant,
                         graph ? " (graph)" : "");
                lab_check_equal(gi, idx, np, sizeof(int64_t), what);
                snprintf(what, sizeof what, "cuda fps variant %d%s dist2", a.variant,
                         graph ? " (graph)" : "");
                lab_check_equal(gd, dist2, np, sizeof(float), what);
                free(gi);
                free(gd);
            }
            const double ms = lab_time_cold_l2(launch_fps, &a, 20);
            printf("cuda fps variant %d (cold L2): %.4f ms, %.0f steps/s per cloud\n", a.variant,
                   ms, P / ms * 1e3);
        }
        cudaFree((void*)a.xyz);
        cudaFree((void*)a.lengths);
        cudaFree((void*)a.start);
        cudaFree(a.workspace);
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
