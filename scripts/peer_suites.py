"""Runs PyTorch3D's own tests of knn_points, sample_farthest_points and ball_query against
pcops.compat.pytorch3d.

    python scripts/peer_suites.py /path/to/pytorch3d            # a git checkout of PyTorch3D
    python scripts/peer_suites.py /path/to/pytorch3d -- -x -q   # extra pytest arguments

Nothing of PyTorch3D is copied into pcops: the script builds, in a temporary directory,
  - a `pytorch3d` package whose `ops` (and `ops.knn`, `ops.ball_query`, `ops.utils`,
    `ops.sample_farthest_points`) are pcops.compat.pytorch3d. The PyTorch3D tests compare the
    library with the checkout's own pure-Python reference `sample_farthest_points_naive`,
    which is loaded from the checkout's pytorch3d/ops/sample_farthest_points.py (its `_C`
    import is given an empty module; the naive function does not use it). What the three test
    files import besides (pytorch3d.io.load_obj, pytorch3d.utils.ico_sphere,
    pytorch3d.ops.sample_points_from_meshes: meshes, used only by two CUDA tests) raises
    unittest.SkipTest when called;
  - a copy of the checkout's tests/__init__.py, tests/common_testing.py and the three test
    files, run there by pytest (the test files import `.common_testing`). Without a GPU,
    common_testing.get_random_cuda_device raises unittest.SkipTest, so the CUDA tests are
    reported as skipped rather than failed.
Prints pytest's summary; the exit status is pytest's.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

TEST_FILES = ["test_knn.py", "test_sample_farthest_points.py", "test_ball_query.py"]

SHIM = {
    "pytorch3d/__init__.py": '"""pytorch3d served by pcops.compat.pytorch3d."""\n',
    "pytorch3d/_C.py": '"""Empty: the checkout\'s naive FPS imports it and does not use it."""\n',
    "pytorch3d/ops/__init__.py": """\
        import unittest

        from pcops.compat.pytorch3d import *  # noqa: F401,F403
        from pcops.compat.pytorch3d import KNN, _KNN, masked_gather  # noqa: F401


        def sample_points_from_meshes(*args, **kwargs):
            raise unittest.SkipTest("pytorch3d meshes are not part of pcops.compat")
        """,
    "pytorch3d/ops/knn.py":
        "from pcops.compat.pytorch3d import _KNN, KNN, knn_gather, knn_points  # noqa: F401\n",
    "pytorch3d/ops/ball_query.py": "from pcops.compat.pytorch3d import ball_query  # noqa: F401\n",
    "pytorch3d/ops/utils.py": "from pcops.compat.pytorch3d import masked_gather  # noqa: F401\n",
    "pytorch3d/ops/sample_farthest_points.py": """\
        import importlib.util
        import os

        from pcops.compat.pytorch3d import sample_farthest_points  # noqa: F401

        # PyTorch3D's own pure-Python reference, loaded from the checkout (not copied)
        _path = os.path.join(os.environ["PCOPS_PEER_PYTORCH3D"], "pytorch3d", "ops",
                             "sample_farthest_points.py")
        _spec = importlib.util.spec_from_file_location("pytorch3d.ops._checkout_fps", _path)
        _mod = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_mod)
        sample_farthest_points_naive = _mod.sample_farthest_points_naive
        """,
    "pytorch3d/io/__init__.py": """\
        import unittest


        def load_obj(*args, **kwargs):
            raise unittest.SkipTest("pytorch3d.io is not part of pcops.compat")
        """,
    "pytorch3d/utils/__init__.py": """\
        import unittest


        def ico_sphere(*args, **kwargs):
            raise unittest.SkipTest("pytorch3d meshes are not part of pcops.compat")
        """,
    # loaded by pytest before the test modules: the CUDA tests skip without a GPU
    "conftest.py": """\
        import unittest

        import torch

        import p3d_tests.common_testing as common_testing

        if not torch.cuda.is_available():
            def _no_cuda(*args, **kwargs):
                raise unittest.SkipTest("no CUDA GPU")

            common_testing.get_random_cuda_device = _no_cuda
        """,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", help="a PyTorch3D source checkout (its tests/ directory)")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    checkout = os.path.abspath(args.checkout)
    tests = os.path.join(checkout, "tests")
    for name in ["__init__.py", "common_testing.py"] + TEST_FILES:
        if not os.path.isfile(os.path.join(tests, name)):
            print(f"peer_suites: {os.path.join(tests, name)} not found", file=sys.stderr)
            return 2
    root = tempfile.mkdtemp(prefix="pcops-peer-pytorch3d-")
    try:
        for rel, text in SHIM.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(textwrap.dedent(text))
        dst = os.path.join(root, "p3d_tests")
        os.makedirs(dst)
        for name in ["__init__.py", "common_testing.py"] + TEST_FILES:
            shutil.copy(os.path.join(tests, name), dst)
        env = dict(os.environ, PCOPS_PEER_PYTORCH3D=checkout)
        # pcops from this repository, the shim ahead of any installed pytorch3d
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join([root, here, env.get("PYTHONPATH", "")])
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rfEs", "-q",
               "--rootdir", root, "p3d_tests"] + args.pytest_args
        return subprocess.call(cmd, cwd=root, env=env)
    finally:
        if args.keep:
            print(f"peer_suites: kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
