"""SGLang integration: a `sglang.srt.plugins` entry point (`w4a16.engines.sglang:register`) that routes the int4
Marlin ops of SGLang's AWQ-Marlin and GPTQ-Marlin linear layers to w4a16.

SGLang (0.5.23) calls these ops as Python functions of `sglang.kernels.ops` (JIT-built CUDA kernels), imported into
the layer modules with `from ... import name`, not through `torch.ops.sgl_kernel`; so they are replaced where SGLang
lets a plugin replace a function: AROUND hooks in SGLang's own HookRegistry, which rebind the defining module and every
`from ... import` copy when SGLang applies the hooks after loading its plugins. Each hook gets SGLang's function and
passes to it whatever w4a16 does not do: 8-bit weights, fp8 / fp4 Marlin (global scales), float zero points,
act-order on a row-parallel shard (is_k_full=False) or with groups that are not whole, shapes w4a16 rejects. Marlin
weights are bit for bit the same from either repack, so every layer can take either GEMM, call by call.
SGLang adds the bias after the GEMM itself (in natural column order), so the GEMM gets none. MoE layers keep
SGLang's fused Marlin MoE kernel (their per-expert repack goes through the same, bit-identical repack hook).

Only releases whose function signatures were read from the real package are touched (`KNOWN`, recorded with the
package versions in tests/engines/schemas/); any other SGLang, or a changed signature, gets one log line and is left
as it is. W4A16_SGLANG=0 keeps SGLang's kernels (or leave `w4a16` out of SGLANG_PLUGINS)."""

import importlib
import inspect
import logging
import os

log = logging.getLogger("w4a16.sglang")

# op name -> module defining the function SGLang's linear layers call
TARGETS = {
    "gptq_marlin_gemm": "sglang.kernels.ops.gemm.gptq_marlin",
    "awq_marlin_repack": "sglang.kernels.ops.quantization.awq_marlin_repack",
    "gptq_marlin_repack": "sglang.kernels.ops.quantization.gptq_marlin_repack",
}
# Act-order GPTQ: SGLang sorts g_idx here at load time; the hook checks that the groups are whole.
SORT_G_IDX = ("marlin_sort_g_idx", "sglang.srt.layers.quantization.marlin_utils")

# Per SGLang release: the parameters (name=default) of each hooked function, and the ids of the weight types that
# w4a16 serves (sgl_kernel.scalar_type). Read from the installed packages by tests/engines/test_sglang.py, which
# fails when an installed release differs from its record.
_GEMM_PARAMS = (
    "a, c, b_q_weight, b_scales, global_scale, b_zeros, g_idx, perm, workspace, b_q_type, size_m, size_n, "
    "size_k, is_k_full=True, use_atomic_add=False, use_fp32_reduce=False, is_zp_float=False"
)
KNOWN = {
    "0.5.23": {
        "sglang_kernel": "0.4.10",
        "params": {
            "gptq_marlin_gemm": _GEMM_PARAMS,
            "awq_marlin_repack": "b_q_weight, size_k, size_n, num_bits",
            "gptq_marlin_repack": "b_q_weight, perm, size_k, size_n, num_bits",
            "marlin_sort_g_idx": "g_idx",
        },
        "scalar_type_ids": {"uint4": 1125899906843648, "uint4b8": 1125899907892224},
        "sgl_kernel_marlin_ops": {},  # sglang-kernel 0.4.10 registers no Marlin op in torch.ops.sgl_kernel
    },
}

# Load-time facts the forward reads: whether every act-order layer had whole groups, and their group sizes.
_state = {"act_order_whole": True, "act_order_groups": set(), "logged": set()}


def params_of(fn):
    """'name, name=default, ...' of a function (through functools.wraps wrappers)."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        out.append(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}")
    return ", ".join(out)


def live_schema():
    """What the running SGLang offers: versions, the hooked functions' parameters, the weight type ids."""
    from importlib.metadata import PackageNotFoundError, version

    def ver(*names):
        for n in names:
            try:
                return version(n)
            except PackageNotFoundError:
                pass
        return None

    params = {}
    for name, module in list(TARGETS.items()) + [SORT_G_IDX]:
        params[name] = params_of(getattr(importlib.import_module(module), name))
    from sglang.srt.layers.quantization.utils import get_scalar_types

    _, scalar_types = get_scalar_types()
    ids = {t: getattr(getattr(scalar_types, t, None), "id", None) for t in ("uint4", "uint4b8")}
    import torch

    ops = {
        str(s.name): str(s)
        for s in torch._C._jit_get_all_schemas()
        if s.name.startswith("sgl_kernel::") and any(w in s.name for w in ("marlin", "gptq", "awq"))
    }
    return {
        "sglang": ver("sglang"),
        "sglang_kernel": ver("sglang-kernel", "sgl-kernel"),
        "params": params,
        "scalar_type_ids": ids,
        "sgl_kernel_marlin_ops": ops,
    }


def _once(key, level, msg, *args):
    if key not in _state["logged"]:
        _state["logged"].add(key)
        log.log(level, msg, *args)


def _empty(t):
    return t is None or t.numel() == 0


def make_hooks(uint4_id, uint4b8_id):
    """AROUND hooks (SGLang's HookRegistry calling convention: hook(original, *args, **kwargs))."""
    import torch

    from .. import torch as wt
    from .._checks_torch import group_of_rows

    def pass_through(reason, original, *args, **kwargs):
        if not torch.compiler.is_compiling():
            _once(reason, logging.INFO, "w4a16: %s: SGLang's own kernel", reason)
        return original(*args, **kwargs)

    def awq_marlin_repack(original, b_q_weight, size_k, size_n, num_bits):
        if (
            num_bits == 4
            and b_q_weight.dtype == torch.int32
            and tuple(b_q_weight.shape) == (size_k, size_n // 8)
            and size_k % 16 == 0
            and size_n % 64 == 0
        ):
            wt.prepare(b_q_weight.device)  # the GEMM's workspace exists before any CUDA graph is captured
            return wt.awq_marlin_repack(b_q_weight.contiguous(), size_k, size_n, num_bits)
        return pass_through(
            f"awq_marlin_repack num_bits={num_bits} K={size_k} N={size_n}",
            original,
            b_q_weight,
            size_k,
            size_n,
            num_bits,
        )

    def gptq_marlin_repack(original, b_q_weight, perm, size_k, size_n, num_bits):
        if (
            num_bits == 4
            and b_q_weight.dtype == torch.int32
            and tuple(b_q_weight.shape) == (size_k // 8, size_n)
            and size_k % 16 == 0
            and size_n % 64 == 0
            and (perm.numel() == 0 or (perm.numel() == size_k and perm.dtype == torch.int32))
        ):
            wt.prepare(b_q_weight.device)
            return wt.gptq_marlin_repack(b_q_weight.contiguous(), perm.contiguous(), size_k, size_n, num_bits)
        return pass_through(
            f"gptq_marlin_repack num_bits={num_bits} K={size_k} N={size_n}",
            original,
            b_q_weight,
            perm,
            size_k,
            size_n,
            num_bits,
        )

    def marlin_sort_g_idx(original, g_idx):
        sorted_g_idx, sort_indices = original(g_idx)
        # Load time, once per layer: w4a16's act-order GEMM takes row k of the sorted weight to be in group k / G,
        # true when every group holds the same number of rows (what GPTQ writes for an unsharded K).
        counts = torch.bincount(sorted_g_idx.to(torch.int64))
        k = sorted_g_idx.numel()
        if k and counts.numel() * int(counts[0]) == k and bool((counts == counts[0]).all()):
            _state["act_order_groups"].add(k // counts.numel())
        else:
            _state["act_order_whole"] = False
            _once(
                "uneven",
                logging.WARNING,
                "w4a16: act-order groups of unequal size: act-order layers stay on SGLang's GEMM",
            )
        return sorted_g_idx, sort_indices

    def gptq_marlin_gemm(
        original,
        a,
        c,
        b_q_weight,
        b_scales,
        global_scale,
        b_zeros,
        g_idx,
        perm,
        workspace,
        b_q_type,
        size_m,
        size_n,
        size_k,
        is_k_full=True,
        use_atomic_add=False,
        use_fp32_reduce=False,
        is_zp_float=False,
    ):
        args = (a, c, b_q_weight, b_scales, global_scale, b_zeros, g_idx, perm, workspace, b_q_type)
        kwargs = dict(
            size_m=size_m,
            size_n=size_n,
            size_k=size_k,
            is_k_full=is_k_full,
            use_atomic_add=use_atomic_add,
            use_fp32_reduce=use_fp32_reduce,
            is_zp_float=is_zp_float,
        )
        reason = _gemm_refusal(
            a,
            c,
            b_q_weight,
            b_scales,
            global_scale,
            b_zeros,
            g_idx,
            perm,
            b_q_type,
            size_m,
            size_n,
            size_k,
            is_k_full,
            is_zp_float,
        )
        if reason:
            return pass_through(f"gptq_marlin_gemm {reason}", original, *args, **kwargs)
        # use_atomic_add / use_fp32_reduce tune SGLang's own kernel; w4a16 adds split-K partials in fp32, in order
        if size_m == 0:
            return a.new_empty((0, size_n)) if c is None else c
        a2 = a.reshape(size_m, size_k).contiguous()
        if not _empty(g_idx):  # act-order: the weight rows were sorted by group with perm at load time
            a2 = wt.permute_cols(a2, perm)
        out = wt.marlin_gemm(
            a2, b_q_weight, b_scales, None if _empty(b_zeros) else b_zeros, None, size_m, size_n, size_k
        )
        if c is not None:
            c.copy_(out)
            return c
        return out

    def _gemm_refusal(
        a,
        c,
        b_q_weight,
        b_scales,
        global_scale,
        b_zeros,
        g_idx,
        perm,
        b_q_type,
        size_m,
        size_n,
        size_k,
        is_k_full,
        is_zp_float,
    ):
        """Why w4a16 does not take this call ('' when it does); only shapes, dtypes and load-time facts."""
        qid = getattr(b_q_type, "id", None)
        if qid not in (uint4_id, uint4b8_id):
            return f"weight type {getattr(b_q_type, 'name', b_q_type)}"
        if global_scale is not None or is_zp_float:
            return "global scale or float zero points"
        if a.dtype not in (torch.float16, torch.bfloat16) or b_scales.dtype != a.dtype:
            return f"dtype {a.dtype} with scales {b_scales.dtype}"
        if (qid == uint4_id) == _empty(b_zeros):
            return "zero points that do not match the weight type"
        if b_q_weight.dtype != torch.int32 or tuple(b_q_weight.shape) != (size_k // 16, 2 * size_n):
            return "weight not in the 4-bit Marlin layout"
        if size_n % 64 or size_k % 128 or b_scales.dim() != 2 or b_scales.shape[1] != size_n:
            return f"shape N={size_n} K={size_k}"
        rows = b_scales.shape[0]
        if group_of_rows(rows, size_k) is None:
            return f"group size {size_k // max(rows, 1)}"
        if _empty(g_idx) != _empty(perm):
            return "g_idx without perm"
        if not _empty(g_idx):
            if not is_k_full:
                return "act-order on a row-parallel shard (is_k_full=False)"
            if not _state["act_order_whole"] or size_k // rows not in _state["act_order_groups"]:
                return "act-order with groups that are not whole"
            if perm.numel() != size_k or perm.dtype != torch.int32:
                return "act-order perm"
        if c is not None and (c.dtype != a.dtype or tuple(c.shape) != (size_m, size_n)):
            return "output tensor"
        return ""

    return {
        "gptq_marlin_gemm": gptq_marlin_gemm,
        "awq_marlin_repack": awq_marlin_repack,
        "gptq_marlin_repack": gptq_marlin_repack,
        "marlin_sort_g_idx": marlin_sort_g_idx,
    }


def check(live):
    """'' when w4a16 knows the running SGLang, else the reason it does not."""
    known = KNOWN.get(live["sglang"])
    if known is None:
        return f"SGLang {live['sglang']} is not a release w4a16 was checked against ({', '.join(sorted(KNOWN))})"
    if live["sglang_kernel"] != known["sglang_kernel"]:
        return (
            f"sglang-kernel {live['sglang_kernel']} is not the release recorded with SGLang {live['sglang']} "
            f"({known['sglang_kernel']})"
        )
    for name, params in known["params"].items():
        if live["params"].get(name) != params:
            return f"SGLang {live['sglang']} {name}({live['params'].get(name)}) differs from the recorded ({params})"
    for t, want in known["scalar_type_ids"].items():
        if live["scalar_type_ids"].get(t) != want:
            return f"sgl-kernel scalar type {t} id {live['scalar_type_ids'].get(t)} (recorded {want})"
    if live["sgl_kernel_marlin_ops"] != known["sgl_kernel_marlin_ops"]:
        return (
            f"sgl-kernel {live['sglang_kernel']} Marlin ops {sorted(live['sgl_kernel_marlin_ops'])} differ from "
            f"the recorded ({sorted(known['sgl_kernel_marlin_ops'])})"
        )
    return ""


def register():
    """The entry point SGLang's load_plugins() runs in every process. Returns True when the hooks were registered
    (SGLang applies them right after its plugins ran)."""
    if os.environ.get("W4A16_SGLANG", "1") == "0":
        log.info("w4a16: W4A16_SGLANG=0, keeping SGLang's kernels")
        return False
    try:
        live = live_schema()
    except Exception as e:  # not the SGLang layout this adapter knows: leave it alone
        log.warning("w4a16: SGLang left untouched: cannot read its Marlin ops (%s: %s)", type(e).__name__, e)
        return False
    reason = check(live)
    if reason:
        log.warning("w4a16: SGLang left untouched: %s", reason)
        return False
    try:
        import w4a16

        hooks = make_hooks(live["scalar_type_ids"]["uint4"], live["scalar_type_ids"]["uint4b8"])
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except Exception as e:  # library missing or unusable: SGLang keeps its kernels
        log.warning("w4a16: SGLang left untouched: %s: %s", type(e).__name__, e)
        return False
    for name, module in list(TARGETS.items()) + [SORT_G_IDX]:
        HookRegistry.register(f"{module}.{name}", hooks[name], HookType.AROUND)
    log.info(
        "w4a16: SGLang %s (sglang-kernel %s) ops now served by w4a16 %s: %s; MoE GEMMs, 8-bit and fp8/fp4 "
        "Marlin stay on SGLang's kernels",
        live["sglang"],
        live["sglang_kernel"],
        w4a16.version(),
        ", ".join(TARGETS),
    )
    return True
