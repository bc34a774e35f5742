"""The `vllm.general_plugins` entry point (`w4a16.vllm_plugin:register`, declared in pyproject.toml): vLLM calls it in
each of its processes. The adapter itself, and what it replaces per vLLM release, is w4a16.engines.vllm.
Set W4A16_VLLM=0 to keep vLLM's kernels."""

import logging
import os

log = logging.getLogger("vllm.w4a16")


def register():
    """Returns True when w4a16 serves vLLM's int4 layers in this process. The adapter (and torch) is imported only
    here, so that importing this module, or opting out, needs neither torch nor vLLM."""
    if os.environ.get("W4A16_VLLM", "1") == "0":
        log.info("w4a16: W4A16_VLLM=0, vLLM's kernels are left as they are")
        return False
    try:
        from .engines import vllm
    except ImportError as e:
        log.warning("w4a16: not replacing vLLM's ops: %s", e)
        return False
    return vllm.register()


def __getattr__(name):
    # install / installed / uninstall of the adapter, as before, without importing it at module load
    if name in ("install", "installed", "uninstall"):
        from .engines import vllm

        return getattr(vllm, name)
    raise AttributeError(name)
