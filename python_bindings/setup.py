"""Builds the w4a16 package with the library from ../build (run `make` first; `make wheel` does both).

libw4a16.so is native code loaded through ctypes: the wheel is a platform wheel (Root-Is-Purelib false) tagged
py3-none-<platform>, since the library depends on the machine but not on the Python ABI; `make wheel` then gives it
its manylinux tag with auditwheel. The library is copied into the build folder, never into the source tree, so no
stale copy can shadow ../build when the package runs from the checkout."""

import glob
import os

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))


def built_library():
    found = sorted(glob.glob(os.path.join(HERE, "..", "build", "libw4a16.so.*.*.*")))
    if not found:
        raise SystemExit(
            "w4a16 setup: ../build/libw4a16.so.<version> not found. The package wraps that native library: build "
            "it first in the w4a16 checkout with `make -j$(nproc)` (then `pip install ./python_bindings`), or "
            "build the wheel with `make wheel`."
        )
    return found[-1]


class BuildPy(build_py):
    def run(self):
        super().run()
        self.copy_file(built_library(), os.path.join(self.build_lib, "w4a16", "libw4a16.so.0"))


class NativeDistribution(Distribution):
    """Carries native code: installed into platlib, and the wheel's Root-Is-Purelib is false."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    def get_tag(self):  # ctypes, no extension module: any Python 3, any ABI, this platform
        return ("py3", "none", super().get_tag()[2])


setup(distclass=NativeDistribution, cmdclass={"build_py": BuildPy, "bdist_wheel": PlatformWheel})
