/*
 * lab_knn.c -- knn and ball_query through the C API: CPU against naive references (bitwise),
 * CUDA against the CPU, a CUDA graph replay, timings with L2 flushed.
 *
 * B batch, M queries, N refs per cloud, K neighbours (kNN), S neighbours (ball query). float32,
 * with per-cloud lengths; coordinates on a coarse grid, so equal distances (ties) happen.
 */
#include "lab.h"

enum { B = 3, M = 700, N = 2500, K = 16, S = 32 };
static const double kRadius2 = 0.01;

/* The K smallest keys (dist2, idx) among the valid refs, by selection: the contract of knn. */
static void naive_knn(const float* q, const float* r, const int64_t* ql, const int64_t* rl,
                      float* dist, int64_t* idx) {
    float* d = (float*)lab_malloc(sizeof(float) * N);
    for (int64_t b = 0; b < B; ++b) {
        const int64_t Lq = pcops_valid_length(ql, b, M), L = pcops_valid_length(rl, b, N);
        for (int64_t m = 0; m < M; ++m) {
            float* od = dist + (b * M + m) * K;
            int64_t* oi = idx + (b * M + m) * K;
            const float* p = q + (b * M + m) * 3;
            for (int64_t n = 0; n < L; ++n) {
                const float* x = r + (b * N + n) * 3;
                d[n] = pcops_dist2_f32(p[0], p[1], p[2], x[0], x[1], x[2]);
            }
            int64_t last = -1;  /* the ref chosen for the previous slot: keys above it only */
            for (int64_t j = 0; j < K; ++j) {
                int64_t best = -1;
                for (int64_t n = 0; m < Lq && n < L; ++n) {
                    if (!(d[n] < INFINITY)) continue;
                    if (last >= 0 && !pcops_key_greater_f32(d[n], n, d[last], last)) continue;
                    if (best < 0 || pcops_key_greater_f32(d[best], best, d[n], n)) best = n;
                }
                od[j] = best < 0 ? INFINITY : d[best];
                oi[j] = best;
                if (best >= 0) last = best;
            }
        }
    }
    free(d);
}

/* The first S valid refs with dist2 < radius2 in index order, padded with the first. */
static void naive_ball_query(const float* q, const float* r, const int64_t* ql,
                             const int64_t* rl, int64_t* idx, int64_t* count) {
    for (int64_t b = 0; b < B; ++b) {
        const int64_t Lq = pcops_valid_length(ql, b, M), L = pcops_valid_length(rl, b, N);
        for (int64_t m = 0; m < M; ++m) {
            int64_t* oi = idx + (b * M + m) * S;
            const float* p = q + (b * M + m) * 3;
            int64_t found = 0;
            for (int64_t n = 0; m < Lq && n < L && found < S; ++n) {
                const float* x = r + (b * N + n) * 3;
                if (pcops_dist2_f32(p[0], p[1], p[2], x[0], x[1], x[2]) < (float)kRadius2)
                    oi[found++] = n;
            }
            for (int64_t s = found; s < S; ++s) oi[s] = found ? oi[0] : -1;
            count[b * M + m] = found;
        }
    }
}

#ifdef PCOPS_WITH_CUDA
typedef struct {
    const float *query, *ref;
    const int64_t *ql, *rl;
    float* dist;
    int64_t *idx, *bq_idx, *bq_count;
    void* workspace;
} KnnArgs;

static cudaError_t launch_knn(void* ctx, cudaStream_t stream) {
    const KnnArgs* a = (const KnnArgs*)ctx;
    return pcops_knn_cuda(PCOPS_FLOAT32, a->query, a->ref, a->ql, a->rl, B, M, N, K,
                          a->workspace, a->dist, a->idx, stream);
}

static cudaError_t launch_ball_query(void* ctx, cudaStream_t stream) {
    const KnnArgs* a = (const KnnArgs*)ctx;
    return pcops_ball_query_cuda(PCOPS_FLOAT32, a->query, a->ref, a->ql, a->rl, B, M, N,
                                 kRadius2, S, a->bq_idx, a->bq_count, stream);
}
#endif

int main(int argc, char** argv) {
    lab_seed(argc, argv);
    const size_t nq = (size_t)B * M * 3, nr = (size_t)B * N * 3, nk = (size_t)B * M * K,
                 ns = (size_t)B * M * S;
    float* query = (float*)lab_malloc(nq * sizeof(float));
    float* ref = (float*)lab_malloc(nr * sizeof(float));
    for (size_t i = 0; i < nq; ++i) query[i] = lab_uniform(0, 1);
    for (size_t i = 0; i < nr; ++i) ref[i] = lab_uniform(0, 1);
    int64_t ql[B], rl[B];
    for (int b = 0; b < B; ++b) {  /* cloud 0 full, the others shorter (one ref-less cloud) */
        ql[b] = b == 0 ? M : (int64_t)(lab_next() % (M + 1));
        rl[b] = b == 0 ? N : b == 1 ? 0 : (int64_t)(lab_next() % (N + 1));
    }

    float* dist = (float*)lab_malloc(nk * sizeof(float));
    float* dist_want = (float*)lab_malloc(nk * sizeof(float));
    int64_t* idx = (int64_t*)lab_malloc(nk * sizeof(int64_t));
    int64_t* idx_want = (int64_t*)lab_malloc(nk * sizeof(int64_t));
    double t = lab_seconds();
    lab_require_status(pcops_knn_cpu(PCOPS_FLOAT32, query, ref, ql, rl, B, M, N, K, dist, idx),
                       "pcops_knn_cpu");
    printf("cpu knn: %.3f ms\n", 1e3 * (lab_seconds() - t));
    naive_knn(query, ref, ql, rl, dist_want, idx_want);
    lab_check_equal(idx, idx_want, nk, sizeof(int64_t), "cpu knn idx vs selection");
    lab_check_equal(dist, dist_want, nk, sizeof(float), "cpu knn dist2 vs selection");

    int64_t* bq = (int64_t*)lab_malloc(ns * sizeof(int64_t));
    int64_t* bq_want = (int64_t*)lab_malloc(ns * sizeof(int64_t));
    int64_t* count = (int64_t*)lab_malloc((size_t)B * M * sizeof(int64_t));
    int64_t* count_want = (int64_t*)lab_malloc((size_t)B * M * sizeof(int64_t));
    t = lab_seconds();
    lab_require_status(pcops_ball_query_cpu(PCOPS_FLOAT32, query, ref, ql, rl, B, M, N,
                                            kRadius2, S, bq, count),
                       "pcops_ball_query_cpu");
    printf("cpu ball_query: %.3f ms\n", 1e3 * (lab_seconds() - t));
    naive_ball_query(query, ref, ql, rl, bq_want, count_want);
    lab_check_equal(bq, bq_want, ns, sizeof(int64_t), "cpu ball_query idx vs scan");
    lab_check_equal(count, count_want, (size_t)B * M, sizeof(int64_t), "cpu ball_query count");

    /* The CPU plans refuse a forced path they cannot run, before reading any pointer, and never
     * run another one instead: the grid on a cloud past int32 indices, a CUDA-only path. */
    const int64_t huge = (int64_t)1 << 31;
    lab_check(pcops_knn_cpu_path(PCOPS_FLOAT32, NULL, NULL, NULL, NULL, 1, 1, huge, K,
                                 PCOPS_KNN_GRID, NULL, NULL, NULL) == PCOPS_ERROR_INVALID_VALUE,
              "cpu knn: forced grid past int32 refused");
    lab_check(pcops_knn_cpu_path(PCOPS_FLOAT32, NULL, NULL, NULL, NULL, 1, 1, huge, K,
                                 PCOPS_KNN_GRID_BASELINE, NULL, NULL,
                                 NULL) == PCOPS_ERROR_INVALID_VALUE,
              "cpu knn: forced grid_baseline past int32 refused");
    lab_check(pcops_knn_cpu_path(PCOPS_FLOAT32, query, ref, ql, rl, B, M, N, K,
                                 PCOPS_KNN_WARP_SELECT, NULL, dist, idx) == PCOPS_ERROR_INVALID_VALUE,
              "cpu knn: forced CUDA path refused");
    lab_check(pcops_ball_query_cpu_path(PCOPS_FLOAT32, NULL, NULL, NULL, NULL, 1, 1, huge,
                                        kRadius2, S, PCOPS_BALL_QUERY_GRID, NULL, NULL,
                                        NULL) == PCOPS_ERROR_INVALID_VALUE,
              "cpu ball_query: forced grid past int32 refused");
    lab_check(pcops_ball_query_cpu_path(PCOPS_FLOAT32, query, ref, ql, rl, B, M, N, kRadius2, S,
                                        PCOPS_BALL_QUERY_BRUTE_SPLIT, NULL, bq,
                                        count) == PCOPS_ERROR_INVALID_VALUE,
              "cpu ball_query: forced CUDA path refused");

#ifdef PCOPS_WITH_CUDA
    if (lab_gpu()) {
        KnnArgs a;
        a.query = (const float*)lab_to_device(query, nq * sizeof(float));
        a.ref = (const float*)lab_to_device(ref, nr * sizeof(float));
        a.ql = (const int64_t*)lab_to_device(ql, sizeof ql);
        a.rl = (const int64_t*)lab_to_device(rl, sizeof rl);
        a.dist = (float*)lab_to_device(NULL, nk * sizeof(float));
        a.idx = (int64_t*)lab_to_device(NULL, nk * sizeof(int64_t));
        a.bq_idx = (int64_t*)lab_to_device(NULL, ns * sizeof(int64_t));
        a.bq_count = (int64_t*)lab_to_device(NULL, (size_t)B * M * sizeof(int64_t));
        a.workspace =
            lab_to_device(NULL, pcops_knn_cuda_workspace_bytes(PCOPS_FLOAT32, B, M, N, K));
        for (int graph = 0; graph < 2; ++graph) {
            LAB_CUDA(cudaMemset(a.idx, 0xff, nk * sizeof(int64_t)));
            LAB_CUDA(cudaMemset(a.bq_idx, 0x7f, ns * sizeof(int64_t)));
            if (graph) {
                lab_graph_replay(launch_knn, &a);
                lab_graph_replay(launch_ball_query, &a);
            } else {
                LAB_CUDA(launch_knn(&a, 0));
                LAB_CUDA(launch_ball_query(&a, 0));
            }
            float* gd = (float*)lab_to_host(a.dist, nk * sizeof(float));
            int64_t* gi = (int64_t*)lab_to_host(a.idx, nk * sizeof(int64_t));
            int64_t* gb = (int64_t*)lab_to_host(a.bq_idx, ns * sizeof(int64_t));
            int64_t* gc = (int64_t*)lab_to_host(a.bq_count, (size_t)B * M * sizeof(int64_t));
            const char* how = graph ? " (graph)" : "";
            char what[64];
            snprintf(what, sizeof what, "cuda knn idx vs cpu%s", how);
            lab_check_equal(gi, idx, nk, sizeof(int64_t), what);
            snprintf(what, sizeof what, "cuda knn dist2 vs cpu%s", how);
            lab_check_equal(gd, dist, nk, sizeof(float), what);
            snprintf(what, sizeof what, "cuda ball_query vs cpu%s", how);
            lab_check_equal(gb, bq, ns, sizeof(int64_t), what);
            lab_check_equal(gc, count, (size_t)B * M, sizeof(int64_t), what);
            free(gd);
            free(gi);
            free(gb);
            free(gc);
        }
        /* bytes: every query and ref read once, outputs written (a lower bound of traffic) */
        const double in_bytes = (double)(nq + nr) * 4;
        const double knn_ms = lab_time_cold_l2(launch_knn, &a, 30);
        const double bq_ms = lab_time_cold_l2(launch_ball_query, &a, 30);
        printf("cuda knn (cold L2): %.4f ms, %.1f GB/s\n", knn_ms,
               (in_bytes + (double)nk * 12) / knn_ms * 1e-6);
        printf("cuda ball_query (cold L2): %.4f ms, %.1f GB/s\n", bq_ms,
               (in_bytes + (double)ns * 8) / bq_ms * 1e-6);
        cudaFree((void*)a.query);
        cudaFree((void*)a.ref);
        cudaFree((void*)a.ql);
        cudaFree((void*)a.rl);
        cudaFree(a.dist);
        cudaFree(a.idx);
        cudaFree(a.bq_idx);
        cudaFree(a.bq_count);
        cudaFree(a.workspace);
    }
#endif
    free(query);
    free(ref);
    free(dist);
    free(dist_want);
    free(idx);
    free(idx_want);
    free(bq);
    free(bq_want);
    free(count);
    free(count_want);
    return lab_finish("lab_knn");
}
