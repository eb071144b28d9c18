#!/usr/bin/env python3
"""Summary of a benchmarks/ab_trees.sh run (markdown on stdout):

  python3 benchmarks/ab_summary.py OUT

- in one process (OUT/inprocess.txt, lab/ab_search): per row and mode, the reference build's
  median and every other build's median ratio to it with its 95% interval; the reference's
  copy ("<ref>copy") is the noise floor: the same code, loaded twice;
- across processes (OUT/processes.txt: ab_search, one build per process; OUT/torch.txt:
  benchmarks/ab_torch.py, the torch extension): per row and build, the median of the process
  medians and their range; the ratio of each build to the reference, and the ratio between
  the reference's own fastest and slowest process (what a fresh process alone moves).
"""
import os
import statistics
import sys
from collections import defaultdict

ROW_ORDER = ["K1", "K2", "K3", "K4", "K5", "K8", "Q1", "Q2", "D8", "DG"]


def parse(path):
    """[(proc, row, mode, label, median, p10, p90, min, ratio, lo, hi, n, same)]"""
    out, proc = [], 0
    if not os.path.isfile(path):
        return out
    for line in open(path):
        f = line.split()
        if not f:
            continue
        if f[0] == "PROC":
            proc = int(f[1])
        elif f[0] == "RESULT" and len(f) >= 13:
            row, mode, label = f[1], f[2], f[3]
            med, p10, p90, mn, ratio, lo, hi = map(float, f[4:11])
            out.append((proc, row, mode, label, med, p10, p90, mn, ratio, lo, hi, int(f[11]),
                        f[12]))
    return out


def row_key(r):
    return (ROW_ORDER.index(r) if r in ROW_ORDER else len(ROW_ORDER), r)


def labels_in(results):
    seen = []
    for r in results:
        if r[3] not in seen:
            seen.append(r[3])
    return seen


def in_process(results):
    if not results:
        return ["(no in-process results)"]
    labels = labels_in(results)
    ref = labels[0]
    lines = ["| row | mode | " + f"{ref} ms (p10-p90) | " +
             " | ".join(f"{x}/{ref} [95%]" for x in labels[1:]) + " | outputs |",
             "|---|---|---|" + "---|" * (len(labels) - 1) + "---|"]
    table = {(r[1], r[2], r[3]): r for r in results}
    for row in sorted({r[1] for r in results}, key=row_key):
        for mode in ("gpu", "idle"):
            base = table.get((row, mode, ref))
            if not base:
                continue
            cells = [f"{base[4]:.4f} ({base[5]:.4f}-{base[6]:.4f})"]
            for x in labels[1:]:
                r = table.get((row, mode, x))
                cells.append(f"{r[8]:.3f} [{r[9]:.3f}, {r[10]:.3f}]" if r else "-")
            lines.append(f"| {row} | {mode} | " + " | ".join(cells) + f" | {base[12]} |")
    return lines


def across(results):
    if not results:
        return ["(no results)"]
    labels = labels_in(results)
    ref = labels[0]
    meds = defaultdict(list)  # (row, mode, label) -> process medians
    for r in results:
        meds[(r[1], r[2], r[3])].append(r[4])
    nproc = max(len(v) for v in meds.values())
    lines = ["| row | mode | " + " | ".join(f"{x} ms: median of process medians (range)"
                                             for x in labels) +
             " | " + " | ".join(f"{x}/{ref}" for x in labels[1:]) +
             f" | {ref} slowest/fastest process |",
             "|---|---|" + "---|" * len(labels) + "---|" * (len(labels) - 1) + "---|"]
    for row in sorted({r[1] for r in results}, key=row_key):
        for mode in sorted({r[2] for r in results if r[1] == row}):
            base = meds.get((row, mode, ref))
            if not base:
                continue
            cells, ratios = [], []
            for x in labels:
                v = meds.get((row, mode, x), [])
                cells.append(f"{statistics.median(v):.4f} ({min(v):.4f}-{max(v):.4f}, n={len(v)})"
                             if v else "-")
                if x != ref:
                    ratios.append(f"{statistics.median(v) / statistics.median(base):.3f}"
                                  if v else "-")
            lines.append(f"| {row} | {mode} | " + " | ".join(cells) + " | " +
                         " | ".join(ratios) + f" | {max(base) / min(base):.3f} |")
    lines.append(f"({nproc} processes per build at most)")
    return lines


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "ab_out"
    env = open(os.path.join(out, "env.txt")).read().strip() if os.path.isfile(
        os.path.join(out, "env.txt")) else ""
    print("# A/B of pcops trees (benchmarks/ab_trees.sh)\n")
    print("```\n" + env + "\n```\n")
    print("## In one process (lab/ab_search: gpu = kernels queued behind the flush, idle = "
          "from an idle GPU, as the peer benchmark)\n")
    print("\n".join(in_process(parse(os.path.join(out, "inprocess.txt")))))
    print("\n## Across processes, the C API (lab/ab_search, one build per process)\n")
    print("\n".join(across(parse(os.path.join(out, "processes.txt")))))
    print("\n## Across processes, the torch extension (benchmarks/ab_torch.py)\n")
    print("\n".join(across(parse(os.path.join(out, "torch.txt")))))


if __name__ == "__main__":
    main()
