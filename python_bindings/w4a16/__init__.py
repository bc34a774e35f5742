"""w4a16: int4 weight-only GEMM (fp16/bf16 x int4, AWQ and Marlin layouts) for inference engines.

`w4a16` itself is framework-free (ctypes over libw4a16, raw device pointers); `w4a16.torch` adds PyTorch ops
(torch custom ops with fake implementations, usable under torch.compile and CUDA graphs) and AWQLinear;
`w4a16.formats` holds numpy implementations of the AWQ / GPTQ / Marlin packing formats."""

from ._lib import (
    BF16,
    FLAG_PDL,
    FLAG_REDUCE_IN_DTYPE,
    FP16,
    STATUS_NAMES,
    LibraryNotFound,
    W4A16Error,
    act_order_plan,
    act_order_sort,
    awq_dequantize,
    awq_gemm,
    compiled_archs,
    device_info,
    force_profile,
    gather_rows,
    last_error_message,
    marlin_awq_zero_points,
    marlin_gemm,
    marlin_permute_scales,
    marlin_repack_awq,
    marlin_repack_gptq,
    permute_cols,
    profile_names,
    status_string,
    version,
    version_number,
    workspace_size,
    workspace_size_staged,
)


def __getattr__(name):  # the library loads on first use, so that `import w4a16.formats` works without it
    if name in ("library_path", "__version__"):
        from . import _lib as lib

        return lib.library_path if name == "library_path" else lib.version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BF16",
    "FLAG_PDL",
    "FLAG_REDUCE_IN_DTYPE",
    "FP16",
    "STATUS_NAMES",
    "LibraryNotFound",
    "W4A16Error",
    "awq_dequantize",
    "awq_gemm",
    "compiled_archs",
    "device_info",
    "force_profile",
    "last_error_message",
    "library_path",
    "marlin_awq_zero_points",
    "marlin_gemm",
    "marlin_permute_scales",
    "marlin_repack_awq",
    "marlin_repack_gptq",
    "profile_names",
    "status_string",
    "version",
    "version_number",
    "workspace_size",
    "workspace_size_staged",
    "act_order_plan",
    "act_order_sort",
    "gather_rows",
    "permute_cols",
]
