"""The `vllm.general_plugins` entry point (`w4a16.vllm_plugin:register`, declared in pyproject.toml): vLLM calls it in
each of its processes. The adapter itself, and what it replaces per vLLM release, is w4a16.engines.vllm.
Set W4A16_VLLM=0 to keep vLLM's kernels."""
from .engines.vllm import install, installed, register, uninstall  # noqa: F401
