/*
 * phases_circle_nms.cu -- where the time of the single-block circle NMS kernel v2 (variant 4)
 * goes: includes kernels/circle_nms.cu with PCOPS_NMS_PHASES defined, so that thread 0 of the
 * kernel prints the clock64 cycles of each phase (sort, grid, cells, lists, scan, outputs),
 * and times every variant with CUDA events (warm L2) on the peer benchmark's kind of input:
 * N boxes uniform in a 100 m x 100 m square, radius 1, scores descending (the sort is skipped)
 * or random. Not part of `make -C lab` (it is a .cu that compiles the kernel itself):
 *
 *   nvcc -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -Ikernels \
 *        lab/phases_circle_nms.cu kernels/common.c -Xcompiler -fopenmp -o /tmp/nms_phases
 *   /tmp/nms_phases
 */
#define PCOPS_NMS_PHASES 1
#include "circle_nms.cu"

#include <cstdio>
#include <cstdlib>
#include <vector>

int main() {
    for (int shuffled = 0; shuffled < 2; ++shuffled) {
        for (int N : {1000, 4096}) {
            std::vector<float> c(2 * N), s(N);
            srand(1000 + N);
            for (int i = 0; i < N; ++i) {
                c[2 * i] = 100.f * rand() / RAND_MAX;
                c[2 * i + 1] = 100.f * rand() / RAND_MAX;
                s[i] = shuffled ? (float)rand() / RAND_MAX : (float)((double)(N - i) / N);
            }
            float *dc, *ds;
            bool* dm;
            int64_t *di, *dn;
            void* ws;
            cudaMalloc(&dc, sizeof(float) * 2 * N);
            cudaMalloc(&ds, sizeof(float) * N);
            cudaMalloc(&dm, N);
            cudaMalloc(&di, sizeof(int64_t) * N);
            cudaMalloc(&dn, sizeof(int64_t));
            cudaMalloc(&ws, 64 << 20);  // more than any variant's workspace at these sizes
            cudaMemcpy(dc, c.data(), sizeof(float) * 2 * N, cudaMemcpyHostToDevice);
            cudaMemcpy(ds, s.data(), sizeof(float) * N, cudaMemcpyHostToDevice);
            cudaEvent_t a, b;
            cudaEventCreate(&a);
            cudaEventCreate(&b);
            for (int v = 1; v <= 4; ++v) {
                for (int r = 0; r < 3; ++r) {  // the first call warms up
                    cudaEventRecord(a);
                    const cudaError_t e = pcops_circle_nms_cuda_variant(
                        PCOPS_FLOAT32, dc, 2, PCOPS_FLOAT32, ds, nullptr, N, 1.0, ws, dm, di,
                        dn, v, 0);
                    cudaEventRecord(b);
                    cudaEventSynchronize(b);
                    float ms = 0;
                    cudaEventElapsedTime(&ms, a, b);
                    int64_t k = 0;
                    cudaMemcpy(&k, dn, sizeof(int64_t), cudaMemcpyDeviceToHost);
                    if (r > 0)
                        printf("%s N=%d variant %d: %.4f ms (events), kept %lld, err %d\n",
                               shuffled ? "random scores" : "descending scores", N, v, ms,
                               (long long)k, (int)e);
                }
            }
            cudaFree(dc);
            cudaFree(ds);
            cudaFree(dm);
            cudaFree(di);
            cudaFree(dn);
            cudaFree(ws);
        }
    }
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
