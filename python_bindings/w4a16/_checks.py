"""Argument checks of the framework-free layer at the ctypes boundary, done before any call into libw4a16.

ctypes converts silently: an int past 32 bits loses its high bits (N = 2**32 + 512 arrives as N = 512), a negative
size_t or address wraps around, and a float or a tensor fails with an unnamed positional error. Each argument is
checked here against its C type and reported with its name and value: TypeError for a value of the wrong kind,
BadArgument (turned into W4A16Error by the caller, with the status the library uses) for an int out of range."""

import operator

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
UINT32_MAX, UINT64_MAX = 2**32 - 1, 2**64 - 1

# status codes of w4a16.h used here
ERR_INVALID_SHAPE, ERR_SIZE_OVERFLOW, ERR_INVALID_VALUE = 3, 7, 8


class BadArgument(Exception):
    """An argument the C API would misread; `status` is the w4a16 status it gets."""

    def __init__(self, status, detail):
        super().__init__(detail)
        self.status, self.detail = status, detail


def integer(call, name, value):
    """value as a Python int (numpy integers accepted), or TypeError naming it (floats, strings, bools)."""
    if not isinstance(value, bool):  # numpy bools have no __index__
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{call}: {name} must be an integer, got {type(value).__name__} {value!r}")


def int32(call, name, value):
    v = integer(call, name, value)
    if not INT32_MIN <= v <= INT32_MAX:
        raise BadArgument(
            ERR_SIZE_OVERFLOW, f"{name}={v} does not fit the C API's 32-bit int [{INT32_MIN}, {INT32_MAX}]"
        )
    return v


def uint32(call, name, value):
    v = integer(call, name, value)
    if not 0 <= v <= UINT32_MAX:
        raise BadArgument(ERR_INVALID_VALUE, f"{name}={v} does not fit the C API's 32-bit unsigned int")
    return v


def size(call, name, value):
    v = integer(call, name, value)
    if v < 0:
        raise BadArgument(ERR_INVALID_VALUE, f"{name}={v} is negative")
    if v > UINT64_MAX:
        raise BadArgument(ERR_INVALID_VALUE, f"{name}={v} does not fit the C API's size_t")
    return v


def address(call, name, value):
    """A device (or host) address: None or 0 is NULL; anything else must be an int in [0, 2**64)."""
    if value is None:
        return None
    if isinstance(value, bool):
        v = None
    else:
        try:
            v = operator.index(value)
        except TypeError:
            v = None
    if v is None:
        raise TypeError(f"{call}: {name} must be a device address (int) or None, got {type(value).__name__} {value!r}")
    if not 0 <= v <= UINT64_MAX:
        raise BadArgument(ERR_INVALID_VALUE, f"{name}={v} is not an address")
    return v or None


_BY_KIND = {"int": int32, "uint": uint32, "size": size, "ptr": address}
_RANGE = {"int": (INT32_MIN, INT32_MAX), "uint": (0, UINT32_MAX), "size": (0, UINT64_MAX), "ptr": (1, UINT64_MAX)}


def spec(names, kinds):
    """The check plan of one C function: names and kinds ("int", "uint", "size", "ptr") in the C order."""
    return tuple((n, k) + _RANGE[k] for n, k in zip(names, kinds)), (names.index("M") if "M" in names else -1)


def arguments(call, plan, values):
    """Checked values for one C call (plan from spec()). M = 0 is reported as such before the library sees it:
    an empty activation tensor has address 0, and the library, which checks pointers first, would call it a NULL
    pointer. The common case (plain ints in range, None pointers) takes the fast path: this runs on every launch."""
    params, m_index = plan
    out = []
    for (name, kind, lo, hi), v in zip(params, values):
        if type(v) is int and lo <= v <= hi or v is None and kind == "ptr":
            out.append(v)
        else:
            out.append(_BY_KIND[kind](call, name, v))
    if m_index >= 0 and out[m_index] < 1:
        raise BadArgument(ERR_INVALID_SHAPE, f"M={out[m_index]} must be at least 1")
    return out


def host_int32_array(call, name, values):
    """A host array of int32 values (numpy int32, C-contiguous) from any 1-D integer sequence; raises TypeError /
    ValueError naming the first value that does not fit."""
    import numpy as np

    a = np.asarray(values)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{call}: {name} must be an integer array, got {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{call}: {name} must be 1-D [K], got shape {a.shape}")
    if a.size > INT32_MAX:
        raise ValueError(f"{call}: {name} has {a.size} entries, more than the C API's 32-bit int holds")
    out = (a < INT32_MIN) | (a > INT32_MAX)
    if out.any():
        i = int(np.argmax(out))
        raise ValueError(f"{call}: {name}[{i}]={a[i]} does not fit in int32")
    return np.ascontiguousarray(a, dtype=np.int32)
