/*
 * circle_nms_paths.h -- the paths of circle NMS (kernels/paths.h says how this table is used).
 * What each path does and when the plan picks it: kernels/README.md, and the head of each
 * path's file.
 */
#ifndef PCOPS_CIRCLE_NMS_PATHS_H
#define PCOPS_CIRCLE_NMS_PATHS_H

/* X(NAME, id, name, devices, dtypes) */
#define PCOPS_CIRCLE_NMS_PATHS(X)                                                            \
    X(AUTO, 0, "auto", PCOPS_ON_CPU | PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                        \
    X(BLOCK, 1, "block", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                                     \
    X(BITMASK, 2, "bitmask", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                                 \
    X(GRID, 3, "grid", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                                       \
    X(BLOCK_V2, 4, "block_v2", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                               \
    X(TILES, 5, "tiles", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                                     \
    X(FLOW, 6, "flow", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                                       \
    X(SWEEP, 7, "sweep", PCOPS_ON_CPU, PCOPS_ANY_FLOAT)

#endif /* PCOPS_CIRCLE_NMS_PATHS_H */
