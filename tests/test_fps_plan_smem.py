"""The CUDA FPS plans against each GPU's shared memory, without a GPU: lab/fps_plan_dump.cpp
answers the plan's device queries for simulated devices (sm_75 64 KiB a block, sm_80 163 KiB,
sm_86 / sm_89 / sm_120 99 KiB, sm_90 / sm_100 227 KiB). Needs nvcc (builds kernels/fps.cu's host
code, about a minute)."""
import os
import re
import shutil
import subprocess

import pytest

from fps_capacity import path_takes

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OPTIN_KIB = {"sm_75": 64, "sm_80": 163, "sm_86": 99, "sm_89": 99, "sm_90": 227, "sm_100": 227,
             "sm_120": 99}
PATH_IDS = {3: "warp", 4: "block", 7: "bucket", 8: "bucket_groups", 9: "bucket_rounds",
            10: "bucket_rounds_cluster", 11: "block_pruned"}
AUTO, BLOCK, BLOCK_PRUNED = 0, 4, 11
BUCKET_PATHS = {7, 8, 9, 10}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    nvcc = shutil.which(os.environ.get("NVCC", "nvcc"))
    if nvcc is None:
        pytest.skip("no nvcc")
    out = tmp_path_factory.mktemp("fps_plan_dump")
    obj, exe = str(out / "fps.o"), str(out / "fps_plan_dump")
    kernels = os.path.join(ROOT, "kernels")
    subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-Xptxas", "-O0", "-I" + kernels, "-c",
                    os.path.join(kernels, "fps.cu"), "-o", obj], check=True)
    subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-I" + kernels,
                    os.path.join(ROOT, "lab", "fps_plan_dump.cpp"), obj, "-cudart", "shared",
                    "-o", exe], check=True)
    return exe


def test_every_plan_fits_its_devices_shared_memory(dump):
    """Every plan AUTO or a forced path makes, for every size of the dump's grid on every
    simulated device, takes at most the device's opt-in shared memory a block."""
    r = subprocess.run([dump, "--check-smem"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert re.search(r": 0 of [1-9]\d* plans past", r.stdout), r.stdout[-2000:]


def _plans(dump, sims):
    """(device, name, dtype, N, path asked, path planned or None) of the one-cloud, 100-sample
    plans of the simulated devices whose name contains `sims`."""
    env = dict(os.environ, FPS_PLAN_SIMS=sims)
    line = re.compile(r"d([01]) B1 N(\d+) n100 path(\d+): (?:error|path (\d+))")
    with subprocess.Popen([dump], stdout=subprocess.PIPE, text=True, env=env) as p:
        name = None
        for text in p.stdout:
            if text.startswith("# "):
                name = text[2:].strip()
                continue
            m = line.match(text)
            if m:
                d, N, asked, got = m.groups()
                yield (name.split()[0], name, 8 if d == "1" else 4, int(N), int(asked),
                       None if got is None else int(got))
    assert p.returncode == 0


@pytest.mark.parametrize("sims", ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90 132 SMs",
                                  "sm_100", "sm_120"])
def test_forced_paths_take_what_the_test_model_says(dump, sims):
    """tests/fps_capacity.py (what the CUDA tests expect a forced path to take or refuse on the
    GPU at hand) agrees with the plans: a forced path either plans the cloud as itself or
    refuses it (never a substitute); AUTO plans every cloud, and takes BLOCK_PRUNED only where it
    fits."""
    seen = 0
    for arch, name, itemsize, N, asked, got in _plans(dump, sims):
        if N == 0:
            continue
        optin = OPTIN_KIB[arch] * 1024
        if asked == AUTO:
            assert got is not None or N > 2**31 - 1, (name, itemsize, N)
            if got == BLOCK_PRUNED:
                assert path_takes("block_pruned", itemsize, N, optin), (name, itemsize, N)
            continue
        clusters = arch in ("sm_90", "sm_100", "sm_120") and "no " not in name
        if asked not in PATH_IDS or (PATH_IDS[asked] == "bucket_rounds_cluster" and not clusters):
            continue
        want = bool(path_takes(PATH_IDS[asked], itemsize, N, optin))
        assert (got is not None) == want, (name, PATH_IDS[asked], itemsize, N, got)
        if got is not None:
            assert got == asked, (name, PATH_IDS[asked], itemsize, N, got)
        seen += 1
    assert seen > 100


def test_auto_falls_back_from_block_pruned_where_it_does_not_fit(dump):
    """On an A100 (163 KiB a block) a float cloud of 8192 points does not fit BLOCK_PRUNED's
    copy of the cloud in shared memory: AUTO takes BLOCK, which holds it in registers; past the
    registers (12288 points) a bucket path. On an H100 (227 KiB) BLOCK_PRUNED takes both."""
    got = {(arch, itemsize, N): path
           for sims in ("sm_80 108 SMs", "sm_90 132 SMs")
           for arch, name, itemsize, N, asked, path in _plans(dump, sims)
           if asked == AUTO and N in (8192, 12288) and name == sims}
    assert got[("sm_80", 4, 8192)] == BLOCK
    assert got[("sm_80", 4, 12288)] in BUCKET_PATHS
    assert got[("sm_90", 4, 8192)] == BLOCK_PRUNED
    assert got[("sm_90", 4, 12288)] == BLOCK_PRUNED
