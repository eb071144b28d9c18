/*
 * grid_nms_host.cu -- the decisions of the circle NMS grid path (kernels/circle_nms/grid.cuh:
 * grid_decide, grid_finish) run on the CPU, against the CPU NMS (kernels/circle_nms.c), on the
 * layouts that stress it: uniform, a line, a line and a far box, two far clusters, one spot,
 * exponentially spread, dense clusters, a chain visited along it; with groups, ties, NaN scores
 * and non-finite centres. The cells, keys and sorts of the CUDA kernels are done here by plain
 * loops with the same functions (grid_cells_of, grid_axis, grid_bucket); every phase visits its
 * items in a fresh random order (the kernels' threads run in any order), and the finish runs
 * with one thread. It proves the decisions' logic without a GPU, and its time per layout (one
 * CPU thread doing the GPU's work) shows that the work follows N, not the layout. Not part of
 * `make -C lab` (nvcc compiles the header's kernels too); from the repository root:
 *
 *   make -C kernels CUDA=0
 *   nvcc -std=c++17 -O2 -arch=sm_90 -Ikernels -Xcompiler -fopenmp lab/grid_nms_host.cu \
 *        kernels/build/cpu/libpcops_kernels.a -o /tmp/grid_nms_host
 *   /tmp/grid_nms_host [N] [seed]
 */
#include "circle_nms/grid.cuh"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

// The host side of grid_decide, one thread: the items of a phase in a fresh random order, or
// (stale) by descending position, so that no box sees a decision of the same phase about an
// earlier box: what the GPU gives when every thread reads before any writes.
struct HostExec {
    std::mt19937_64* rng;
    const int32_t* spos;
    bool stale;
    std::vector<int64_t> perm;

    bool first() const { return true; }
    template <typename F>
    void items(int64_t n, F&& f) {
        perm.resize((size_t)n);
        std::iota(perm.begin(), perm.end(), 0);
        if (stale)
            std::sort(perm.begin(), perm.end(),
                      [&](int64_t a, int64_t b) { return spos[a] > spos[b]; });
        else
            std::shuffle(perm.begin(), perm.end(), *rng);
        for (int64_t s : perm) f(s);
    }
    // The evaluate phase: a scan that runs out of its budget is done again without one, at
    // once (the device lists it and a warp scans it after a barrier; either way the decision is
    // one the unbounded scan may make).
    template <typename T, typename F>
    void evaluate(const GridView<T>& v, const GridCells& c, int64_t n, const int32_t* cur, int,
                  F&& f) {
        items(n, [&](int64_t s) {
            if (!f(s)) grid_evaluate(v, c, s, cur, INT64_MAX);
        });
    }
    void barrier() {}
    template <typename T>
    void pull_open(const GridView<T>& v, const GridCells& c, int64_t n, const int32_t* cur,
                   int32_t* next, uint32_t* left) {
        items(n, [&](int64_t s) {
            grid_pull(v, c, s, cur);
            if (!grid_open(v, s, cur)) return;
            ++*left;
            int32_t& b = next[v.skey[s]];
            if ((int32_t)s < b) b = (int32_t)s;
        });
    }
    bool lead() const { return true; }
    int tid() const { return 0; }
    int nthreads() const { return 1; }
    void sync() {}
    bool sync_or(bool b) { return b; }
    int rounds = 0, windows = 0;
    uint32_t left = 0;
    void note_round(int round, uint32_t now) {
        rounds = round + 1;
        left = now;
    }
    void note_window(int) { ++windows; }
};

struct Stats {
    int rounds, windows;
    uint32_t left;  // undecided after the rounds
};

struct Layout {
    std::string name;
    std::vector<float> xy;  // [N, 2]
    std::vector<float> s;
    std::vector<int64_t> g;  // empty: no groups
    double radius;
};

double key_of(float s) { return (double)pcops_nms_score_key_f32(s); }

// The grid path's decisions on the host; returns keep_idx (kept boxes in visiting order).
template <typename T>
std::vector<int64_t> grid_nms_host(const Layout& L, std::mt19937_64& rng, bool stale,
                                   Stats* stats) {
    const int64_t N = (int64_t)L.s.size();
    std::vector<int32_t> order((size_t)N);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return key_of(L.s[a]) < key_of(L.s[b]); });
    std::vector<T> xs(N), ys(N);
    std::vector<int64_t> gs(N);
    double lo_x = INFINITY, lo_y = INFINITY, hi_x = -INFINITY, hi_y = -INFINITY;
    for (int64_t p = 0; p < N; ++p) {
        xs[p] = (T)L.xy[2 * order[p]];
        ys[p] = (T)L.xy[2 * order[p] + 1];
        gs[p] = L.g.empty() ? 0 : L.g[order[p]];
        if (std::isfinite(xs[p]) && std::isfinite(ys[p])) {
            lo_x = std::min(lo_x, (double)xs[p]);
            lo_y = std::min(lo_y, (double)ys[p]);
            hi_x = std::max(hi_x, (double)xs[p]);
            hi_y = std::max(hi_y, (double)ys[p]);
        }
    }
    const T r2 = (T)(L.radius * L.radius);
    const int64_t B = grid_buckets(N);
    const bool any = lo_x <= hi_x;
    const GridCells cells = grid_cells_of(any ? lo_x : 0, any ? lo_y : 0, any ? hi_x : 0,
                                          any ? hi_y : 0, (double)r2,
                                          sizeof(T) == 4 ? 0x1p-149 : 0x1p-1074,
                                          (uint32_t)(B - 1));
    std::vector<uint32_t> key(N);
    for (int64_t p = 0; p < N; ++p) {
        key[p] = (uint32_t)B;
        if (std::isfinite(xs[p]) && std::isfinite(ys[p]))
            key[p] = grid_bucket(grid_axis((double)xs[p], cells.x0, cells.inv_x),
                                 grid_axis((double)ys[p], cells.y0, cells.inv_y), gs[p],
                                 cells.mask);
    }
    std::vector<int32_t> spos(N);
    std::iota(spos.begin(), spos.end(), 0);
    std::stable_sort(spos.begin(), spos.end(),
                     [&](int32_t a, int32_t b) { return key[a] < key[b]; });
    std::vector<uint32_t> skey(N);
    std::vector<T> sx(N), sy(N);
    std::vector<int64_t> sg(N);
    for (int64_t s = 0; s < N; ++s) {
        skey[s] = key[spos[s]];
        sx[s] = xs[spos[s]];
        sy[s] = ys[spos[s]];
        sg[s] = gs[spos[s]];
    }
    std::vector<int32_t> begin(B + 1);
    for (int64_t b = 0, s = 0; b <= B; ++b) {
        while (s < N && skey[s] < (uint32_t)b) ++s;
        begin[b] = (int32_t)s;
    }
    std::vector<uint8_t> state(N);
    for (int64_t p = 0; p < N; ++p)
        state[p] = std::isfinite(xs[p]) && std::isfinite(ys[p]) ? kUndecided : kKept;
    std::vector<int32_t> cur0(begin.begin(), begin.end() - 1), cur1 = cur0;
    uint32_t count[5] = {0, 0, 0, 0, 0};
    const bool grouped = !L.g.empty();
    GridView<T> v{spos.data(), skey.data(), sx.data(), sy.data(), grouped ? sg.data() : nullptr,
                  begin.data(), xs.data(), ys.data(), grouped ? gs.data() : nullptr, &cells,
                  state.data(), {cur0.data(), cur1.data()}, count, N, r2};
    GridFinishShared sh;
    HostExec x{&rng, spos.data(), stale, {}};
    grid_decide(v, sh, x);
    *stats = {x.rounds, x.windows, x.left};
    std::vector<int64_t> keep;
    for (int64_t p = 0; p < N; ++p) {
        if (state[p] == kUndecided) {
            fprintf(stderr, "position %lld left undecided\n", (long long)p);
            std::exit(1);
        }
        if (state[p] == kKept) keep.push_back(order[p]);
    }
    return keep;
}

template <typename T>
std::vector<int64_t> cpu_nms(const Layout& L) {
    const int64_t N = (int64_t)L.s.size();
    std::vector<T> c(2 * N);
    for (int64_t i = 0; i < 2 * N; ++i) c[i] = (T)L.xy[i];
    std::vector<unsigned char> ws(pcops_circle_nms_workspace_bytes(
        sizeof(T) == 4 ? PCOPS_FLOAT32 : PCOPS_FLOAT64, N) + 1);
    std::vector<int64_t> idx(N);
    int64_t kept = 0;
    const pcops_status st = pcops_circle_nms_cpu(
        sizeof(T) == 4 ? PCOPS_FLOAT32 : PCOPS_FLOAT64, c.data(), 2, PCOPS_FLOAT32, L.s.data(),
        L.g.empty() ? nullptr : L.g.data(), N, L.radius * L.radius, ws.data(), nullptr,
        idx.data(), &kept);
    if (st != PCOPS_SUCCESS) std::exit(2);
    idx.resize(kept);
    return idx;
}

std::vector<Layout> layouts(int64_t N, std::mt19937_64& rng) {
    std::uniform_real_distribution<double> U(0.0, 1.0);
    std::normal_distribution<double> G(0.0, 1.0);
    std::vector<Layout> out;
    auto scores = [&](Layout& L) {
        L.s.resize(N);
        for (auto& v : L.s) v = (float)U(rng);
    };
    auto add = [&](const char* name, double radius, auto&& xy_of) {
        Layout L;
        L.name = name;
        L.radius = radius;
        L.xy.resize(2 * N);
        for (int64_t i = 0; i < N; ++i) {
            double x, y;
            xy_of(i, x, y);
            L.xy[2 * i] = (float)x;
            L.xy[2 * i + 1] = (float)y;
        }
        scores(L);
        out.push_back(L);
    };
    const double side = std::sqrt((double)N);
    add("uniform", 1.0, [&](int64_t, double& x, double& y) {
        x = U(rng) * side;
        y = U(rng) * side;
    });
    add("line", 1.0, [&](int64_t, double& x, double& y) { x = U(rng) * N; y = 0; });
    add("line + far box", 1.0, [&](int64_t i, double& x, double& y) {
        x = U(rng) * N;
        y = i == 0 ? 10.0 * N : 0.0;
    });
    add("two far clusters", 1.0, [&](int64_t i, double& x, double& y) {
        const double c = (i & 1) ? 1e7 : 0.0;
        x = c + U(rng) * side / 1.4;
        y = c + U(rng) * side / 1.4;
    });
    add("one spot", 1.0, [&](int64_t, double& x, double& y) { x = 5.0; y = 5.0; });
    add("exponential", 1.0, [&](int64_t, double& x, double& y) {
        x = (U(rng) < 0.5 ? -1 : 1) * std::exp(U(rng) * 40.0 - 20.0);
        y = (U(rng) < 0.5 ? -1 : 1) * std::exp(U(rng) * 40.0 - 20.0);
    });
    std::vector<double> cx(N / 100 + 1), cy(N / 100 + 1);
    for (size_t k = 0; k < cx.size(); ++k) {
        cx[k] = U(rng) * side * 3;
        cy[k] = U(rng) * side * 3;
    }
    add("dense clusters", 1.0, [&](int64_t i, double& x, double& y) {
        const size_t k = (size_t)(i % (int64_t)cx.size());
        x = cx[k] + G(rng) * 0.2;
        y = cy[k] + G(rng) * 0.2;
    });
    add("chain visited along it", 0.5, [&](int64_t i, double& x, double& y) {
        x = i * 0.45;
        y = 0;
    });
    for (int64_t i = 0; i < N; ++i) out.back().s[i] = (float)(1.0 - (double)i / N);
    // groups, ties, NaN scores, non-finite centres
    Layout L = out[0];
    L.name = "uniform, 3 groups, ties, NaN, non-finite";
    L.g.resize(N);
    for (int64_t i = 0; i < N; ++i) {
        L.g[i] = (int64_t)(U(rng) * 3);
        L.s[i] = std::round(L.s[i] * 8) / 8;
        if (i % 7 == 0) L.s[i] = NAN;
        if (i % 13 == 0) L.xy[2 * i] = NAN;
        if (i % 17 == 0) L.xy[2 * i + 1] = INFINITY;
    }
    out.push_back(L);
    for (double radius : {0.0, 1e-30, 1e20}) {  // r2 zero, zero in float, inf in float
        L = out[0];
        L.name = "uniform, radius " + std::to_string(radius);
        L.radius = radius;
        out.push_back(L);
    }
    L = out[0];
    L.name = "uniform over 1e30, radius 1e28";
    for (auto& v : L.xy) v *= 1e30f / (float)side;
    L.radius = 1e28;
    out.push_back(L);
    L = out[4];
    L.name = "one spot, 5 groups";
    L.g.resize(N);
    for (int64_t i = 0; i < N; ++i) L.g[i] = i % 5;
    out.push_back(L);
    return out;
}

template <typename T>
int run(const Layout& L, std::mt19937_64& rng, bool stale) {
    const auto t0 = std::chrono::steady_clock::now();
    Stats st;
    const std::vector<int64_t> got = grid_nms_host<T>(L, rng, stale, &st);
    const auto t1 = std::chrono::steady_clock::now();
    const std::vector<int64_t> want = cpu_nms<T>(L);
    const bool same = got == want;
    printf("%-42s %s%s N=%zu kept %zu: %s; %d rounds, %u left to the finish, %d windows; host "
           "%.3f s\n", L.name.c_str(), sizeof(T) == 4 ? "f32" : "f64", stale ? " stale" : "",
           L.s.size(), want.size(), same ? "same" : "DIFFERENT", st.rounds, st.left, st.windows,
           std::chrono::duration<double>(t1 - t0).count());
    return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    const int64_t N = argc > 1 ? atoll(argv[1]) : 20000;
    const uint64_t seed = argc > 2 ? strtoull(argv[2], nullptr, 10) : (uint64_t)time(nullptr);
    printf("grid_nms_host N=%lld seed=%llu\n", (long long)N, (unsigned long long)seed);
    std::mt19937_64 rng(seed);
    int bad = 0;
    for (const Layout& L : layouts(N, rng)) {
        bad += run<float>(L, rng, false);
        bad += run<float>(L, rng, true);
        bad += run<double>(L, rng, false);
    }
    printf("%s\n", bad ? "FAILED" : "all layouts match the CPU");
    return bad ? 1 : 0;
}
