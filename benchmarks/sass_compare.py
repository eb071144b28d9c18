#!/usr/bin/env python3
"""Per-kernel comparison of the device code of two pcops trees, without a GPU: each tree's
kernels/<file>.cu compiled for one architecture with kernels/Makefile's flags (-cubin, ptxas -v),
disassembled with cuobjdump -sass, and for every kernel: SASS instructions, registers, stack,
spill stores/loads, shared memory, and whether the SASS is identical (the names of anonymous
namespaces, which differ per build, are normalised).

    python3 benchmarks/sass_compare.py OLD NEW [--files knn,ball_query] [--match heap] [-v]
                                           [--rename old_kernel=new_kernel,...]

OLD / NEW: a directory holding a pcops tree, or a git revision of this repository. -v adds, for
kernels that differ, the opcode counts new - old. --rename compares OLD's kernel old_kernel
with NEW's new_kernel (a kernel renamed by a refactor; an OLD kernel that already had the new
name is listed as removed). cuobjdump: $CUOBJDUMP, else on PATH, beside
nvcc, or the copy a triton wheel ships.
"""
import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ["-std=c++17", "-lineinfo", "-O3", "-Xptxas", "-v", "-cubin"]


def find_tool(name, env):
    if os.environ.get(env):
        return os.environ[env]
    found = shutil.which(name)
    if found:
        return found
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    beside = os.path.join(os.path.dirname(nvcc), name)
    if os.path.isfile(beside):
        return beside
    for p in glob.glob(os.path.join(sys.prefix, "lib", "python*", "site-packages", "triton",
                                    "backends", "nvidia", "bin", name)):
        return p
    sys.exit(f"sass_compare: no {name} (set ${env})")


def tree_dir(spec, tmp, label):
    if os.path.isdir(spec):
        return spec
    dst = os.path.join(tmp, label)
    os.makedirs(dst)
    archive = subprocess.run(["git", "-C", HERE, "archive", spec, "kernels"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dst], input=archive, check=True)
    return dst


def norm(name):
    """The anonymous namespace's per-build hash zeroed (same length: names still demangle)."""
    return re.sub(r"_GLOBAL__N__[0-9a-f]{8}_", "_GLOBAL__N__00000000_", name)


def compile_file(tree, cu, arch, out, nvcc):
    """ptxas -v text of kernels/<cu>.cu of `tree`, compiled to `out`."""
    r = subprocess.run([nvcc, f"-arch=sm_{arch}", *FLAGS, "-o", out, f"{cu}.cu"],
                       cwd=os.path.join(tree, "kernels"), capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sass_compare: {tree}/kernels/{cu}.cu does not compile:\n{r.stderr[-2000:]}")
    return r.stderr + r.stdout


def ptxas_info(text):
    info, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            cur = info.setdefault(norm(m.group(1)), {})
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m and cur is not None:
            cur.update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur is not None:
            cur["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(s.group(1)) if s else 0
    return info


def sass(cubin, cuobjdump):
    """{kernel: [instruction text]} (encodings and addresses dropped, names normalised)."""
    text = subprocess.run([cuobjdump, "-sass", cubin], check=True, capture_output=True,
                          text=True).stdout
    funcs, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = funcs.setdefault(norm(m.group(1)), [])
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m and cur is not None:
            cur.append(norm(re.sub(r"\s+", " ", m.group(1)).strip()))
    return funcs


def opcode(ins):
    return re.sub(r"^@!?U?P[T0-9] ", "", ins).split(" ")[0]


def short(name):
    d = subprocess.run(["c++filt"], input=name, capture_output=True, text=True).stdout.strip()
    d = (d or name).replace("(anonymous namespace)::", "")
    return re.sub(r"^void ", "", re.sub(r"\(.*", "", d))


def renamed(props, funcs, old, new):
    """props and funcs of a tree with kernel `old` named `new` (in the mangled names, so the
    template arguments stay); a kernel that was already called `new` becomes `new [removed]`."""
    def enc(name):
        return f"{len(name)}{name}"

    def rename(name):
        if enc(new) in name:
            return name.replace(enc(new), enc(new + "_REMOVED_"))
        return name.replace(enc(old), enc(new))
    return ({rename(k): v for k, v in props.items()}, {rename(k): v for k, v in funcs.items()})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--files", default="knn,ball_query", help="kernels/*.cu stems")
    ap.add_argument("--arch", default="90")
    ap.add_argument("--match", default="", help="only kernels whose name matches (regex)")
    ap.add_argument("-v", action="store_true", help="opcode counts of the kernels that differ")
    ap.add_argument("--rename", default="", help="old_kernel=new_kernel[,...]: renamed kernels")
    args = ap.parse_args()
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cuobjdump = find_tool("cuobjdump", "CUOBJDUMP")
    with tempfile.TemporaryDirectory() as tmp:
        trees = [tree_dir(args.old, tmp, "old"), tree_dir(args.new, tmp, "new")]
        for cu in args.files.split(","):
            res = []
            for i, tree in enumerate(trees):
                cubin = os.path.join(tmp, f"{cu}_{i}.cubin")
                res.append((ptxas_info(compile_file(tree, cu, args.arch, cubin, nvcc)),
                            sass(cubin, cuobjdump)))
            (pa, sa), (pb, sb) = res
            for pair in filter(None, args.rename.split(",")):
                pa, sa = renamed(pa, sa, *pair.split("="))
            print(f"== kernels/{cu}.cu, sm_{args.arch}: old {args.old}, new {args.new}")
            same = 0
            for name in sorted(set(sa) | set(sb), key=short):
                if args.match and not re.search(args.match, short(name)):
                    continue
                a, b = sa.get(name), sb.get(name)
                if a == b:
                    same += 1

                def props(p, s):
                    if s is None:
                        return "absent"
                    return (f"{len(s):5d} ins {p.get('regs', '?'):>3}r stack {p.get('stack', '?')} "
                            f"spill {p.get('spill_st', '?')}/{p.get('spill_ld', '?')} "
                            f"smem {p.get('smem', '?')}")
                what = "same " if a == b else ("gone " if b is None else
                                                ("added" if a is None else "DIFF "))
                print(f"{what} {short(name)[:90]:90s}  old "
                      f"{props(pa.get(name, {}), a)} | new {props(pb.get(name, {}), b)}")
                if args.v and a and b and a != b:
                    ca, cb = collections.Counter(map(opcode, a)), collections.Counter(map(opcode, b))
                    d = {k: cb[k] - ca[k] for k in set(ca) | set(cb) if cb[k] != ca[k]}
                    print("       opcodes new - old:",
                          dict(sorted(d.items(), key=lambda kv: -abs(kv[1]))))
            print(f"   {same} kernels with identical SASS (gone: only in OLD, added: only in NEW)")


if __name__ == "__main__":
    main()
