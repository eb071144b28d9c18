/*
 * fps_paths.h -- the paths of furthest point sampling (kernels/paths.h says how this table is
 * used). What each path does and when the plan picks it: kernels/README.md, and the head of
 * each path's file.
 */
#ifndef PCOPS_FPS_PATHS_H
#define PCOPS_FPS_PATHS_H

/* X(NAME, id, name, devices, dtypes) */
#define PCOPS_FPS_PATHS(X)                                                                   \
    X(AUTO, 0, "auto", PCOPS_ON_CPU | PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                        \
    X(SIMPLE, 1, "simple", PCOPS_ON_CPU | PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                    \
    X(TREE, 2, "tree", PCOPS_ON_CPU, PCOPS_ANY_FLOAT)                                        \
    X(WARP, 3, "warp", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                                       \
    X(BLOCK, 4, "block", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                                     \
    X(CLUSTER, 5, "cluster", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                                 \
    X(GRID, 6, "grid", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                                       \
    X(BUCKET, 7, "bucket", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                                   \
    X(BUCKET_GROUPS, 8, "bucket_groups", PCOPS_ON_CUDA, PCOPS_F32)                           \
    X(BUCKET_ROUNDS, 9, "bucket_rounds", PCOPS_ON_CUDA, PCOPS_F32)                           \
    X(BUCKET_ROUNDS_CLUSTER, 10, "bucket_rounds_cluster", PCOPS_ON_CUDA, PCOPS_F32)          \
    X(BLOCK_PRUNED, 11, "block_pruned", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)

#endif /* PCOPS_FPS_PATHS_H */
