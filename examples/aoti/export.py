"""Exports two programs that call pcops ops with torch.export, packages them with AOTInductor and
checks that a C++ program without Python (run_model, examples/aoti/run_model.cpp) returns what
eager PyTorch returns:

    classifier   the PointNet++ classifier of models/ on 4 shapes of the built-in data set (256
                 points each): logits [4, 10] and the predicted classes. Its weights are a
                 models.train checkpoint (--checkpoint runs/<run>/last.pt, e.g. of the README's
                 main command), or seeded random ones of the ssg-lite preset
    preprocess   pcops.preprocess (FPS, kNN, grouping) on a ragged batch (300 and 200 points):
                 centres, idx, grouped, lengths, sample_idx, point_lengths, shift, scale

    python examples/aoti/export.py [--device cpu|cuda] [--out DIR] [--runner PATH] [--checkpoint CKPT]

Without --runner it builds run_model first (examples/aoti/build.sh, into DIR/build). The pcops
outputs must match eager bit for bit; the classifier's predictions must match and its logits
agree to 1e-4 (Inductor fuses and reorders the float arithmetic of the MLPs). Exits 1 otherwise.

On Linux the packages' shared libraries are linked with -Bsymbolic (--no-symbolic: not), through a
small wrapper of the C++ compiler that Inductor runs (symbolic_compiler). torch's libraries
export their own instantiations of libstdc++ templates (std::regex among them); in a program
that links libtorch, a package compiled by a newer g++ than torch's would have its calls bound
to those, from another compiler version, and can crash on loading (seen with torch 2.11's wheel
and g++ 13: a segfault in the package's device-string regex). -Bsymbolic binds the package's
calls to its own copies. A package built this way runs with any libtorch of its torch version.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # models/ (and pcops when it is not installed)

import pcops  # noqa: E402
from models.checkpoint import load_model  # noqa: E402
from models.pointnet2 import build_model  # noqa: E402
from models.shapes import ProceduralShapes  # noqa: E402

DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.int64: "int64",
               torch.int32: "int32", torch.bool: "bool"}
NAMES = {v: k for k, v in DTYPE_NAMES.items()}


class Preprocess(torch.nn.Module):
    """pcops.preprocess of a padded batch (xyz [B, N, 3], lengths [B]) as a module: the tensors
    of its result, in the order of pcops.Preprocessed."""

    def __init__(self, npoint: int, nsample: int):
        super().__init__()
        self.npoint, self.nsample = npoint, nsample

    def forward(self, xyz, lengths):
        return tuple(pcops.preprocess(xyz, self.npoint, self.nsample, lengths=lengths))


def programs(device, checkpoint=None):
    """name -> (module, inputs), seeded."""
    torch.manual_seed(0)
    if checkpoint:
        classifier = load_model(checkpoint, device)[0]
    else:
        classifier = build_model("ssg-lite", 10).to(device).eval()
    shapes = ProceduralShapes(num_shapes=4, num_points=256, split="test")
    clouds = torch.stack([shapes[i][0] for i in range(4)]).to(device)  # sphere, box, cylinder, cone
    g = torch.Generator().manual_seed(1)
    xyz = torch.rand(2, 300, 3, generator=g).to(device)
    lengths = torch.tensor([300, 200]).to(device)
    return {
        "classifier": (classifier, (clouds,)),
        "preprocess": (Preprocess(npoint=64, nsample=8).to(device), (xyz, lengths)),
    }


def write_tensors(folder, tensors, list_name, prefix):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, list_name), "w") as f:
        for i, t in enumerate(tensors):
            t = t.detach().cpu().contiguous()
            name = f"{prefix}_{i}.bin"
            t.numpy().tofile(os.path.join(folder, name))
            f.write(" ".join([name, DTYPE_NAMES[t.dtype], *map(str, t.shape)]) + "\n")


def read_tensors(folder, list_name):
    import numpy as np

    out = []
    with open(os.path.join(folder, list_name)) as f:
        for line in f:
            name, dtype, *shape = line.split()
            data = np.fromfile(os.path.join(folder, name), dtype=str(NAMES[dtype]).split(".")[-1])
            out.append(torch.from_numpy(data).reshape([int(s) for s in shape]))
    return out


def symbolic_compiler(out):
    """Points Inductor's C++ compiler at a wrapper (in out/cxx, named like the compiler, so that
    Inductor recognises its kind) that adds -Wl,-Bsymbolic to shared-library links; the path of
    the wrapper, or None where this does not apply (not Linux, no compiler found)."""
    import torch._inductor.config as inductor_config

    cxx = os.environ.get("CXX", "g++")
    real = shutil.which(cxx)
    if not sys.platform.startswith("linux") or real is None:
        return None
    folder = os.path.join(out, "cxx")
    os.makedirs(folder, exist_ok=True)
    wrapper = os.path.join(folder, os.path.basename(real))
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\n"
                "# Inductor's C++ compiler, with -Bsymbolic for shared libraries (export.py)\n"
                f'case " $* " in *" -shared "*) exec "{real}" "$@" -Wl,-Bsymbolic;; esac\n'
                f'exec "{real}" "$@"\n')
    os.chmod(wrapper, 0o755)
    inductor_config.cpp.cxx = (None, wrapper)
    os.environ["CXX"] = wrapper  # Inductor's compile workers read their compiler from CXX
    return wrapper


def build_runner(out):
    build_dir = os.path.join(out, "build")
    subprocess.run(["bash", os.path.join(ROOT, "examples", "aoti", "build.sh"), build_dir],
                   check=True)
    return os.path.join(build_dir, "run_model")


def compare(name, eager, got):
    if len(eager) != len(got):
        return [f"{len(got)} outputs, eager has {len(eager)}"]
    problems = []
    for i, (e, g) in enumerate(zip(eager, got)):
        e = e.detach().cpu()
        if e.shape != g.shape or e.dtype != g.dtype:
            problems.append(f"output {i}: {g.dtype} {tuple(g.shape)}, eager {e.dtype} {tuple(e.shape)}")
        elif name == "classifier":
            if not torch.equal(e.argmax(1), g.argmax(1)):
                problems.append(f"predictions {g.argmax(1).tolist()}, eager {e.argmax(1).tolist()}")
            if not torch.allclose(e, g, rtol=1e-4, atol=1e-4):
                problems.append(f"logits differ by {(e - g).abs().max().item():.3g}")
        elif not torch.equal(e, g):
            problems.append(f"output {i} differs from eager")
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "aoti"))
    parser.add_argument("--runner", help="a built run_model (default: build it)")
    parser.add_argument("--checkpoint", help="a models.train checkpoint for the classifier")
    parser.add_argument("--no-symbolic", action="store_true",
                        help="link the packages as Inductor does by default (no -Bsymbolic)")
    args = parser.parse_args(argv)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    runner = args.runner or build_runner(out)
    if not args.no_symbolic:
        symbolic_compiler(out)
    failed = False
    for name, (module, inputs) in programs(args.device, args.checkpoint).items():
        t0 = time.perf_counter()
        with torch.no_grad():
            eager = module(*inputs)
        eager = eager if isinstance(eager, tuple) else (eager,)
        exported = torch.export.export(module, inputs)
        t1 = time.perf_counter()
        package = torch._inductor.aoti_compile_and_package(
            exported, package_path=os.path.join(out, f"{name}_{args.device}.pt2"))
        t2 = time.perf_counter()
        folder = os.path.join(out, f"{name}_{args.device}")
        write_tensors(folder, inputs, "inputs.txt", "in")
        run = subprocess.run([runner, pcops._C.__file__, package, args.device, folder, folder],
                             capture_output=True, text=True)
        t3 = time.perf_counter()
        print(run.stdout, end="")
        if run.returncode != 0:
            print(run.stderr, end="")
            print(f"{name}: run_model failed ({run.returncode})")
            failed = True
            continue
        got = read_tensors(folder, "outputs.txt")
        if name == "classifier":
            names = ProceduralShapes.classes
            print(f"  eager predictions:    {eager[0].argmax(1).tolist()} "
                  f"({', '.join(names[i] for i in eager[0].argmax(1).tolist())}; "
                  f"the shapes are {', '.join(names[:4])})")
        problems = compare(name, eager, got)
        print(f"{name} on {args.device}: {'MATCHES eager' if not problems else 'DIFFERS'} "
              f"(export {t1 - t0:.1f} s, AOTInductor {t2 - t1:.1f} s, run_model {t3 - t2:.1f} s)")
        for p in problems:
            print("  " + p)
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
