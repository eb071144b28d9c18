"""Finds the CUDA toolkit to build pcops with: one whose nvcc has torch's CUDA major version.

Used by setup.py (find_cuda_home) and by scripts/install.sh:

    python scripts/cuda_toolkit.py          # prints the pip requirements of a matching nvcc,
                                            # or nothing when one is already here (or not needed)

Where it looks, in order: $CUDA_HOME, $CUDA_PATH, the nvcc on PATH, /usr/local/cuda*,
/opt/cuda*, and the pip packages' toolkit under site-packages/nvidia/cu<major> (the layout of
nvidia-cuda-nvcc >= 13, which completes the headers and libraries torch's wheels already bring)
or site-packages/nvidia/cuda_nvcc (nvidia-cuda-nvcc-cu12).
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig


def nvcc_version(home):
    """(major, minor) of home/bin/nvcc, or None."""
    nvcc = os.path.join(home, "bin", "nvcc")
    if not os.path.isfile(nvcc):
        return None
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def candidate_homes():
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        homes.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    homes += sorted(glob.glob("/usr/local/cuda*"), reverse=True)
    homes += sorted(glob.glob("/opt/cuda*"), reverse=True)
    site = sysconfig.get_paths()["purelib"]
    homes += sorted(glob.glob(os.path.join(site, "nvidia", "cu[0-9]*")))
    homes.append(os.path.join(site, "nvidia", "cuda_nvcc"))
    unique = []
    for h in homes:
        if h and h not in unique:
            unique.append(h)
    return unique


def find_cuda_home(torch_cuda):
    """(home, found) where home is the first toolkit whose nvcc major equals torch_cuda's major
    (None if there is none) and found lists every (home, (major, minor)) seen."""
    want = int(torch_cuda.split(".")[0])
    found = []
    for home in candidate_homes():
        v = nvcc_version(home)
        if v is None:
            continue
        found.append((home, v))
        if v[0] == want:
            return home, found
    return None, found


def pip_requirements(torch_cuda):
    """The pip packages that provide an nvcc for torch's CUDA version."""
    major, minor = (int(x) for x in torch_cuda.split(".")[:2])
    if major >= 13:
        v = f"=={major}.{minor}.*"
        return [f"nvidia-cuda-nvcc{v}", f"nvidia-nvvm{v}", f"nvidia-cuda-crt{v}"]
    return [f"nvidia-cuda-nvcc-cu{major}=={major}.{minor}.*"]


def main():
    import torch

    if torch.version.cuda is None or os.environ.get("PCOPS_CUDA") == "0":
        return  # a CPU-only torch or build: nothing to install
    asked = (os.environ.get("PCOPS_CUDA") == "1" or os.environ.get("PCOPS_WHEEL_ARCHS", "0") != "0"
             or os.environ.get("TORCH_CUDA_ARCH_LIST") or torch.cuda.device_count() > 0)
    if not asked:
        return  # no GPU and no CUDA code asked for: setup.py builds the CPU ops only
    home, found = find_cuda_home(torch.version.cuda)
    if home is None and (found or os.environ.get("PCOPS_CUDA") == "1"):
        # an nvcc of another major version is here (or CUDA is required): fetch a matching one
        print(" ".join(pip_requirements(torch.version.cuda)))


if __name__ == "__main__":
    sys.exit(main())
