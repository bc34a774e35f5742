"""How the package finds libw4a16: lazily (w4a16.formats needs no library), and from a checkout the fresh build/
before any copy of the library left inside the package folder. (The wheel itself: tests/wheel_test.sh.)"""

import os
import shutil
import subprocess
import sys

import pytest

BINDINGS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(BINDINGS)
BUILT = os.path.join(REPO, "build", "libw4a16.so")


def run_python(code, cwd, env_extra, pythonpath):
    env = {k: v for k, v in os.environ.items() if k != "W4A16_LIBRARY"}
    env.update(PYTHONPATH=pythonpath, **env_extra)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_formats_import_without_library(tmp_path):
    code = (
        "import numpy as np, w4a16.formats as f, w4a16\n"
        "q = np.arange(32 * 64, dtype=np.int32).reshape(32, 64) % 16\n"
        "assert (f.awq_unpack(f.awq_pack(q)) == q).all()\n"
        "try:\n    w4a16.version()\nexcept w4a16.LibraryNotFound as e:\n    print('not found:', e)\n"
        "else:\n    raise SystemExit('loaded a library that does not exist')\n"
    )
    r = run_python(code, tmp_path, {"W4A16_LIBRARY": str(tmp_path / "missing" / "libw4a16.so")}, BINDINGS)
    assert r.returncode == 0, r.stderr
    assert "could not load libw4a16.so" in r.stdout and "missing" in r.stdout


@pytest.mark.skipif(not os.path.exists(BUILT), reason="build/libw4a16.so not built (make lib)")
def test_checkout_prefers_build_over_a_stale_copy(tmp_path):
    # a checkout-shaped tree: include/w4a16.h, build/libw4a16.so, and a (loadable) stale copy in the package folder
    (tmp_path / "include").mkdir()
    shutil.copy(os.path.join(REPO, "include", "w4a16.h"), tmp_path / "include")
    (tmp_path / "build").mkdir()
    shutil.copy(os.path.realpath(BUILT), tmp_path / "build" / "libw4a16.so")
    shutil.copytree(
        os.path.join(BINDINGS, "w4a16"),
        tmp_path / "python_bindings" / "w4a16",
        ignore=shutil.ignore_patterns("__pycache__", "libw4a16.so*"),
    )
    shutil.copy(os.path.realpath(BUILT), tmp_path / "python_bindings" / "w4a16" / "libw4a16.so.0")
    r = run_python("import w4a16; print(w4a16.library_path)", tmp_path, {}, str(tmp_path / "python_bindings"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "build" / "libw4a16.so")
