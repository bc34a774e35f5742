"""SGLang integration: a `sglang.srt.plugins` entry point (`w4a16.engines.sglang:register`) that routes the int4
Marlin ops of SGLang's AWQ-Marlin and GPTQ-Marlin linear and MoE layers to w4a16.

SGLang (0.5.22, 0.5.23) calls these ops as Python functions of `sglang.kernels.ops` (JIT-built CUDA kernels), imported
into the layer modules with `from ... import name`, not through `torch.ops.sgl_kernel`; so they are replaced where
SGLang lets a plugin replace a function: AROUND hooks in SGLang's own HookRegistry, which rebind the defining module and
every `from ... import` copy when SGLang applies the hooks after loading its plugins. Each hook gets SGLang's function
and passes to it whatever w4a16 does not do: 8-bit weights, fp8 / fp4 Marlin (global scales), float zero points,
act-order on a row-parallel shard (is_k_full=False) or with groups that are not whole, shapes w4a16 rejects. Marlin
weights are bit for bit the same from either repack, so every layer can take either GEMM, call by call.
SGLang adds the bias after the GEMM itself (in natural column order), so the GEMM gets none.

MoE layers: SGLang's AWQ / GPTQ Marlin MoE (fused_marlin_moe) calls the Python function `moe_wna16_marlin_gemm` of
`sglang.kernels.ops.moe.moe_wna16_marlin` twice per layer, on stacked experts whose per-expert repacks are the repack
hooks above; an AROUND hook on it runs w4a16's grouped GEMM with SGLang's routing buffers (moe_align_block_size's
sorted ids, expert ids, padded count), c_or_none, mul_topk_weights and the bias as they come (the bias in Marlin's
column order, as SGLang's kernel takes it, put back in natural order). Rows of blocks whose expert id is outside
[0, E) (SGLang's -1 blocks, e.g. padded tokens) are left alone by w4a16's GEMM; where SGLang asks its kernel to zero
them (zero_inactive_output, 0.5.23) the hook zeroes them with a few small torch ops (no host sync, capture-safe).
SGLang 0.5.22's function lacks zero_inactive_output, expert_ids_are_sorted and has_inactive_prefix_count (its
fused_marlin_moe zeroes its shared cache itself: allocated with torch.zeros, and zero_() before the down GEMM under
expert parallelism) and allocates a missing c_or_none with torch.empty where w4a16 zeroes it.
SGLang's workspace, use_atomic_add, use_fp32_reduce and the sorted-expert hints are not needed. Passed to SGLang's
kernel: act-order experts, is_k_full=False, fp4 / 8-bit weights, global scales, float zero points, scales of another
dtype, block sizes other than 8..64 in steps of 8, N % 64 or K % 64 != 0, GPUs w4a16 does not run on, a first call
during CUDA-graph capture, calls w4a16 refuses. w4a16's MoE workspace is created while the experts load (an AROUND hook
on marlin_moe_permute_scales), so captured decode graphs are served; the same hook permutes gate/up scales of expert
widths up to G for the order the kernel reads (SGLang, like vLLM, permutes them for size_k = the width:
engines/vllm.py, "MoE scale order").

Expert parallelism (is_ep=True) is served like any other call: in 0.5.22 and 0.5.23 no expert map reaches the GEMM.
SGLang's dispatcher maps global expert ids to this rank's local ones and other ranks' experts to -1 before the experts
run (srt/layers/moe/token_dispatcher/standard.py), moe_align_block_size puts those pairs in -1 blocks, and in the GEMM
the flag only turns the sorted-id specialisations off: the kernel skips -1 blocks and writes nothing for them (zeroes
their rows with zero_inactive_output; sgl-kernel's marlin_template.h), which is what w4a16's grouped GEMM and
zero_inactive_rows do for every block whose id is outside [0, E). In 0.5.22 the flag is also what makes its kernel skip
-1 blocks: with is_ep=False it computes a -1 block with expert id -1 (out of bounds; such blocks hold CUDA-graph padding
tokens in layers without expert parallelism), where w4a16 skips it and leaves those rows as they are. So is_ep=True is
served the same on both releases, and is_ep=False differs only in rows that 0.5.22 leaves undefined.

Only releases whose function signatures were read from the real package are touched (`KNOWN`, recorded with the
package versions in tests/engines/schemas/); any other SGLang, or a changed signature, gets one log line and is left
as it is (a changed signature of the two MoE functions leaves only the MoE layers on SGLang's kernels).
W4A16_SGLANG=0 keeps SGLang's kernels (or leave `w4a16` out of SGLANG_PLUGINS)."""

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
# MoE: op name -> module defining the function SGLang's fused Marlin MoE calls (the GEMM), and the load-time function
# of the AWQ / GPTQ Marlin MoE kernels after which w4a16's MoE workspace is created. Hooked only when their
# parameters are the recorded ones (`moe_params`); otherwise only the MoE layers stay on SGLang's kernels.
MOE_TARGETS = {
    "moe_wna16_marlin_gemm": "sglang.kernels.ops.moe.moe_wna16_marlin",
    "marlin_moe_permute_scales": "sglang.srt.layers.quantization.marlin_utils",
}

# Per SGLang release: the parameters (name=default) of each hooked function, and the ids of the weight types that
# w4a16 serves (sgl_kernel.scalar_type). Read from the installed packages by tests/engines/test_sglang.py, which
# fails when an installed release differs from its record.
_GEMM_PARAMS = (
    "a, c, b_q_weight, b_scales, global_scale, b_zeros, g_idx, perm, workspace, b_q_type, size_m, size_n, "
    "size_k, is_k_full=True, use_atomic_add=False, use_fp32_reduce=False, is_zp_float=False"
)
_MOE_PARAMS_0522 = (
    "a, c_or_none, b_q_weight, b_bias_or_none, b_scales, global_scale_or_none, b_zeros_or_none, g_idx_or_none, "
    "perm_or_none, workspace, sorted_token_ids, expert_ids, num_tokens_post_padded, topk_weights, moe_block_size, "
    "top_k, mul_topk_weights, is_ep, b_q_type, size_m, size_n, size_k, is_k_full=True, use_atomic_add=False, "
    "use_fp32_reduce=False, is_zp_float=False"
)
# 0.5.23 added three keyword parameters at the end (the hook reads zero_inactive_output where it is present)
_MOE_PARAMS = _MOE_PARAMS_0522 + (
    ", expert_ids_are_sorted=False, zero_inactive_output=False, has_inactive_prefix_count=False"
)
_LINEAR_PARAMS = {
    "gptq_marlin_gemm": _GEMM_PARAMS,
    "awq_marlin_repack": "b_q_weight, size_k, size_n, num_bits",
    "gptq_marlin_repack": "b_q_weight, perm, size_k, size_n, num_bits",
    "marlin_sort_g_idx": "g_idx",
}
_SCALAR_TYPE_IDS = {"uint4": 1125899906843648, "uint4b8": 1125899907892224}
KNOWN = {
    "0.5.22": {
        "sglang_kernel": "0.4.9",
        "params": _LINEAR_PARAMS,
        "scalar_type_ids": _SCALAR_TYPE_IDS,
        "sgl_kernel_marlin_ops": {},  # sglang-kernel 0.4.9 registers no Marlin op in torch.ops.sgl_kernel
        "moe_params": {
            "moe_wna16_marlin_gemm": _MOE_PARAMS_0522,
            "marlin_moe_permute_scales": "s, size_k, size_n, group_size",
        },
    },
    "0.5.23": {
        "sglang_kernel": "0.4.10",
        "params": _LINEAR_PARAMS,
        "scalar_type_ids": _SCALAR_TYPE_IDS,
        "sgl_kernel_marlin_ops": {},  # sglang-kernel 0.4.10 registers no Marlin op in torch.ops.sgl_kernel
        "moe_params": {
            "moe_wna16_marlin_gemm": _MOE_PARAMS,
            "marlin_moe_permute_scales": "s, size_k, size_n, group_size",
        },
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
    moe_params = {}
    for name, module in MOE_TARGETS.items():
        try:
            moe_params[name] = params_of(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError) as e:  # moved or gone: only the MoE layers are then left alone
            moe_params[name] = f"missing ({type(e).__name__})"
    return {
        "sglang": ver("sglang"),
        "sglang_kernel": ver("sglang-kernel", "sgl-kernel"),
        "params": params,
        "scalar_type_ids": ids,
        "sgl_kernel_marlin_ops": ops,
        "moe_params": moe_params,
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


def _moe():
    from .. import moe  # looked up per call, so that tests can stand in for w4a16's grouped GEMM

    return moe


def zero_inactive_rows(c, sorted_ids, expert_ids, npp, block, num_experts):
    """Zero the rows of c that SGLang's routing put in blocks with no expert of this layer (expert id outside
    [0, E), within the padded count): what SGLang's kernel does for zero_inactive_output=True, and w4a16's grouped
    GEMM does not (it skips those blocks). Fixed-shape torch ops only (no host sync, capture-safe); rows listed in no
    block are left as they are, as SGLang leaves them."""
    import torch

    rows = c.shape[0]
    n = min(sorted_ids.numel(), expert_ids.numel() * block)
    ids = sorted_ids[:n].to(torch.int64)
    pos = torch.arange(n, device=ids.device)
    e = expert_ids.index_select(0, pos // block)
    inactive = ((e < 0) | (e >= num_experts)) & (pos < npp[:1].to(torch.int64)) & (ids >= 0) & (ids < rows)
    mask = torch.zeros(rows + 1, dtype=torch.bool, device=c.device)
    mask.index_fill_(0, torch.where(inactive, ids, rows), True)
    c.masked_fill_(mask[:rows].unsqueeze(1), 0)


def make_moe_hooks(uint4_id, uint4b8_id, moe_gemm, device_ok=None):
    """AROUND hooks of the MoE path: SGLang's moe_wna16_marlin_gemm on w4a16's grouped GEMM (`moe_gemm`: SGLang's
    function, whose signature the arguments are bound by) and marlin_moe_permute_scales (creates w4a16's MoE
    workspace while the experts load)."""
    import torch

    import w4a16

    from .._checks_torch import group_of_rows
    from . import _common

    def served_device(device):  # _common's looked up per call (tests stand in for it)
        return (device_ok or _common.device_supported)(device)

    signature = inspect.signature(moe_gemm)
    op = "moe_wna16_marlin_gemm"

    def pass_through(reason, original, args, kwargs):
        if not torch.compiler.is_compiling():
            _once(f"{op} {reason}", logging.INFO, "w4a16: %s %s: SGLang's own kernel", op, reason)
        return original(*args, **kwargs)

    def refusal(p):
        """Why w4a16 does not take this call (None when it does): only host-side facts."""
        a, b_scales, b_zeros, w = p["a"], p["b_scales"], p["b_zeros_or_none"], p["b_q_weight"]
        size_n, size_k, block = p["size_n"], p["size_k"], p["moe_block_size"]
        if p["global_scale_or_none"] is not None:
            return "global scale (fp4)"
        if p["is_zp_float"]:
            return "float zero points"
        if not _empty(p["g_idx_or_none"]) or not _empty(p["perm_or_none"]):
            return "act-order experts (g_idx / perm)"
        if not p["is_k_full"]:
            return "act-order on a row-parallel shard (is_k_full=False)"
        # is_ep is served: SGLang's kernel skips the -1 blocks (other ranks' experts) as w4a16 does (module docstring)
        qid = getattr(p["b_q_type"], "id", None)
        kind = {uint4_id: "uint4", uint4b8_id: "uint4b8"}.get(qid)
        type_text = f"weight type {getattr(p['b_q_type'], 'name', p['b_q_type'])}"
        reason = _common.moe_weight_reason(a, b_scales, not _empty(b_zeros), kind, type_text, block)
        if reason is not None:
            return reason
        if p["top_k"] < 1 or size_n % 64 or size_k % 64:
            return f"shape N={size_n} K={size_k} (w4a16 MoE: N % 64, K % 64)"
        if w.dtype != torch.int32 or w.dim() != 3 or tuple(w.shape[1:]) != (size_k // 16, 2 * size_n):
            return "weight not in the 4-bit Marlin layout"
        if b_scales.dim() != 3 or group_of_rows(b_scales.shape[1], size_k) is None:
            return f"scales {tuple(b_scales.shape)} for K={size_k}"
        if p["mul_topk_weights"] and p["topk_weights"].dtype != torch.float32:
            return f"topk_weights {p['topk_weights'].dtype}"
        if not served_device(a.device):
            return f"device {a.device} not served by w4a16"
        return _common.capture_reason(a, _moe()._workspaces, "MoE ")

    def moe_wna16_marlin_gemm(original, *args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        p = bound.arguments
        reason = refusal(p)
        if reason is not None:
            return pass_through(reason, original, args, kwargs)
        a, c, size_m, size_n, top_k = p["a"], p["c_or_none"], p["size_m"], p["size_n"], p["top_k"]
        if size_m == 0:  # as SGLang: nothing to compute
            return c if c is not None else a.new_zeros((0, size_n))
        bias = p["b_bias_or_none"]
        bias = _common.marlin_bias_unpermute(bias) if bias is not None else None
        zeros = None if _empty(p["b_zeros_or_none"]) else p["b_zeros_or_none"]
        sorted_ids, expert_ids, npp, block = (
            p["sorted_token_ids"],
            p["expert_ids"],
            p["num_tokens_post_padded"],
            p["moe_block_size"],
        )
        try:
            out = _moe()._grouped(
                "marlin",
                a,
                c,
                p["b_q_weight"],
                bias,
                p["b_scales"],
                zeros,
                sorted_ids,
                expert_ids,
                npp,
                p["topk_weights"],
                p["mul_topk_weights"],
                block,
                top_k,
                size_m,
                size_n,
                p["size_k"],
            )
        except ValueError as e:  # w4a16 refused the call: it launched and wrote nothing
            return pass_through(f"w4a16 refused it ({e})", original, args, kwargs)
        except w4a16.W4A16Error as e:
            if e.status not in _common.REFUSALS:
                raise  # a device fault: SGLang's kernel would run on a broken context and hide it
            return pass_through(f"w4a16 refused it ({e})", original, args, kwargs)
        # c_or_none None: w4a16 allocated c zeroed (SGLang 0.5.23 zeroes it too; 0.5.22 leaves it uninitialised);
        # a caller's c keeps its inactive rows unless asked. SGLang 0.5.22's function has no zero_inactive_output
        # (its fused_marlin_moe zeroes the caches itself; its kernel never zeroes rows): False there.
        if c is not None and p.get("zero_inactive_output", False):
            zero_inactive_rows(out, sorted_ids, expert_ids, npp, block, p["b_q_weight"].shape[0])
        _state["moe_served"] = _state.get("moe_served", 0) + 1
        return out

    def marlin_moe_permute_scales(original, s, size_k, size_n, group_size):
        # SGLang's AWQ / GPTQ MoE methods pass the expert width per partition as size_k for the gate/up scales (as
        # vLLM does): where it is at most G, grouped scales would get the one-group order the kernel does not read
        # (it takes the order from the scale rows). Permute for the order the kernel reads.
        k = _common.grouped_size_k(s.shape[1], size_k, group_size)
        if k != size_k:
            _once(
                "moe scale order",
                logging.WARNING,
                "w4a16: SGLang permutes the scales of MoE layers like this one (%d scale rows, G=%d) for size_k=%d, "
                "an order the Marlin MoE kernel does not read; w4a16 permutes them for size_k=%d, so these layers "
                "compute the checkpoint's weights (on w4a16 and on SGLang's kernel alike)",
                s.shape[1],
                group_size,
                size_k,
                k,
            )
        out = original(s, k, size_n, group_size)
        if s.is_cuda and served_device(s.device):
            _moe().prepare(s.device)  # load time, before any CUDA graph is captured
        return out

    return {"moe_wna16_marlin_gemm": moe_wna16_marlin_gemm, "marlin_moe_permute_scales": marlin_moe_permute_scales}


def check_moe(live):
    """'' when the running SGLang's MoE functions are the recorded ones (check() passed), else why not."""
    known = KNOWN[live["sglang"]]["moe_params"]
    for name, params in known.items():
        if live.get("moe_params", {}).get(name) != params:
            got = live.get("moe_params", {}).get(name)
            return f"{name}({got}) differs from the recorded ({params})"
    return ""


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
    moe_why = check_moe(live)
    if not moe_why:
        try:
            moe_gemm = getattr(importlib.import_module(MOE_TARGETS["moe_wna16_marlin_gemm"]), "moe_wna16_marlin_gemm")
            moe_hooks = make_moe_hooks(live["scalar_type_ids"]["uint4"], live["scalar_type_ids"]["uint4b8"], moe_gemm)
        except Exception as e:
            moe_why = f"{type(e).__name__}: {e}"
    if moe_why:
        log.warning("w4a16: SGLang %s: %s; its MoE layers stay on SGLang's kernels", live["sglang"], moe_why)
    else:
        for name, module in MOE_TARGETS.items():
            HookRegistry.register(f"{module}.{name}", moe_hooks[name], HookType.AROUND)
    served = list(TARGETS) + ([] if moe_why else ["moe_wna16_marlin_gemm"])
    log.info(
        "w4a16: SGLang %s (sglang-kernel %s) ops now served by w4a16 %s: %s; %s8-bit and fp8/fp4 Marlin stay on "
        "SGLang's kernels",
        live["sglang"],
        live["sglang_kernel"],
        w4a16.version(),
        ", ".join(served),
        "MoE GEMMs, " if moe_why else "act-order MoE, ",
    )
    return True
