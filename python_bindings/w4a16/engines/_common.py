"""What the engine adapters share: reading an engine's live op schemas, replacing an op's kernel for one dispatch
key while keeping the engine's own kernel callable, and the per-device question "does w4a16 run here".

Why the dispatcher: from vLLM 0.15 on, the layers reach the int4 GEMM through `torch.ops._C.marlin_gemm` (0.23+:
through a second custom op, `torch.ops.vllm.marlin_gemm`, that calls it), and torch.compile records the op itself
in its graph. A replacement of Python module attributes is bypassed by both; a kernel registered for the op's CUDA
dispatch key is what every caller (eager, compiled graph, CUDA-graph replay of a capture) ends up running. The
op's schema and its fake (meta) implementation stay the engine's, so tracing and torch.compile see the same op."""

import logging

import torch

log = logging.getLogger("w4a16.engines")


def live_schema(namespace, name):
    """The schema string of torch.ops.<namespace>.<name>.default, or None when the op does not exist."""
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return None
    try:
        return str(packet.default._schema)
    except AttributeError:
        return None


def schema_mismatches(namespace, expected):
    """[(op, expected schema, live schema or None)] for every op of `expected` whose live schema differs."""
    out = []
    for name, schema in expected.items():
        live = live_schema(namespace, name)
        if live is not None and namespace != "_C":  # a stand-in namespace holding the recorded schemas
            live = "_C::" + live.split("::", 1)[1] if live.startswith(namespace + "::") else live
        if live != schema:
            out.append((name, schema, live))
    return out


def can_override():
    """Whether this torch can hand back an op's existing kernel (torch.library.get_kernel, torch >= 2.9)."""
    return hasattr(torch.library, "get_kernel")


class Overrides:
    """Kernels of existing ops replaced for one dispatch key, all or none. `original(name)` is the engine's kernel
    for that key (a SafeKernelFunction: call_boxed(keyset, *args)); `remove()` puts the engine's kernels back."""

    def __init__(self, namespace, dispatch_key):
        self.namespace, self.dispatch_key = namespace, dispatch_key
        self._originals = {}
        self._lib = None

    def install(self, impls):
        """impls: {op name: fn(keyset, *args)}. Raises (and registers nothing) when any op cannot be replaced."""
        originals = {}
        for n in impls:
            try:
                originals[n] = torch.library.get_kernel(f"{self.namespace}::{n}", self.dispatch_key)
            except RuntimeError:
                # The engine has no kernel for this key. Only allowed off CUDA: the engine tests install for the CPU
                # key, where vLLM's CUDA wheels register nothing, and its calls then fail as the dispatcher would.
                if self.dispatch_key == "CUDA":
                    raise
                originals[n] = None
        lib = torch.library.Library(self.namespace, "IMPL")
        try:
            for name, fn in impls.items():
                lib.impl(name, fn, self.dispatch_key, with_keyset=True, allow_override=True)
        except Exception:
            lib._destroy()
            raise
        self._originals, self._lib = originals, lib

    def original(self, name):
        return self._originals[name]

    def call_original(self, name, keyset, *args):
        kernel = self._originals[name]
        if kernel is None:
            raise NotImplementedError(
                f"Could not run '{self.namespace}::{name}' with arguments from the "
                f"'{self.dispatch_key}' backend: the engine has no kernel for it"
            )
        return kernel.call_boxed(keyset, *args)

    def remove(self):
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None


# W4A16Error statuses that mean "w4a16 does not take this call" (arguments, shapes, an unsupported GPU, driver or
# profile, not implemented): the library launched and wrote nothing. The rest (W4A16_ERR_CUDA, _LAUNCH_FAILED,
# _INTERNAL) are raised.
REFUSALS = frozenset(range(1, 20)) | {20, 21, 22, 23, 26}


def capture_reason(a, workspaces, what):
    """Why not during a CUDA-graph capture: the first call on a device creates w4a16's workspace, which inside a
    capture would live in the graph's memory pool (None when not capturing or the workspace exists)."""
    if a.is_cuda and torch.cuda.is_current_stream_capturing():
        idx = a.device.index if a.device.index is not None else torch.cuda.current_device()
        if idx not in workspaces:
            return f"first call during CUDA-graph capture (w4a16's {what}workspace does not exist yet)"
    return None


_device_ok = {}


def device_supported(device):
    """Whether w4a16 runs on this CUDA device (asked once per device; a host query, no stream work)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    ok = _device_ok.get(idx)
    if ok is None:
        import w4a16

        try:
            info = w4a16.device_info(idx)
            ok = bool(info["supported"])
            if not ok:
                log.warning(
                    "w4a16: device %d (%s) is not supported by this w4a16 (%s); its layers stay on the "
                    "engine's kernels",
                    idx,
                    info["name"],
                    info["reason"],
                )
        except w4a16.W4A16Error as e:
            log.warning("w4a16: cannot query device %d (%s); its layers stay on the engine's kernels", idx, e)
            ok = False
        _device_ok[idx] = ok
    return ok


def marlin_bias_unpermute(b):
    """Inverse of the engines' Marlin bias order (vLLM's marlin_permute_bias): within each 32 columns the engine
    puts column 8a + 2i + j at position 8i + 2a + j (a, i < 4; j < 2), a swap of two axes of a [4, 4, 2] view, so
    the permutation is its own inverse. Views and one copy: no index tensor, nothing that a CUDA-graph capture or
    torch.compile cannot take."""
    return b.reshape(-1, 4, 4, 2).transpose(1, 2).reshape(b.shape).contiguous()


def grouped_size_k(rows, size_k, group_size, is_a_8bit=False):
    """The size_k for which marlin_permute_scales (vLLM's and SGLang's: grouped order when group_size < size_k) gives
    [rows, N] MoE scales the order the Marlin MoE kernel reads: grouped for more than one row (it takes G = K / rows),
    the one-group order for one row. The engine's own size_k where it already does, and for per-channel scales and
    W4A8 (not served)."""
    if group_size == -1 or is_a_8bit:
        return size_k
    grouped = group_size < size_k
    if rows > 1 and not grouped:
        return rows * group_size  # the K these scales cover, above G
    if rows == 1 and grouped:
        return group_size
    return size_k


def moe_weight_reason(a, b_scales, has_zeros, kind, type_text, block):
    """Why w4a16's grouped GEMM does not take a Marlin MoE call's operands (None when it does), the checks both engines'
    MoE GEMMs share, in this order: activation / scale dtypes, the weight type (`kind` "uint4" with zero points or
    "uint4b8" without; None: `type_text` is not 4-bit) and the routing block size."""
    if a.dtype not in (torch.float16, torch.bfloat16) or b_scales.dtype != a.dtype:
        return f"activations {a.dtype} with scales {b_scales.dtype}"
    if kind == "uint4":
        if not has_zeros:
            return "uint4 without zero points"
    elif kind == "uint4b8":
        if has_zeros:
            return "uint4b8 with zero points"
    else:
        return f"{type_text} (not 4-bit uint4 / uint4b8)"
    if block < 8 or block > 64 or block % 8:
        return f"moe_block_size {block} (w4a16: 8..64 in steps of 8)"
    return None
