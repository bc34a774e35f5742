"""PyTorch ops over libw4a16: torch custom ops (with fake implementations, so torch.compile traces them and CUDA
graphs capture them) on the current CUDA stream, with vLLM's signatures where vLLM has the op, and AWQLinear.

Every op checks each tensor's type, dtype, shape (against the sizes and the other tensors), contiguity, device and
alignment before calling the library (w4a16._checks_torch: ValueError / TypeError naming the argument; M = 0 is an
error, as in the C API), allocates its output with torch,
and uses one zero-initialised workspace per device (allocated on first use: call `prepare()` before capturing a
CUDA graph).

Programmatic dependent launch (W4A16_FLAG_PDL in w4a16.h; sm_90+): `use_pdl(True)`, or W4A16_PDL=1 in the environment
at import, makes the GEMM ops let each GEMM start while the previous kernel finishes. Turn it on only once the weights
are loaded and converted (the flag's contract: no kernel that may still be running writes them)."""

import os
from typing import Optional

import torch
from torch import Tensor

from . import _checks_torch as _checks
from . import _lib

_DT = {torch.float16: _lib.FP16, torch.bfloat16: _lib.BF16}
_workspaces = {}
_flags = _lib.FLAG_PDL if os.environ.get("W4A16_PDL") == "1" else 0


def use_pdl(enabled: bool = True):
    """Launch the GEMM ops with programmatic dependent launch (see the module doc); returns the previous setting."""
    global _flags
    previous = bool(_flags & _lib.FLAG_PDL)
    _flags = (_flags | _lib.FLAG_PDL) if enabled else (_flags & ~_lib.FLAG_PDL)
    return previous


def _dev_index(t):
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def prepare(device=None):
    """Allocate (once) and return the zeroed workspace of `device` (default: current CUDA device)."""
    return _workspace(_workspaces, _lib.workspace_size, device)


def _workspace(pool, nbytes, device, refuse_in_capture=None):
    """pool[device index], created zeroed with nbytes() bytes on first use. refuse_in_capture: the message of the
    RuntimeError raised if that first use is inside a CUDA-graph capture (the workspace would live in the graph's
    pool, zeroed by every replay); None allows it."""
    idx = torch.device(device if device is not None else "cuda").index
    idx = torch.cuda.current_device() if idx is None else idx
    ws = pool.get(idx)
    if ws is None:
        if refuse_in_capture and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(refuse_in_capture % idx)
        with torch.cuda.device(idx):
            ws = torch.zeros(nbytes(), dtype=torch.uint8, device=f"cuda:{idx}")
        pool[idx] = ws
    return ws


def _stream(t):
    return torch.cuda.current_stream(t.device).cuda_stream


# ---------------------------------------------------------------- AWQ path
@torch.library.custom_op("w4a16::awq_gemm", mutates_args=())
def awq_gemm(input: Tensor, qweight: Tensor, scales: Tensor, qzeros: Tensor, split_k_iters: int) -> Tensor:
    """vLLM's awq_gemm: input [M, K] (fp16 or bf16), qweight [K, N/8], scales [K/G, N], qzeros [K/G, N/8] -> [M, N].
    split_k_iters is accepted for compatibility; w4a16 chooses its own K split."""
    M, N, K, G = _checks.awq_gemm(input, qweight, scales, qzeros)
    out = torch.empty((M, N), dtype=input.dtype, device=input.device)
    ws = prepare(input.device)
    with torch.cuda.device(_dev_index(input)):
        _lib.awq_gemm(
            input.data_ptr(),
            qweight.data_ptr(),
            scales.data_ptr(),
            qzeros.data_ptr(),
            0,
            out.data_ptr(),
            M,
            N,
            K,
            G,
            _DT[input.dtype],
            ws.data_ptr(),
            ws.numel(),
            _stream(input),
            flags=_flags,
        )
    return out


@awq_gemm.register_fake
def _(input, qweight, scales, qzeros, split_k_iters):
    return input.new_empty((input.shape[0], scales.shape[1]))


@torch.library.custom_op("w4a16::awq_dequantize", mutates_args=())
def awq_dequantize(qweight: Tensor, scales: Tensor, zeros: Tensor, split_k_iters: int, thx: int, thy: int) -> Tensor:
    """vLLM's awq_dequantize: -> W [K, N] in the scales' dtype (the extra arguments are ignored)."""
    K, N, G = _checks.awq_dequantize(qweight, scales, zeros)
    out = torch.empty((K, N), dtype=scales.dtype, device=scales.device)
    with torch.cuda.device(_dev_index(scales)):
        _lib.awq_dequantize(
            qweight.data_ptr(),
            scales.data_ptr(),
            zeros.data_ptr(),
            out.data_ptr(),
            K,
            N,
            G,
            _DT[scales.dtype],
            _stream(scales),
        )
    return out


@awq_dequantize.register_fake
def _(qweight, scales, zeros, split_k_iters, thx, thy):
    return scales.new_empty((qweight.shape[0], scales.shape[1]))


# ---------------------------------------------------------------- Marlin converters
@torch.library.custom_op("w4a16::awq_marlin_repack", mutates_args=())
def awq_marlin_repack(b_q_weight: Tensor, size_k: int, size_n: int, num_bits: int) -> Tensor:
    _checks.awq_marlin_repack(b_q_weight, size_k, size_n, num_bits)
    out = torch.empty((size_k // 16, size_n * 2), dtype=torch.int32, device=b_q_weight.device)
    with torch.cuda.device(_dev_index(b_q_weight)):
        _lib.marlin_repack_awq(b_q_weight.data_ptr(), out.data_ptr(), size_k, size_n, _stream(b_q_weight))
    return out


@awq_marlin_repack.register_fake
def _(b_q_weight, size_k, size_n, num_bits):
    return b_q_weight.new_empty((size_k // 16, size_n * 2))


@torch.library.custom_op("w4a16::gptq_marlin_repack", mutates_args=())
def gptq_marlin_repack(b_q_weight: Tensor, perm: Tensor, size_k: int, size_n: int, num_bits: int) -> Tensor:
    """perm: int32 [size_k] (act-order; -1 = an empty row) or empty. Its values are checked, which synchronises."""
    has_perm = _checks.gptq_marlin_repack(b_q_weight, perm, size_k, size_n, num_bits)
    out = torch.empty((size_k // 16, size_n * 2), dtype=torch.int32, device=b_q_weight.device)
    with torch.cuda.device(_dev_index(b_q_weight)):
        _lib.marlin_repack_gptq(
            b_q_weight.data_ptr(),
            perm.data_ptr() if has_perm else 0,
            out.data_ptr(),
            size_k,
            size_n,
            _stream(b_q_weight),
        )
    return out


@gptq_marlin_repack.register_fake
def _(b_q_weight, perm, size_k, size_n, num_bits):
    return b_q_weight.new_empty((size_k // 16, size_n * 2))


@torch.library.custom_op("w4a16::marlin_permute_scales", mutates_args=())
def marlin_permute_scales(s: Tensor, size_k: int, size_n: int, group_size: int) -> Tensor:
    _checks.marlin_permute_scales(s, size_k, size_n, group_size)
    out = torch.empty_like(s)
    with torch.cuda.device(_dev_index(s)):
        _lib.marlin_permute_scales(s.data_ptr(), out.data_ptr(), size_k, size_n, group_size, _DT[s.dtype], _stream(s))
    return out


@marlin_permute_scales.register_fake
def _(s, size_k, size_n, group_size):
    return torch.empty_like(s)


@torch.library.custom_op("w4a16::awq_to_marlin_zero_points", mutates_args=())
def awq_to_marlin_zero_points(q_zp_packed: Tensor, size_k: int, size_n: int, num_bits: int) -> Tensor:
    """vLLM's helper: size_k is the number of groups here."""
    _checks.awq_to_marlin_zero_points(q_zp_packed, size_k, size_n, num_bits)
    out = torch.empty_like(q_zp_packed)
    # the library takes K and G; with K = size_k groups of G = 16 rows the row count is the same
    with torch.cuda.device(_dev_index(q_zp_packed)):
        _lib.marlin_awq_zero_points(
            q_zp_packed.data_ptr(), out.data_ptr(), size_k * 32, size_n, 32 if size_k > 1 else -1, _stream(q_zp_packed)
        )
    return out


@awq_to_marlin_zero_points.register_fake
def _(q_zp_packed, size_k, size_n, num_bits):
    return torch.empty_like(q_zp_packed)


@torch.library.custom_op("w4a16::permute_cols", mutates_args=())
def permute_cols(a: Tensor, perm: Tensor) -> Tensor:
    """a[:, perm]: the activation side of act-order GPTQ (perm from w4a16_act_order_sort / argsort(g_idx))."""
    _checks.permute_cols(a, perm)
    out = torch.empty_like(a)
    with torch.cuda.device(_dev_index(a)):
        _lib.permute_cols(
            a.data_ptr(), perm.data_ptr(), out.data_ptr(), a.shape[0], a.shape[1], a.shape[1], _DT[a.dtype], _stream(a)
        )
    return out


@permute_cols.register_fake
def _(a, perm):
    return torch.empty_like(a)


# ---------------------------------------------------------------- Marlin GEMM
@torch.library.custom_op("w4a16::marlin_gemm", mutates_args=())
def marlin_gemm(
    a: Tensor,
    b_q_weight: Tensor,
    b_scales: Tensor,
    b_zeros: Optional[Tensor],
    b_bias: Optional[Tensor],
    size_m: int,
    size_n: int,
    size_k: int,
) -> Tensor:
    """a [M, K] x Marlin weight [K/16, 2N] with permuted scales [K/G, N] (and Marlin zero points for AWQ;
    None for symmetric GPTQ) + bias -> [M, N]."""
    G = _checks.marlin_gemm(a, b_q_weight, b_scales, b_zeros, b_bias, size_m, size_n, size_k)
    out = torch.empty((size_m, size_n), dtype=a.dtype, device=a.device)
    ws = prepare(a.device)
    with torch.cuda.device(_dev_index(a)):
        _lib.marlin_gemm(
            a.data_ptr(),
            b_q_weight.data_ptr(),
            b_scales.data_ptr(),
            b_zeros.data_ptr() if b_zeros is not None else 0,
            b_bias.data_ptr() if b_bias is not None else 0,
            out.data_ptr(),
            size_m,
            size_n,
            size_k,
            G,
            _DT[a.dtype],
            ws.data_ptr(),
            ws.numel(),
            _stream(a),
            flags=_flags,
        )
    return out


@marlin_gemm.register_fake
def _(a, b_q_weight, b_scales, b_zeros, b_bias, size_m, size_n, size_k):
    return a.new_empty((size_m, size_n))


# ---------------------------------------------------------------- module
class AWQLinear(torch.nn.Module):
    """A linear layer on AWQ checkpoint tensors. Uses the Marlin path (tensors converted once, here) when
    K % 128 == 0, the pure AWQ path otherwise."""

    def __init__(self, qweight, qzeros, scales, bias=None, group_size=128):
        super().__init__()
        _checks.awq_linear(qweight, qzeros, scales, bias, group_size)
        K, N = qweight.shape[0], scales.shape[1]
        self.in_features, self.out_features, self.group_size = K, N, group_size
        self.use_marlin = K % 128 == 0 and N % 64 == 0
        if self.use_marlin:
            groups = scales.shape[0]
            self.register_buffer("weight", awq_marlin_repack(qweight, K, N, 4))
            self.register_buffer("scales", marlin_permute_scales(scales, K, N, group_size))
            self.register_buffer("zeros", awq_to_marlin_zero_points(qzeros, groups, N, 4))
        else:
            self.register_buffer("weight", qweight)
            self.register_buffer("scales", scales)
            self.register_buffer("zeros", qzeros)
        self.register_buffer("bias", bias)

    @classmethod
    def from_float(cls, linear: torch.nn.Linear, group_size=128, dtype=torch.float16):
        """Quantise an nn.Linear the AutoAWQ way (w4a16.formats.awq_quantize) and wrap it."""
        import numpy as np

        from .formats import awq_quantize

        w = linear.weight.detach().float().cpu().numpy().T.copy()  # [K, N]
        qw, qz, s = awq_quantize(w, group_size)
        dev = linear.weight.device if linear.weight.is_cuda else torch.device("cuda")
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dev)
        bias = linear.bias.detach().to(device=dev, dtype=dtype) if linear.bias is not None else None
        return cls(t(qw), t(qz), t(s.astype(np.float32)).to(dtype), bias, group_size)

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        if self.use_marlin:
            y = marlin_gemm(
                x2, self.weight, self.scales, self.zeros, self.bias, x2.shape[0], self.out_features, self.in_features
            )
        else:
            y = awq_gemm(x2, self.weight, self.scales, self.zeros, 0)
            if self.bias is not None:
                y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)
