"""Summary of a scripts/gpu_check.sh run: tests per op, sanitizer errors per tool, benchmarks.

    python scripts/gpu_summary.py OUT_DIR
"""
import collections
import os
import re
import sys
import xml.etree.ElementTree as ET


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def test_rows(out):
    root = ET.parse(os.path.join(out, "junit.xml")).getroot()
    counts = collections.OrderedDict()
    for case in root.iter("testcase"):
        module = case.get("classname", "?").split(".")[-1]
        c = counts.setdefault(module, collections.Counter())
        cuda = "cuda" in case.get("name", "")
        if case.find("failure") is not None or case.find("error") is not None:
            state = "failed"
        elif case.find("skipped") is not None:
            state = "skipped"
        else:
            state = "passed"
        c[state] += 1
        if cuda:
            c["cuda " + state] += 1
    rows = []
    for module, c in counts.items():
        rows.append([module, c["passed"], c["failed"], c["skipped"], c["cuda passed"], c["cuda failed"]])
    return rows


ERROR_HEAD = re.compile(r"^========= (?!\s|ERROR SUMMARY|COMPUTE-SANITIZER|Target application|Program hit)(.+)$")


def sanitizer_row(out, tool):
    log = read(os.path.join(out, f"sanitizer_{tool}.log"))
    if log is None:
        return [tool, "not run", "", "", ""]
    # one summary per sanitizer run (racecheck runs once per test file): their sum
    counts = re.findall(r"ERROR SUMMARY: (\d+) error", log) + re.findall(
        r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error", log)
    total = str(sum(int(c) for c in counts)) if counts else "?"
    warnings = sum(int(w) for w in re.findall(r"RACECHECK SUMMARY: .*?(\d+) warning", log))
    if warnings:  # racecheck's possible hazards (e.g. shared memory read, then written by another
        total += f" (+{warnings} warnings)"  # lane with no __syncwarp in between)
    lines = log.splitlines()
    ours = other = 0
    for i, line in enumerate(lines):
        if ERROR_HEAD.match(line) and not line.startswith("=========     "):
            window = "\n".join(lines[i + 1 : i + 6])
            if "/kernels/" in window:
                ours += 1
            elif " at " in window:
                other += 1
    runs = re.findall(r"^(?:\d+ \w+(?:, )?)+ in [\d.]+s", log, re.M)  # pytest's last lines
    def summed(word):
        return sum(int(n) for run in runs for n in re.findall(rf"(\d+) {word}", run))
    tests = (f"{summed('passed')} passed, {summed('failed')} failed, {summed('error')} errors, "
             f"{summed('skipped')} skipped ({len(runs)} run{'s' if len(runs) != 1 else ''})"
             if runs else "no test summary")
    rc = (read(os.path.join(out, f"sanitizer_{tool}.rc")) or "?").strip()
    return [tool, total, ours, other, tests + f" (rc {rc})"]


def table(header, rows):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    print(fmt.format(*header))
    print(fmt.format(*("-" * w for w in widths)))
    for r in rows:
        print(fmt.format(*r))


def main(out):
    print("\n================ GPU check summary ================")
    env = read(os.path.join(out, "env.txt"))
    if env:
        print(env.strip())
    rc = read(os.path.join(out, "build.rc"))
    if rc is not None:
        print(f"build: rc {rc.strip()}")
    if os.path.exists(os.path.join(out, "junit.xml")):
        print("\n# tests (all = CPU + CUDA; cuda = tests parametrised on the GPU)")
        rows = test_rows(out)
        total = [sum(r[i] for r in rows) for i in range(1, 6)]
        table(["file", "passed", "failed", "skipped", "cuda passed", "cuda failed"], rows + [["TOTAL", *total]])
        log = read(os.path.join(out, "pytest.log")) or ""
        failed = re.findall(r"^FAILED (\S+)", log, re.M)
        for name in failed[:30]:
            print("FAILED", name)
    if any(os.path.exists(os.path.join(out, f"sanitizer_{t}.log")) for t in ("memcheck", "racecheck", "initcheck", "synccheck")):
        print("\n# compute-sanitizer (errors in total / in kernels/*.cu / elsewhere)")
        table(["tool", "errors", "ours", "other", "tests"],
              [sanitizer_row(out, t) for t in ("memcheck", "racecheck", "initcheck", "synccheck")])
    for name in ("bench.txt", "bench_train.txt"):
        text = read(os.path.join(out, name))
        if text:
            print(f"\n# {name}\n{text.strip()}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gpu_check_out")
