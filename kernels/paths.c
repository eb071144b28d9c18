/*
 * paths.c -- the path tables of kernels/paths.h, generated from the X-macros of
 * kernels/<op>_paths.h (the C enums of pcops.h come from the same lists).
 */
#include <string.h>

#include "pcops.h"

#define PCOPS_PATH_ROW(NAME, id, name, devices, dtypes) {id, name, devices, dtypes},

static const pcops_path_info fps_paths[] = {PCOPS_FPS_PATHS(PCOPS_PATH_ROW)};
static const pcops_path_info knn_paths[] = {PCOPS_KNN_PATHS(PCOPS_PATH_ROW)};
static const pcops_path_info ball_query_paths[] = {PCOPS_BALL_QUERY_PATHS(PCOPS_PATH_ROW)};
static const pcops_path_info circle_nms_paths[] = {PCOPS_CIRCLE_NMS_PATHS(PCOPS_PATH_ROW)};

#define PCOPS_PATH_TABLE(op_name, rows)                                                      \
    if (strcmp(op, op_name) == 0) {                                                          \
        *count = (int)(sizeof rows / sizeof rows[0]);                                        \
        return rows;                                                                         \
    }

const pcops_path_info* pcops_path_table(const char* op, int* count) {
    *count = 0;
    if (op == NULL) return NULL;
    PCOPS_PATH_TABLE("furthest_point_sample", fps_paths)
    PCOPS_PATH_TABLE("knn", knn_paths)
    PCOPS_PATH_TABLE("ball_query", ball_query_paths)
    PCOPS_PATH_TABLE("circle_nms", circle_nms_paths)
    return NULL;
}
