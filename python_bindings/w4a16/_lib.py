"""Framework-free layer: libw4a16 through ctypes, on raw device pointers (ints) and CUDA streams (ints).

The library is found, in order, at $W4A16_LIBRARY, in the repository's build/ folder when this package runs from a
checkout (so that a stale copy left in the source tree never shadows the fresh build), next to this package (where
the wheel puts it), then by the system loader (libw4a16.so.0). It is loaded on first use, not at import, so that
`w4a16.formats` (numpy only) works without it.
Every non-OK status raises W4A16Error carrying the library's own message."""

import ctypes
import os
import threading

from . import _checks

_HERE = os.path.dirname(os.path.abspath(__file__))

FP16, BF16 = 0, 1
# GEMM flags (w4a16.h): round split-K partials to the output dtype; programmatic dependent launch (sm_90+)
FLAG_REDUCE_IN_DTYPE, FLAG_PDL = 1, 2

# Mirrors W4A16_STATUS_LIST in include/w4a16.h (values never change meaning); the sentences come from the library.
STATUS_NAMES = {
    0: "W4A16_OK",
    1: "W4A16_ERR_NULL_POINTER",
    2: "W4A16_ERR_MISALIGNED",
    3: "W4A16_ERR_INVALID_SHAPE",
    4: "W4A16_ERR_UNSUPPORTED_GROUP_SIZE",
    5: "W4A16_ERR_UNSUPPORTED_DTYPE",
    6: "W4A16_ERR_WORKSPACE_TOO_SMALL",
    7: "W4A16_ERR_SIZE_OVERFLOW",
    8: "W4A16_ERR_INVALID_VALUE",
    20: "W4A16_ERR_NO_DEVICE",
    21: "W4A16_ERR_DRIVER_TOO_OLD",
    22: "W4A16_ERR_ARCH_UNSUPPORTED",
    23: "W4A16_ERR_PROFILE_UNAVAILABLE",
    24: "W4A16_ERR_CUDA",
    25: "W4A16_ERR_LAUNCH_FAILED",
    26: "W4A16_ERR_NOT_IMPLEMENTED",
    40: "W4A16_ERR_INTERNAL",
}


class W4A16Error(RuntimeError):
    """A w4a16 call returned a non-OK status. `status` is the code, `name` its enum name, `detail` the message."""

    def __init__(self, status, detail, call=""):
        self.status = status
        self.name = STATUS_NAMES.get(status, "unknown")
        self.detail = detail
        prefix = f"{call}: " if call else ""
        super().__init__(f"{prefix}{self.name} ({status}): {status_string(status)}: {detail}")


class LibraryNotFound(ImportError):
    pass


def _candidates():
    env = os.environ.get("W4A16_LIBRARY")
    if env:
        yield env
        return
    repo = os.path.normpath(os.path.join(_HERE, "..", ".."))
    if os.path.exists(os.path.join(repo, "include", "w4a16.h")):  # running from a checkout
        yield os.path.join(repo, "build", "libw4a16.so")
    for name in sorted(os.listdir(_HERE)):
        if name.startswith("libw4a16.so"):
            yield os.path.join(_HERE, name)
    yield "libw4a16.so.0"


def _load():
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise LibraryNotFound(
        "w4a16: could not load libw4a16.so. Build it with `make` in the w4a16 checkout and `pip install "
        "./python_bindings`, or point W4A16_LIBRARY at the library. Tried:\n  " + "\n  ".join(errors)
    )


class _Pending:
    """A library function named before the library is loaded: keeps its signature, loads the library when called."""

    def __init__(self, library, name):
        self._library, self._name, self.argtypes, self.restype = library, name, None, ctypes.c_int

    def __call__(self, *args):
        return getattr(self._library.load(), self._name)(*args)


class _Library:
    """libw4a16, loaded on first use (thread-safe); `_lib.w4a16_x.argtypes = ...` before that is applied at load."""

    def __init__(self):
        self._cdll, self.path, self._pending, self._lock = None, None, {}, threading.Lock()

    def load(self):
        with self._lock:
            if self._cdll is None:
                cdll, path = _load()
                for name, p in self._pending.items():
                    fn = getattr(cdll, name)
                    fn.argtypes, fn.restype = p.argtypes, p.restype
                self._cdll, self.path = cdll, path
        return self._cdll

    def __getattr__(self, name):
        if not name.startswith("w4a16_"):
            raise AttributeError(name)
        if self._cdll is not None:
            return getattr(self._cdll, name)
        return self._pending.setdefault(name, _Pending(self, name))


_lib = _Library()


def __getattr__(name):  # module attribute `library_path`: the file loaded (loads the library)
    if name == "library_path":
        _lib.load()
        return _lib.path
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_c = ctypes
_lib.w4a16_version_number.restype = _c.c_uint
_lib.w4a16_version_string.restype = _c.c_char_p
_lib.w4a16_status_string.restype = _c.c_char_p
_lib.w4a16_status_string.argtypes = [_c.c_int]
_lib.w4a16_last_error_message.restype = _c.c_char_p
_lib.w4a16_compiled_archs.restype = _c.c_char_p
_lib.w4a16_profile_names.restype = _c.POINTER(_c.c_char_p)
_lib.w4a16_force_profile.argtypes = [_c.c_char_p]
_lib.w4a16_workspace_size.argtypes = [_c.POINTER(_c.c_size_t)]
_lib.w4a16_workspace_size_staged.argtypes = [_c.c_int, _c.c_int, _c.POINTER(_c.c_size_t)]

_P, _I, _Z = _c.c_void_p, _c.c_int, _c.c_size_t
_SIGS = {
    "w4a16_awq_gemm": [_P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _P, _Z, _P],
    "w4a16_marlin_gemm": [_P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _P, _Z, _P],
    "w4a16_awq_gemm_ex": [_P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _P, _Z, _c.c_uint, _P],
    "w4a16_marlin_gemm_ex": [_P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _P, _Z, _c.c_uint, _P],
    "w4a16_awq_dequantize": [_P, _P, _P, _P, _I, _I, _I, _I, _P],
    "w4a16_marlin_repack_awq": [_P, _P, _I, _I, _P],
    "w4a16_marlin_repack_gptq": [_P, _P, _P, _I, _I, _P],
    "w4a16_marlin_permute_scales": [_P, _P, _I, _I, _I, _I, _P],
    "w4a16_marlin_awq_zero_points": [_P, _P, _I, _I, _I, _P],
    "w4a16_permute_cols": [_P, _P, _P, _I, _I, _I, _I, _P],
    "w4a16_gather_rows": [_P, _I, _P, _P, _I, _I, _I, _P],
    "w4a16_act_order_sort": [_P, _I, _I, _P, _P],
    "w4a16_act_order_plan": [_P, _I, _I, _P, _I, _P, _P],
}
for _name, _args in _SIGS.items():
    getattr(_lib, _name).argtypes = _args
    getattr(_lib, _name).restype = _c.c_int
# The arguments' names, in the C order, for the checks at the ctypes boundary (w4a16._checks) and their messages.
_NAMES = {
    "w4a16_awq_gemm_ex": "A qweight scales qzeros bias C M N K group_size dtype workspace workspace_bytes flags stream",
    "w4a16_marlin_gemm_ex": "A weight scales zeros bias C M N K group_size dtype workspace workspace_bytes flags "
    "stream",
    "w4a16_awq_dequantize": "qweight scales qzeros W K N group_size dtype stream",
    "w4a16_marlin_repack_awq": "qweight out K N stream",
    "w4a16_marlin_repack_gptq": "qweight perm out K N stream",
    "w4a16_marlin_permute_scales": "scales out K N group_size dtype stream",
    "w4a16_marlin_awq_zero_points": "qzeros out K N group_size stream",
    "w4a16_permute_cols": "A perm A_out M K_in K_out dtype stream",
    "w4a16_gather_rows": "src rows_in idx out rows_out cols dtype stream",
    "w4a16_act_order_sort": "g_idx K group_size perm sorted_g_idx",
    "w4a16_act_order_plan": "g_idx K groups row_src capacity K_padded block_group",
}
_KINDS = {_c.c_int: "int", _c.c_uint: "uint", _c.c_size_t: "size", _c.c_void_p: "ptr"}


class DeviceInfo(ctypes.Structure):
    _fields_ = [
        ("device", _c.c_int),
        ("name", _c.c_char * 128),
        ("cc_major", _c.c_int),
        ("cc_minor", _c.c_int),
        ("sm_count", _c.c_int),
        ("smem_per_block_optin", _c.c_size_t),
        ("l2_bytes", _c.c_size_t),
        ("driver_version", _c.c_int),
        ("runtime_version", _c.c_int),
        ("profile", _c.c_char * 32),
        ("native_sass", _c.c_int),
        ("supported", _c.c_int),
        ("status", _c.c_int),
        ("reason", _c.c_char * 256),
    ]


_lib.w4a16_get_device_info.argtypes = [_c.c_int, _c.POINTER(DeviceInfo)]


def status_string(status):
    return _lib.w4a16_status_string(int(status)).decode()


def last_error_message():
    return _lib.w4a16_last_error_message().decode()


def _check(status, call):
    if status != 0:
        raise W4A16Error(status, last_error_message(), call)


def _checked(call, check, *args):
    """check(call, *args) from w4a16._checks, its BadArgument raised as the W4A16Error the library would give."""
    try:
        return check(call, *args)
    except _checks.BadArgument as e:
        raise W4A16Error(e.status, e.detail, call) from None


def version():
    return _lib.w4a16_version_string().decode()


def version_number():
    return int(_lib.w4a16_version_number())


def compiled_archs():
    return _lib.w4a16_compiled_archs().decode()


def profile_names():
    names, p, i = [], _lib.w4a16_profile_names(), 0
    while p[i]:
        names.append(p[i].decode())
        i += 1
    return names


def device_info(device=0):
    """A dict describing CUDA device `device` and what w4a16 will do on it. Raises W4A16Error when no device can
    be queried at all (no driver, no GPU, driver too old)."""
    info = DeviceInfo()
    device = _checked("w4a16_get_device_info", _checks.int32, "device", device)
    _check(_lib.w4a16_get_device_info(device, ctypes.byref(info)), "w4a16_get_device_info")
    d = {f: getattr(info, f) for f, _ in DeviceInfo._fields_}
    for k in ("name", "profile", "reason"):
        d[k] = d[k].decode()
    d["status_name"] = STATUS_NAMES.get(d["status"], "unknown")
    return d


def force_profile(name=None):
    _check(_lib.w4a16_force_profile(name.encode() if name else None), "w4a16_force_profile")


def workspace_size():
    n = ctypes.c_size_t()
    _check(_lib.w4a16_workspace_size(ctypes.byref(n)), "w4a16_workspace_size")
    return n.value


def workspace_size_staged(N, K):
    """Workspace bytes that let w4a16_awq_gemm run an [*, K] x [K, N] layer staged at large M (see w4a16.h)."""
    n, call = ctypes.c_size_t(), "w4a16_workspace_size_staged"
    N, K = _checked(call, _checks.int32, "N", N), _checked(call, _checks.int32, "K", K)
    _check(_lib.w4a16_workspace_size_staged(N, K, ctypes.byref(n)), call)
    return n.value


_PLANS = {}


def _call(name, *args):
    """Calls entry point `name` with args in the C order, each checked against its C type first (_checks)."""
    fn = getattr(_lib, name)
    plan = _PLANS.get(name)
    if plan is None:
        plan = _PLANS[name] = _checks.spec(_NAMES[name].split(), [_KINDS.get(t, "ptr") for t in fn.argtypes])
    args = _checked(name, _checks.arguments, plan, args)
    _check(fn(*args), name)


# ---- raw operations: pointers and streams are ints (0 / None = NULL / default stream); sizes must fit the C API's
# 32-bit int (W4A16Error W4A16_ERR_SIZE_OVERFLOW otherwise, never truncated)
# flags: FLAG_REDUCE_IN_DTYPE | FLAG_PDL (the *_ex entry points of w4a16.h; 0 is the plain call)
def awq_gemm(
    A, qweight, scales, qzeros, bias, C, M, N, K, group_size, dtype, workspace, workspace_bytes, stream=0, flags=0
):
    _call(
        "w4a16_awq_gemm_ex",
        A,
        qweight,
        scales,
        qzeros,
        bias,
        C,
        M,
        N,
        K,
        group_size,
        dtype,
        workspace,
        workspace_bytes,
        flags,
        stream,
    )


def marlin_gemm(
    A, weight, scales, zeros, bias, C, M, N, K, group_size, dtype, workspace, workspace_bytes, stream=0, flags=0
):
    _call(
        "w4a16_marlin_gemm_ex",
        A,
        weight,
        scales,
        zeros,
        bias,
        C,
        M,
        N,
        K,
        group_size,
        dtype,
        workspace,
        workspace_bytes,
        flags,
        stream,
    )


def awq_dequantize(qweight, scales, qzeros, W, K, N, group_size, dtype, stream=0):
    _call("w4a16_awq_dequantize", qweight, scales, qzeros, W, K, N, group_size, dtype, stream)


def marlin_repack_awq(qweight, out, K, N, stream=0):
    _call("w4a16_marlin_repack_awq", qweight, out, K, N, stream)


def marlin_repack_gptq(qweight, perm, out, K, N, stream=0):
    _call("w4a16_marlin_repack_gptq", qweight, perm, out, K, N, stream)


def marlin_permute_scales(scales, out, K, N, group_size, dtype, stream=0):
    _call("w4a16_marlin_permute_scales", scales, out, K, N, group_size, dtype, stream)


def marlin_awq_zero_points(qzeros, out, K, N, group_size, stream=0):
    _call("w4a16_marlin_awq_zero_points", qzeros, out, K, N, group_size, stream)


def permute_cols(A, perm, A_out, M, K_in, K_out, dtype, stream=0):
    """A_out[m, k] = A[m, perm[k]] for perm[k] in [0, K_in), else 0 (device int32 perm [K_out]; see w4a16.h)."""
    _call("w4a16_permute_cols", A, perm, A_out, M, K_in, K_out, dtype, stream)


def gather_rows(src, rows_in, idx, out, rows_out, cols, dtype, stream=0):
    """out[r, :] = src[idx[r], :] for idx[r] in [0, rows_in), else 0 (device int32 idx [rows_out]; see w4a16.h)."""
    _call("w4a16_gather_rows", src, rows_in, idx, out, rows_out, cols, dtype, stream)


# ---- act-order GPTQ on the host (numpy arrays in, numpy int32 arrays out)
def act_order_sort(g_idx, group_size):
    """(perm, sorted_g_idx): perm = stable argsort(g_idx), int32 [K], for act-order GPTQ over the whole K
    (is_k_full); W4A16Error W4A16_ERR_NOT_IMPLEMENTED when a group does not hold group_size rows (use
    act_order_plan), W4A16_ERR_INVALID_VALUE for a g_idx value outside [0, K/G)."""
    import numpy as np

    g = _checks.host_int32_array("w4a16_act_order_sort", "g_idx", g_idx)
    perm, sorted_g = np.empty_like(g), np.empty_like(g)
    _call("w4a16_act_order_sort", g.ctypes.data, len(g), group_size, perm.ctypes.data, sorted_g.ctypes.data)
    return perm, sorted_g


def act_order_plan(g_idx, groups):
    """(row_src, block_group) for a row-parallel shard of an act-order layer (is_k_full=false): row_src int32
    [K_padded], the source row of each padded row or -1 (K_padded = len(row_src), a multiple of 128), and
    block_group int32 [K_padded/32], the group of each 32-row block. See w4a16_act_order_plan in w4a16.h."""
    import numpy as np

    g = _checks.host_int32_array("w4a16_act_order_plan", "g_idx", g_idx)
    kp = ctypes.c_int()
    _call("w4a16_act_order_plan", g.ctypes.data, len(g), groups, None, 0, ctypes.addressof(kp), None)
    row_src, block_group = np.empty(kp.value, np.int32), np.empty(kp.value // 32, np.int32)
    _call(
        "w4a16_act_order_plan",
        g.ctypes.data,
        len(g),
        groups,
        row_src.ctypes.data,
        kp.value,
        ctypes.addressof(kp),
        block_group.ctypes.data,
    )
    return row_src, block_group
