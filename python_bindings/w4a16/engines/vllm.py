"""vLLM adapter: runs vLLM's dense int4 Marlin / AWQ linear layers on w4a16, chosen from the running vLLM.

Where it hooks in (see _common for why the dispatcher): the kernels of vLLM's own ops `_C::marlin_gemm`,
`_C::gptq_marlin_repack`, `_C::awq_marlin_repack`, `_C::awq_gemm` and `_C::awq_dequantize` are replaced for the CUDA
dispatch key. vLLM's Python code, its fake implementations and torch.compile's graphs stay as they are; every call
lands here at run time, with real tensors, where w4a16 serves it or hands it to vLLM's own kernel (kept with
torch.library.get_kernel). Only host-side facts decide (dtypes, shapes, ints and bools of the call, and what was
recorded while the weights loaded): no device synchronisation, nothing a CUDA-graph capture cannot take.

A generation is a range of vLLM releases plus the exact schemas of the ops above, read from the real wheels
(tests/engines/schemas/ holds the full records; the engine tests compare the two). The adapter is installed only when
the running vLLM's version lies in a known range *and* every live schema equals the recorded one; otherwise one log
line says why and vLLM is left untouched.

Served by w4a16: 4-bit weights of types uint4 (AWQ, with zero points) and uint4b8 (GPTQ, symmetric), fp16/bf16
activations, group sizes 32/64/128/per-channel, N % 64 == 0 and K % 128 == 0 for Marlin (K % 32 for the AWQ GEMM),
act-order on the whole K (0.15-0.22: vLLM 0.23+ refuses desc_act itself). Goes to vLLM's kernel: activation scales
(W4A8 int8/fp8), fp4/fp8 weights and global scales, 8-bit weights, float zero points, a row-parallel shard of an
act-order layer (is_k_full=False), act-order whose groups are not whole, other shapes, GPUs w4a16 does not run on.
MoE layers (`_moe_C::moe_wna16_marlin_gemm`) stay on vLLM's kernels; their per-expert repack calls are the same
`_C::*_marlin_repack` ops and get w4a16's bit-identical output.

Bias: vLLM stores a Marlin layer's bias in Marlin's column order (marlin_permute_bias); w4a16 adds the bias in
natural order, so it is put back in order on the way in (one small copy per call, capture-safe)."""
import importlib.metadata
import logging
import os
import re

import torch

from . import _common

# A child of vLLM's logger, so the lines show in vLLM's own log output (vLLM's handler sits on "vllm").
log = logging.getLogger("vllm.w4a16")

_MARLIN_GEMM_015 = (
    "_C::marlin_gemm(Tensor a, Tensor? c_or_none, Tensor b_q_weight, Tensor? b_bias_or_none, Tensor b_scales, "
    "Tensor? a_scales, Tensor? global_scale, Tensor? b_zeros_or_none, Tensor? g_idx_or_none, Tensor? perm_or_none, "
    "Tensor workspace, int b_type_id, SymInt size_m, SymInt size_n, SymInt size_k, bool is_k_full, "
    "bool use_atomic_add, bool use_fp32_reduce, bool is_zp_float) -> Tensor")
_MARLIN_GEMM_023 = (
    "_C::marlin_gemm(Tensor a, Tensor? c_or_none, Tensor b_q_weight, Tensor? b_bias_or_none, Tensor b_scales, "
    "Tensor? a_scales, Tensor? global_scale, Tensor? b_zeros_or_none, Tensor workspace, int b_type_id, "
    "SymInt size_m, SymInt size_n, SymInt size_k, bool use_atomic_add, bool use_fp32_reduce, bool is_zp_float) "
    "-> Tensor")
_GPTQ_REPACK_015 = ("_C::gptq_marlin_repack(Tensor b_q_weight, Tensor perm, SymInt size_k, SymInt size_n, "
                    "int num_bits, bool is_a_8bit) -> Tensor")
_GPTQ_REPACK_023 = ("_C::gptq_marlin_repack(Tensor b_q_weight, SymInt size_k, SymInt size_n, int num_bits, "
                    "bool is_a_8bit) -> Tensor")
_AWQ_REPACK = ("_C::awq_marlin_repack(Tensor b_q_weight, SymInt size_k, SymInt size_n, int num_bits, "
               "bool is_a_8bit) -> Tensor")
_AWQ_GEMM = ("_C::awq_gemm(Tensor _in_feats, Tensor _kernel, Tensor _scaling_factors, Tensor _zeros, "
             "SymInt split_k_iters) -> Tensor")
_AWQ_DEQUANT = ("_C::awq_dequantize(Tensor _kernel, Tensor _scaling_factors, Tensor _zeros, SymInt split_k_iters, "
                "int thx, int thy) -> Tensor")


class Generation:
    def __init__(self, name, first, last, recorded_from, schemas, type_ids):
        self.name, self.first, self.last, self.recorded_from = name, first, last, recorded_from
        self.schemas, self.type_ids = schemas, type_ids

    def covers(self, version):
        return self.first <= version[:2] <= self.last


# ScalarType ids (vllm.scalar_type.scalar_types.<t>.id) as the wheels compute them; checked against the live vLLM.
_TYPE_IDS = {"uint4": 1125899906843648, "uint4b8": 1125899907892224}

GENERATIONS = (
    Generation("0.15-0.22", (0, 15), (0, 22), "0.15.1",
               {"marlin_gemm": _MARLIN_GEMM_015, "gptq_marlin_repack": _GPTQ_REPACK_015,
                "awq_marlin_repack": _AWQ_REPACK, "awq_gemm": _AWQ_GEMM, "awq_dequantize": _AWQ_DEQUANT},
               _TYPE_IDS),
    Generation("0.23-0.33", (0, 23), (0, 33), "0.33.0",
               {"marlin_gemm": _MARLIN_GEMM_023, "gptq_marlin_repack": _GPTQ_REPACK_023,
                "awq_marlin_repack": _AWQ_REPACK, "awq_gemm": _AWQ_GEMM, "awq_dequantize": _AWQ_DEQUANT},
               _TYPE_IDS),
)

_FLOATS = (torch.float16, torch.bfloat16)


def parse_version(text):
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(g or 0) for g in m.groups()) if m else None


def generation_for(version_text):
    v = parse_version(version_text)
    if v is None:
        return None
    return next((g for g in GENERATIONS if g.covers(v)), None)


def load_vllm_ops():
    """Import vLLM's compiled extension(s) holding the _C ops (vllm._C up to 0.22, vllm._C_stable_libtorch from
    0.23; vLLM itself imports them from its CUDA platform code, which may not have run yet when plugins load)."""
    import vllm._custom_ops  # noqa: F401
    loaded = []
    for name in ("vllm._C", "vllm._C_stable_libtorch"):
        try:
            importlib.import_module(name)
            loaded.append(name)
        except ImportError:
            pass
    return loaded


def _wt():
    from .. import torch as wt  # looked up per call, so that tests can stand in for w4a16's ops
    return wt


class VllmAdapter:
    """The installed replacement. `served` / `fell_back` count calls per op (host counters, for logs and tests)."""

    def __init__(self, generation, dispatch_key="CUDA", device_ok=None, namespace="_C"):
        self.generation = generation
        self.overrides = _common.Overrides(namespace, dispatch_key)
        self.device_ok = device_ok or _common.device_supported
        self.uint4, self.uint4b8 = generation.type_ids["uint4"], generation.type_ids["uint4b8"]
        self.served, self.fell_back = {}, {}
        self._said = set()
        # act-order layers whose sorted groups were checked whole at load time: perm data_ptr -> (perm, g_idx, G)
        self.act_order = {}
        self._unpatch = []

    # ------------------------------------------------------------------ bookkeeping
    def _fallback(self, op, reason, keyset, *args):
        self.fell_back[op] = self.fell_back.get(op, 0) + 1
        if (op, reason) not in self._said:
            self._said.add((op, reason))
            log.info("w4a16: _C::%s goes to vLLM's kernel: %s", op, reason)
        return self.overrides.call_original(op, keyset, *args)

    def _serve(self, op, fn, keyset, args):
        """Run w4a16's op; if w4a16 refuses the call (it then launched and wrote nothing), vLLM's kernel runs it."""
        import w4a16
        try:
            out = fn()
        except (ValueError, w4a16.W4A16Error) as e:
            return self._fallback(op, f"w4a16 refused it ({e})", keyset, *args)
        self.served[op] = self.served.get(op, 0) + 1
        return out

    # ------------------------------------------------------------------ decisions (host-side only)
    def _marlin_gemm_reason(self, a, b_scales, b_zeros, a_scales, global_scale, b_type_id, size_m, size_n, size_k,
                            is_zp_float):
        if a_scales is not None:
            return "activation scales (W4A8)"
        if global_scale is not None:
            return "global scale (fp4)"
        if is_zp_float:
            return "float zero points"
        if a.dtype not in _FLOATS or b_scales.dtype != a.dtype:
            return f"activations {a.dtype} with scales {b_scales.dtype}"
        has_zp = b_zeros is not None and b_zeros.numel() > 0
        if b_type_id == self.uint4:
            if not has_zp:
                return "uint4 without zero points"
        elif b_type_id == self.uint4b8:
            if has_zp:
                return "uint4b8 with zero points"
        else:
            return f"weight type id {b_type_id} (not 4-bit uint4 / uint4b8)"
        if size_m < 1 or size_n % 64 or size_k % 128:
            return f"shape M={size_m} N={size_n} K={size_k} (w4a16 Marlin: N % 64, K % 128)"
        if _common.group_size_of(size_k, b_scales.shape[0]) not in (32, 64, 128, -1):
            return f"{b_scales.shape[0]} scale rows for K={size_k}"
        if not self.device_ok(a.device):
            return f"device {a.device} not served by w4a16"
        return None

    def _act_order_reason(self, g_idx, perm, is_k_full, size_k, scale_rows):
        if not is_k_full:
            return "act-order on a row-parallel shard (is_k_full=False)"
        entry = None if perm is None else self.act_order.get((perm.data_ptr(), perm.numel()))
        if entry is None or entry[1].data_ptr() != g_idx.data_ptr():
            return "act-order layer whose groups were not checked whole at load time"
        if entry[2] != _common.group_size_of(size_k, scale_rows):
            return "act-order group size differs from the scales'"
        return None

    def _run_marlin(self, a, c, b_q_weight, b_bias, b_scales, b_zeros, perm, size_m, size_n, size_k):
        wt = _wt()
        a2 = a.reshape(size_m, size_k).contiguous()
        if perm is not None:
            a2 = wt.permute_cols(a2, perm)
        zeros = b_zeros if b_zeros is not None and b_zeros.numel() > 0 else None
        bias = _common.marlin_bias_unpermute(b_bias) if b_bias is not None else None
        out = wt.marlin_gemm(a2, b_q_weight, b_scales, zeros, bias, size_m, size_n, size_k)
        if c is not None:
            c.copy_(out)
            return c
        return out

    # ------------------------------------------------------------------ op kernels (called with the dispatch keyset)
    def marlin_gemm_015(self, keyset, a, c, b_q_weight, b_bias, b_scales, a_scales, global_scale, b_zeros, g_idx,
                        perm, workspace, b_type_id, size_m, size_n, size_k, is_k_full, use_atomic_add,
                        use_fp32_reduce, is_zp_float):
        args = (a, c, b_q_weight, b_bias, b_scales, a_scales, global_scale, b_zeros, g_idx, perm, workspace,
                b_type_id, size_m, size_n, size_k, is_k_full, use_atomic_add, use_fp32_reduce, is_zp_float)
        reason = self._marlin_gemm_reason(a, b_scales, b_zeros, a_scales, global_scale, b_type_id, size_m, size_n,
                                          size_k, is_zp_float)
        act_order = g_idx is not None and g_idx.numel() > 0
        if reason is None and act_order:
            reason = self._act_order_reason(g_idx, perm, is_k_full, size_k, b_scales.shape[0])
        if reason is not None:
            return self._fallback("marlin_gemm", reason, keyset, *args)
        return self._serve("marlin_gemm", lambda: self._run_marlin(
            a, c, b_q_weight, b_bias, b_scales, b_zeros, perm if act_order else None, size_m, size_n, size_k),
            keyset, args)

    def marlin_gemm_023(self, keyset, a, c, b_q_weight, b_bias, b_scales, a_scales, global_scale, b_zeros,
                        workspace, b_type_id, size_m, size_n, size_k, use_atomic_add, use_fp32_reduce, is_zp_float):
        args = (a, c, b_q_weight, b_bias, b_scales, a_scales, global_scale, b_zeros, workspace, b_type_id, size_m,
                size_n, size_k, use_atomic_add, use_fp32_reduce, is_zp_float)
        reason = self._marlin_gemm_reason(a, b_scales, b_zeros, a_scales, global_scale, b_type_id, size_m, size_n,
                                          size_k, is_zp_float)
        if reason is not None:
            return self._fallback("marlin_gemm", reason, keyset, *args)
        return self._serve("marlin_gemm", lambda: self._run_marlin(
            a, c, b_q_weight, b_bias, b_scales, b_zeros, None, size_m, size_n, size_k), keyset, args)

    def _repack_reason(self, b_q_weight, size_k, size_n, num_bits, is_a_8bit):
        if num_bits != 4:
            return f"{num_bits}-bit weights"
        if is_a_8bit:
            return "8-bit activation layout (W4A8)"
        if b_q_weight.dtype != torch.int32 or size_n % 64 or size_k % 16:
            return f"{b_q_weight.dtype} weights of K={size_k} N={size_n} (w4a16 repack: N % 64, K % 16)"
        if not self.device_ok(b_q_weight.device):
            return f"device {b_q_weight.device} not served by w4a16"
        return None

    def gptq_marlin_repack_015(self, keyset, b_q_weight, perm, size_k, size_n, num_bits, is_a_8bit):
        args = (b_q_weight, perm, size_k, size_n, num_bits, is_a_8bit)
        reason = self._repack_reason(b_q_weight, size_k, size_n, num_bits, is_a_8bit)
        if reason is None and perm.numel() not in (0, size_k):
            reason = f"perm of {perm.numel()} rows for K={size_k}"
        if reason is not None:
            return self._fallback("gptq_marlin_repack", reason, keyset, *args)
        return self._serve("gptq_marlin_repack", lambda: _wt().gptq_marlin_repack(
            b_q_weight.contiguous(), perm.to(torch.int32), size_k, size_n, num_bits), keyset, args)

    def gptq_marlin_repack_023(self, keyset, b_q_weight, size_k, size_n, num_bits, is_a_8bit):
        args = (b_q_weight, size_k, size_n, num_bits, is_a_8bit)
        reason = self._repack_reason(b_q_weight, size_k, size_n, num_bits, is_a_8bit)
        if reason is not None:
            return self._fallback("gptq_marlin_repack", reason, keyset, *args)
        no_perm = torch.empty(0, dtype=torch.int32, device=b_q_weight.device)
        return self._serve("gptq_marlin_repack", lambda: _wt().gptq_marlin_repack(
            b_q_weight.contiguous(), no_perm, size_k, size_n, num_bits), keyset, args)

    def awq_marlin_repack(self, keyset, b_q_weight, size_k, size_n, num_bits, is_a_8bit):
        args = (b_q_weight, size_k, size_n, num_bits, is_a_8bit)
        reason = self._repack_reason(b_q_weight, size_k, size_n, num_bits, is_a_8bit)
        if reason is not None:
            return self._fallback("awq_marlin_repack", reason, keyset, *args)
        return self._serve("awq_marlin_repack", lambda: _wt().awq_marlin_repack(
            b_q_weight.contiguous(), size_k, size_n, num_bits), keyset, args)

    def _awq_reason(self, x_dtype, scales, K, N, device):
        if x_dtype not in _FLOATS or scales.dtype != x_dtype:
            return f"{x_dtype} with scales {scales.dtype}"
        if N % 64 or K % 32:
            return f"shape K={K} N={N} (w4a16 AWQ: N % 64, K % 32)"
        if _common.group_size_of(K, scales.shape[0]) not in (32, 64, 128, -1):
            return f"{scales.shape[0]} scale rows for K={K}"
        if not self.device_ok(device):
            return f"device {device} not served by w4a16"
        return None

    def awq_gemm(self, keyset, x, qweight, scales, qzeros, split_k_iters):
        args = (x, qweight, scales, qzeros, split_k_iters)
        reason = "input is not 2-D" if x.dim() != 2 else self._awq_reason(
            x.dtype, scales, x.shape[1], scales.shape[1], x.device)
        if reason is not None:
            return self._fallback("awq_gemm", reason, keyset, *args)
        return self._serve("awq_gemm", lambda: _wt().awq_gemm(x.contiguous(), qweight, scales, qzeros, 0),
                           keyset, args)

    def awq_dequantize(self, keyset, qweight, scales, zeros, split_k_iters, thx, thy):
        args = (qweight, scales, zeros, split_k_iters, thx, thy)
        reason = "a partial (thx, thy) tile" if (thx, thy) != (0, 0) else self._awq_reason(
            scales.dtype, scales, qweight.shape[0], scales.shape[1], scales.device)
        if reason is not None:
            return self._fallback("awq_dequantize", reason, keyset, *args)
        return self._serve("awq_dequantize", lambda: _wt().awq_dequantize(
            qweight, scales, zeros, split_k_iters, thx, thy), keyset, args)

    # ------------------------------------------------------------------ load-time act-order check (0.15-0.22)
    def check_act_order(self, sorted_g_idx, perm):
        """At load time (vLLM's marlin_sort_g_idx): an act-order layer is served when, sorted, every group holds the
        same number of rows (then row k is in group k / G, what w4a16's GEMM assumes). Reading the tensor syncs the
        device, which is fine while loading; the forward only looks the answer up by perm's address."""
        k = sorted_g_idx.numel()
        if k == 0:
            return False
        groups = int(sorted_g_idx[-1].item()) + 1
        g = k // groups if groups > 0 and k % groups == 0 else 0
        ok = bool(g) and torch.equal(sorted_g_idx, torch.arange(k, device=sorted_g_idx.device,
                                                                 dtype=sorted_g_idx.dtype) // g)
        if ok:
            self.act_order[(perm.data_ptr(), perm.numel())] = (perm, sorted_g_idx, -1 if groups == 1 else g)
        return ok

    def _wrap_sort_g_idx(self, module):
        original = module.marlin_sort_g_idx
        adapter = self

        def marlin_sort_g_idx(g_idx):
            sorted_g_idx, perm = original(g_idx)
            adapter.check_act_order(sorted_g_idx, perm)
            return sorted_g_idx, perm

        module.marlin_sort_g_idx = marlin_sort_g_idx
        self._unpatch.append(lambda: setattr(module, "marlin_sort_g_idx", original))

    # ------------------------------------------------------------------ install / remove
    def impls(self):
        old = self.generation.schemas["marlin_gemm"] == _MARLIN_GEMM_015
        return {
            "marlin_gemm": self.marlin_gemm_015 if old else self.marlin_gemm_023,
            "gptq_marlin_repack": self.gptq_marlin_repack_015 if old else self.gptq_marlin_repack_023,
            "awq_marlin_repack": self.awq_marlin_repack,
            "awq_gemm": self.awq_gemm,
            "awq_dequantize": self.awq_dequantize,
        }

    def install(self):
        self.overrides.install(self.impls())
        if self.generation.schemas["marlin_gemm"] == _MARLIN_GEMM_015 and self.overrides.namespace == "_C":
            try:
                import importlib
                self._wrap_sort_g_idx(importlib.import_module(
                    "vllm.model_executor.layers.quantization.kernels.mixed_precision.marlin"))
            except (ImportError, AttributeError):
                pass  # act-order layers then stay on vLLM's kernel (their groups were never checked)

    def remove(self):
        self.overrides.remove()
        for undo in self._unpatch:
            undo()
        self._unpatch.clear()


_installed = None


def installed():
    return _installed


def install(version_text=None, dispatch_key="CUDA", device_ok=None, type_ids=None, namespace="_C"):
    """Install w4a16 under the running vLLM's ops when its version and op schemas are known; returns the
    VllmAdapter, or None after one log line saying why vLLM was left alone. `version_text` defaults to the
    installed vLLM's version; `type_ids` ({"uint4", "uint4b8"}) to vLLM's scalar_types. Stand-in tests (no vLLM)
    pass the type ids and a `namespace` holding ops defined with the recorded schemas."""
    global _installed
    if _installed is not None:
        return _installed
    if version_text is None:
        version_text = importlib.metadata.version("vllm")
    gen = generation_for(version_text)
    if gen is None:
        known = ", ".join(f"{g.first[0]}.{g.first[1]}-{g.last[0]}.{g.last[1]}" for g in GENERATIONS)
        log.warning("w4a16: vLLM %s is not a release this w4a16 knows (%s); vLLM's kernels are left as they are",
                    version_text, known)
        return None
    if namespace == "_C":
        load_vllm_ops()
    bad = _common.schema_mismatches(namespace, gen.schemas)
    if bad:
        name, want, got = bad[0]
        log.warning("w4a16: vLLM %s: _C::%s %s (w4a16 was written against %s); vLLM's kernels are left as they are",
                    version_text, name, "is missing" if got is None else f"has the schema '{got}'",
                    gen.recorded_from)
        return None
    if type_ids is None:
        from vllm.scalar_type import scalar_types
        type_ids = {"uint4": scalar_types.uint4.id, "uint4b8": scalar_types.uint4b8.id}
    if type_ids != gen.type_ids:
        log.warning("w4a16: vLLM %s numbers its weight types differently (%s, expected %s); vLLM's kernels are left "
                    "as they are", version_text, type_ids, gen.type_ids)
        return None
    if not _common.can_override():
        log.warning("w4a16: torch %s cannot keep vLLM's kernels callable (no torch.library.get_kernel); vLLM's "
                    "kernels are left as they are", torch.__version__)
        return None
    adapter = VllmAdapter(gen, dispatch_key, device_ok, namespace)
    try:
        adapter.install()
    except Exception as e:  # nothing stays registered (Overrides.install is all or none)
        adapter.remove()
        log.warning("w4a16: could not replace vLLM %s's ops (%s); vLLM's kernels are left as they are",
                    version_text, e)
        return None
    _installed = adapter
    import w4a16
    log.info("w4a16 %s serves vLLM %s's int4 linear layers (ops %s, schemas of vLLM %s): %s. MoE, W4A8, fp4/fp8 "
             "and 8-bit stay on vLLM's kernels; W4A16_VLLM=0 turns this off", w4a16.version(), version_text,
             gen.name, gen.recorded_from, ", ".join(f"_C::{n}" for n in gen.schemas))
    return adapter


def uninstall():
    global _installed
    if _installed is not None:
        _installed.remove()
        _installed = None


def register():
    """The `vllm.general_plugins` entry point, called by vLLM in each of its processes. Returns True when w4a16
    serves vLLM's int4 layers in this process."""
    if os.environ.get("W4A16_VLLM", "1") == "0":
        log.info("w4a16: W4A16_VLLM=0, vLLM's kernels are left as they are")
        return False
    try:
        import w4a16  # noqa: F401  (raises LibraryNotFound when libw4a16.so cannot be loaded)
        load_vllm_ops()
    except ImportError as e:
        log.warning("w4a16: not replacing vLLM's ops: %s", e)
        return False
    try:
        return install() is not None
    except Exception as e:  # never fail vLLM's start-up because of w4a16
        log.warning("w4a16: not replacing vLLM's ops: %s", e)
        return False
