"""Shared pytest set-up: fresh seeds, poisoned outputs, device parametrisation.

- Every test that takes the `seed` fixture gets a fresh random seed, printed (pytest shows it
  with a failure); PCOPS_TEST_SEED=<n> replays one.
- Outputs are poisoned: torch's deterministic mode fills memory from torch.empty (which the
  bindings use for every output) with NaN / the largest integer, so an element a kernel forgets
  to write shows up instead of passing as a stale value.
- `device` parametrisations run on "cpu" and, where a GPU and a CUDA build exist, "cuda"; the
  cuda ones get the `cuda` marker, so the GPU script can select them with -m cuda.
- torch.compile gets an on-disk cache of its own, new for each run (unless
  TORCHINDUCTOR_CACHE_DIR is set): Inductor's FX graph cache does not key on the schemas of
  custom ops, so a cache written by an older pcops build replays calls with the old arguments
  (seen when furthest_point_sample lost its random_start argument).
"""
import os
import random
import tempfile

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="pcops-tests-inductor-"))

import pytest  # noqa: E402
import torch  # noqa: E402

import pcops  # noqa: E402

HAS_CUDA = bool(pcops.WITH_CUDA and torch.cuda.is_available())
DEVICES = ["cpu", "cuda"] if HAS_CUDA else ["cpu"]


def pytest_report_header(config):
    gpu = torch.cuda.get_device_name(0) if HAS_CUDA else "none (CUDA tests skipped)"
    return [f"pcops {pcops.__version__}, torch {torch.__version__}, CUDA build: {pcops.WITH_CUDA}, GPU: {gpu}"]


def pytest_collection_modifyitems(config, items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_cuda = callspec is not None and str(callspec.params.get("device", "")).startswith("cuda")
        if on_cuda or "cuda" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cuda)


@pytest.fixture
def seed(request):
    s = int(os.environ.get("PCOPS_TEST_SEED", random.SystemRandom().randrange(2**31)))
    print(f"\n[{request.node.nodeid}] seed: PCOPS_TEST_SEED={s}")
    torch.manual_seed(s)
    return s


@pytest.fixture
def gen(seed):
    """A CPU torch.Generator seeded with the test's fresh seed."""
    return torch.Generator().manual_seed(seed)


@pytest.fixture(autouse=True)
def poison_outputs():
    if os.environ.get("PCOPS_TEST_NO_POISON") == "1":  # under compute-sanitizer initcheck
        yield
        return
    old = torch.are_deterministic_algorithms_enabled()
    old_fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(old)
    torch.utils.deterministic.fill_uninitialized_memory = old_fill


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture
def cuda():
    if not HAS_CUDA:
        pytest.skip("needs a CUDA GPU and a CUDA build of pcops")
    return "cuda"


@pytest.fixture
def debug_checks():
    """pcops.set_debug_checks(True) for one test: value checks of index inputs (idx, lengths,
    start) on CUDA too, as on the CPU. Bad-input tests that expect a value error on CUDA take it."""
    previous = pcops.set_debug_checks(True)
    yield
    pcops.set_debug_checks(previous)


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a module of small tensors: faster than two, many times so on a
    busy machine (the models tests: pytestmark = pytest.mark.usefixtures("one_thread"))."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
