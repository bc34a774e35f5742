"""Engine tests: run by an engine venv's python (tools/engine-test, `make test-engines`), against the real engine
packages, on a machine without a GPU.

Before anything imports an engine, a stand-in CUDA driver (tests/engines/stub_libcuda.c) is compiled into a temporary
folder and loaded under the soname libcuda.so.1, so that the engines' compiled extensions, which name the driver as a
dependency, load and their op schemas can be read; every driver call answers "no device".
Under the repository's plain `make test` (no W4A16_ENGINE_TESTS=1) this folder is not collected: its tests need the
engine venvs, which `make test-engines` builds."""

import ctypes
import os
import subprocess
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))

if os.environ.get("W4A16_ENGINE_TESTS") != "1":
    collect_ignore_glob = ["test_*.py"]
else:
    _stub_dir = tempfile.mkdtemp(prefix="w4a16-stub-libcuda-")
    STUB_DRIVER = os.path.join(_stub_dir, "libcuda.so.1")
    subprocess.run(
        [
            os.environ.get("CC", "cc"),
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            STUB_DRIVER,
            os.path.join(ROOT, "tests", "engines", "stub_libcuda.c"),
        ],
        check=True,
    )
    ctypes.CDLL(STUB_DRIVER, mode=ctypes.RTLD_GLOBAL)  # satisfies every later dependency on libcuda.so.1
    os.environ["W4A16_STUB_DRIVER"] = STUB_DRIVER  # for subprocesses (LD_PRELOAD)


def schema_record_path(engine, version):
    return os.path.join(ROOT, "tests", "engines", "schemas", f"{engine}-{version}.json")


@pytest.fixture
def root():
    return ROOT
