"""Framework-free layer: libw4a16 through ctypes, on raw device pointers (ints) and CUDA streams (ints).

The library is found, in order, at $W4A16_LIBRARY, in the repository's build/ folder when this package runs from a
checkout (so that a stale copy left in the source tree never shadows the fresh build), next to this package (where
the wheel puts it), then by the system loader (libw4a16.so.0). It is loaded on first use, not at import, so that
`w4a16.formats` (numpy only) works without it.
Every non-OK status raises W4A16Error carrying the library's own message."""
import ctypes
import os
import threading

_HERE = os.path.dirname(os.path.abspath(__file__))

FP16, BF16 = 0, 1
# GEMM flags (w4a16.h): round split-K partials to the output dtype; programmatic dependent launch (sm_90+)
FLAG_REDUCE_IN_DTYPE, FLAG_PDL = 1, 2

# Mirrors W4A16_STATUS_LIST in include/w4a16.h (values never change meaning); the sentences come from the library.
STATUS_NAMES = {
    0: "W4A16_OK", 1: "W4A16_ERR_NULL_POINTER", 2: "W4A16_ERR_MISALIGNED", 3: "W4A16_ERR_INVALID_SHAPE",
    4: "W4A16_ERR_UNSUPPORTED_GROUP_SIZE", 5: "W4A16_ERR_UNSUPPORTED_DTYPE", 6: "W4A16_ERR_WORKSPACE_TOO_SMALL",
    7: "W4A16_ERR_SIZE_OVERFLOW", 8: "W4A16_ERR_INVALID_VALUE", 20: "W4A16_ERR_NO_DEVICE",
    21: "W4A16_ERR_DRIVER_TOO_OLD", 22: "W4A16_ERR_ARCH_UNSUPPORTED", 23: "W4A16_ERR_PROFILE_UNAVAILABLE",
    24: "W4A16_ERR_CUDA", 25: "W4A16_ERR_LAUNCH_FAILED", 26: "W4A16_ERR_NOT_IMPLEMENTED", 40: "W4A16_ERR_INTERNAL",
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
    if os.path.exists(os.path.join(repo, "include", "w4a16.h")):   # running from a checkout
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
        "./python_bindings`, or point W4A16_LIBRARY at the library. Tried:\n  " + "\n  ".join(errors))


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
}
for _name, _args in _SIGS.items():
    getattr(_lib, _name).argtypes = _args
    getattr(_lib, _name).restype = _c.c_int


class DeviceInfo(ctypes.Structure):
    _fields_ = [
        ("device", _c.c_int), ("name", _c.c_char * 128), ("cc_major", _c.c_int), ("cc_minor", _c.c_int),
        ("sm_count", _c.c_int), ("smem_per_block_optin", _c.c_size_t), ("l2_bytes", _c.c_size_t),
        ("driver_version", _c.c_int), ("runtime_version", _c.c_int), ("profile", _c.c_char * 32),
        ("native_sass", _c.c_int), ("supported", _c.c_int), ("status", _c.c_int), ("reason", _c.c_char * 256),
    ]


_lib.w4a16_get_device_info.argtypes = [_c.c_int, _c.POINTER(DeviceInfo)]


def status_string(status):
    return _lib.w4a16_status_string(int(status)).decode()


def last_error_message():
    return _lib.w4a16_last_error_message().decode()


def _check(status, call):
    if status != 0:
        raise W4A16Error(status, last_error_message(), call)


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
    _check(_lib.w4a16_get_device_info(int(device), ctypes.byref(info)), "w4a16_get_device_info")
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
    n = ctypes.c_size_t()
    _check(_lib.w4a16_workspace_size_staged(int(N), int(K), ctypes.byref(n)), "w4a16_workspace_size_staged")
    return n.value


def _call(name, *args):
    _check(getattr(_lib, name)(*args), name)


# ---- raw operations: pointers and streams are ints (0 / None = NULL / default stream)
# flags: FLAG_REDUCE_IN_DTYPE | FLAG_PDL (the *_ex entry points of w4a16.h; 0 is the plain call)
def awq_gemm(A, qweight, scales, qzeros, bias, C, M, N, K, group_size, dtype, workspace, workspace_bytes, stream=0,
             flags=0):
    _call("w4a16_awq_gemm_ex", A, qweight, scales, qzeros, bias or None, C, M, N, K, group_size, dtype,
          workspace or None, workspace_bytes, flags, stream or None)


def marlin_gemm(A, weight, scales, zeros, bias, C, M, N, K, group_size, dtype, workspace, workspace_bytes, stream=0,
                flags=0):
    _call("w4a16_marlin_gemm_ex", A, weight, scales, zeros or None, bias or None, C, M, N, K, group_size, dtype,
          workspace or None, workspace_bytes, flags, stream or None)


def awq_dequantize(qweight, scales, qzeros, W, K, N, group_size, dtype, stream=0):
    _call("w4a16_awq_dequantize", qweight, scales, qzeros, W, K, N, group_size, dtype, stream or None)


def marlin_repack_awq(qweight, out, K, N, stream=0):
    _call("w4a16_marlin_repack_awq", qweight, out, K, N, stream or None)


def marlin_repack_gptq(qweight, perm, out, K, N, stream=0):
    _call("w4a16_marlin_repack_gptq", qweight, perm or None, out, K, N, stream or None)


def marlin_permute_scales(scales, out, K, N, group_size, dtype, stream=0):
    _call("w4a16_marlin_permute_scales", scales, out, K, N, group_size, dtype, stream or None)


def marlin_awq_zero_points(qzeros, out, K, N, group_size, stream=0):
    _call("w4a16_marlin_awq_zero_points", qzeros, out, K, N, group_size, stream or None)


def permute_cols(A, perm, A_out, M, K_in, K_out, dtype, stream=0):
    _call("w4a16_permute_cols", A, perm, A_out, M, K_in, K_out, dtype, stream or None)
