"""Build of pcops: one extension, pcops._C, from kernels/*.c (C11), kernels/*.cu (CUDA C) and
bindings/*.cpp (the only C++), compiled with ninja.

The bindings use PyTorch's stable ABI (torch/csrc/stable, TORCH_TARGET_VERSION below) and the
module uses Python's limited API, so one build imports into every torch from TORCH_TARGET on
and every Python from 3.10 on: a wheel is built once per platform and CUDA major version.

CUDA code is compiled with an nvcc whose major version matches torch's CUDA (with or without a
GPU), for the first of these that applies:
  PCOPS_WHEEL_ARCHS=1   the wheel's list: SASS for sm_75, 80, 86, 89, 90, 100, 120 + PTX of 120
                        (or =<list>, e.g. "9.0+PTX"); a wheel build: no -lineinfo, no host
                        debug info, fatbins compressed for size
  TORCH_CUDA_ARCH_LIST  e.g. "9.0" or "8.0;9.0+PTX" (SASS for each, PTX where "+PTX")
  the visible GPUs      SASS for each, PTX of the newest
  PCOPS_CUDA=1          (no GPU visible) PTX of compute_75 only, which the driver compiles for
                        the GPU at first use and caches: one compile instead of seven
With none of them (no GPU, nothing asked) the build has the CPU ops only: a machine without a
GPU gets a working install in a minute, and says how to add CUDA code.
Other switches:
  PCOPS_CUDA=0|1        force the CUDA part off, or on (failing if it cannot be built)
  DEBUG=1               -O0 -g, and a stream synchronisation after every kernel launch
  MAX_JOBS              parallel compile jobs (ninja)

Install from source with the torch you run (no build isolation: it would download a torch):
  pip install --no-build-isolation -e .
A wheel (dist/pcops-<version>+cu<major>-cp310-abi3-<platform>.whl; +cpu without CUDA):
  PCOPS_WHEEL_ARCHS=1 pip wheel --no-build-isolation --no-deps -w dist .
"""
import concurrent.futures
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import warnings

import torch
from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
DEBUG = os.environ.get("DEBUG", "0") == "1"


sys.path.insert(0, os.path.join(ROOT, "scripts"))
import cuda_toolkit  # noqa: E402


def find_cuda_home():
    """The CUDA toolkit to build with (one whose nvcc has torch's CUDA major), or None to build
    the CPU ops only; see scripts/cuda_toolkit.py for where it looks."""
    mode = os.environ.get("PCOPS_CUDA", "auto")
    if mode == "0":
        return None
    if not cuda_asked():
        print("pcops: no GPU visible and no CUDA code asked for: building the CPU ops only "
              "(TORCH_CUDA_ARCH_LIST=<e.g. 9.0> or PCOPS_CUDA=1 adds CUDA code; see setup.py)")
        return None
    if torch.version.cuda is None:
        if mode == "1":
            sys.exit("pcops: PCOPS_CUDA=1 but this torch has no CUDA support (torch.version.cuda is None)")
        return None
    home, found = cuda_toolkit.find_cuda_home(torch.version.cuda)
    if home is not None:
        return home
    seen = ", ".join(f"{h} (CUDA {v[0]}.{v[1]})" for h, v in found) or "none"
    need = " ".join(cuda_toolkit.pip_requirements(torch.version.cuda))
    msg = (
        f"pcops: torch was built with CUDA {torch.version.cuda} and no nvcc of that major version "
        f"was found (nvcc found: {seen}). `pip install {need}` (scripts/install.sh does this) or "
        f"set CUDA_HOME to a matching toolkit."
    )
    if mode == "1":
        sys.exit(msg)
    if found:
        warnings.warn(msg + " Building the CPU ops only.")
    return None


def links_libstdcxx_dynamically(cxx):
    """Whether `cxx` links a shared library against libstdc++.so (True), statically (False) or
    cannot link at all (None). A copy of libstdc++ inside _C would give pcops its own exception
    runtime, and every error raised by an op would crash the process instead (seen with a
    wrapper toolchain whose private lib directory holds only libstdc++.a)."""
    with tempfile.TemporaryDirectory() as d:
        src, lib = os.path.join(d, "probe.cpp"), os.path.join(d, "probe.so")
        with open(src, "w") as f:
            f.write('#include <stdexcept>\nvoid probe() { throw std::runtime_error("probe"); }\n')
        try:
            subprocess.run(shlex.split(cxx) + ["-shared", "-fPIC", src, "-o", lib],
                           capture_output=True, check=True)
            dyn = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True)
        except (OSError, subprocess.CalledProcessError):
            return None
        return "libstdc++.so" in dyn.stdout


def choose_cxx():
    """Keeps $CXX unless it links libstdc++ statically; then falls back to a g++ that does not."""
    cxx = os.environ.get("CXX", "c++")
    if links_libstdcxx_dynamically(cxx) is not False:
        return
    for alt_cxx, alt_cc in (("/usr/bin/g++", "/usr/bin/gcc"), ("g++", "gcc"), ("c++", "cc")):
        if shutil.which(alt_cxx) and links_libstdcxx_dynamically(alt_cxx):
            warnings.warn(f"pcops: CXX={cxx} links libstdc++ statically into shared libraries, so "
                          f"exceptions raised by pcops would crash; building with {alt_cxx} instead.")
            os.environ["CXX"], os.environ["CC"] = alt_cxx, alt_cc
            return
    sys.exit(f"pcops: CXX={cxx} links libstdc++ statically into shared libraries (exceptions raised "
             f"by pcops would crash the process) and no other g++ was found: set CXX/CC to one that "
             f"links libstdc++.so.")


# The oldest torch whose stable ABI the bindings use: 2.10 has every call they make (the
# stable Tensor, empty / to / contiguous through the dispatcher, DeviceGuard, the CUDA stream and
# synchronisation shims, TORCH_BOX). bindings/README.md says why not older.
TORCH_TARGET = (2, 10)

# The wheel's architectures: Turing (the oldest that CUDA 13 compiles for) to Blackwell, SASS
# for each and PTX of the newest for GPUs after it.
WHEEL_ARCHS = "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX"
WHEEL_BUILD = os.environ.get("PCOPS_WHEEL_ARCHS", "0").strip()
WHEEL_BUILD = "" if WHEEL_BUILD == "0" else WHEEL_BUILD


def gencode_flags(spec, nvcc_archs):
    """nvcc -gencode flags for a TORCH_CUDA_ARCH_LIST-style `spec` ("8.0;9.0+PTX"), keeping the
    architectures this nvcc knows."""
    flags = []
    for item in spec.replace(",", ";").replace(" ", ";").split(";"):
        if not item:
            continue
        ptx = item.endswith("+PTX")
        num = item[:-4] if ptx else item
        arch = num.replace(".", "")
        if nvcc_archs and f"sm_{arch}" not in nvcc_archs:
            warnings.warn(f"pcops: this nvcc cannot compile for sm_{arch}; skipped")
            continue
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{arch},code=compute_{arch}")
    return flags


def cuda_arch_flags(cuda_home):
    """(nvcc flags, description) of the code to build (the module docstring's rules)."""
    try:
        out = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--list-gpu-arch"],
                             capture_output=True, text=True, check=True).stdout
        nvcc_archs = {a.replace("compute_", "sm_") for a in out.split()}
    except (OSError, subprocess.CalledProcessError):
        nvcc_archs = set()
    if WHEEL_BUILD:
        spec = WHEEL_ARCHS if WHEEL_BUILD == "1" else WHEEL_BUILD
        return gencode_flags(spec, nvcc_archs), spec + " (PCOPS_WHEEL_ARCHS)"
    spec = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    if spec:
        return gencode_flags(spec, nvcc_archs), spec + " (TORCH_CUDA_ARCH_LIST)"
    if gpus_visible():
        caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
        names = [f"{a}.{b}" for a, b in caps]
        spec = ";".join(names[:-1] + [names[-1] + "+PTX"])
        return gencode_flags(spec, nvcc_archs), spec + " (the visible GPUs)"
    return (["-gencode=arch=compute_75,code=compute_75"],
            "PTX of compute_75 (PCOPS_CUDA=1, no GPU visible; TORCH_CUDA_ARCH_LIST gives SASS)")


def gpus_visible():
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def cuda_asked():
    """Whether CUDA code is wanted (the module docstring's rules; PCOPS_CUDA=0 aside)."""
    return (os.environ.get("PCOPS_CUDA") == "1" or bool(WHEEL_BUILD)
            or bool(os.environ.get("TORCH_CUDA_ARCH_LIST")) or gpus_visible())


def check_torch():
    have = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
    if have < TORCH_TARGET:
        sys.exit(f"pcops: building needs torch >= {TORCH_TARGET[0]}.{TORCH_TARGET[1]} (its stable "
                 f"ABI), found torch {torch.__version__}")


check_torch()
choose_cxx()
CUDA_HOME = find_cuda_home()
if CUDA_HOME:
    # torch.utils.cpp_extension reads CUDA_HOME when it is imported.
    os.environ["CUDA_HOME"] = CUDA_HOME
    ARCH_FLAGS, ARCH_DESCRIPTION = cuda_arch_flags(CUDA_HOME)
    print(f"pcops: CUDA code for {ARCH_DESCRIPTION}")
from torch.utils import cpp_extension  # noqa: E402

WITH_CUDA = CUDA_HOME is not None
CUDA_MAJOR = int(torch.version.cuda.split(".")[0]) if WITH_CUDA else None
VERSION = "0.1.0" + (f"+cu{CUDA_MAJOR}" if WITH_CUDA else "+cpu")

# C++ and CUDA get the language standard torch asks for (C++17 or C++20) from cpp_extension.
# No contraction flags: kernels/geometry.h rounds every product and sum of a distance itself, so
# CPU and CUDA agree bit for bit whatever -ffp-contract / -fmad say (C is ISO C11: GCC's GNU
# mode would contract, and geometry.h refuses it).
C_FLAGS = ["-std=c11", "-fPIC", "-fopenmp", "-Wall", "-Wextra"]
C_FLAGS += ["-O0", "-g"] if DEBUG else ["-O3"]
# The stable ABI only: with TORCH_TARGET_VERSION (and TORCH_STABLE_ONLY) defined, every header
# outside torch/csrc/stable and torch/headeronly is an error, and the stable headers offer only
# what torch TORCH_TARGET has. Hidden visibility: the library exports PyInit__C alone.
TARGET_VERSION = (TORCH_TARGET[0] << 56) | (TORCH_TARGET[1] << 48)
# No debug info unless DEBUG=1 (Python's CFLAGS carry -g, which doubles the bindings' compile
# time).
CXX_FLAGS = ["-O0", "-g"] if DEBUG else ["-O3", "-g0"]
CXX_FLAGS += [f"-DTORCH_TARGET_VERSION=0x{TARGET_VERSION:016x}", "-DTORCH_STABLE_ONLY",
              "-fvisibility=hidden", "-Wall", "-Wextra"]
NVCC_FLAGS = ["-O0", "-g"] if DEBUG else ["-O3"]
if WHEEL_BUILD:  # what the wheel ships: no line tables, no host debug info, small fatbins
    NVCC_FLAGS += ["--compress-mode=size"]
else:  # line tables for compute-sanitizer and Nsight (scripts/gpu_check.sh)
    NVCC_FLAGS.append("-lineinfo")
DEFINES = ["-DPCOPS_DEBUG_SYNC"] if DEBUG else []
if WITH_CUDA:
    DEFINES.append("-DPCOPS_WITH_CUDA")
    CXX_FLAGS.append("-DUSE_CUDA")  # declares the stable ABI's CUDA shims (stream, sync)
    NVCC_FLAGS += ARCH_FLAGS  # explicit -gencode: cpp_extension then adds none of its own
# Python's limited API: torch's cpp_extension defines Py_LIMITED_API (3.10) for py_limited_api
# extensions, and the wheel is tagged cp310-abi3.
WHEEL_ABI_TAG = "cp310"


class BuildExt(cpp_extension.BuildExtension):
    """BuildExtension that compiles kernels/*.c as C11 (torch's rules would compile them as C++)."""

    def build_extensions(self):
        for ext in self.extensions:
            c_sources = [s for s in ext.sources if s.endswith(".c")]
            ext.sources = [s for s in ext.sources if not s.endswith(".c")]
            ext.extra_objects = list(ext.extra_objects or []) + self._compile_c(c_sources)
        super().build_extensions()

    def _compile_c(self, sources):
        """Compiles the C sources that changed, MAX_JOBS at a time; returns every object."""
        cc = os.environ.get("CC") or sysconfig.get_config_var("CC").split()[0] or "cc"
        out_dir = os.path.join(os.path.abspath(self.build_temp), "c")
        os.makedirs(out_dir, exist_ok=True)
        headers = glob.glob(os.path.join(ROOT, "kernels", "*.h")) + glob.glob(
            os.path.join(ROOT, "kernels", "*.inc"))
        newest_header = max((os.path.getmtime(h) for h in headers), default=0)
        objects, commands = [], []
        for src in sources:
            obj = os.path.join(out_dir, os.path.basename(src)[:-2] + ".o")
            if (self.force or not os.path.exists(obj)
                    or os.path.getmtime(obj) < max(os.path.getmtime(src), newest_header)):
                commands.append([cc, *C_FLAGS, "-c", src, "-o", obj])  # no CUDA header needed
            objects.append(obj)
        jobs = max(1, int(os.environ.get("MAX_JOBS") or os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            for cmd in commands:
                print(" ".join(cmd))
            for done in pool.map(lambda cmd: subprocess.run(cmd).returncode, commands):
                if done != 0:
                    sys.exit("pcops: compiling the C kernels failed (see above)")
        return objects


def write_build_info():
    """pcops/_build_info.py: what the extension was built for, checked at import (_loader.py)."""
    arch = ARCH_DESCRIPTION if WITH_CUDA else ""
    with open(os.path.join(ROOT, "pcops", "_build_info.py"), "w") as f:
        f.write("# Written by setup.py at build time; checked by pcops/_loader.py at import.\n")
        f.write(f"VERSION = {VERSION!r}\n")
        f.write(f"TORCH_TARGET = {TORCH_TARGET!r}  # the oldest torch it imports into\n")
        f.write(f"BUILT_WITH_TORCH = {torch.__version__!r}\n")
        f.write(f"WITH_CUDA = {WITH_CUDA!r}\n")
        f.write(f"CUDA_MAJOR = {CUDA_MAJOR!r}\n")
        f.write(f"CUDA_ARCHS = {arch!r}\n")


def get_extension():
    sources = sorted(glob.glob("kernels/*.c")) + sorted(glob.glob("bindings/*.cpp"))
    extra = {"cxx": CXX_FLAGS + DEFINES}
    if WITH_CUDA:
        sources += sorted(glob.glob("kernels/*.cu"))
        extra["nvcc"] = NVCC_FLAGS + DEFINES
        Extension = cpp_extension.CUDAExtension
    else:
        Extension = cpp_extension.CppExtension
    return Extension(
        "pcops._C",
        sources,
        extra_compile_args=extra,
        extra_link_args=["-fopenmp"],
        py_limited_api=True,
    )


write_build_info()
print(f"pcops: building {'with CUDA from ' + CUDA_HOME if WITH_CUDA else 'the CPU ops only'}")

setup(
    name="pcops",
    version=VERSION,
    description="Point-cloud ops for PyTorch (FPS, kNN, ball query, group, circle NMS) in C and CUDA C",
    packages=find_packages(include=["pcops", "pcops.*", "models", "models.*"]),
    ext_modules=[get_extension()],
    install_requires=[f"torch>={TORCH_TARGET[0]}.{TORCH_TARGET[1]}", "numpy"],
    python_requires=">=3.10",
    cmdclass={"build_ext": BuildExt},
    options={"bdist_wheel": {"py_limited_api": WHEEL_ABI_TAG}},
)
