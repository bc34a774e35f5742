"""vLLM integration: a `vllm.general_plugins` entry point that routes vLLM's int4 ops to w4a16.

Written against the op names and signatures of `vllm/_custom_ops.py` in vLLM 0.10-0.11 (awq_gemm, awq_dequantize,
awq_marlin_repack, gptq_marlin_repack, and gptq_marlin_gemm with b_bias and global_scale). vLLM's layers call these
through the module at call time, so replacing the module attributes is enough. What w4a16 does not do is passed
through to vLLM's own op: act-order on a K shard with cut groups (is_k_full=False), float zero points, global
scales (fp4), other bit widths.
Set W4A16_VLLM=0 to keep vLLM's kernels. vLLM itself is not run in w4a16's tests (it is not installed on the test
machines); the adapters are tested against a stand-in module with vLLM's signatures, up to that boundary."""
import logging
import os

log = logging.getLogger("w4a16.vllm")

PATCHED_OPS = ("awq_gemm", "awq_dequantize", "awq_marlin_repack", "gptq_marlin_repack", "gptq_marlin_gemm")


def _empty(t):
    return t is None or t.numel() == 0


def _qtype(b_q_type):
    """('uint4' | 'uint4b8' | other name, size in bits) of a vLLM ScalarType (or a plain string)."""
    name = str(getattr(b_q_type, "name", b_q_type))
    bits = getattr(b_q_type, "size_bits", 4 if "4" in name else 0)
    return name, bits


def make_adapters(original):
    """Adapters with vLLM's signatures; `original` is the module (or namespace) holding vLLM's own ops."""
    import torch

    from . import torch as wt

    def awq_gemm(input, qweight, scales, qzeros, split_k_iters):
        return wt.awq_gemm(input, qweight, scales, qzeros, split_k_iters)

    def awq_dequantize(qweight, scales, zeros, split_k_iters, thx, thy):
        return wt.awq_dequantize(qweight, scales, zeros, split_k_iters, thx, thy)

    def awq_marlin_repack(b_q_weight, size_k, size_n, num_bits):
        if num_bits != 4:
            return original.awq_marlin_repack(b_q_weight, size_k, size_n, num_bits)
        return wt.awq_marlin_repack(b_q_weight, size_k, size_n, num_bits)

    def gptq_marlin_repack(b_q_weight, perm, size_k, size_n, num_bits):
        if num_bits != 4:
            return original.gptq_marlin_repack(b_q_weight, perm, size_k, size_n, num_bits)
        return wt.gptq_marlin_repack(b_q_weight, perm, size_k, size_n, num_bits)

    whole_groups = {}  # g_idx tensor -> its sorted groups are whole (checked once: one device sync at load time)

    def act_order_whole(g_idx, size_k, scale_rows):
        key = (g_idx.data_ptr(), g_idx.numel(), scale_rows)
        if key not in whole_groups:
            G = size_k // scale_rows
            expect = torch.arange(size_k, device=g_idx.device, dtype=g_idx.dtype) // G
            whole_groups[key] = bool((g_idx == expect).all())
        return whole_groups[key]

    def gptq_marlin_gemm(a, c, b_q_weight, b_bias, b_scales, global_scale, b_zeros, g_idx, perm, workspace, b_q_type,
                         size_m, size_n, size_k, is_k_full=True, use_atomic_add=False, use_fp32_reduce=False,
                         is_zp_float=False):
        name, bits = _qtype(b_q_type)
        act_order = not _empty(g_idx)
        supported = (bits == 4 and name in ("uint4", "uint4b8") and global_scale is None and not is_zp_float
                     and (name == "uint4b8") == _empty(b_zeros)
                     and (not act_order or (is_k_full and not _empty(perm)
                                            and act_order_whole(g_idx, size_k, b_scales.shape[0]))))
        if not supported:
            return original.gptq_marlin_gemm(a, c, b_q_weight, b_bias, b_scales, global_scale, b_zeros, g_idx, perm,
                                             workspace, b_q_type, size_m, size_n, size_k, is_k_full, use_atomic_add,
                                             use_fp32_reduce, is_zp_float)
        a2 = a.reshape(size_m, size_k).contiguous()
        if act_order:  # vLLM passes g_idx sorted and perm = its sort order; the weights were repacked with it
            a2 = wt.permute_cols(a2, perm)
        out = wt.marlin_gemm(a2, b_q_weight, b_scales,
                             None if _empty(b_zeros) else b_zeros, b_bias, size_m, size_n, size_k)
        if c is not None:
            c.copy_(out)
            return c
        return out

    return dict(awq_gemm=awq_gemm, awq_dequantize=awq_dequantize, awq_marlin_repack=awq_marlin_repack,
                gptq_marlin_repack=gptq_marlin_repack, gptq_marlin_gemm=gptq_marlin_gemm)


def install(ops):
    """Replace the int4 ops of `ops` (vllm._custom_ops, or a stand-in) by w4a16's adapters, keeping the originals
    for the pass-through cases. Returns the list of replaced names."""
    import types
    original = types.SimpleNamespace(**{n: getattr(ops, n) for n in PATCHED_OPS if hasattr(ops, n)})
    adapters = make_adapters(original)
    done = []
    for n in PATCHED_OPS:
        if hasattr(ops, n):
            setattr(ops, n, adapters[n])
            done.append(n)
    ops._w4a16_original_ops = original
    return done


def register():
    """The entry point vLLM calls in every process it starts. Returns True when the ops were replaced."""
    if os.environ.get("W4A16_VLLM", "1") == "0":
        log.info("w4a16: W4A16_VLLM=0, keeping vLLM's kernels")
        return False
    try:
        import vllm._custom_ops as ops
    except ImportError as e:
        log.info("w4a16: vLLM is not importable (%s); nothing to patch", e)
        return False
    try:
        done = install(ops)
    except Exception as e:  # no usable GPU, library missing: leave vLLM as it is, and say why
        log.warning("w4a16: not replacing vLLM's int4 ops: %s", e)
        return False
    log.info("w4a16: vLLM ops now served by w4a16 %s: %s", __import__("w4a16").version(), ", ".join(done))
    return True
