"""Copies the built libw4a16 (../build, from `make`) into the package so that the wheel carries it."""
import glob
import os
import shutil

from setuptools import setup

here = os.path.dirname(os.path.abspath(__file__))
built = sorted(glob.glob(os.path.join(here, "..", "build", "libw4a16.so.*.*.*")))
if built:
    shutil.copy2(built[-1], os.path.join(here, "w4a16", "libw4a16.so.0"))
else:
    print("w4a16 setup: ../build/libw4a16.so not found: run `make` first, or set W4A16_LIBRARY at run time")
setup()
