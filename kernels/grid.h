/*
 * grid.h -- the uniform grid (cell list) shared by kNN and ball query, CPU and CUDA.
 *
 * A cloud's valid refs with finite coordinates are binned into a grid of dims[0] x dims[1] x
 * dims[2] cells over their bounding box [lo, hi]; cells are numbered x fastest. The refs of a
 * cell lie contiguously in a sorted copy, in index order inside a cell (a stable counting
 * sort), so a ball query can stop inside a cell as soon as the indices pass its limit. A ref
 * with a non-finite coordinate is never a neighbour (its squared distance is NaN or +inf), so
 * it stays out of the grid.
 *
 * The cell size comes from a cell budget (cells at most `budget`, chosen by the caller from the
 * sizes only, so that the CUDA path needs no host read of the data) and a minimum cell edge
 * (the ball-query radius; 0 for kNN). Axes of extent 0 (a plane, a line, identical points)
 * get one cell. Cell coordinates are computed in double relative to lo, so UTM-sized
 * coordinates (1e5..1e6) bin as well as coordinates near 0.
 *
 * Exactness. The search itself never decides a result: every candidate's squared distance is
 * computed with the contract's formula and compared by the full key (dist2, idx). The grid
 * only decides which refs need not be looked at, from lower bounds on the distance from the
 * query to a cell, or to every cell not visited yet. Those bounds are made conservative twice:
 * each axis gap shrinks by `margin` (an absolute slack far above the rounding of the binning
 * in double), and the squared bound is multiplied by PCOPS_GRID_SHRINK (far above the relative
 * error of a squared distance computed in float32). A ref is skipped only when its bound is
 * STRICTLY above the current k-th distance, so refs at an equal distance with a lower index
 * are still visited.
 */
#ifndef PCOPS_GRID_H
#define PCOPS_GRID_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "geometry.h"

/* 1 - 2**-14: a squared distance computed in float32 is at least (1 - 6 * 2**-24) times the
 * exact one; the slack leaves room for the rounding of the bound itself. */
#define PCOPS_GRID_SHRINK (1.0 - 1.0 / 16384.0)
/* Relative slack of the binning (double arithmetic on coordinates of magnitude |lo| + extent). */
#define PCOPS_GRID_MARGIN_REL 1e-9

/* The CPU build spends budget / PCOPS_GRID_OCCUPANCY_SPARE cells over the box, and refines the
 * grid up to the whole budget where most of those cells stay empty (kernels/grid_cpu.inc). */
#define PCOPS_GRID_OCCUPANCY_SPARE 8

typedef struct pcops_grid {
    double lo[3];     /* box minimum */
    double h[3];      /* cell edge per axis (extent / dims) */
    double inv[3];    /* dims / extent per axis; 0 for an axis of one cell */
    double margin;    /* absolute slack of every gap */
    int32_t dims[3];  /* cells per axis, >= 1 */
    int32_t cells;    /* dims[0] * dims[1] * dims[2] (0: the grid is empty) */
} pcops_grid;

/* Whether a point has three finite coordinates (a grid ref; a query that can have neighbours). */
PCOPS_HD int pcops_grid_finite3(double x, double y, double z) {
    return isfinite(x) && isfinite(y) && isfinite(z);
}

/* Sets up the grid of a box [lo, hi] (finite, lo <= hi) with at most `budget` >= 1 cells and
 * a cell edge of at least `min_cell` >= 0. The edge h is chosen so that the box holds about
 * `budget` cubes of edge h, counting only the axes longer than h (the others get one cell). */
PCOPS_HD void pcops_grid_setup(pcops_grid* g, const double lo[3], const double hi[3],
                               int64_t budget, double min_cell) {
    double ext[3];
    double scale = 0.0;
    for (int a = 0; a < 3; ++a) {
        ext[a] = hi[a] - lo[a];
        if (!(ext[a] > 0.0) || !isfinite(ext[a])) ext[a] = 0.0;
        g->lo[a] = lo[a];
        const double m = fabs(lo[a]) + ext[a];
        scale = m > scale ? m : scale;
    }
    if (budget < 1) budget = 1;
    /* axes in descending extent */
    int order[3] = {0, 1, 2};
    for (int i = 0; i < 3; ++i)
        for (int j = i + 1; j < 3; ++j)
            if (ext[order[j]] > ext[order[i]]) {
                const int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    double h = 0.0;
    for (int d = 3; d >= 1; --d) {
        const double small = ext[order[d - 1]];
        if (!(small > 0.0)) continue;
        double prod = 1.0;
        for (int i = 0; i < d; ++i) prod *= ext[order[i]];
        h = d == 3 ? cbrt(prod / (double)budget)
                   : (d == 2 ? sqrt(prod / (double)budget) : prod / (double)budget);
        if (small >= h) break;
    }
    if (h < min_cell) h = min_cell;
    int64_t cells = 1;
    for (int a = 0; a < 3; ++a) {
        double n = h > 0.0 ? floor(ext[a] / h) : 0.0;
        if (!(n >= 1.0)) n = 1.0;
        if (n > (double)budget) n = (double)budget;
        g->dims[a] = (int32_t)n;
        cells *= (int64_t)n;
    }
    /* rounding of cbrt / sqrt may overshoot the budget by a cell or so: trim the longest axis */
    while (cells > budget) {
        int a = 0;
        for (int i = 1; i < 3; ++i)
            if (g->dims[i] > g->dims[a]) a = i;
        cells = cells / g->dims[a] * (g->dims[a] - 1);
        g->dims[a] -= 1;
    }
    for (int a = 0; a < 3; ++a) {
        if (g->dims[a] > 1) {
            g->inv[a] = (double)g->dims[a] / ext[a];
            g->h[a] = ext[a] / (double)g->dims[a];
        } else {
            g->inv[a] = 0.0;
            g->h[a] = ext[a];
        }
    }
    g->cells = (int32_t)cells;
    g->margin = PCOPS_GRID_MARGIN_REL * scale + 1e-300;
}

/* An empty grid: no refs to search. */
PCOPS_HD void pcops_grid_set_empty(pcops_grid* g) {
    for (int a = 0; a < 3; ++a) {
        g->lo[a] = 0.0;
        g->h[a] = 0.0;
        g->inv[a] = 0.0;
        g->dims[a] = 1;
    }
    g->margin = 0.0;
    g->cells = 0;
}

/* Cell coordinate along axis a of a finite coordinate x, clamped to [0, dims[a]). */
PCOPS_HD int32_t pcops_grid_coord(const pcops_grid* g, int a, double x) {
    const double t = (x - g->lo[a]) * g->inv[a];
    if (!(t >= 1.0)) return 0;
    if (t >= (double)g->dims[a]) return g->dims[a] - 1;
    return (int32_t)t;
}

/* Linear cell number of a finite point. */
PCOPS_HD int32_t pcops_grid_cell(const pcops_grid* g, double x, double y, double z) {
    return (pcops_grid_coord(g, 2, z) * g->dims[1] + pcops_grid_coord(g, 1, y)) * g->dims[0] +
           pcops_grid_coord(g, 0, x);
}

/* Gap along axis a between the coordinate q and the slab of cells [c0, c1] of that axis (0
 * inside), shrunk by the margin. The slab of the border cells ends at the box (every ref lies
 * in the box), so queries outside the box get a positive gap too. */
PCOPS_HD double pcops_grid_axis_gap(const pcops_grid* g, int a, double q, int32_t c0,
                                    int32_t c1) {
    double gap = 0.0;
    const double face0 = g->lo[a] + (double)c0 * g->h[a];
    const double face1 = g->lo[a] + (double)(c1 + 1) * g->h[a];
    if (q < face0) gap = face0 - q;
    if (q > face1) gap = q - face1;
    gap -= g->margin;
    return gap > 0.0 ? gap : 0.0;
}

/* A lower bound (conservative, see the top) on the squared distance from q to any ref in cell
 * (cx, cy, cz). */
PCOPS_HD double pcops_grid_cell_bound(const pcops_grid* g, const double q[3], int32_t cx,
                                      int32_t cy, int32_t cz) {
    const double gx = pcops_grid_axis_gap(g, 0, q[0], cx, cx);
    const double gy = pcops_grid_axis_gap(g, 1, q[1], cy, cy);
    const double gz = pcops_grid_axis_gap(g, 2, q[2], cz, cz);
    return (gx * gx + gy * gy + gz * gz) * PCOPS_GRID_SHRINK;
}

/* A lower bound on the squared distance from q to any ref outside the block of cells
 * [c - r, c + r] (clipped to the grid) around the query's cell c, or +inf when that block is
 * the whole grid. An unvisited ref lies beyond one of the block's faces that has cells behind
 * it; its distance is at least the gap to that face. */
PCOPS_HD double pcops_grid_ring_bound(const pcops_grid* g, const double q[3], const int32_t c[3],
                                      int32_t r) {
    double best = INFINITY;
    for (int a = 0; a < 3; ++a) {
        if (c[a] - r > 0) {
            double gap = q[a] - (g->lo[a] + (double)(c[a] - r) * g->h[a]) - g->margin;
            gap = gap > 0.0 ? gap : 0.0;
            best = gap < best ? gap : best;
        }
        if (c[a] + r < g->dims[a] - 1) {
            double gap = (g->lo[a] + (double)(c[a] + r + 1) * g->h[a]) - q[a] - g->margin;
            gap = gap > 0.0 ? gap : 0.0;
            best = gap < best ? gap : best;
        }
    }
    return best == INFINITY ? INFINITY : best * best * PCOPS_GRID_SHRINK;
}

/* The limit of a ball query's cell bounds (a cell is skipped when its bound >= the limit): r2,
 * or NaN, which no bound reaches, when radius**2 overflowed to +inf. Then every ref with finite
 * coordinates is inside (its squared distance saturates below +inf, geometry.h), also where
 * the bound itself overflows to +inf. */
PCOPS_HD double pcops_grid_ball_limit(double r2) { return r2 < INFINITY ? r2 : NAN; }

/* Largest ring around cell c that still holds cells of the grid. */
PCOPS_HD int32_t pcops_grid_max_ring(const pcops_grid* g, const int32_t c[3]) {
    int32_t r = 0;
    for (int a = 0; a < 3; ++a) {
        const int32_t lo = c[a], hi = g->dims[a] - 1 - c[a];
        r = lo > r ? lo : r;
        r = hi > r ? hi : r;
    }
    return r;
}

/* Cells per kNN grid of a cloud of N refs (the budget): about one cell per
 * PCOPS_GRID_KNN_POINTS_PER_CELL refs, more for real scans whose boxes are mostly empty is the
 * caller's choice through `cells_per_point`. */
PCOPS_HD int64_t pcops_grid_budget(int64_t N, double cells_per_point) {
    double c = (double)N * cells_per_point;
    if (c < 1.0) c = 1.0;
    if (c > 1073741824.0) c = 1073741824.0; /* 2**30: the cell numbers stay int32 */
    return (int64_t)c;
}

/* The scratch of the CPU grid paths (kNN, ball query) for B clouds of M queries and N refs with
 * `budget` cells each: per cloud its pcops_grid, the cell starts [budget + 1] (int32), the refs
 * sorted by cell (x, y, z arrays of `scalar` bytes per element and their indices, int32), the
 * cell of every ref (int32, build scratch), and the queries in cell order: their order and
 * cells [M] and the counts of the counting sort [budget + 2] (int32). */
typedef struct pcops_grid_scratch {
    pcops_grid* grids; /* [B] */
    int32_t* start;    /* [B, budget + 1] */
    void* x;           /* [B, N] */
    void* y;           /* [B, N] */
    void* z;           /* [B, N] */
    int32_t* id;       /* [B, N] */
    int32_t* cell;     /* [B, N] */
    int32_t* qorder;   /* [B, M] */
    int32_t* qcell;    /* [B, M] */
    int32_t* qcounts;  /* [B, budget + 2] */
} pcops_grid_scratch;

/* Carves the scratch from the carver (geometry.h; base NULL: only counts). */
PCOPS_HD void pcops_grid_carve(pcops_carver* w, int64_t B, int64_t M, int64_t N, int64_t budget,
                               size_t scalar, pcops_grid_scratch* s) {
    s->grids = (pcops_grid*)pcops_carve(w, B, sizeof(pcops_grid));
    s->start = (int32_t*)pcops_carve(w, B * (budget + 1), sizeof(int32_t));
    s->x = pcops_carve(w, B * N, scalar);
    s->y = pcops_carve(w, B * N, scalar);
    s->z = pcops_carve(w, B * N, scalar);
    s->id = (int32_t*)pcops_carve(w, B * N, sizeof(int32_t));
    s->cell = (int32_t*)pcops_carve(w, B * N, sizeof(int32_t));
    s->qorder = (int32_t*)pcops_carve(w, B * M, sizeof(int32_t));
    s->qcell = (int32_t*)pcops_carve(w, B * M, sizeof(int32_t));
    s->qcounts = (int32_t*)pcops_carve(w, B * (budget + 2), sizeof(int32_t));
}

#endif /* PCOPS_GRID_H */
