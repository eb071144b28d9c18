/*
 * knn_paths.h -- the paths of kNN (kernels/paths.h says how this table is used). What each
 * path does and when the plan picks it: kernels/README.md, and the head of each path's file.
 */
#ifndef PCOPS_KNN_PATHS_H
#define PCOPS_KNN_PATHS_H

/* X(NAME, id, name, devices, dtypes) */
#define PCOPS_KNN_PATHS(X)                                                                   \
    X(AUTO, 0, "auto", PCOPS_ON_CPU | PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                        \
    X(BRUTE, 1, "brute", PCOPS_ON_CPU | PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                      \
    X(GRID, 2, "grid", PCOPS_ON_CPU | PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                        \
    X(BRUTE_HEAP, 3, "brute_heap", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                           \
    X(GRID_BASELINE, 4, "grid_baseline", PCOPS_ON_CPU | PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)      \
    X(WARP_SELECT, 5, "warp_select", PCOPS_ON_CUDA, PCOPS_F32)                               \
    X(GRID_SELECT, 6, "grid_select", PCOPS_ON_CUDA, PCOPS_F32)                               \
    X(GRID_BATCH, 7, "grid_batch", PCOPS_ON_CUDA, PCOPS_F32)                                 \
    X(BRUTE_BLOCKED, 8, "brute_blocked", PCOPS_ON_CPU, PCOPS_F32)                            \
    X(TC, 9, "tc", PCOPS_ON_CUDA, PCOPS_F32)

#endif /* PCOPS_KNN_PATHS_H */
