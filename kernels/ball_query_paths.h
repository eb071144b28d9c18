/*
 * ball_query_paths.h -- the paths of ball query (kernels/paths.h says how this table is used).
 * What each path does and when the plan picks it: kernels/README.md, and the head of each
 * path's file.
 */
#ifndef PCOPS_BALL_QUERY_PATHS_H
#define PCOPS_BALL_QUERY_PATHS_H

/* X(NAME, id, name, devices, dtypes) */
#define PCOPS_BALL_QUERY_PATHS(X)                                                            \
    X(AUTO, 0, "auto", PCOPS_ON_CPU | PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                        \
    X(BRUTE, 1, "brute", PCOPS_ON_CPU | PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                      \
    X(GRID, 2, "grid", PCOPS_ON_CPU | PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                        \
    X(BRUTE_SPLIT, 3, "brute_split", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)                         \
    X(SPLIT_SORTED, 4, "split_sorted", PCOPS_ON_CUDA, PCOPS_ANY_FLOAT)

#endif /* PCOPS_BALL_QUERY_PATHS_H */
