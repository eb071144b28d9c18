/*
 * lab_group.c -- group and group_backward through the C API: CPU against a naive gather and an
 * ordered sum, CUDA against the CPU (bitwise), a CUDA graph replay, timings with L2 flushed.
 *
 * B batch, N points, C channels, M groups, S neighbours. float32.
 */
#include "lab.h"

enum { B = 2, N = 3000, C = 64, M = 512, S = 32 };

/* out[b,m,s,:] = features[b, idx, :], zeros where idx is outside [0, N). */
static void naive_group(const float* features, const int64_t* idx, float* out) {
    for (int64_t r = 0; r < (int64_t)B * M * S; ++r) {
        const int64_t b = r / ((int64_t)M * S), n = idx[r];
        for (int64_t c = 0; c < C; ++c)
            out[r * C + c] = (n >= 0 && n < N) ? features[(b * N + n) * C + c] : 0.0f;
    }
}

/* grad[b,n,:] = the rows with idx == n added in ascending (m,s) order from 0: the contract. */
static void naive_backward(const float* grad_out, const int64_t* idx, float* grad) {
    memset(grad, 0, sizeof(float) * (size_t)B * N * C);
    for (int64_t r = 0; r < (int64_t)B * M * S; ++r) {
        const int64_t b = r / ((int64_t)M * S), n = idx[r];
        if (n < 0 || n >= N) continue;
        for (int64_t c = 0; c < C; ++c) grad[(b * N + n) * C + c] += grad_out[r * C + c];
    }
}

#ifdef PCOPS_WITH_CUDA
typedef struct {
    const float *features, *grad_out;
    const int64_t* idx;
    float *out, *grad;
    void* workspace;
} GroupArgs;

static cudaError_t launch_forward(void* ctx, cudaStream_t stream) {
    const GroupArgs* a = (const GroupArgs*)ctx;
    return pcops_group_cuda(PCOPS_FLOAT32, a->features, a->idx, PCOPS_INDEX_INT64, B, N, C, M,
                            S, a->out, stream);
}

static cudaError_t launch_backward(void* ctx, cudaStream_t stream) {
    const GroupArgs* a = (const GroupArgs*)ctx;
    return pcops_group_backward_cuda(PCOPS_FLOAT32, a->grad_out, a->idx, PCOPS_INDEX_INT64, B,
                                     N, C, M, S, a->workspace, a->grad, stream);
}
#endif

int main(int argc, char** argv) {
    lab_seed(argc, argv);
    const size_t n_feat = (size_t)B * N * C, n_idx = (size_t)B * M * S, n_out = n_idx * C;
    float* features = (float*)lab_malloc(n_feat * sizeof(float));
    float* grad_out = (float*)lab_malloc(n_out * sizeof(float));
    int64_t* idx = (int64_t*)lab_malloc(n_idx * sizeof(int64_t));
    for (size_t i = 0; i < n_feat; ++i) features[i] = lab_uniform(-1, 1);
    for (size_t i = 0; i < n_out; ++i) grad_out[i] = lab_uniform(-1, 1);
    for (size_t i = 0; i < n_idx; ++i) {  /* mostly valid, some -1, a few out of range */
        const uint64_t r = lab_next() % 100;
        idx[i] = r < 10 ? -1 : r < 12 ? N + (int64_t)r : (int64_t)(lab_next() % N);
    }

    float* out = (float*)lab_malloc(n_out * sizeof(float));
    float* want = (float*)lab_malloc(n_out * sizeof(float));
    double t = lab_seconds();
    lab_require_status(
        pcops_group_cpu(PCOPS_FLOAT32, features, idx, PCOPS_INDEX_INT64, B, N, C, M, S, out),
        "pcops_group_cpu");
    printf("cpu group: %.3f ms\n", 1e3 * (lab_seconds() - t));
    naive_group(features, idx, want);
    lab_check_equal(out, want, n_out, sizeof(float), "cpu group vs naive gather");

    float* grad = (float*)lab_malloc(n_feat * sizeof(float));
    float* grad_want = (float*)lab_malloc(n_feat * sizeof(float));
    t = lab_seconds();
    lab_require_status(
        pcops_group_backward_cpu(PCOPS_FLOAT32, grad_out, idx, PCOPS_INDEX_INT64, B, N, C, M, S,
                                 NULL, grad),
        "pcops_group_backward_cpu");
    printf("cpu group_backward: %.3f ms\n", 1e3 * (lab_seconds() - t));
    naive_backward(grad_out, idx, grad_want);
    lab_check_equal(grad, grad_want, n_feat, sizeof(float), "cpu backward vs ordered sum");

#ifdef PCOPS_WITH_CUDA
    if (lab_gpu()) {
        GroupArgs a;
        a.features = (const float*)lab_to_device(features, n_feat * sizeof(float));
        a.grad_out = (const float*)lab_to_device(grad_out, n_out * sizeof(float));
        a.idx = (const int64_t*)lab_to_device(idx, n_idx * sizeof(int64_t));
        a.out = (float*)lab_to_device(NULL, n_out * sizeof(float));
        a.grad = (float*)lab_to_device(NULL, n_feat * sizeof(float));
        a.workspace = lab_to_device(NULL, pcops_group_backward_cuda_workspace_bytes(B, N, M, S));

        LAB_CUDA(launch_forward(&a, 0));
        LAB_CUDA(launch_backward(&a, 0));
        float* got = (float*)lab_to_host(a.out, n_out * sizeof(float));
        float* got_grad = (float*)lab_to_host(a.grad, n_feat * sizeof(float));
        lab_check_equal(got, out, n_out, sizeof(float), "cuda group vs cpu");
        lab_check_equal(got_grad, grad, n_feat, sizeof(float), "cuda backward vs cpu");

        LAB_CUDA(cudaMemset(a.out, 0xff, n_out * sizeof(float)));
        LAB_CUDA(cudaMemset(a.grad, 0xff, n_feat * sizeof(float)));
        lab_graph_replay(launch_forward, &a);
        lab_graph_replay(launch_backward, &a);
        free(got);
        free(got_grad);
        got = (float*)lab_to_host(a.out, n_out * sizeof(float));
        got_grad = (float*)lab_to_host(a.grad, n_feat * sizeof(float));
        lab_check_equal(got, out, n_out, sizeof(float), "cuda group in a graph vs cpu");
        lab_check_equal(got_grad, grad, n_feat, sizeof(float), "cuda backward in a graph vs cpu");

        /* bytes moved: forward reads idx and the gathered rows, writes out; the backward reads
         * idx and grad_out and writes grad (its sort scratch not counted) */
        const double fwd_bytes = (double)n_idx * 8 + 2.0 * (double)n_out * 4;
        const double bwd_bytes = (double)n_idx * 8 + (double)n_out * 4 + (double)n_feat * 4;
        const double fwd = lab_time_cold_l2(launch_forward, &a, 50);
        const double bwd = lab_time_cold_l2(launch_backward, &a, 50);
        printf("cuda group (cold L2): %.4f ms, %.1f GB/s\n", fwd, fwd_bytes / fwd * 1e-6);
        printf("cuda group_backward (cold L2): %.4f ms, %.1f GB/s\n", bwd, bwd_bytes / bwd * 1e-6);
        free(got);
        free(got_grad);
        cudaFree((void*)a.features);
        cudaFree((void*)a.grad_out);
        cudaFree((void*)a.idx);
        cudaFree(a.out);
        cudaFree(a.grad);
        cudaFree(a.workspace);
    }
#endif
    free(features);
    free(grad_out);
    free(idx);
    free(out);
    free(want);
    free(grad);
    free(grad_want);
    return lab_finish("lab_group");
}
