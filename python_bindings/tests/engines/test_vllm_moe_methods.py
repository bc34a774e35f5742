"""w4a16 under vLLM's real MoE quantization methods (AWQ / GPTQ Marlin MoE: `AWQMoEMethod` (0.11) or
`AWQMarlinMoEMethod` and `GPTQMarlinMoEMethod` up to 0.29, `AutoAWQMoEMethod` and `AutoGPTQMoEMethod` in 0.33), on a
machine without a GPU.

Each test runs a method as vLLM's FusedMoE layer does: `create_weights` on a module, the checkpoint tensors copied
into its parameters (the weight loader at tensor parallel size 1), `process_weights_after_loading` (vLLM's own repack,
scale and zero-point conversions, whose per-expert repacks reach w4a16 through the dispatcher) and `apply` (vLLM's
fused Marlin MoE, whose two `_moe_C::moe_wna16_marlin_gemm` calls reach w4a16). w4a16 is replaced by the recorders of
test_vllm_moe.py, and what reaches its grouped GEMM is checked bit for bit against w4a16.formats per expert.

Stood in for, because it is CUDA-only or asks the GPU: vLLM's routing kernel (moe_align_block_size, by the CPU twin in
test_vllm_moe.py), its SiLU-and-mul and (0.33) top-k sum kernels (`_C::silu_and_mul`, `_moe_C::moe_sum`, given CPU
implementations for the test), the Marlin workspace allocation (sized from the GPU's SM count) and capability check,
in 0.11 the GPU capability query of fused_marlin_moe and the router (FusedMoE.select_experts, whose top-k kernel is
CUDA-only) and in 0.14 the router object apply routes through (both answering fixed top-k ids), and in 0.33 the MoE
backend choice and the experts' device check (made from the platform: on a CPU-only machine vLLM picks its CPU
experts, so the Marlin backend is named instead) and the model runner's workspace manager (initialised on the CPU)."""

import contextlib
import dataclasses
import importlib
import importlib.metadata

import numpy as np
import pytest
import torch

vllm = pytest.importorskip("vllm", reason="not a vLLM venv")

from test_vllm import _capture_log, _same  # noqa: E402
from test_vllm_moe import (  # noqa: E402
    GEN,
    MOE,
    SERVED,
    AlignSpy,
    _experts,
    _is_ep_spy,
    _want,
    align_cpu,
    check_expert_parallel,
    cpu_kernels,
    no_gpu_queries,
    recording_adapter,
)
from w4a16 import formats  # noqa: E402
from w4a16.engines import vllm as adapter_mod  # noqa: E402

VERSION = importlib.metadata.version("vllm")
DTYPES = (torch.float16, torch.bfloat16)

pytestmark = pytest.mark.skipif(not SERVED, reason=f"vLLM {VERSION} has no _moe_C::{MOE} op")


@pytest.fixture
def rec(monkeypatch):
    """As in test_vllm_moe.py: the adapter installed for CPU tensors, w4a16's repacks and grouped GEMM recorded."""
    yield from recording_adapter(monkeypatch)


# ---------------------------------------------------------------------------------------------- vLLM's classes
def _q(name):
    return importlib.import_module("vllm.model_executor.layers.quantization." + name)


def _method_classes():
    """(AWQ config, AWQ MoE method, GPTQ config, GPTQ MoE method) of this release."""
    try:
        awq, gptq = _q("awq_marlin"), _q("gptq_marlin")
        awq_moe = getattr(awq, "AWQMarlinMoEMethod", None) or awq.AWQMoEMethod  # AWQMoEMethod in 0.11
        return awq.AWQMarlinConfig, awq_moe, gptq.GPTQMarlinConfig, gptq.GPTQMarlinMoEMethod
    except ImportError:
        awq, gptq = _q("auto_awq"), _q("auto_gptq")
        return awq.AutoAWQConfig, awq.AutoAWQMoEMethod, gptq.AutoGPTQConfig, gptq.AutoGPTQMoEMethod


def _quant_config(method, G, act_order=False):
    awq_cfg, _, gptq_cfg, _ = _method_classes()
    if method == "awq":
        return awq_cfg.from_config({"bits": 4, "group_size": G, "zero_point": True})
    return gptq_cfg.from_config({"bits": 4, "group_size": G, "desc_act": act_order, "sym": True})


def _no_parallel(cls):
    """One rank of one: vLLM's make_no_parallel where it has it (0.15 on), else the same fields by hand (0.14)."""
    if hasattr(cls, "make_no_parallel"):
        return cls.make_no_parallel()
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    values = {n: (1 if n.endswith("_size") else 0) for n in fields if n.endswith(("_size", "_rank"))}
    return cls(**values, use_ep=False, all2all_backend="naive")


def _moe_config(E, top_k, H, inter, dtype):
    """vLLM's FusedMoEConfig for one unsharded layer (tensor parallel 1, no expert parallelism)."""
    cfg = importlib.import_module("vllm.model_executor.layers.fused_moe.config")
    values = dict(
        num_experts=E,
        experts_per_token=top_k,
        hidden_dim=H,
        intermediate_size=inter,
        intermediate_size_per_partition=inter,
        num_local_experts=E,
        num_logical_experts=E,
        activation="silu",
        device="cpu",
        routing_method=cfg.RoutingMethodType.Renormalize,
        moe_parallel_config=_no_parallel(cfg.FusedMoEParallelConfig),
        in_dtype=dtype,
    )
    if _is_new():  # the activation is an enum from 0.33 on, a string before
        values["activation"] = importlib.import_module(
            "vllm.model_executor.layers.fused_moe.activation"
        ).MoEActivation.SILU
    names = {f.name for f in dataclasses.fields(cfg.FusedMoEConfig) if f.init}
    return cfg.FusedMoEConfig(**{k: v for k, v in values.items() if k in names})


def _is_new():
    """0.33's MoE plumbing (method -> oracle-chosen experts class -> modular kernel) rather than 0.15's direct call."""
    try:
        importlib.import_module("vllm.model_executor.layers.fused_moe.oracle.int_wna16")
        return True
    except ImportError:
        return False


def _env(monkeypatch):
    """vLLM's GPU-only environment: the Marlin workspace, the routing kernel, (0.11) the GPU capability and (0.33)
    the backend choice. Returns the routing kernel's stand-in (an AlignSpy, which keeps the calls)."""
    no_gpu_queries(monkeypatch)
    spy = AlignSpy()
    ws = lambda device, *a, **k: torch.zeros(132, dtype=torch.int32, device=device)  # noqa: E731
    for name in ("awq_marlin", "gptq_marlin", "auto_awq", "auto_gptq", "utils.marlin_utils"):
        try:
            mod = _q(name)
        except ImportError:
            continue
        for attr in ("marlin_make_workspace_new", "get_marlin_workspace"):
            if hasattr(mod, attr):
                monkeypatch.setattr(mod, attr, ws)
        if hasattr(mod, "verify_marlin_supported"):  # asks the GPU's capability
            monkeypatch.setattr(mod, "verify_marlin_supported", lambda *a, **k: None)
    for name in (
        "vllm.model_executor.layers.fused_moe.experts.marlin_moe",
        "vllm.model_executor.layers.fused_moe.fused_marlin_moe",
    ):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        monkeypatch.setattr(mod, "moe_align_block_size", spy)
        for attr in ("marlin_make_workspace_new", "get_marlin_workspace"):
            if hasattr(mod, attr):
                monkeypatch.setattr(mod, attr, ws)
    if _is_new():
        oracle = importlib.import_module("vllm.model_executor.layers.fused_moe.oracle.int_wna16")
        monkeypatch.setattr(oracle, "_get_priority_backends", lambda: [oracle.WNA16MoEBackend.MARLIN])
        # the model runner's scratch memory, which the modular kernel takes its buffers from (here on the CPU)
        workspace = importlib.import_module("vllm.v1.worker.workspace")
        monkeypatch.setattr(workspace, "_manager", None)
        workspace.init_workspace_manager(torch.device("cpu"))
        marlin = importlib.import_module("vllm.model_executor.layers.fused_moe.experts.marlin_moe")
        monkeypatch.setattr(marlin.MarlinExpertsBase, "_supports_current_device", staticmethod(lambda: True))
    return spy


# ---------------------------------------------------------------------------------------------- the layer
def _gptq_checkpoint(E, K, N, G, dtype, seed, act_order):
    """Symmetric GPTQ experts for a [K -> N] projection: qweight [E, K/8, N], scales, qzeros (8 stored as 7), g_idx."""
    qw, _, s = _experts("gptq", E, K, N, G, dtype, seed)
    rng = np.random.default_rng(seed + 7)
    if act_order:
        g_idx = torch.from_numpy(np.stack([rng.permutation(K).astype(np.int32) // G for _ in range(E)]))
    else:
        g_idx = (torch.arange(K, dtype=torch.int32) // G).repeat(E, 1)
    qz = torch.from_numpy(formats.awq_pack(np.full((E * (K // G), N), 7, dtype=np.uint8))).view(E, K // G, N // 8)
    return qw, qz, s, g_idx


def _layer(method, E, H, inter, G, dtype, bias, act_order=False, seed=0):
    """vLLM's MoE method on a bare module, as FusedMoE sets it up: create_weights, the checkpoint loaded,
    process_weights_after_loading. Returns (method object, layer, checkpoint)."""
    _, awq_cls, _, gptq_cls = _method_classes()
    moe = _moe_config(E, 2, H, inter, dtype)
    qm = (awq_cls if method == "awq" else gptq_cls)(_quant_config(method, G, act_order), moe)
    layer = torch.nn.Module()
    layer.intermediate_size_per_partition = inter
    layer.hidden_size = H
    layer.local_num_experts = E
    layer.global_num_experts = E
    layer.apply_router_weight_on_input = False
    layer.expert_map = None
    layer.moe_config = moe
    layer.activation = getattr(moe, "activation", "silu")
    layer._expert_routing_tables = lambda: None  # RoutedExperts' answer without expert parallelism
    extra = dict(weight_loader=lambda *a, **k: None, intermediate_size_full=inter)
    qm.create_weights(layer, E, H, inter, dtype, **extra)
    if method == "awq":
        ck13 = _experts("awq", E, H, 2 * inter, G, dtype, seed)
        ck2 = _experts("awq", E, inter, H, G, dtype, seed + 1)
        for name, (qw, qz, s) in (("w13", ck13), ("w2", ck2)):
            getattr(layer, f"{name}_qweight").data.copy_(qw)
            getattr(layer, f"{name}_qzeros").data.copy_(qz)
            getattr(layer, f"{name}_scales").data.copy_(s)
    else:
        ck13 = _gptq_checkpoint(E, H, 2 * inter, G, dtype, seed, act_order)
        ck2 = _gptq_checkpoint(E, inter, H, G, dtype, seed + 1, act_order)
        for name, (qw, qz, s, g_idx) in (("w13", ck13), ("w2", ck2)):
            getattr(layer, f"{name}_qweight").data.copy_(qw)
            getattr(layer, f"{name}_scales").data.copy_(s)
            qzeros = getattr(layer, f"{name}_qzeros", None)
            if qzeros is not None and qzeros.dtype == torch.int32 and qzeros.shape == qz.shape:
                qzeros.data.copy_(qz)
            if hasattr(layer, f"{name}_g_idx"):
                getattr(layer, f"{name}_g_idx").data.copy_(g_idx)
    b13 = b2 = None
    if bias:  # FusedMoE registers expert biases (has_bias) next to the method's parameters, natural order
        b13, b2 = (torch.randn(E, 2 * inter) * 0.5).to(dtype), (torch.randn(E, H) * 0.5).to(dtype)
        layer.register_parameter("w13_bias", torch.nn.Parameter(b13.clone(), requires_grad=False))
        layer.register_parameter("w2_bias", torch.nn.Parameter(b2.clone(), requires_grad=False))
    layer._loaded_expert_biases = {"w13_bias", "w2_bias"} if bias else set()  # what RoutedExperts' loader records
    qm.process_weights_after_loading(layer)
    return qm, layer, (ck13, ck2, b13, b2)


def _apply(qm, layer, x, topk_weights, topk_ids, monkeypatch=None):
    """The method's forward for routed tokens, as FusedMoE's runner calls it. 0.11's and 0.14's methods route inside
    apply, 0.11 through FusedMoE.select_experts (given the layer's expert_map there), 0.14 through a router object:
    stood in for by ones that answer these top-k weights and ids."""
    import inspect
    import types

    params = inspect.signature(qm.apply).parameters
    with cpu_kernels():
        if "top_k" in params:  # 0.11: apply(layer, x, router_logits, top_k, renormalize, ..., expert_map, ...)
            fused_moe = importlib.import_module("vllm.model_executor.layers.fused_moe.layer")
            monkeypatch.setattr(
                fused_moe.FusedMoE, "select_experts", staticmethod(lambda **kw: (topk_weights, topk_ids, None))
            )
            return qm.apply(
                layer,
                x,
                torch.empty(x.shape[0], layer.global_num_experts),
                topk_ids.shape[1],
                True,
                global_num_experts=layer.global_num_experts,
                expert_map=layer.expert_map,
            )
        if "router" in params:
            router = types.SimpleNamespace(select_experts=lambda hidden_states, router_logits: (topk_weights, topk_ids))
            return qm.apply(layer, router, x, torch.empty(x.shape[0], layer.global_num_experts))
        extra = {k: None for k in ("shared_experts", "shared_experts_input") if k in params}
        return qm.apply(layer, x, topk_weights, topk_ids, **extra)


def _route(T, E, top_k):
    logits = torch.randn(T, E)
    topk_weights, topk_ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    return topk_weights, topk_ids.to(torch.int32)


# ---------------------------------------------------------------------------------------------- served by w4a16
@pytest.mark.parametrize("method", ["awq", "gptq"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
# intermediate sizes above G: vLLM's w13 scales are in the grouped order (width <= G: test_w13_width_g_* below)
@pytest.mark.parametrize("E,T,H,inter,G", [(4, 5, 256, 128, 64), (8, 33, 384, 256, 128)])
def test_moe_method_on_w4a16(rec, monkeypatch, method, dtype, bias, E, T, H, inter, G):
    _env(monkeypatch)
    top_k = 2
    qm, layer, (ck13, ck2, b13, b2) = _layer(method, E, H, inter, G, dtype, bias, seed=E * 100 + T + G + bias)
    assert rec.named("moe_gemm") == []
    # the per-expert repacks vLLM made when the weights loaded went to w4a16 (one dense repack per expert)
    repacks = rec.named("awq_marlin_repack") + rec.named("gptq_marlin_repack")
    assert len(repacks) == 2 * E, [r[0] for r in repacks]

    x = torch.randn(T, H).to(dtype)
    topk_weights, topk_ids = _route(T, E, top_k)
    rec.calls.clear()
    y = _apply(qm, layer, x, topk_weights, topk_ids, monkeypatch)

    assert rec.adapter.fell_back == {} and rec.adapter.served.get(MOE) == 2
    c1, c2 = [c[1] for c in rec.named("moe_gemm")]
    want13 = _want(method, ck13[0], ck13[1] if method == "awq" else None, ck13[2], H, 2 * inter, G)
    want2 = _want(method, ck2[0], ck2[1] if method == "awq" else None, ck2[2], inter, H, G)
    for c, (ww, ws, wz), b in ((c1, want13, b13), (c2, want2, b2)):
        assert c["layout"] == "marlin"
        for e in range(E):  # per expert, so that a failure names the expert
            assert np.array_equal(c["w"][e].numpy(), ww[e].numpy()), f"expert {e}: Marlin weights"
            assert _same(c["scales"][e], ws[e]), f"expert {e}: Marlin scales"
            if wz is None:
                assert c["zeros"] is None or c["zeros"].numel() == 0
            else:
                assert np.array_equal(c["zeros"][e].numpy(), wz[e].numpy()), f"expert {e}: zero points"
        assert (c["bias"] is None) if b is None else _same(c["bias"], b), "bias must reach w4a16 in natural order"
    # routing: vLLM's buffers (from the CPU twin of its kernel) reach both GEMMs unchanged
    sorted_ids, expert_ids, npp = align_cpu(topk_ids, c1["block"], E)
    for c in (c1, c2):
        assert torch.equal(c["sorted_ids"][: sorted_ids.numel()], sorted_ids)
        assert torch.equal(c["expert_ids"][: expert_ids.numel()], expert_ids) and torch.equal(c["npp"], npp)
    assert _same(c1["a"], x) and (c1["m"], c1["top_k"], c1["n"], c1["k"], c1["mul"]) == (T, top_k, 2 * inter, H, False)
    act = torch.empty(T * top_k, inter, dtype=dtype)
    n = inter
    act.copy_(torch.nn.functional.silu(c1["out"][:, :n]) * c1["out"][:, n:])
    assert _same(c2["a"], act)
    assert (c2["n"], c2["k"], c2["mul"]) == (H, inter, True)
    assert _same(c2["topk_weights"].to(topk_weights.dtype).view(-1), topk_weights.reshape(-1))
    # vLLM sums the top_k weighted rows of the second GEMM (its moe_sum, in the activations' dtype)
    want_y = torch.sum(c2["out"].view(T, top_k, H), dim=1)
    assert y.shape == (T, H) and y.dtype == dtype
    assert _same(y, want_y)


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_moe_method_expert_parallel_on_w4a16(rec, monkeypatch, method):
    """One rank under expert parallelism: the layer holds 4 of 8 experts and its expert_map, which the method hands
    to vLLM's fused Marlin MoE (0.11: through apply's expert_map argument; later: from the layer, in 0.33 through the
    modular kernel). Checked as in test_vllm_moe.py (check_expert_parallel): 0.11's -1 blocks with is_ep=True, or from
    0.14 on a routing of this rank's pairs only with local expert ids; both GEMMs served by w4a16 on the rank's
    experts, other ranks' rows left as they were, the output the sum of this rank's rows."""
    spy = _env(monkeypatch)
    E, E_global, T, H, inter, G, top_k = 4, 8, 16, 256, 128, 64, 2
    qm, layer, (ck13, ck2, _, _) = _layer(method, E, H, inter, G, torch.float16, bias=False, seed=23)
    layer.global_num_experts = E_global
    layer.expert_map = torch.tensor([-1, 0, -1, 1, 2, -1, 3, -1], dtype=torch.int32)  # this rank: 1, 3, 4, 6
    is_ep = _is_ep_spy(rec, monkeypatch)
    topk_weights, topk_ids = _route(T, E_global, top_k)
    x = torch.randn(T, H).half()
    rec.calls.clear()
    y = _apply(qm, layer, x, topk_weights, topk_ids, monkeypatch)

    assert is_ep == ([True, True] if "is_ep" in GEN.arg_names(MOE) else [None, None])
    wants = [
        _want(method, ck[0], ck[1] if method == "awq" else None, ck[2], K, N, G)
        for ck, (K, N) in ((ck13, (H, 2 * inter)), (ck2, (inter, H)))
    ]
    check_expert_parallel(rec, spy, x, topk_weights, topk_ids, layer.expert_map, wants, y)


# ---------------------------------------------------------------------------------------------- left to vLLM
def test_act_order_moe_goes_to_vllms_kernel(rec, monkeypatch):
    """GPTQ act-order experts (desc_act): w4a16 does not serve them, so the forward reaches vLLM's own kernel (CUDA
    only: NotImplementedError on this CPU), and nothing reaches w4a16's grouped GEMM."""
    _env(monkeypatch)
    if "g_idx_or_none" not in GEN.arg_names(MOE):
        pytest.skip(f"vLLM {VERSION}'s MoE GEMM takes no act-order arguments (vLLM refuses act-order MoE itself)")
    E, H, inter, G, T = 4, 256, 128, 128, 3
    qm, layer, _ = _layer("gptq", E, H, inter, G, torch.float16, bias=False, act_order=True, seed=11)
    topk_weights, topk_ids = _route(T, E, 2)
    rec.calls.clear()
    with pytest.raises(NotImplementedError, match=f"_moe_C::{MOE}"):
        _apply(qm, layer, torch.randn(T, H).half(), topk_weights, topk_ids, monkeypatch)
    assert rec.named("moe_gemm") == [] and rec.adapter.fell_back == {MOE: 1}


@pytest.mark.parametrize("method", ["awq", "gptq"])
@pytest.mark.parametrize("case", ["w4a16 refuses", "device not served"])
def test_moe_method_falls_back_to_vllms_kernel(rec, monkeypatch, method, case):
    """A forward w4a16 does not take (its own argument check refuses it, or the device is not one it serves) runs
    vLLM's kernel instead (CUDA only: NotImplementedError here), through the same method classes."""
    import w4a16.moe

    _env(monkeypatch)
    E, H, inter, G, T = 4, 256, 128, 64, 3
    qm, layer, _ = _layer(method, E, H, inter, G, torch.bfloat16, bias=False, seed=5)
    if case == "w4a16 refuses":

        def refuse(*a, **k):
            raise ValueError("w4a16: b_scales must be [E, K/G, N]")

        monkeypatch.setattr(w4a16.moe, "_grouped", refuse)
    else:
        monkeypatch.setattr(rec.adapter, "device_ok", lambda device: False)
    topk_weights, topk_ids = _route(T, E, 2)
    rec.calls.clear()
    with pytest.raises(NotImplementedError, match=f"_moe_C::{MOE}"):
        _apply(qm, layer, torch.randn(T, H).bfloat16(), topk_weights, topk_ids, monkeypatch)
    assert rec.named("moe_gemm") == [] and rec.adapter.fell_back == {MOE: 1}
    assert rec.adapter.served.get(MOE) is None


# ---------------------------------------------------------------------------------------------- w13 width <= G
def _marlin_utils():
    return _q("utils.marlin_utils")


def _kernel_order(s, G):
    """What the Marlin MoE kernel reads for natural-order scales [E, K/G, N]: vLLM's own marlin_permute_scales (which
    the adapter does not wrap) per expert, with size_k = the K the scales cover: grouped for more than one row."""
    rows, n = s.shape[1], s.shape[2]
    return torch.stack([_marlin_utils().marlin_permute_scales(s[e], rows * G, n, G) for e in range(s.shape[0])])


@pytest.mark.parametrize(
    "rows,size_k,G,want",
    [
        (16, 128, 128, 2048),  # w13 of a width of G (hidden 2048): vLLM's size_k is the width
        (32, 64, 64, 2048),
        (16, 768, 128, 768),  # a width above G: vLLM's size_k already gives the grouped order
        (6, 768, 128, 768),  # w2 of that width
        (1, 128, 128, 128),  # w2 of a width of G: one row, the one-group order
        (1, 512, 128, 128),  # one row permuted as grouped (vLLM's size_k above G): the one-group order
        (16, 128, -1, 128),  # per-channel: as vLLM asks
    ],
)
def test_grouped_size_k(rows, size_k, G, want):
    assert adapter_mod.grouped_size_k(rows, size_k, G) == want
    assert adapter_mod.grouped_size_k(rows, size_k, G, is_a_8bit=True) == size_k  # W4A8: vLLM's order, not served


def test_permutation_wrapped_only_while_installed(rec):
    """The wrapper sits where vLLM's modules hold marlin_moe_permute_scales while MoE is served, and goes with the
    adapter."""
    utils = _marlin_utils()
    wrapped = utils.marlin_moe_permute_scales
    assert wrapped.__module__ == adapter_mod.__name__
    holders = []  # the modules that permute MoE scales in this release: up to 0.29 the methods, in 0.33 the oracle
    for name in (
        "vllm.model_executor.layers.quantization.awq_marlin",
        "vllm.model_executor.layers.quantization.gptq_marlin",
        "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe",
        "vllm.model_executor.layers.fused_moe.oracle.int_wna16",
    ):
        with contextlib.suppress(ImportError):
            module = importlib.import_module(name)
            if hasattr(module, "marlin_moe_permute_scales"):
                holders.append(module)
                assert module.marlin_moe_permute_scales is wrapped, name
    assert holders
    adapter_mod.uninstall()
    for module in [utils, *holders]:
        assert module.marlin_moe_permute_scales is wrapped.__wrapped__, module.__name__


@pytest.mark.parametrize("E,H,inter,G", [(4, 2048, 128, 128), (3, 256, 64, 64), (2, 2048, 768, 128), (2, 512, 256, 64)])
def test_w13_permutation_is_what_the_kernel_reads(rec, E, H, inter, G):
    """vLLM's w13 call (size_k = the expert width) through the wrapper gives what the kernel reads for [E, H/G,
    2 width] scales: for a width of G, unlike vLLM's own function; above G, the same as it."""
    utils = _marlin_utils()
    s = (torch.rand(E, H // G, 2 * inter) + 0.5).half()
    want = _kernel_order(s, G)
    assert _same(utils.marlin_moe_permute_scales(s, inter, 2 * inter, G), want)
    vllm_own = torch.stack([utils.marlin_permute_scales(s[e], inter, 2 * inter, G) for e in range(E)])
    assert torch.equal(vllm_own, want) == (inter > G)


@pytest.mark.parametrize("method", ["awq", "gptq"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("E,T,H,inter,G", [(4, 5, 256, 64, 64), (3, 9, 384, 128, 128)])
def test_w13_width_g_on_w4a16(rec, monkeypatch, method, dtype, E, T, H, inter, G):
    """An expert width of G per partition (e.g. 512 at tensor parallel 4 with G = 128) through vLLM's real MoE
    method: without w4a16 vLLM leaves w13's scales in the one-group order, which its kernel misreads; with it they
    are in the grouped order (vLLM's own permutation for the hidden size), for w4a16's grouped GEMM and for vLLM's
    kernel alike, with one log line saying so. w2 (one scale row) is as vLLM makes it."""
    _env(monkeypatch)
    seed = E * 10 + G
    with monkeypatch.context() as m:  # vLLM's own permutation first (its repacks are CUDA-only: w4a16's stay)
        own = _marlin_utils().marlin_moe_permute_scales
        own = getattr(own, "__wrapped__", own)
        for name in ("awq_marlin", "gptq_marlin", "auto_awq", "auto_gptq"):
            with contextlib.suppress(ImportError):
                m.setattr(_q(name), "marlin_moe_permute_scales", own, raising=False)
        with contextlib.suppress(ImportError):
            oracle = importlib.import_module("vllm.model_executor.layers.fused_moe.oracle.int_wna16")
            m.setattr(oracle, "marlin_moe_permute_scales", own)
        _, plain, (ck13, _, _, _) = _layer(method, E, H, inter, G, dtype, bias=False, seed=seed)
    kernel_reads = _kernel_order(ck13[2], G)
    assert not torch.equal(plain.w13_scales, kernel_reads)  # vLLM alone: the case is real in this release
    lines = _capture_log(monkeypatch)

    qm, layer, (ck13, ck2, _, _) = _layer(method, E, H, inter, G, dtype, bias=False, seed=seed)
    assert _same(layer.w13_scales, kernel_reads)
    said = [line for line in lines if "column order" in line]
    assert len(said) == 1 and "one-group column order" in said[0] and f"size_k={H} instead" in said[0], lines
    top_k = 2
    x = torch.randn(T, H).to(dtype)
    topk_weights, topk_ids = _route(T, E, top_k)
    rec.calls.clear()
    y = _apply(qm, layer, x, topk_weights, topk_ids, monkeypatch)
    assert rec.adapter.fell_back == {} and rec.adapter.served.get(MOE) == 2
    c1, c2 = [c[1] for c in rec.named("moe_gemm")]
    assert (c1["n"], c1["k"], c2["n"], c2["k"]) == (2 * inter, H, H, inter)
    for e in range(E):
        assert _same(c1["scales"][e], kernel_reads[e]), f"expert {e}: w13 scales not in the grouped order"
    assert _same(c2["scales"], _want(method, ck2[0], ck2[1] if method == "awq" else None, ck2[2], inter, H, G)[1])
    assert _same(y, torch.sum(c2["out"].view(T, top_k, H), dim=1))


def test_w13_width_32_padded_on_w4a16(rec, monkeypatch):
    """From 0.30 vLLM pads an AWQ expert width of 32 to 64 (G = 32) and permutes both projections' scales for 32:
    the one-group order, while its kernel reads 2 groups for w2 and 8 for w13. With w4a16 both are grouped."""
    if not _is_new():
        pytest.skip(f"vLLM {VERSION} pads no expert width (a width of 32 is not a Marlin MoE layer there)")
    oracle = importlib.import_module("vllm.model_executor.layers.fused_moe.oracle.int_wna16")
    _env(monkeypatch)
    E, T, H, inter, G, padded = 2, 3, 256, 32, 32, 64
    qm, layer, (ck13, ck2, _, _) = _layer("awq", E, H, inter, G, torch.float16, bias=False, seed=3)
    s13 = oracle._pad_w13_shard_cols(ck13[2], inter, padded)
    s2 = oracle._pad_rows(ck2[2], padded // G)
    assert layer.w13_scales.shape == (E, H // G, 2 * padded) and layer.w2_scales.shape == (E, 2, H)
    assert _same(layer.w13_scales, _kernel_order(s13, G)) and _same(layer.w2_scales, _kernel_order(s2, G))
    topk_weights, topk_ids = _route(T, E, 2)
    rec.calls.clear()
    _apply(qm, layer, torch.randn(T, H).half(), topk_weights, topk_ids, monkeypatch)
    assert rec.adapter.fell_back == {} and rec.adapter.served.get(MOE) == 2
