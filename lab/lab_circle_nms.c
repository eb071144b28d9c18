/*
 * lab_circle_nms.c -- circle NMS through the C API: CPU against a naive greedy loop (bitwise),
 * CUDA against the CPU, a CUDA graph replay, and the CUDA launcher timed with L2 flushed.
 *
 * N boxes with centres [N, D] (D = 3, only x and y used), scores, and groups (classes). The C
 * API orders the boxes itself (descending score, ties to the lower index); the naive reference
 * here sorts with qsort. On CUDA every path (auto, grid, block, flow: the CUDA rows of
 * kernels/circle_nms_paths.h) is checked against the CPU, and each is timed.
 */
#include "lab.h"

enum { N = 3000, D = 3, G = 3 };
static const double kRadius2 = 0.25;

static const float* g_scores; /* for the comparator */

/* Descending score, ties to the lower index: the visiting order of the contract. */
static int by_score(const void* a, const void* b) {
    const int64_t i = *(const int64_t*)a, j = *(const int64_t*)b;
    if (g_scores[i] != g_scores[j]) return g_scores[i] > g_scores[j] ? -1 : 1;
    return (i > j) - (i < j);
}

static void naive_nms(const float* centers, const int64_t* order, const int64_t* groups,
                      bool* keep_mask, int64_t* keep_idx, int64_t* num_kept) {
    int64_t kept = 0;
    for (int64_t i = 0; i < N; ++i) keep_mask[i] = false;
    for (int64_t v = 0; v < N; ++v) {
        const int64_t i = order[v];
        bool keep = true;
        for (int64_t k = 0; k < kept && keep; ++k) {
            const int64_t j = keep_idx[k];
            keep = groups[j] != groups[i] ||
                   !(pcops_dist2_xy_f32(centers[i * D], centers[i * D + 1], centers[j * D],
                                        centers[j * D + 1]) < (float)kRadius2);
        }
        if (keep) {
            keep_mask[i] = true;
            keep_idx[kept++] = i;
        }
    }
    for (int64_t k = kept; k < N; ++k) keep_idx[k] = -1;
    *num_kept = kept;
}

#ifdef PCOPS_WITH_CUDA
typedef struct {
    const float *centers, *scores;
    const int64_t* groups;
    int path;
    void* workspace;
    bool* keep_mask;
    int64_t *keep_idx, *num_kept;
} NmsArgs;

static cudaError_t launch_nms(void* ctx, cudaStream_t stream) {
    const NmsArgs* a = (const NmsArgs*)ctx;
    return pcops_circle_nms_cuda_path(PCOPS_FLOAT32, a->centers, D, PCOPS_FLOAT32, a->scores,
                                         a->groups, N, kRadius2, a->workspace, a->keep_mask,
                                         a->keep_idx, a->num_kept, a->path, stream);
}
#endif

int main(int argc, char** argv) {
    lab_seed(argc, argv);
    float* centers = (float*)lab_malloc(sizeof(float) * N * D);
    float* scores = (float*)lab_malloc(sizeof(float) * N);
    int64_t* groups = (int64_t*)lab_malloc(sizeof(int64_t) * N);
    int64_t* order = (int64_t*)lab_malloc(sizeof(int64_t) * N);
    for (int64_t i = 0; i < N * D; ++i) centers[i] = lab_uniform(0, 20);
    for (int64_t i = 0; i < N; ++i) {
        scores[i] = lab_uniform(0, 1); /* on a grid: equal scores happen */
        groups[i] = (int64_t)(lab_next() % G);
        order[i] = i;
    }
    g_scores = scores;
    qsort(order, N, sizeof(int64_t), by_score);

    bool *mask = (bool*)lab_malloc(N), *mask_want = (bool*)lab_malloc(N);
    int64_t* keep = (int64_t*)lab_malloc(sizeof(int64_t) * N);
    int64_t* keep_want = (int64_t*)lab_malloc(sizeof(int64_t) * N);
    int64_t kept = -1, kept_want = -2;
    void* workspace = lab_malloc(pcops_circle_nms_workspace_bytes(PCOPS_FLOAT32, N));
    const double t = lab_seconds();
    lab_require_status(pcops_circle_nms_cpu(PCOPS_FLOAT32, centers, D, PCOPS_FLOAT32, scores,
                                            groups, N, kRadius2, workspace, mask, keep, &kept),
                       "pcops_circle_nms_cpu");
    printf("cpu circle_nms: %.3f ms, %lld of %d kept\n", 1e3 * (lab_seconds() - t),
           (long long)kept, N);
    naive_nms(centers, order, groups, mask_want, keep_want, &kept_want);
    lab_check(kept == kept_want, "cpu circle_nms keeps %lld, naive %lld", (long long)kept,
              (long long)kept_want);
    lab_check_equal(mask, mask_want, N, 1, "cpu circle_nms keep_mask vs naive");
    lab_check_equal(keep, keep_want, N, sizeof(int64_t), "cpu circle_nms keep_idx vs naive");

#ifdef PCOPS_WITH_CUDA
    if (lab_gpu()) {
        NmsArgs a;
        a.centers = (const float*)lab_to_device(centers, sizeof(float) * N * D);
        a.scores = (const float*)lab_to_device(scores, sizeof(float) * N);
        a.groups = (const int64_t*)lab_to_device(groups, sizeof(int64_t) * N);
        size_t ws = 0;
        /* the CUDA paths are ids AUTO .. FLOW (SWEEP, the CPU's, comes last) */
        for (int p = PCOPS_CIRCLE_NMS_AUTO; p <= PCOPS_CIRCLE_NMS_FLOW; ++p) {
            const size_t b = pcops_circle_nms_cuda_workspace_bytes(PCOPS_FLOAT32, PCOPS_FLOAT32, N, p);
            ws = b > ws ? b : ws;
        }
        a.workspace = lab_to_device(NULL, ws > 0 ? ws : 1);
        a.keep_mask = (bool*)lab_to_device(NULL, N);
        a.keep_idx = (int64_t*)lab_to_device(NULL, sizeof(int64_t) * N);
        a.num_kept = (int64_t*)lab_to_device(NULL, sizeof(int64_t));
        for (int run = 0; run < 2 * (PCOPS_CIRCLE_NMS_FLOW + 1); ++run) {
            const int graph = run & 1;
            a.path = run >> 1;
            LAB_CUDA(cudaMemset(a.keep_idx, 0x7f, sizeof(int64_t) * N));
            if (graph) lab_graph_replay(launch_nms, &a);
            else LAB_CUDA(launch_nms(&a, 0));
            LAB_CUDA(cudaDeviceSynchronize());
            bool* gm = (bool*)lab_to_host(a.keep_mask, N);
            int64_t* gk = (int64_t*)lab_to_host(a.keep_idx, sizeof(int64_t) * N);
            int64_t* gn = (int64_t*)lab_to_host(a.num_kept, sizeof(int64_t));
            lab_check(*gn == kept, "cuda circle_nms path %d%s keeps %lld, cpu %lld",
                      a.path, graph ? " (graph)" : "", (long long)*gn, (long long)kept);
            lab_check_equal(gm, mask, N, 1, graph ? "cuda keep_mask (graph)" : "cuda keep_mask");
            lab_check_equal(gk, keep, N, sizeof(int64_t),
                            graph ? "cuda keep_idx (graph)" : "cuda keep_idx");
            free(gm);
            free(gk);
            free(gn);
        }
        for (a.path = PCOPS_CIRCLE_NMS_AUTO; a.path <= PCOPS_CIRCLE_NMS_FLOW; ++a.path) {
            const double ms = lab_time_cold_l2(launch_nms, &a, 30);
            printf("cuda circle_nms path %d (cold L2): %.4f ms, %.2f Mboxes/s\n", a.path, ms,
                   N / ms * 1e-3);
        }
        cudaFree((void*)a.centers);
        cudaFree((void*)a.scores);
        cudaFree((void*)a.groups);
        cudaFree(a.workspace);
        cudaFree(a.keep_mask);
        cudaFree(a.keep_idx);
        cudaFree(a.num_kept);
    }
#endif
    free(centers);
    free(scores);
    free(groups);
    free(order);
    free(mask);
    free(mask_want);
    free(keep);
    free(keep_want);
    free(workspace);
    return lab_finish("lab_circle_nms");
}
