"""Build of pcops: one extension, pcops._C, from kernels/*.c (C11), kernels/*.cu (CUDA C) and
bindings/*.cpp (the only C++), compiled with ninja.

CUDA sources are compiled whenever an nvcc whose major version matches torch's CUDA is found,
with or without a GPU. Environment switches:
  PCOPS_CUDA=0|1        force the CUDA part off, or fail if it cannot be built (default: auto)
  TORCH_CUDA_ARCH_LIST  e.g. "9.0" (default: the visible GPUs; with none, every architecture
                        of torch's own list that nvcc supports, the newest also as PTX)
  DEBUG=1               -O0 -g, and a stream synchronisation after every kernel launch
  MAX_JOBS              parallel compile jobs (ninja)

Install with the torch you run (pip's build isolation would build against another one):
  pip install --no-build-isolation -e .
"""
import glob
import os
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


def default_arch_list(cuda_home):
    """TORCH_CUDA_ARCH_LIST for a machine with no visible GPU (torch's own choice needs one and
    fails without): every architecture this torch was built for that the nvcc can target, as
    native code, plus PTX of the newest for later GPUs -- so the build runs on any GPU this torch
    runs on. On 2 cores this costs about a minute more than one architecture."""
    torch_archs = [a for a in torch.cuda.get_arch_list() if a.startswith("sm_")]
    try:
        out = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--list-gpu-arch"],
                             capture_output=True, text=True, check=True).stdout
        nvcc_archs = {a.replace("compute_", "sm_") for a in out.split()}
    except (OSError, subprocess.CalledProcessError):
        nvcc_archs = set(torch_archs)
    # plain numbered architectures only (a suffixed one such as sm_90a would not run elsewhere)
    archs = sorted({int(a[3:]) for a in torch_archs if a in nvcc_archs and a[3:].isdigit()})
    if not archs:
        return "9.0"
    names = [f"{a // 10}.{a % 10}" for a in archs]
    return ";".join(names[:-1] + [names[-1] + "+PTX"])


choose_cxx()
CUDA_HOME = find_cuda_home()
if CUDA_HOME:
    # torch.utils.cpp_extension reads CUDA_HOME when it is imported.
    os.environ["CUDA_HOME"] = CUDA_HOME
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and torch.cuda.device_count() == 0:
        os.environ["TORCH_CUDA_ARCH_LIST"] = default_arch_list(CUDA_HOME)
        print(f"pcops: no GPU visible and TORCH_CUDA_ARCH_LIST unset: building for "
              f"{os.environ['TORCH_CUDA_ARCH_LIST']} (set TORCH_CUDA_ARCH_LIST to build for fewer)")
from torch.utils import cpp_extension  # noqa: E402

WITH_CUDA = CUDA_HOME is not None
PY_LIMITED_API = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 6)

# C++ and CUDA get the language standard torch asks for (C++17 or C++20) from cpp_extension.
# No contraction flags: kernels/geometry.h rounds every product and sum of a distance itself, so
# CPU and CUDA agree bit for bit whatever -ffp-contract / -fmad say (C is ISO C11: GCC's GNU
# mode would contract, and geometry.h refuses it).
C_FLAGS = ["-std=c11", "-fPIC", "-fopenmp", "-Wall", "-Wextra"]
C_FLAGS += ["-O0", "-g"] if DEBUG else ["-O3"]
CXX_FLAGS = ["-O0", "-g"] if DEBUG else ["-O3"]
NVCC_FLAGS = ["-lineinfo"] + (["-O0", "-g"] if DEBUG else ["-O3"])
DEFINES = ["-DPCOPS_DEBUG_SYNC"] if DEBUG else []
if WITH_CUDA:
    DEFINES.append("-DPCOPS_WITH_CUDA")
WHEEL_ABI_TAG = "cp39"
if PY_LIMITED_API and "-DPy_LIMITED_API=" in open(cpp_extension.__file__).read():
    WHEEL_ABI_TAG = "cp310"  # newer torch defines Py_LIMITED_API (3.10) itself
elif PY_LIMITED_API:
    CXX_FLAGS.append("-DPy_LIMITED_API=0x03090000")


class BuildExt(cpp_extension.BuildExtension):
    """BuildExtension that compiles kernels/*.c as C11 (torch's rules would compile them as C++)."""

    def build_extensions(self):
        for ext in self.extensions:
            c_sources = [s for s in ext.sources if s.endswith(".c")]
            ext.sources = [s for s in ext.sources if not s.endswith(".c")]
            ext.extra_objects = list(ext.extra_objects or []) + self._compile_c(c_sources)
        super().build_extensions()

    def _compile_c(self, sources):
        cc = os.environ.get("CC") or sysconfig.get_config_var("CC").split()[0] or "cc"
        out_dir = os.path.join(os.path.abspath(self.build_temp), "c")
        os.makedirs(out_dir, exist_ok=True)
        headers = glob.glob(os.path.join(ROOT, "kernels", "*.h")) + glob.glob(
            os.path.join(ROOT, "kernels", "*.inc"))
        newest_header = max((os.path.getmtime(h) for h in headers), default=0)
        objects = []
        for src in sources:
            obj = os.path.join(out_dir, os.path.basename(src)[:-2] + ".o")
            if (self.force or not os.path.exists(obj)
                    or os.path.getmtime(obj) < max(os.path.getmtime(src), newest_header)):
                cmd = [cc, *C_FLAGS, "-c", src, "-o", obj]  # the C code needs no CUDA header
                print(" ".join(cmd))
                subprocess.run(cmd, check=True)
            objects.append(obj)
        return objects


def write_build_info():
    """pcops/_build_info.py: what the extension was built against, checked at import."""
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    with open(os.path.join(ROOT, "pcops", "_build_info.py"), "w") as f:
        f.write("# Written by setup.py at build time; checked by pcops/__init__.py at import.\n")
        f.write(f"TORCH_VERSION = {torch.__version__!r}\n")
        f.write(f"TORCH_CUDA_VERSION = {torch.version.cuda!r}\n")
        f.write(f"WITH_CUDA = {WITH_CUDA!r}\n")
        f.write(f"CUDA_ARCH_LIST = {arch!r}\n")


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
        py_limited_api=PY_LIMITED_API,
    )


write_build_info()
print(f"pcops: building {'with CUDA from ' + CUDA_HOME if WITH_CUDA else 'the CPU ops only'}")

setup(
    name="pcops",
    version="0.1.0",
    description="Point-cloud ops for PyTorch (FPS, kNN, ball query, group, circle NMS) in C and CUDA C",
    packages=find_packages(include=["pcops", "pcops.*", "models", "models.*"]),
    ext_modules=[get_extension()],
    install_requires=["torch", "numpy"],
    python_requires=">=3.9",
    cmdclass={"build_ext": BuildExt},
    options={"bdist_wheel": {"py_limited_api": WHEEL_ABI_TAG}} if PY_LIMITED_API else {},
)
