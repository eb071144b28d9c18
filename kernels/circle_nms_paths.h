/*
 * circle_nms_paths.h -- the paths of circle NMS (kernels/paths.h says how this table is used).
 * What each path does and when the plan picks it: kernels/README.md, the head of each path's
 * file (kernels/circle_nms/<path>.cuh; SWEEP: kernels/circle_nms.c), kernels/circle_nms/plan.cuh.
 */
#ifndef PCOPS_CIRCLE_NMS_PATHS_H
#define PCOPS_CIRCLE_NMS_PATHS_H

/* X(NAME, id, name, devices, dtypes) */
#define PCOPS_CIRCLE_NMS_PATHS(X)                                                            \
    X(AUTO, 0, "auto", PCOPS_ON_CPU | PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                        \
    X(GRID, 1, "grid", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                                       \
    X(BLOCK, 2, "block", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                                     \
    X(FLOW, 3, "flow", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                                       \
    X(SWEEP, 4, "sweep", PCOPS_ON_CPU, PCOPS_ANY_FLOAT)

#endif /* PCOPS_CIRCLE_NMS_PATHS_H */
