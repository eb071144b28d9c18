/*
 * paths.h -- the path tables of the ops that have several paths (part of the C API; included
 * by pcops.h).
 *
 * An op with several paths (FPS, kNN, ball query, circle NMS) lists them ONCE, in an X-macro in
 * kernels/<op>_paths.h:
 *
 *     #define PCOPS_FPS_PATHS(X) \
 *         X(AUTO,   0, "auto",   PCOPS_ON_CPU | PCOPS_ON_CUDA, PCOPS_ANY_FLOAT) \
 *         X(SIMPLE, 1, "simple", PCOPS_ON_CPU | PCOPS_ON_CUDA, PCOPS_ANY_FLOAT) \
 *         ...
 *
 * (NAME, id, name, devices, dtypes). From that one list come
 *   - the C enum (pcops.h: PCOPS_FPS_SIMPLE = 1, ..., and PCOPS_FPS_PATH_END),
 *   - the table that pcops_path_table() returns (kernels/paths.c): names, devices and dtypes,
 *     which the bindings use to check a forced path and to name it in messages,
 *   - and, through that function, the check of the Python list (pcops/_paths.py,
 *     tests/test_paths.py).
 * AUTO (id 0) lets the op's plan choose; any other id forces that path. A forced path that
 * does not run on the device, does not take the dtype, or cannot take the sizes is an error
 * (PCOPS_ERROR_INVALID_VALUE / cudaErrorInvalidValue), never a silent substitute.
 */
#ifndef PCOPS_PATHS_H
#define PCOPS_PATHS_H

/* Where a path runs (pcops_path_info.devices). */
#define PCOPS_ON_CPU 1
#define PCOPS_ON_CUDA 2

/* The dtypes a path takes (pcops_path_info.dtypes): bit (1 << pcops_dtype). */
#define PCOPS_F32 1
#define PCOPS_F64 2
#define PCOPS_ANY_FLOAT (PCOPS_F32 | PCOPS_F64)

typedef struct pcops_path_info {
    int id;           /* the value of the op's enum; 0 is AUTO */
    const char* name; /* lower case, as in Python: "auto", "simple", "bucket_rounds", ... */
    int devices;      /* PCOPS_ON_CPU | PCOPS_ON_CUDA */
    int dtypes;       /* PCOPS_F32 | PCOPS_F64 */
} pcops_path_info;

/* X-macro helpers for the enums of pcops.h: one enumerator per table row. */
#define PCOPS_PATH_ENUM_FPS(NAME, id, name, devices, dtypes) PCOPS_FPS_##NAME = id,
#define PCOPS_PATH_ENUM_KNN(NAME, id, name, devices, dtypes) PCOPS_KNN_##NAME = id,
#define PCOPS_PATH_ENUM_BALL_QUERY(NAME, id, name, devices, dtypes) PCOPS_BALL_QUERY_##NAME = id,
#define PCOPS_PATH_ENUM_CIRCLE_NMS(NAME, id, name, devices, dtypes) PCOPS_CIRCLE_NMS_##NAME = id,

#include "fps_paths.h"
#include "knn_paths.h"
#include "ball_query_paths.h"
#include "circle_nms_paths.h"

#endif /* PCOPS_PATHS_H */
