"""vLLM adapter: runs vLLM's dense int4 Marlin / AWQ linear layers on w4a16, chosen from the running vLLM.

Where it hooks in (see _common for why the dispatcher): the CUDA kernels of vLLM's own ops -- the Marlin GEMM
(`_C::gptq_marlin_gemm` up to 0.14, `_C::marlin_gemm` from 0.15), `_C::gptq_marlin_repack`, `_C::awq_marlin_repack`,
`_C::awq_gemm` and `_C::awq_dequantize` -- are replaced through torch.library. vLLM's Python code, its fake
implementations and torch.compile's graphs stay as they are; every call lands here at run time, with real tensors,
where w4a16 serves it or hands it to vLLM's own kernel (kept with torch.library.get_kernel). Only host-side facts
decide (dtypes, shapes, the call's ints and bools, what was recorded while the weights loaded): no device
synchronisation, nothing a CUDA-graph capture cannot take.

vLLM changed these ops' argument lists over its releases; each set is a Generation below, written from the schemas
compiled into the wheels. The adapter installs only for a release in the known range whose live schemas all equal
one generation's (tests/engines/schemas/ holds the live records of the releases the engine tests run); otherwise one
log line says why and vLLM is left untouched.

Served by w4a16: 4-bit weights of types uint4 (AWQ, with zero points) and uint4b8 (GPTQ, symmetric), fp16/bf16
activations, group sizes 32/64/128/per-channel, N % 64 == 0 and K % 128 == 0 for Marlin (K % 32 for the AWQ GEMM),
act-order on the whole K (generations up to 0.15-0.29; later vLLMs refuse desc_act themselves). Goes to vLLM's kernel:
activation scales (W4A8 int8/fp8), fp4/fp8 weights and global scales, 8-bit weights, float zero points, a
row-parallel shard of an act-order layer (is_k_full=False), act-order whose groups are not whole, other shapes, GPUs
w4a16 does not run on.

MoE layers: vLLM's fused Marlin MoE (AWQ / GPTQ Marlin MoE methods) calls `_moe_C::moe_wna16_marlin_gemm` twice per
layer on stacked experts already in Marlin layout (their per-expert repacks are the `_C::*_marlin_repack` ops above).
Its CUDA kernel is replaced too when the live MoE schema equals the generation's recorded one (else one log line and
only the MoE op stays vLLM's; the dense ops are served either way). w4a16's grouped GEMM takes vLLM's routing buffers
(moe_align_block_size's sorted ids, expert ids, padded count; ids -1 from expert parallelism skip a block, which is
what 0.11's is_ep=True asks of vLLM's kernel), c_or_none, mul_topk_weights and the Marlin-permuted bias as they
come; vLLM's workspace is not needed (w4a16 keeps one per device, created on the first eager call). Goes to vLLM's
kernel: act-order experts (g_idx / perm), is_full_k=False, W4A8 / fp8 / fp4, 8-bit, float zero points, block sizes
other than 8..64 in steps of 8, N % 64 or K % 64 != 0, a first call during CUDA-graph capture.

MoE scale order: vLLM's int4 Marlin MoE weight processing (read in 0.11.2, 0.14.1, 0.15.1: the AWQ and GPTQ MoE methods;
in 0.33.0 every method, compressed-tensors included) permutes the gate/up (w13) scales with size_k = the intermediate
size per partition instead of the hidden size. Where that size is at most G (an expert width of 512 at tensor parallel 4
with G = 128) the grouped scales get Marlin's one-group column order, while the Marlin MoE kernel (vLLM's and w4a16's)
reads the order from the scale tensor's row count: grouped for more than one row, so 62 of every 64 columns would take
another column's scale. A MoE call cannot tell such scales from right ones of the same shapes, so the adapter corrects
the permutation where it is made: vLLM's marlin_moe_permute_scales is wrapped (while MoE is served) to permute for the
order its result will be read in (grouped_size_k), one log line saying so. Those layers then compute the checkpoint's
weights, on w4a16 and on the calls left to vLLM's kernel alike; elsewhere the result is vLLM's own.

Bias: vLLM stores a Marlin layer's bias in Marlin's column order (marlin_permute_bias); w4a16 adds the bias in
natural order, so it is put back in order on the way in (one small copy per call, capture-safe).
use_fp32_reduce=False is not followed: w4a16 adds split-K partial sums in fp32 (at least as accurate). The decision
costs a Python call per GEMM in eager mode; a CUDA-graph replay (vLLM's decode) runs without it."""

import importlib.metadata
import logging
import os
import re

import torch

from .._checks_torch import group_of_rows
from . import _common

# A child of vLLM's logger, so the lines show in vLLM's own log output (vLLM's handler sits on "vllm").
log = logging.getLogger("vllm.w4a16")


def _schemas(gemm_name, gemm_args, gptq_repack, awq_repack):
    return {
        gemm_name: f"_C::{gemm_name}({gemm_args}) -> Tensor",
        "gptq_marlin_repack": f"_C::gptq_marlin_repack({gptq_repack}) -> Tensor",
        "awq_marlin_repack": f"_C::awq_marlin_repack({awq_repack}) -> Tensor",
        "awq_gemm": "_C::awq_gemm(Tensor _in_feats, Tensor _kernel, Tensor _scaling_factors, Tensor _zeros, "
        "SymInt split_k_iters) -> Tensor",
        "awq_dequantize": "_C::awq_dequantize(Tensor _kernel, Tensor _scaling_factors, Tensor _zeros, "
        "SymInt split_k_iters, int thx, int thy) -> Tensor",
    }


_GEMM_HEAD = (
    "Tensor a, Tensor? c_or_none, Tensor b_q_weight, Tensor? b_bias_or_none, Tensor b_scales, "
    "Tensor? a_scales, Tensor? global_scale, Tensor? b_zeros_or_none, "
)
_GEMM_ACT_ORDER = "Tensor? g_idx_or_none, Tensor? perm_or_none, "
_GEMM_TAIL = (
    "Tensor workspace, int b_type_id, SymInt size_m, SymInt size_n, SymInt size_k, bool is_k_full, "
    "bool use_atomic_add, bool use_fp32_reduce, bool is_zp_float"
)
_REPACK_A8 = "SymInt size_k, SymInt size_n, int num_bits, bool is_a_8bit"


_MOE_HEAD = (
    "Tensor($0! -> ) a, Tensor? c_or_none, Tensor($1! -> ) b_q_weight, Tensor? b_bias_or_none, "
    "Tensor($2! -> ) b_scales, Tensor? a_scales, Tensor? global_scale, Tensor? b_zeros_or_none, "
)
_MOE_MID = (
    "Tensor($3! -> ) workspace, Tensor sorted_token_ids, Tensor($4! -> ) expert_ids, "
    "Tensor($5! -> ) num_tokens_past_padded, Tensor($6! -> ) topk_weights, int moe_block_size, int top_k, "
    "bool mul_topk_weights, int b_type_id, int size_m, int size_n, int size_k, "
)
_MOE_TAIL = "bool use_atomic_add, bool use_fp32_reduce, bool is_zp_float, int thread_k, int thread_n, int blocks_per_sm"


def _moe_schema(args):
    # as the wheels print it (the ($n! -> ) annotations are vLLM's own, kept so the comparison is exact)
    return f"_moe_C::moe_wna16_marlin_gemm({args}) -> Tensor"


# 0.12-0.29: with act-order (g_idx, perm) and is_full_k; 0.30-0.33: without (recorded from 0.14.1 / 0.15.1, 0.33.0)
_MOE_ACT_ORDER = _moe_schema(
    _MOE_HEAD + "Tensor? g_idx_or_none, Tensor? perm_or_none, " + _MOE_MID + "bool is_full_k, " + _MOE_TAIL
)
_MOE_PLAIN = _moe_schema(_MOE_HEAD + _MOE_MID + _MOE_TAIL)
# 0.11 (recorded from 0.11.2): no a_scales, an is_ep flag, the type id named b_q_type_id, no thread / occupancy hints
_MOE_V0_11 = _moe_schema(
    _MOE_HEAD.replace("Tensor? a_scales, ", "")
    + "Tensor? g_idx_or_none, Tensor? perm_or_none, "
    + _MOE_MID.replace("bool mul_topk_weights, int b_type_id", "bool mul_topk_weights, bool is_ep, int b_q_type_id")
    + "bool is_full_k, "
    + _MOE_TAIL.replace(", int thread_k, int thread_n, int blocks_per_sm", "")
)


class Generation:
    """A set of op schemas vLLM kept over a range of releases. `recorded_from`: the release whose live schemas (read
    with the wheel loaded) are stored in tests/engines/schemas; `seen_in`: releases whose compiled schemas were read
    to find where the generation starts and ends."""

    MOE = "moe_wna16_marlin_gemm"

    def __init__(self, name, recorded_from, seen_in, gemm, schemas, type_ids, moe=None):
        self.name, self.recorded_from, self.seen_in = name, recorded_from, seen_in
        self.gemm, self.schemas, self.type_ids = gemm, schemas, type_ids
        self.moe = moe  # the schema of _moe_C::moe_wna16_marlin_gemm served in this generation (None: not served)

    def arg_names(self, op):
        schema = self.moe if op == self.MOE else self.schemas[op]
        return [a.name for a in torch._C.parse_schema(strip_alias_marks(schema)).arguments]


# ScalarType ids (vllm.scalar_type.scalar_types.<t>.id) as the wheels compute them; checked against the live vLLM.
_TYPE_IDS = {"uint4": 1125899906843648, "uint4b8": 1125899907892224}

GENERATIONS = (
    # 0.11: gptq_marlin_gemm without activation scales, repacks without is_a_8bit; the MoE GEMM with is_ep
    Generation(
        "0.11",
        "0.11.2",
        ("0.11.2",),
        "gptq_marlin_gemm",
        _schemas(
            "gptq_marlin_gemm",
            "Tensor a, Tensor? c_or_none, Tensor b_q_weight, Tensor? b_bias_or_none, Tensor b_scales, "
            "Tensor? global_scale, Tensor? b_zeros_or_none, "
            + _GEMM_ACT_ORDER
            + _GEMM_TAIL.replace("int b_type_id", "int b_q_type"),
            "Tensor b_q_weight, Tensor perm, SymInt size_k, SymInt size_n, int num_bits",
            "Tensor b_q_weight, SymInt size_k, SymInt size_n, int num_bits",
        ),
        _TYPE_IDS,
        _MOE_V0_11,
    ),
    # 0.12-0.14: activation scales (W4A8) and is_a_8bit added
    Generation(
        "0.12-0.14",
        "0.14.1",
        ("0.12.0", "0.14.1"),
        "gptq_marlin_gemm",
        _schemas(
            "gptq_marlin_gemm",
            _GEMM_HEAD + _GEMM_ACT_ORDER + _GEMM_TAIL,
            "Tensor b_q_weight, Tensor perm, " + _REPACK_A8,
            "Tensor b_q_weight, " + _REPACK_A8,
        ),
        _TYPE_IDS,
        _MOE_ACT_ORDER,
    ),
    # 0.15-0.29: the GEMM renamed marlin_gemm
    Generation(
        "0.15-0.29",
        "0.15.1",
        ("0.15.1", "0.22.1", "0.23.0", "0.27.0", "0.28.0", "0.29.0"),
        "marlin_gemm",
        _schemas(
            "marlin_gemm",
            _GEMM_HEAD + _GEMM_ACT_ORDER + _GEMM_TAIL,
            "Tensor b_q_weight, Tensor perm, " + _REPACK_A8,
            "Tensor b_q_weight, " + _REPACK_A8,
        ),
        _TYPE_IDS,
        _MOE_ACT_ORDER,
    ),
    # 0.30-0.33: act-order gone from the dense GEMM and the GPTQ repack (vLLM refuses desc_act itself)
    Generation(
        "0.30-0.33",
        "0.33.0",
        ("0.30.0", "0.33.0"),
        "marlin_gemm",
        _schemas(
            "marlin_gemm",
            _GEMM_HEAD + _GEMM_TAIL.replace("bool is_k_full, ", ""),
            "Tensor b_q_weight, " + _REPACK_A8,
            "Tensor b_q_weight, " + _REPACK_A8,
        ),
        _TYPE_IDS,
        _MOE_PLAIN,
    ),
)

# Releases this adapter accepts at all (a generation is then chosen by the live schemas).
FIRST_KNOWN, LAST_KNOWN = (0, 11), (0, 33)
_FLOATS = (torch.float16, torch.bfloat16)


def parse_version(text):
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(g or 0) for g in m.groups()) if m else None


def known_release(version_text):
    v = parse_version(version_text)
    return v is not None and FIRST_KNOWN <= v[:2] <= LAST_KNOWN


def generation_matching(namespace="_C"):
    """(the generation whose schemas all equal the live ones, or None; the closest generation's mismatches)."""
    best = None
    for gen in GENERATIONS:
        bad = _common.schema_mismatches(namespace, gen.schemas)
        if not bad:
            return gen, []
        # closest: the generation whose GEMM op exists here, then the fewest differences
        rank = (any(name == gen.gemm and live is None for name, _, live in bad), len(bad))
        if best is None or rank < best[0]:
            best = (rank, sorted(bad, key=lambda m: m[0] != gen.gemm))
    return None, best[1]


def strip_alias_marks(schema):
    """The schema without the "($0! -> )" marks that vLLM's MoE op prints and torch cannot parse back."""
    return re.sub(r"\(\$\d+! -> \)", "", schema)


def moe_mismatch(gen, namespace="_moe_C"):
    """None when the live _moe_C::moe_wna16_marlin_gemm has `gen`'s MoE schema, else why not (for the log)."""
    if gen.moe is None:
        return f"w4a16 serves no MoE op schema of vLLM generation {gen.name}"
    live = _common.live_schema(namespace, Generation.MOE)
    want = gen.moe
    if live is not None and namespace != "_moe_C" and live.startswith(namespace + "::"):
        # a stand-in namespace holding the recorded schema, defined without vLLM's ($n! -> ) marks
        live = "_moe_C::" + live.split("::", 1)[1]
        want = strip_alias_marks(want)
    if live is None:
        return f"_moe_C::{Generation.MOE} is missing"
    if live != want:
        return f"_moe_C::{Generation.MOE} has the schema '{live}'"
    return None


def generation_named(recorded_from):
    return next((g for g in GENERATIONS if g.recorded_from == recorded_from), None)


def load_vllm_ops():
    """Import vLLM's compiled extension(s) holding the _C and _moe_C ops (vllm._C / vllm._moe_C, and their
    _stable_libtorch builds in newer releases; vLLM itself imports them from its CUDA platform code, which may not
    have run yet when plugins load)."""
    import vllm._custom_ops  # noqa: F401

    loaded = []
    for name in ("vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C", "vllm._moe_C_stable_libtorch"):
        try:
            importlib.import_module(name)
            loaded.append(name)
        except ImportError:
            pass
    return loaded


def _wt():
    from .. import torch as wt  # looked up per call, so that tests can stand in for w4a16's ops

    return wt


_REFUSALS = _common.REFUSALS  # W4A16Error statuses that mean "w4a16 does not take this call"
_capture_reason = _common.capture_reason


def _moe():
    from .. import moe  # looked up per call, so that tests can stand in for w4a16's grouped GEMM

    return moe


grouped_size_k = _common.grouped_size_k  # shared with the SGLang adapter


class VllmAdapter:
    """The installed replacement. `served` / `fell_back` count calls per op (host counters, for logs and tests)."""

    def __init__(self, generation, dispatch_key="CUDA", device_ok=None, namespace="_C", moe_namespace="_moe_C"):
        self.generation = generation
        self.overrides = _common.Overrides(namespace, dispatch_key)
        self.moe_overrides = _common.Overrides(moe_namespace, dispatch_key)
        self.serves_moe = False
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
        moe = op == Generation.MOE
        if (op, reason) not in self._said:
            self._said.add((op, reason))
            log.info("w4a16: %s::%s goes to vLLM's kernel: %s", "_moe_C" if moe else "_C", op, reason)
        return (self.moe_overrides if moe else self.overrides).call_original(op, keyset, *args)

    def _serve(self, op, fn, keyset, args):
        """Run w4a16's op; if w4a16 refuses the call (it then launched and wrote nothing), vLLM's kernel runs it.
        Only refusals fall back: a CUDA or launch failure (a device fault, a sticky error) or an internal error is
        raised, since vLLM's kernel would run on a broken context and hide it."""
        import w4a16

        try:
            out = fn()
        except ValueError as e:
            return self._fallback(op, f"w4a16 refused it ({e})", keyset, *args)
        except w4a16.W4A16Error as e:
            if e.status not in _REFUSALS:
                raise
            return self._fallback(op, f"w4a16 refused it ({e})", keyset, *args)
        self.served[op] = self.served.get(op, 0) + 1
        return out

    # ------------------------------------------------------------------ decisions (host-side only)
    def _marlin_gemm_reason(
        self, a, b_scales, b_zeros, a_scales, global_scale, b_type_id, size_m, size_n, size_k, is_zp_float
    ):
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
        if group_of_rows(b_scales.shape[0], size_k) is None:
            return f"{b_scales.shape[0]} scale rows for K={size_k}"
        if not self.device_ok(a.device):
            return f"device {a.device} not served by w4a16"
        return _capture_reason(a, _wt()._workspaces, "")

    def _act_order_reason(self, g_idx, perm, is_k_full, size_k, scale_rows):
        if not is_k_full:
            return "act-order on a row-parallel shard (is_k_full=False)"
        entry = None if perm is None else self.act_order.get((perm.data_ptr(), perm.numel()))
        if entry is None or entry[1].data_ptr() != g_idx.data_ptr():
            return "act-order layer whose groups were not checked whole at load time"
        if entry[2] != group_of_rows(scale_rows, size_k):
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
    # The GEMM and the repacks changed their argument lists between generations; the kernels read the arguments by
    # the names of the generation's recorded schema (a missing argument takes the value that older vLLMs implied).
    def _gemm_kernel(self):
        op, names = self.generation.gemm, self.generation.arg_names(self.generation.gemm)

        def kernel(keyset, *args):
            p = dict(zip(names, args))
            a, b_scales, b_zeros, g_idx = p["a"], p["b_scales"], p["b_zeros_or_none"], p.get("g_idx_or_none")
            size_m, size_n, size_k = p["size_m"], p["size_n"], p["size_k"]
            reason = self._marlin_gemm_reason(
                a,
                b_scales,
                b_zeros,
                p.get("a_scales"),
                p["global_scale"],
                p.get("b_type_id", p.get("b_q_type")),
                size_m,
                size_n,
                size_k,
                p["is_zp_float"],
            )
            act_order = g_idx is not None and g_idx.numel() > 0
            if reason is None and act_order:
                reason = self._act_order_reason(
                    g_idx, p["perm_or_none"], p.get("is_k_full", True), size_k, b_scales.shape[0]
                )
            if reason is not None:
                return self._fallback(op, reason, keyset, *args)
            return self._serve(
                op,
                lambda: self._run_marlin(
                    a,
                    p["c_or_none"],
                    p["b_q_weight"],
                    p["b_bias_or_none"],
                    b_scales,
                    b_zeros,
                    p["perm_or_none"] if act_order else None,
                    size_m,
                    size_n,
                    size_k,
                ),
                keyset,
                args,
            )

        return kernel

    def _moe_reason(self, p):
        a, b_scales, b_zeros = p["a"], p["b_scales"], p["b_zeros_or_none"]
        size_n, size_k, block = p["size_n"], p["size_k"], p["moe_block_size"]
        if p.get("a_scales") is not None:  # 0.11 has no a_scales argument
            return "activation scales (W4A8)"
        if p["global_scale"] is not None:
            return "global scale (fp4)"
        if p["is_zp_float"]:
            return "float zero points"
        g_idx, perm = p.get("g_idx_or_none"), p.get("perm_or_none")
        if (g_idx is not None and g_idx.numel() > 0) or (perm is not None and perm.numel() > 0):
            return "act-order experts (g_idx / perm)"
        if not p.get("is_full_k", True):
            return "act-order on a row-parallel shard (is_full_k=False)"
        type_id = p.get("b_type_id", p.get("b_q_type_id"))  # b_q_type_id in 0.11
        kind = {self.uint4: "uint4", self.uint4b8: "uint4b8"}.get(type_id)
        has_zp = b_zeros is not None and b_zeros.numel() > 0
        reason = _common.moe_weight_reason(a, b_scales, has_zp, kind, f"weight type id {type_id}", block)
        if reason is not None:
            return reason
        if p["size_m"] < 1 or p["top_k"] < 1 or size_n % 64 or size_k % 64:
            return f"shape M={p['size_m']} N={size_n} K={size_k} (w4a16 MoE: N % 64, K % 64)"
        if b_scales.dim() != 3 or group_of_rows(b_scales.shape[1], size_k) is None:
            return f"scales {tuple(b_scales.shape)} for K={size_k}"
        if not self.device_ok(a.device):
            return f"device {a.device} not served by w4a16"
        return _capture_reason(a, _moe()._workspaces, "MoE ")

    def _moe_kernel(self):
        names = self.generation.arg_names(Generation.MOE)
        op = Generation.MOE

        def kernel(keyset, *args):
            p = dict(zip(names, args))
            reason = self._moe_reason(p)
            if reason is not None:
                return self._fallback(op, reason, keyset, *args)
            zeros = p["b_zeros_or_none"]
            zeros = zeros if zeros is not None and zeros.numel() > 0 else None
            bias = p["b_bias_or_none"]
            bias = _common.marlin_bias_unpermute(bias) if bias is not None else None
            # vLLM's workspace, use_atomic_add, use_fp32_reduce (w4a16 adds in fp32) and thread hints are not needed.
            # 0.11's is_ep=True asks vLLM's kernel to skip the blocks whose expert id is -1 (experts of other ranks,
            # marked by expert_map after routing) and write nothing for their rows; w4a16's grouped GEMM skips every
            # block whose expert id is outside [0, E) and writes nothing for it, with or without the flag. Without
            # it, vLLM's routing holds no such ids (no expert_map), so the flag changes nothing here.
            return self._serve(
                op,
                lambda: _moe()._grouped(
                    "marlin",
                    p["a"],
                    p["c_or_none"],
                    p["b_q_weight"],
                    bias,
                    p["b_scales"],
                    zeros,
                    p["sorted_token_ids"],
                    p["expert_ids"],
                    p["num_tokens_past_padded"],
                    p["topk_weights"],
                    p["mul_topk_weights"],
                    p["moe_block_size"],
                    p["top_k"],
                    p["size_m"],
                    p["size_n"],
                    p["size_k"],
                ),
                keyset,
                args,
            )

        return kernel

    def _gptq_repack_kernel(self):
        names = self.generation.arg_names("gptq_marlin_repack")

        def kernel(keyset, *args):
            p = dict(zip(names, args))
            q, perm, size_k, size_n, num_bits = p["b_q_weight"], p.get("perm"), p["size_k"], p["size_n"], p["num_bits"]
            reason = self._repack_reason(q, size_k, size_n, num_bits, p.get("is_a_8bit", False))
            if reason is None and perm is not None and perm.numel() not in (0, size_k):
                reason = f"perm of {perm.numel()} rows for K={size_k}"
            if reason is not None:
                return self._fallback("gptq_marlin_repack", reason, keyset, *args)
            if perm is None:
                perm = torch.empty(0, dtype=torch.int32, device=q.device)
            return self._serve(
                "gptq_marlin_repack",
                lambda: _wt().gptq_marlin_repack(q.contiguous(), perm.to(torch.int32), size_k, size_n, num_bits),
                keyset,
                args,
            )

        return kernel

    def _awq_repack_kernel(self):
        names = self.generation.arg_names("awq_marlin_repack")

        def kernel(keyset, *args):
            p = dict(zip(names, args))
            q, size_k, size_n, num_bits = p["b_q_weight"], p["size_k"], p["size_n"], p["num_bits"]
            reason = self._repack_reason(q, size_k, size_n, num_bits, p.get("is_a_8bit", False))
            if reason is not None:
                return self._fallback("awq_marlin_repack", reason, keyset, *args)
            return self._serve(
                "awq_marlin_repack",
                lambda: _wt().awq_marlin_repack(q.contiguous(), size_k, size_n, num_bits),
                keyset,
                args,
            )

        return kernel

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

    def _awq_reason(self, x_dtype, scales, K, N, device):
        if x_dtype not in _FLOATS or scales.dtype != x_dtype:
            return f"{x_dtype} with scales {scales.dtype}"
        if N % 64 or K % 32:
            return f"shape K={K} N={N} (w4a16 AWQ: N % 64, K % 32)"
        if group_of_rows(scales.shape[0], K) is None:
            return f"{scales.shape[0]} scale rows for K={K}"
        if not self.device_ok(device):
            return f"device {device} not served by w4a16"
        return None

    def awq_gemm(self, keyset, x, qweight, scales, qzeros, split_k_iters):
        args = (x, qweight, scales, qzeros, split_k_iters)
        reason = (
            "input is not 2-D"
            if x.dim() != 2
            else self._awq_reason(x.dtype, scales, x.shape[1], scales.shape[1], x.device)
        )
        if reason is not None:
            return self._fallback("awq_gemm", reason, keyset, *args)
        return self._serve("awq_gemm", lambda: _wt().awq_gemm(x.contiguous(), qweight, scales, qzeros, 0), keyset, args)

    def awq_dequantize(self, keyset, qweight, scales, zeros, split_k_iters, thx, thy):
        args = (qweight, scales, zeros, split_k_iters, thx, thy)
        reason = (
            "a partial (thx, thy) tile"
            if (thx, thy) != (0, 0)
            else self._awq_reason(scales.dtype, scales, qweight.shape[0], scales.shape[1], scales.device)
        )
        if reason is not None:
            return self._fallback("awq_dequantize", reason, keyset, *args)
        return self._serve(
            "awq_dequantize",
            lambda: _wt().awq_dequantize(qweight, scales, zeros, split_k_iters, thx, thy),
            keyset,
            args,
        )

    # ------------------------------------------------------------------ load-time act-order check (up to 0.29)
    def check_act_order(self, sorted_g_idx, perm):
        """At load time (vLLM's marlin_sort_g_idx): an act-order layer is served when, sorted, every group holds the
        same number of rows (then row k is in group k / G, what w4a16's GEMM assumes). Reading the tensor syncs the
        device, which is fine while loading; the forward only looks the answer up by perm's address."""
        k = sorted_g_idx.numel()
        if k == 0:
            return False
        groups = int(sorted_g_idx[-1].item()) + 1
        g = k // groups if groups > 0 and k % groups == 0 else 0
        ok = bool(g) and torch.equal(
            sorted_g_idx, torch.arange(k, device=sorted_g_idx.device, dtype=sorted_g_idx.dtype) // g
        )
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

    # ------------------------------------------------------------------ load-time MoE scale order
    def _wrap_moe_permute_scales(self):
        """vLLM's marlin_moe_permute_scales, wherever vLLM's modules hold it, asked for the order the kernel reads
        (grouped_size_k). Modules importing it later take the wrapper from marlin_utils."""
        import sys

        try:
            utils = importlib.import_module("vllm.model_executor.layers.quantization.utils.marlin_utils")
            original = utils.marlin_moe_permute_scales
        except (ImportError, AttributeError) as e:
            log.warning(
                "w4a16: vLLM's marlin_moe_permute_scales was not found (%s): MoE layers whose expert width per "
                "partition is at most G keep vLLM's gate/up scale order, which the Marlin MoE kernel misreads",
                e,
            )
            return
        adapter = self

        def marlin_moe_permute_scales(s, size_k, size_n, group_size, *args, **kwargs):
            is_a_8bit = kwargs.get("is_a_8bit", args[0] if args else False)
            k = grouped_size_k(s.shape[1], size_k, group_size, is_a_8bit)
            if k != size_k and "scale order" not in adapter._said:
                adapter._said.add("scale order")
                log.warning(
                    "w4a16: vLLM permutes the scales of MoE layers like this one (%d scale rows, G=%d) for size_k=%d, "
                    "which gives them Marlin's %s column order while the Marlin MoE kernel reads the %s one; w4a16 "
                    "has them permuted for size_k=%d instead, so these layers compute the checkpoint's weights, on "
                    "w4a16 and on vLLM's kernel alike (vLLM without w4a16 does not)",
                    s.shape[1],
                    group_size,
                    size_k,
                    "one-group" if k > size_k else "grouped",
                    "grouped" if k > size_k else "one-group",
                    k,
                )
            return original(s, k, size_n, group_size, *args, **kwargs)

        marlin_moe_permute_scales.__wrapped__ = original

        def swap(old, new):  # in every vLLM module holding `old` (also those that imported the wrapper meanwhile)
            for name, module in list(sys.modules.items()):
                if name.startswith("vllm.") and getattr(module, "marlin_moe_permute_scales", None) is old:
                    module.marlin_moe_permute_scales = new

        swap(original, marlin_moe_permute_scales)
        self._unpatch.append(lambda: swap(marlin_moe_permute_scales, original))

    # ------------------------------------------------------------------ install / remove
    def impls(self):
        return {
            self.generation.gemm: self._gemm_kernel(),
            "gptq_marlin_repack": self._gptq_repack_kernel(),
            "awq_marlin_repack": self._awq_repack_kernel(),
            "awq_gemm": self.awq_gemm,
            "awq_dequantize": self.awq_dequantize,
        }

    def install_moe(self):
        """Replace vLLM's MoE GEMM too; raises (and registers nothing for MoE) when it cannot."""
        self.moe_overrides.install({Generation.MOE: self._moe_kernel()})
        self.serves_moe = True
        if self.moe_overrides.namespace == "_moe_C":  # vLLM's own ops (not a stand-in test's): its weight processing
            self._wrap_moe_permute_scales()

    def install(self):
        self.overrides.install(self.impls())
        if "g_idx_or_none" in self.generation.schemas[self.generation.gemm] and self.overrides.namespace == "_C":
            try:
                import importlib

                self._wrap_sort_g_idx(
                    importlib.import_module("vllm.model_executor.layers.quantization.kernels.mixed_precision.marlin")
                )
            except (ImportError, AttributeError):
                pass  # act-order layers then stay on vLLM's kernel (their groups were never checked)

    def remove(self):
        self.moe_overrides.remove()
        self.serves_moe = False
        self.overrides.remove()
        for undo in self._unpatch:
            undo()
        self._unpatch.clear()


_installed = None


def installed():
    return _installed


def install(
    version_text=None, dispatch_key="CUDA", device_ok=None, type_ids=None, namespace="_C", moe_namespace="_moe_C"
):
    """Install w4a16 under the running vLLM's ops when its version and op schemas are known; returns the
    VllmAdapter, or None after one log line saying why vLLM was left alone. `version_text` defaults to the
    installed vLLM's version; `type_ids` ({"uint4", "uint4b8"}) to vLLM's scalar_types. Stand-in tests (no vLLM)
    pass the type ids and a `namespace` (`moe_namespace`) holding ops defined with the recorded schemas.
    The MoE GEMM is replaced when its live schema is the generation's; otherwise one log line says so and only the
    dense ops are served (they do not depend on it)."""
    global _installed
    if _installed is not None:
        return _installed
    if version_text is None:
        version_text = importlib.metadata.version("vllm")
    if not known_release(version_text):
        log.warning(
            "w4a16: vLLM %s is not a release this w4a16 knows (%d.%d-%d.%d); vLLM's kernels are left as they are",
            version_text,
            *FIRST_KNOWN,
            *LAST_KNOWN,
        )
        return None
    if namespace == "_C":
        load_vllm_ops()
    gen, bad = generation_matching(namespace)
    if gen is None:
        name, want, got = bad[0]
        log.warning(
            "w4a16: vLLM %s: _C::%s %s, not as in any vLLM release w4a16 was written against; vLLM's kernels "
            "are left as they are",
            version_text,
            name,
            "is missing" if got is None else f"has the schema '{got}'",
        )
        return None
    if type_ids is None:
        from vllm.scalar_type import scalar_types

        type_ids = {"uint4": scalar_types.uint4.id, "uint4b8": scalar_types.uint4b8.id}
    if type_ids != gen.type_ids:
        log.warning(
            "w4a16: vLLM %s numbers its weight types differently (%s, expected %s); vLLM's kernels are left "
            "as they are",
            version_text,
            type_ids,
            gen.type_ids,
        )
        return None
    if not _common.can_override():
        log.warning(
            "w4a16: torch %s cannot keep vLLM's kernels callable (no torch.library.get_kernel); vLLM's "
            "kernels are left as they are",
            torch.__version__,
        )
        return None
    adapter = VllmAdapter(gen, dispatch_key, device_ok, namespace, moe_namespace)
    try:
        adapter.install()
    except Exception as e:  # nothing stays registered (Overrides.install is all or none)
        adapter.remove()
        log.warning("w4a16: could not replace vLLM %s's ops (%s); vLLM's kernels are left as they are", version_text, e)
        return None
    moe_why = moe_mismatch(gen, moe_namespace)
    if moe_why is None:
        try:
            adapter.install_moe()
        except Exception as e:
            moe_why = f"it could not be replaced ({e})"
    if moe_why is not None:
        log.warning(
            "w4a16: vLLM %s: %s; its MoE layers stay on vLLM's kernels (the linear layers are served)",
            version_text,
            moe_why,
        )
    _installed = adapter
    import w4a16

    ops = [f"_C::{n}" for n in gen.schemas] + ([f"_moe_C::{Generation.MOE}"] if adapter.serves_moe else [])
    log.info(
        "w4a16 %s serves vLLM %s's int4 linear layers%s (op generation %s): %s. %sW4A8, fp4/fp8 and 8-bit stay "
        "on vLLM's kernels; W4A16_VLLM=0 turns this off",
        w4a16.version(),
        version_text,
        " and MoE experts" if adapter.serves_moe else "",
        gen.name,
        ", ".join(ops),
        "Act-order MoE, " if adapter.serves_moe else "MoE, ",
    )
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
