"""Argument checks of the torch ops (w4a16.torch), one function per op, run before anything is allocated or launched.

Each tensor is checked for type, dtype, rank, contiguity and shape against the sizes (every optional tensor too),
then all of them for device (CUDA, the same one) and alignment, so that no op reads past a tensor or runs on a
shape it misreads. Failures raise TypeError (not a tensor) or ValueError naming the argument and its value.
Shapes are checked before devices, so these checks can be exercised with CPU tensors."""

import torch

FLOATS = (torch.float16, torch.bfloat16)
GROUP_SIZES = (32, 64, 128)  # and -1: one group over all of K


def _fail(op, msg, exc=ValueError):
    raise exc(f"w4a16.torch.{op}: {msg}")


def _dtype_name(d):
    return str(d).replace("torch.", "")


def tensor(op, name, t, dtypes, ndim, layout):
    """t is a contiguous `ndim`-D tensor of one of `dtypes`; `layout` (e.g. "[K, N/8]") goes into the messages."""
    if not isinstance(t, torch.Tensor):
        _fail(op, f"{name} must be a torch.Tensor {layout}, got {type(t).__name__}", TypeError)
    dtypes = dtypes if isinstance(dtypes, tuple) else (dtypes,)
    if t.dtype not in dtypes:
        _fail(op, f"{name} has dtype {_dtype_name(t.dtype)}, expected {' or '.join(map(_dtype_name, dtypes))}")
    if t.dim() != ndim:
        _fail(op, f"{name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        _fail(op, f"{name} must be contiguous (shape {tuple(t.shape)}, strides {t.stride()})")


def shape(op, name, t, expected, layout):
    if tuple(t.shape) != tuple(expected):
        _fail(op, f"{name} has shape {tuple(t.shape)}, expected {layout} = {tuple(expected)}")


def integer(op, name, v):
    if isinstance(v, bool) or not isinstance(v, int):
        _fail(op, f"{name} must be an int, got {type(v).__name__} {v!r}", TypeError)
    return v


def size(op, name, v, multiple):
    """A size argument: a positive multiple of `multiple`."""
    integer(op, name, v)
    if v < multiple or v % multiple:
        _fail(op, f"{name}={v} must be a positive multiple of {multiple}")
    return v


def rows_m(op, name, t):
    """The token count of an activation tensor: at least 1, as in the C API (an empty tensor has no address)."""
    if t.shape[0] < 1:
        _fail(op, f"{name} has M={t.shape[0]} rows (shape {tuple(t.shape)}): w4a16 needs M >= 1, as its C API")
    return t.shape[0]


def group_of_rows(rows, K):
    """Group size of a [K/G, N] scale tensor with `rows` rows: -1 for one row, else K / rows when that is a
    supported group size; None otherwise (a scale row too many or too few would otherwise give a wrong group size)."""
    if rows == 1:
        return -1
    if rows >= 1 and K % rows == 0 and K // rows in GROUP_SIZES:
        return K // rows
    return None


def group_from_rows(op, name, rows, K):
    """group_of_rows, raising ValueError (naming the valid row counts) where it is None."""
    G = group_of_rows(rows, K)
    if G is not None:
        return G
    valid = [f"{K // g} (G={g})" for g in GROUP_SIZES if K % g == 0] + ["1 (G=-1)"]
    _fail(op, f"{name} has {rows} rows for K={K}: expected K/G rows, one of {', '.join(valid)}")


def group_size(op, name, g, K):
    """A group-size argument: 32, 64, 128, or -1 / K for one group; K must be a multiple of it."""
    integer(op, name, g)
    if g in (-1, K):
        return K
    if g not in GROUP_SIZES:
        _fail(op, f"{name}={g} is not one of 32, 64, 128, -1")
    if K % g:
        _fail(op, f"K={K} is not a multiple of {name}={g}")
    return g


def devices(op, named, align=None):
    """All tensors of `named` ({name: tensor or None}) on one CUDA device and aligned (16 bytes, or align[name])."""
    first = None
    for name, t in named.items():
        if t is None:
            continue
        if not t.is_cuda:
            _fail(op, f"{name} must be a CUDA tensor, got device {t.device}")
        if first is None:
            first = (name, t.device)
        elif t.device != first[1]:
            _fail(op, f"{name} is on {t.device} but {first[0]} on {first[1]}: all tensors must be on one device")
        a = (align or {}).get(name, 16)
        if t.numel() and t.data_ptr() % a:
            _fail(
                op, f"{name} at address {t.data_ptr():#x} is not {a}-byte aligned (storage offset {t.storage_offset()})"
            )


def num_bits(op, n):
    if n != 4:
        _fail(op, f"num_bits={n}: w4a16 has 4-bit weights only")


# ---------------------------------------------------------------- one function per op; each returns what the op needs
def awq_gemm(input, qweight, scales, qzeros):
    """-> (M, N, K, G)"""
    op = "awq_gemm"
    tensor(op, "input", input, FLOATS, 2, "[M, K]")
    tensor(op, "qweight", qweight, torch.int32, 2, "[K, N/8]")
    tensor(op, "scales", scales, input.dtype, 2, "[K/G, N]")
    tensor(op, "qzeros", qzeros, torch.int32, 2, "[K/G, N/8]")
    M, K = rows_m(op, "input", input), input.shape[1]
    groups, N = scales.shape
    size(op, "K (input.shape[1])", K, 32)
    size(op, "N (scales.shape[1])", N, 64)
    G = group_from_rows(op, "scales", groups, K)
    shape(op, "qweight", qweight, (K, N // 8), "[K, N/8]")
    shape(op, "qzeros", qzeros, (groups, N // 8), "[K/G, N/8]")
    devices(op, {"input": input, "qweight": qweight, "scales": scales, "qzeros": qzeros})
    return M, N, K, G


def awq_dequantize(qweight, scales, zeros):
    """-> (K, N, G)"""
    op = "awq_dequantize"
    tensor(op, "qweight", qweight, torch.int32, 2, "[K, N/8]")
    tensor(op, "scales", scales, FLOATS, 2, "[K/G, N]")
    tensor(op, "zeros", zeros, torch.int32, 2, "[K/G, N/8]")
    K = qweight.shape[0]
    groups, N = scales.shape
    size(op, "N (scales.shape[1])", N, 64)
    if K < 1:
        _fail(op, f"qweight has K={K} rows: at least 1 needed")
    G = group_from_rows(op, "scales", groups, K)
    shape(op, "qweight", qweight, (K, N // 8), "[K, N/8]")
    shape(op, "zeros", zeros, (groups, N // 8), "[K/G, N/8]")
    devices(op, {"qweight": qweight, "scales": scales, "zeros": zeros})
    return K, N, G


def awq_marlin_repack(b_q_weight, size_k, size_n, bits):
    op = "awq_marlin_repack"
    num_bits(op, bits)
    size(op, "size_k", size_k, 16)
    size(op, "size_n", size_n, 64)
    tensor(op, "b_q_weight", b_q_weight, torch.int32, 2, "[size_k, size_n/8]")
    shape(op, "b_q_weight", b_q_weight, (size_k, size_n // 8), "[size_k, size_n/8]")
    devices(op, {"b_q_weight": b_q_weight})


def gptq_marlin_repack(b_q_weight, perm, size_k, size_n, bits):
    """-> whether perm is given (an empty perm means none). perm's values are read (a synchronisation, at load
    time): one outside [-1, size_k) would make the kernel read outside b_q_weight."""
    op = "gptq_marlin_repack"
    num_bits(op, bits)
    size(op, "size_k", size_k, 16)
    size(op, "size_n", size_n, 64)
    tensor(op, "b_q_weight", b_q_weight, torch.int32, 2, "[size_k/8, size_n]")
    shape(op, "b_q_weight", b_q_weight, (size_k // 8, size_n), "[size_k/8, size_n]")
    if not isinstance(perm, torch.Tensor):
        _fail(op, f"perm must be a torch.Tensor [size_k] (empty for none), got {type(perm).__name__}", TypeError)
    has_perm = perm.numel() > 0
    if has_perm:
        tensor(op, "perm", perm, torch.int32, 1, "[size_k]")
        shape(op, "perm", perm, (size_k,), "[size_k]")
    devices(op, {"b_q_weight": b_q_weight, "perm": perm if has_perm else None}, {"perm": 4})
    if has_perm:
        if perm.is_cuda and torch.cuda.is_current_stream_capturing():
            _fail(op, "perm's values cannot be checked while a CUDA graph is being captured: repack before capture")
        lo, hi = perm.min().item(), perm.max().item()
        if lo < -1 or hi >= size_k:
            bad = lo if lo < -1 else hi
            i = int(torch.nonzero(perm == bad)[0].item())
            _fail(op, f"perm[{i}]={bad} is outside [0, size_k={size_k}) (or -1 for an empty row)")
    return has_perm


def marlin_permute_scales(s, size_k, size_n, g):
    op = "marlin_permute_scales"
    size(op, "size_k", size_k, 16)
    size(op, "size_n", size_n, 64)
    G = group_size(op, "group_size", g, size_k)
    tensor(op, "s", s, FLOATS, 2, "[size_k/group_size, size_n]")
    shape(op, "s", s, (size_k // G, size_n), "[size_k/group_size, size_n]")
    devices(op, {"s": s})


def awq_to_marlin_zero_points(q_zp_packed, groups, size_n, bits):
    op = "awq_to_marlin_zero_points"
    num_bits(op, bits)
    size(op, "size_k (the number of groups)", groups, 1)
    size(op, "size_n", size_n, 64)
    tensor(op, "q_zp_packed", q_zp_packed, torch.int32, 2, "[size_k, size_n/8]")
    shape(op, "q_zp_packed", q_zp_packed, (groups, size_n // 8), "[size_k, size_n/8]")
    devices(op, {"q_zp_packed": q_zp_packed})


def permute_cols(a, perm):
    op = "permute_cols"
    tensor(op, "a", a, FLOATS, 2, "[M, K]")
    tensor(op, "perm", perm, torch.int32, 1, "[K]")
    rows_m(op, "a", a)
    if a.shape[1] < 1:
        _fail(op, f"a has K={a.shape[1]} columns: at least 1 needed")
    shape(op, "perm", perm, (a.shape[1],), "[K]")
    devices(op, {"a": a, "perm": perm}, {"perm": 4})


def marlin_gemm(a, b_q_weight, b_scales, b_zeros, b_bias, size_m, size_n, size_k):
    """-> G"""
    op = "marlin_gemm"
    integer(op, "size_m", size_m)  # 0 is reported below, as a's M
    size(op, "size_n", size_n, 64)
    size(op, "size_k", size_k, 128)
    tensor(op, "a", a, FLOATS, 2, "[size_m, size_k]")
    shape(op, "a", a, (size_m, size_k), "[size_m, size_k]")
    rows_m(op, "a", a)
    tensor(op, "b_q_weight", b_q_weight, torch.int32, 2, "[size_k/16, 2 size_n]")
    shape(op, "b_q_weight", b_q_weight, (size_k // 16, 2 * size_n), "[size_k/16, 2 size_n]")
    tensor(op, "b_scales", b_scales, a.dtype, 2, "[size_k/G, size_n]")
    groups = b_scales.shape[0]
    G = group_from_rows(op, "b_scales", groups, size_k)
    shape(op, "b_scales", b_scales, (groups, size_n), "[size_k/G, size_n]")
    if b_zeros is not None:
        tensor(op, "b_zeros", b_zeros, torch.int32, 2, "[size_k/G, size_n/8]")
        shape(op, "b_zeros", b_zeros, (groups, size_n // 8), "[size_k/G, size_n/8]")
    if b_bias is not None:
        tensor(op, "b_bias", b_bias, a.dtype, 1, "[size_n]")
        shape(op, "b_bias", b_bias, (size_n,), "[size_n]")
    devices(
        op,
        {"a": a, "b_q_weight": b_q_weight, "b_scales": b_scales, "b_zeros": b_zeros, "b_bias": b_bias},
        {"b_bias": 4},
    )
    return G


def awq_linear(qweight, qzeros, scales, bias, g):
    """AWQLinear's tensors agree with each other and with group_size (the ops check the rest)."""
    op = "AWQLinear"
    tensor(op, "qweight", qweight, torch.int32, 2, "[K, N/8]")
    tensor(op, "scales", scales, FLOATS, 2, "[K/G, N]")
    K, N = qweight.shape[0], scales.shape[1]
    G = group_size(op, "group_size", g, K)
    shape(op, "scales", scales, (K // G, N), f"[K/group_size, N] for K={K}, group_size={g}")
    shape(op, "qweight", qweight, (K, N // 8), "[K, N/8]")
    tensor(op, "qzeros", qzeros, torch.int32, 2, "[K/G, N/8]")
    shape(op, "qzeros", qzeros, (K // G, N // 8), "[K/G, N/8]")
    if bias is not None:
        tensor(op, "bias", bias, scales.dtype, 1, "[N]")
        shape(op, "bias", bias, (N,), "[N]")
