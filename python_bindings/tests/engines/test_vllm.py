"""w4a16 under the real vLLM (the engine venv's release), on a machine without a GPU.

The adapter is installed for the CPU dispatch key (on a GPU it is the CUDA key; the decision code is the same), and
w4a16's torch ops are replaced by recorders: each records its arguments and answers from w4a16.formats (the numpy
twins of the GPU converters), so vLLM's real linear-method and kernel classes run create_weights,
process_weights_after_loading and apply end to end, and what reaches w4a16 is checked bit for bit against what
w4a16.formats computes from the checkpoint tensors. Only vLLM's GPU environment is stood in for (the Marlin workspace
allocation and the kernel choice, which ask the GPU); the layer code itself is vLLM's."""

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

if os.environ.get("W4A16_ENGINE_NAME", "").startswith("vllm"):
    import vllm  # a vLLM venv (tools/engine-test): failing to import it is a failure, not a skip
else:
    vllm = pytest.importorskip("vllm", reason="not a vLLM venv")

from conftest import ROOT, schema_record_path  # noqa: E402
from engine_schemas import vllm_record  # noqa: E402
from w4a16 import formats  # noqa: E402
from w4a16.engines import _common  # noqa: E402
from w4a16.engines import vllm as adapter_mod  # noqa: E402

adapter_mod.load_vllm_ops()  # vLLM's compiled ops, as a vLLM process has them when plugins load
VERSION = importlib.metadata.version("vllm")
GEN = adapter_mod.generation_named(VERSION)  # the engine venvs hold the releases the generations were recorded from
ACT_ORDER = GEN is not None and "g_idx_or_none" in GEN.schemas[GEN.gemm]  # the GEMM still takes g_idx / perm
DTYPES = (torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------------------------- schemas and versions
def test_schemas_match_the_record():
    """The live op schemas of this vLLM equal the record in tests/engines/schemas (a newer release that changes one
    fails here, and the adapter refuses it at run time)."""
    path = schema_record_path("vllm", VERSION)
    assert os.path.exists(path), f"no schema record for vLLM {VERSION}: write one with engine_schemas.py"
    recorded = json.load(open(path))
    live = vllm_record()
    assert live["ops"] == recorded["ops"]
    assert live["scalar_type_ids"] == recorded["scalar_type_ids"]


def test_adapter_knows_this_release_with_the_recorded_schemas():
    assert GEN is not None, f"vLLM {VERSION} has no adapter generation"
    assert adapter_mod.known_release(VERSION)
    adapter_mod.load_vllm_ops()
    assert adapter_mod.generation_matching() == (GEN, [])
    recorded = json.load(open(schema_record_path("vllm", VERSION)))
    for name, schema in GEN.schemas.items():
        assert recorded["ops"].get(f"_C::{name}") == schema, name
    ids = recorded["scalar_type_ids"]
    assert GEN.type_ids == {"uint4": ids["uint4"], "uint4b8": ids["uint4b8"]}


def test_changed_schema_leaves_vllm_untouched(monkeypatch, caplog):
    """A schema that differs from the recorded one: one log line, nothing registered."""
    changed = dict(GEN.schemas, **{GEN.gemm: GEN.schemas[GEN.gemm].replace("bool is_zp_float", "bool zp_f")})
    monkeypatch.setattr(GEN, "schemas", changed)
    lines = _capture_log(monkeypatch)
    before = torch._C._dispatch_dump(f"_C::{GEN.gemm}")
    assert adapter_mod.install(VERSION, dispatch_key="CPU") is None
    assert torch._C._dispatch_dump(f"_C::{GEN.gemm}") == before
    assert len(lines) == 1 and f"_C::{GEN.gemm} has the schema" in lines[0] and "left as they are" in lines[0]


def test_unknown_release_leaves_vllm_untouched(monkeypatch):
    lines = _capture_log(monkeypatch)
    assert adapter_mod.install("0.99.0", dispatch_key="CPU") is None
    assert adapter_mod.install("0.10.2", dispatch_key="CPU") is None
    assert len(lines) == 2 and all("not a release this w4a16 knows" in s for s in lines)


def _capture_log(monkeypatch):
    """The adapter's log lines (its logger is a child of vLLM's, which does not propagate to pytest's capture)."""
    import logging

    lines = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    monkeypatch.setattr(adapter_mod.log, "handlers", adapter_mod.log.handlers + [handler])
    monkeypatch.setattr(adapter_mod.log, "level", logging.INFO)
    return lines


# ---------------------------------------------------------------------------------------------- vLLM's plugin loading
def _plugin_env(tmp_path):
    """A dist-info holding the entry point that python_bindings/pyproject.toml declares, so that vLLM's real plugin
    loader (importlib.metadata entry points of group vllm.general_plugins) finds w4a16 as an installed package."""
    import tomllib

    project = tomllib.load(open(os.path.join(ROOT, "python_bindings", "pyproject.toml"), "rb"))["project"]
    eps = project["entry-points"]["vllm.general_plugins"]
    dist = tmp_path / f"w4a16-{project['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: w4a16\nVersion: {project['version']}\n")
    (dist / "entry_points.txt").write_text("[vllm.general_plugins]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tmp_path), os.path.join(ROOT, "python_bindings")]),
        LD_PRELOAD=os.environ["W4A16_STUB_DRIVER"],
        VLLM_LOGGING_LEVEL="INFO",
    )
    return env


# As a vLLM process starts: logging configured (0.33 does it per process from the config), then the plugins loaded.
_LOAD = (
    "import vllm.logger as L\n"
    "if hasattr(L, 'configure_logging'):\n"
    "    from vllm.config.logging import LoggingConfig; L.configure_logging(LoggingConfig())\n"
    "from vllm.plugins import load_general_plugins; load_general_plugins(); "
    "from w4a16.engines import vllm as a; import torch; "
    "print('INSTALLED', a.installed() is not None, a.installed() and a.installed().generation.name); "
    "print('DUMP', a.installed() is not None and "
    "'w4a16' in torch._C._dispatch_dump('_C::' + a.installed().generation.gemm))"
)


def test_plugin_loads_through_vllms_plugin_loader(tmp_path):
    env = _plugin_env(tmp_path)
    out = subprocess.run([sys.executable, "-c", _LOAD], capture_output=True, text=True, env=env, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert f"INSTALLED True {GEN.name}" in text, text
    line = next((s for s in text.splitlines() if "serves vLLM" in s), None)
    assert line is not None, text
    assert f"serves vLLM {VERSION}'s int4 linear layers" in line and f"_C::{GEN.gemm}" in line, line
    assert "DUMP True" in text, text
    print(line)


def test_plugin_off_with_w4a16_vllm_0(tmp_path):
    env = dict(_plugin_env(tmp_path), W4A16_VLLM="0")
    out = subprocess.run([sys.executable, "-c", _LOAD], capture_output=True, text=True, env=env, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "INSTALLED False" in text and "W4A16_VLLM=0" in text, text


# ---------------------------------------------------------------------------------------------- recorders
class Recorder:
    """Stands in for w4a16.torch's ops: records each call and answers from w4a16.formats."""

    def __init__(self):
        self.calls = []

    def awq_marlin_repack(self, b_q_weight, size_k, size_n, num_bits):
        self.calls.append(("awq_marlin_repack", b_q_weight.clone(), size_k, size_n, num_bits))
        return torch.from_numpy(formats.marlin_repack_awq(b_q_weight.numpy()))

    def gptq_marlin_repack(self, b_q_weight, perm, size_k, size_n, num_bits):
        self.calls.append(("gptq_marlin_repack", b_q_weight.clone(), perm.clone(), size_k, size_n, num_bits))
        p = perm.numpy().astype(np.int64) if perm.numel() else None
        return torch.from_numpy(formats.marlin_repack_gptq(b_q_weight.numpy(), p))

    def permute_cols(self, a, perm):
        self.calls.append(("permute_cols", a.clone(), perm.clone()))
        return a[:, perm.long()].contiguous()

    def marlin_gemm(self, a, b_q_weight, b_scales, b_zeros, b_bias, size_m, size_n, size_k):
        self.calls.append(
            (
                "marlin_gemm",
                a.clone(),
                b_q_weight.clone(),
                b_scales.clone(),
                None if b_zeros is None else b_zeros.clone(),
                None if b_bias is None else b_bias.clone(),
                size_m,
                size_n,
                size_k,
            )
        )
        self.out = torch.randn(size_m, size_n).to(a.dtype)  # what vLLM must hand back unchanged
        return self.out.clone()

    def awq_gemm(self, x, qweight, scales, qzeros, split_k_iters):
        self.calls.append(("awq_gemm", x.clone(), qweight.clone(), scales.clone(), qzeros.clone()))
        self.out = torch.randn(x.shape[0], scales.shape[1]).to(x.dtype)
        return self.out.clone()

    def awq_dequantize(self, qweight, scales, zeros, split_k_iters, thx, thy):
        self.calls.append(("awq_dequantize", qweight.clone(), scales.clone(), zeros.clone()))
        g = qweight.shape[0] // scales.shape[0]
        return torch.from_numpy(formats.awq_dequantize(qweight.numpy(), zeros.numpy(), scales.float().numpy(), g)).to(
            scales.dtype
        )

    def named(self, name):
        return [c for c in self.calls if c[0] == name]


@pytest.fixture
def rec(monkeypatch):
    """The adapter installed for CPU tensors, with w4a16's ops recorded; removed again after the test."""
    import w4a16.torch as wt

    r = Recorder()
    for name in (
        "awq_marlin_repack",
        "gptq_marlin_repack",
        "permute_cols",
        "marlin_gemm",
        "awq_gemm",
        "awq_dequantize",
    ):
        monkeypatch.setattr(wt, name, getattr(r, name))
    adapter_mod.uninstall()
    a = adapter_mod.install(VERSION, dispatch_key="CPU", device_ok=lambda device: True)
    assert a is not None
    r.adapter = a
    yield r
    adapter_mod.uninstall()


def _vllm_env(monkeypatch):
    """vLLM's GPU-only environment: the Marlin workspace (sized from the GPU's SM count), the kernel choice (made
    from the GPU's capability) and the tensor-parallel rank (from an initialised process group; here 0 of 1) are
    stood in for; everything else is vLLM's own code."""
    mu = importlib.import_module("vllm.model_executor.layers.quantization.utils.marlin_utils")
    params = importlib.import_module("vllm.model_executor.parameter")  # tensor parallel size 1, rank 0
    monkeypatch.setattr(params, "get_tensor_model_parallel_rank", lambda *a, **k: 0)
    if hasattr(params, "get_tensor_model_parallel_world_size"):
        monkeypatch.setattr(params, "get_tensor_model_parallel_world_size", lambda *a, **k: 1)
    ws = lambda device, *a, **k: torch.zeros(132, dtype=torch.int32, device=device)  # noqa: E731
    for mod in _marlin_modules():
        if hasattr(mod, "marlin_make_workspace_new"):
            monkeypatch.setattr(mod, "marlin_make_workspace_new", ws)
        if hasattr(mod, "verify_marlin_supported"):
            monkeypatch.setattr(mod, "verify_marlin_supported", lambda *a, **k: None)
        if hasattr(mod, "choose_mp_linear_kernel"):
            monkeypatch.setattr(mod, "choose_mp_linear_kernel", lambda *a, **k: _marlin_kernel_class())
    if hasattr(mu, "get_marlin_workspace"):
        monkeypatch.setattr(mu, "get_marlin_workspace", ws)
    monkeypatch.setattr(mu, "should_use_atomic_add_reduce", lambda *a, **k: False)


def _marlin_kernel_module():
    for name in (
        "vllm.model_executor.kernels.linear.mixed_precision.marlin",
        "vllm.model_executor.layers.quantization.kernels.mixed_precision.marlin",
    ):
        try:
            return importlib.import_module(name)
        except ImportError:
            pass
    raise ImportError("vLLM's MarlinLinearKernel module")


def _marlin_kernel_class():
    return _marlin_kernel_module().MarlinLinearKernel


def _marlin_modules():
    q = "vllm.model_executor.layers.quantization."
    names = [q + "awq_marlin", q + "gptq_marlin", q + "auto_awq", q + "auto_gptq", q + "utils.marlin_utils"]
    mods = [_marlin_kernel_module()]
    for n in names:
        try:
            mods.append(importlib.import_module(n))
        except ImportError:
            pass
    return mods


# ---------------------------------------------------------------------------------------------- checkpoints and layers
def _awq_checkpoint(K, N, G, dtype, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((K, N)).astype(np.float32) * 0.05
    qw, qz, s = formats.awq_quantize(w, G)
    scales = torch.from_numpy(s.astype(np.float32)).to(dtype)
    return torch.from_numpy(qw), torch.from_numpy(qz), scales


def _gptq_checkpoint(K, N, G, dtype, seed, act_order=False):
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 16, size=(K, N), dtype=np.uint8)
    groups = K // G if G != -1 else 1
    scales = (torch.from_numpy(rng.random((groups, N)).astype(np.float32)) * 0.01 + 0.002).to(dtype)
    if act_order:
        g_idx = torch.from_numpy(rng.permutation(K).astype(np.int32) // G)
    else:
        g_idx = torch.arange(K, dtype=torch.int32) // (G if G != -1 else K)
    # GPTQ stores qzeros too (8 for symmetric checkpoints, stored as 7 by the old packer's off-by-one)
    qzeros = torch.from_numpy(formats.awq_pack(np.full((groups, N), 7, dtype=np.uint8)))
    return torch.from_numpy(formats.gptq_pack(q)), qzeros, scales, g_idx


def _awq_layer(K, N, G, dtype, bias):
    """vLLM's AWQ Marlin linear method on a bare module: create_weights, the checkpoint copied in (what the weight
    loader does at tensor parallel size 1), process_weights_after_loading."""
    qw, qz, s = _awq_checkpoint(K, N, G, dtype, seed=K + N + G)
    layer = torch.nn.Module()
    try:
        from vllm.model_executor.layers.quantization.awq_marlin import AWQMarlinConfig, AWQMarlinLinearMethod

        cfg = AWQMarlinConfig(
            weight_bits=4,
            group_size=G,
            zero_point=True,
            lm_head_quantized=False,
            modules_to_not_convert=None,
            full_config={},
        )
        method = AWQMarlinLinearMethod(cfg)
    except ImportError:
        from vllm.model_executor.layers.quantization.auto_awq import AutoAWQConfig, AutoAWQMarlinLinearMethod

        cfg = AutoAWQConfig.from_config({"bits": 4, "group_size": G, "zero_point": True})
        method = AutoAWQMarlinLinearMethod(cfg)
    method.create_weights(layer, K, [N], K, N, dtype, weight_loader=lambda *a, **k: None)
    layer.qweight.data.copy_(qw)
    layer.qzeros.data.copy_(qz)
    layer.scales.data.copy_(s)
    b = None
    if bias:
        b = (torch.randn(N) * 0.5).to(dtype)
        layer.register_parameter("bias", torch.nn.Parameter(b.clone(), requires_grad=False))
    else:
        layer.bias = None
    method.process_weights_after_loading(layer)
    return method, layer, (qw, qz, s, b)


def _gptq_layer(K, N, G, dtype, bias, act_order=False, k_shard=None):
    qw, qz, s, g_idx = _gptq_checkpoint(K, N, G, dtype, seed=K + N + G + act_order, act_order=act_order)
    Kp = k_shard or K
    layer = torch.nn.Module()
    try:
        from vllm.model_executor.layers.quantization.gptq_marlin import GPTQMarlinConfig, GPTQMarlinLinearMethod

        cfg = GPTQMarlinConfig(
            weight_bits=4,
            group_size=G,
            desc_act=act_order,
            is_sym=True,
            lm_head_quantized=False,
            dynamic={},
            full_config={},
        )
        method = GPTQMarlinLinearMethod(cfg)
    except ImportError:
        from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig, AutoGPTQLinearMethod

        cfg = AutoGPTQConfig.from_config({"bits": 4, "group_size": G, "desc_act": act_order, "sym": True})
        method = AutoGPTQLinearMethod(cfg)
    method.create_weights(layer, Kp, [N], K, N, dtype, weight_loader=lambda *a, **k: None)
    layer.qweight.data.copy_(qw[: Kp // 8])
    if layer.scales.shape[0] == s.shape[0]:
        layer.scales.data.copy_(s)
    else:
        layer.scales.data.copy_(s[: layer.scales.shape[0]])
    if hasattr(layer, "g_idx"):
        layer.g_idx.data.copy_(g_idx[:Kp])
    if hasattr(layer, "qzeros") and layer.qzeros.shape == qz.shape:
        layer.qzeros.data.copy_(qz)
    b = None
    if bias:
        b = (torch.randn(N) * 0.5).to(dtype)
        layer.register_parameter("bias", torch.nn.Parameter(b.clone(), requires_grad=False))
    else:
        layer.bias = None
    method.process_weights_after_loading(layer)
    return method, layer, (qw, s, g_idx, b)


def _bits(t):
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _same(a, b):
    return a.shape == b.shape and torch.equal(_bits(a), _bits(b))


# ---------------------------------------------------------------------------------------------- layers on w4a16
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("K,N,G", [(256, 128, 128), (512, 192, 64), (256, 64, -1)])
def test_awq_marlin_layer(rec, monkeypatch, dtype, bias, K, N, G):
    _vllm_env(monkeypatch)
    method, layer, (qw, qz, s, b) = _awq_layer(K, N, G, dtype, bias)
    Geff = K if G == -1 else G
    want_w = formats.marlin_repack_awq(qw.numpy())
    repacks = rec.named("awq_marlin_repack") + rec.named("gptq_marlin_repack")
    assert len(repacks) == 1
    r = repacks[0]
    if r[0] == "awq_marlin_repack":  # 0.15-0.22: AWQ words straight to the AWQ repack
        assert _same(r[1], qw) and r[2:] == (K, N, 4)
    else:  # newer: vLLM turns AWQ into the GPTQ packing first
        assert r[2].numel() == 0 and r[3:] == (K, N, 4)
        assert np.array_equal(formats.marlin_repack_gptq(r[1].numpy()), want_w)

    x = torch.randn(3, 2, K).to(dtype)
    y = method.apply(layer, x, layer.bias)
    (call,) = rec.named("marlin_gemm")
    _, a, w, sc, zp, bb, M, n, k = call
    assert (M, n, k) == (6, N, K)
    assert _same(a, x.reshape(6, K))
    assert np.array_equal(w.numpy(), want_w)
    assert _same(sc, torch.from_numpy(formats.marlin_permute_scales(s.float().numpy(), K, N, Geff)).to(dtype))
    assert np.array_equal(zp.numpy(), formats.awq_to_marlin_zero_points(qz.numpy(), K // Geff, N))
    if bias:
        assert bb is not None and _same(bb, b), "the bias must reach w4a16 in natural column order"
    else:
        assert bb is None
    assert _same(y, rec.out.reshape(3, 2, N))
    assert rec.adapter.fell_back == {}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("K,N,G", [(256, 128, 128), (512, 256, 32), (256, 64, -1)])
def test_gptq_marlin_layer(rec, monkeypatch, dtype, bias, K, N, G):
    _vllm_env(monkeypatch)
    method, layer, (qw, s, g_idx, b) = _gptq_layer(K, N, G, dtype, bias)
    Geff = K if G == -1 else G
    (r,) = rec.named("gptq_marlin_repack")
    assert _same(r[1], qw) and r[2].numel() == 0 and r[3:] == (K, N, 4)
    x = torch.randn(5, K).to(dtype)
    y = method.apply(layer, x, layer.bias)
    (call,) = rec.named("marlin_gemm")
    _, a, w, sc, zp, bb, M, n, k = call
    assert (M, n, k) == (5, N, K) and _same(a, x)
    assert np.array_equal(w.numpy(), formats.marlin_repack_gptq(qw.numpy()))
    assert _same(sc, torch.from_numpy(formats.marlin_permute_scales(s.float().numpy(), K, N, Geff)).to(dtype))
    assert zp is None
    assert (bb is None) if not bias else _same(bb, b)
    assert _same(y, rec.out) and rec.adapter.fell_back == {}


@pytest.mark.skipif(not ACT_ORDER, reason="this vLLM refuses act-order (desc_act) Marlin layers itself")
@pytest.mark.parametrize("dtype", DTYPES)
def test_gptq_act_order_whole_k_is_served(rec, monkeypatch, dtype):
    """desc_act over the whole K: the groups are checked whole when the weights load; per call the activations are
    permuted by vLLM's sort order and the GEMM runs on the sorted weights."""
    _vllm_env(monkeypatch)
    K, N, G = 512, 128, 128
    method, layer, (qw, s, g_idx, b) = _gptq_layer(K, N, G, dtype, bias=True, act_order=True)
    perm = torch.argsort(g_idx).to(torch.int32)
    (r,) = rec.named("gptq_marlin_repack")
    assert _same(r[1], qw) and r[3:] == (K, N, 4)
    assert torch.equal(g_idx[r[2].long()], g_idx[perm.long()])  # rows sorted by group
    x = torch.randn(4, K).to(dtype)
    y = method.apply(layer, x, layer.bias)
    (pc,) = rec.named("permute_cols")
    assert _same(pc[1], x) and torch.equal(pc[2], r[2])
    (call,) = rec.named("marlin_gemm")
    assert _same(call[1], x[:, r[2].long()])
    assert np.array_equal(call[2].numpy(), formats.marlin_repack_gptq(qw.numpy(), r[2].numpy().astype(np.int64)))
    assert _same(call[3], torch.from_numpy(formats.marlin_permute_scales(s.float().numpy(), K, N, G)).to(dtype))
    assert _same(call[5], b) and _same(y, rec.out)


@pytest.mark.skipif(not ACT_ORDER, reason="this vLLM refuses act-order (desc_act) Marlin layers itself")
def test_gptq_act_order_row_parallel_shard_goes_to_vllm(rec, monkeypatch):
    """A row-parallel shard of an act-order layer (is_k_full=False) goes to vLLM's own kernel."""
    _vllm_env(monkeypatch)
    K, N, G = 512, 128, 128
    method, layer, _ = _gptq_layer(K, N, G, torch.float16, bias=False, act_order=True, k_shard=256)
    x = torch.randn(2, 256).half()
    with pytest.raises(NotImplementedError, match=f"_C::{GEN.gemm}"):  # vLLM's kernel: CUDA only, here on CPU
        method.apply(layer, x, None)
    assert rec.named("marlin_gemm") == [] and rec.adapter.fell_back == {GEN.gemm: 1}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [4, 256])  # vLLM: awq_gemm below 256 tokens, awq_dequantize + matmul above
def test_awq_plain_layer(rec, monkeypatch, dtype, tokens):
    """vLLM's non-Marlin AWQ linear method (quantization=awq): the checkpoint tensors reach w4a16 as they are, and
    vLLM adds the bias itself."""
    _vllm_env(monkeypatch)
    K, N, G = 256, 128, 64
    qw, qz, s = _awq_checkpoint(K, N, G, dtype, seed=5)
    try:
        from vllm.model_executor.layers.quantization.awq import AWQConfig, AWQLinearMethod

        method = AWQLinearMethod(AWQConfig(weight_bits=4, group_size=G, zero_point=True))
    except ImportError:
        from vllm.model_executor.layers.quantization.auto_awq import AutoAWQConfig, AutoAWQLinearMethod

        method = AutoAWQLinearMethod(AutoAWQConfig.from_config({"bits": 4, "group_size": G, "zero_point": True}))
    layer = torch.nn.Module()
    method.create_weights(layer, K, [N], K, N, dtype, weight_loader=lambda *a, **k: None)
    layer.qweight.data.copy_(qw)
    layer.qzeros.data.copy_(qz)
    layer.scales.data.copy_(s)
    method.process_weights_after_loading(layer)
    b = (torch.randn(N) * 0.5).to(dtype)
    x = torch.randn(tokens, K).to(dtype)
    y = method.apply(layer, x, b)
    if tokens < 256:
        (call,) = rec.named("awq_gemm")
        assert _same(call[1], x) and _same(call[2], qw) and _same(call[3], s) and _same(call[4], qz)
        assert _same(y, rec.out + b)
    else:
        (call,) = rec.named("awq_dequantize")
        assert _same(call[1], qw) and _same(call[2], s) and _same(call[3], qz)
        w = torch.from_numpy(formats.awq_dequantize(qw.numpy(), qz.numpy(), s.float().numpy(), G)).to(dtype)
        assert _same(y, torch.matmul(x, w) + b)
    assert rec.adapter.fell_back == {}


# ---------------------------------------------------------------------------------------------- what stays on vLLM
def _gemm_args(
    dtype=torch.float16, a_scales=None, global_scale=None, type_name="uint4", is_zp_float=False, K=256, N=128
):
    """A call of this vLLM's GEMM op, its arguments in the order of its schema."""
    from vllm.scalar_type import scalar_types

    e = torch.empty(0, dtype=torch.int32)
    v = dict(
        a=torch.randn(4, K).to(dtype),
        c_or_none=None,
        b_q_weight=torch.zeros(K // 16, 2 * N, dtype=torch.int32),
        b_bias_or_none=None,
        b_scales=torch.ones(K // 128, N).to(dtype),
        a_scales=a_scales,
        global_scale=global_scale,
        b_zeros_or_none=torch.zeros(K // 128, N // 8, dtype=torch.int32),
        g_idx_or_none=e,
        perm_or_none=e,
        workspace=torch.zeros(128, dtype=torch.int32),
        b_type_id=getattr(scalar_types, type_name).id,
        b_q_type=getattr(scalar_types, type_name).id,
        size_m=4,
        size_n=N,
        size_k=K,
        is_k_full=True,
        use_atomic_add=False,
        use_fp32_reduce=True,
        is_zp_float=is_zp_float,
    )
    return tuple(v[n] for n in GEN.arg_names(GEN.gemm))


def _gemm_op():
    return getattr(torch.ops._C, GEN.gemm)


@pytest.mark.parametrize("case", ["a_scales", "global_scale", "uint8b128", "is_zp_float", "fp32", "K=192"])
def test_unsupported_gemm_goes_to_vllms_kernel(rec, case):
    if case == "a_scales" and "a_scales" not in GEN.arg_names(GEN.gemm):
        pytest.skip("this vLLM's GEMM takes no activation scales")
    kw = {
        "a_scales": dict(a_scales=torch.ones(4)),
        "global_scale": dict(global_scale=torch.ones(1)),
        "uint8b128": dict(type_name="uint8b128"),
        "is_zp_float": dict(is_zp_float=True),
        "fp32": dict(dtype=torch.float32),
        "K=192": dict(K=192),
    }[case]
    with pytest.raises(NotImplementedError, match=f"_C::{GEN.gemm}"):  # vLLM's own (CUDA) kernel was reached
        _gemm_op()(*_gemm_args(**kw))
    assert rec.named("marlin_gemm") == [] and rec.adapter.fell_back == {GEN.gemm: 1}


def test_supported_gemm_call_is_served(rec):
    _gemm_op()(*_gemm_args())
    assert len(rec.named("marlin_gemm")) == 1 and rec.adapter.fell_back == {}


@pytest.mark.parametrize("num_bits,is_a_8bit", [(8, False), (4, True)])
def test_unsupported_repack_goes_to_vllms_kernel(rec, num_bits, is_a_8bit):
    names = GEN.arg_names("gptq_marlin_repack")
    if is_a_8bit and "is_a_8bit" not in names:
        pytest.skip("this vLLM's repack has no 8-bit activation layout")
    v = dict(
        b_q_weight=torch.zeros(256 // 8, 128, dtype=torch.int32),
        perm=torch.empty(0, dtype=torch.int32),
        size_k=256,
        size_n=128,
        num_bits=num_bits,
        is_a_8bit=is_a_8bit,
    )
    with pytest.raises(NotImplementedError, match="_C::gptq_marlin_repack"):
        torch.ops._C.gptq_marlin_repack(*(v[n] for n in names))
    assert rec.named("gptq_marlin_repack") == []


def test_repack_accepts_vllms_keyword_call(rec):
    """The exact call vLLM's layer code makes, keywords and is_a_8bit included (the old adapter raised TypeError)."""
    import vllm._custom_ops as ops

    q = torch.from_numpy(formats.awq_pack(np.random.default_rng(1).integers(0, 16, (256, 128), dtype=np.uint8)))
    if "is_a_8bit" in GEN.arg_names("awq_marlin_repack"):
        out = ops.awq_marlin_repack(q, size_k=256, size_n=128, num_bits=4, is_a_8bit=False)
    else:
        out = ops.awq_marlin_repack(q, size_k=256, size_n=128, num_bits=4)
    assert np.array_equal(out.numpy(), formats.marlin_repack_awq(q.numpy()))


def test_first_gemm_during_graph_capture_goes_to_vllm(rec, monkeypatch):
    """The first dense GEMM on a device creates w4a16's workspace: inside a CUDA-graph capture it would live in the
    graph's pool, so that call goes to vLLM's kernel (decided on the host; a stand-in CUDA activation here)."""
    import types

    import w4a16.torch as wt

    a = types.SimpleNamespace(dtype=torch.float16, is_cuda=True, device=torch.device("cuda", 0))
    s, z = torch.ones(2, 256).half(), torch.zeros(2, 32, dtype=torch.int32)
    args = (a, s, z, None, None, rec.adapter.uint4, 4, 256, 256, False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(wt, "_workspaces", {})
    assert "CUDA-graph capture" in rec.adapter._marlin_gemm_reason(*args)
    monkeypatch.setattr(wt, "_workspaces", {0: None})  # created before the capture
    assert rec.adapter._marlin_gemm_reason(*args) is None


def test_uninstall_restores_vllms_kernels(rec):
    assert rec.adapter.overrides._lib is not None
    adapter_mod.uninstall()
    with pytest.raises(NotImplementedError, match=f"_C::{GEN.gemm}"):
        _gemm_op()(*_gemm_args())
    assert rec.named("marlin_gemm") == []


# ---------------------------------------------------------------------------------------------- bias order
def test_bias_unpermute_inverts_vllms_marlin_permute_bias():
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_permute_bias

    b = torch.randn(256).half()
    permuted = marlin_permute_bias(b)
    assert not torch.equal(permuted, b)
    assert torch.equal(_common.marlin_bias_unpermute(permuted), b)


# ---------------------------------------------------------------------------------------------- torch.compile
def test_forward_compiles_fullgraph(rec, monkeypatch):
    """vLLM compiles its model with torch.compile: the layer's forward (vLLM's apply and the op, with w4a16 behind
    the dispatcher) traces in one graph, and the compiled graph still reaches w4a16."""
    _vllm_env(monkeypatch)
    method, layer, (qw, qz, s, b) = _awq_layer(256, 128, 128, torch.float16, True)
    fn = torch.compile(lambda x: method.apply(layer, x, layer.bias), fullgraph=True, backend="aot_eager")
    x = torch.randn(4, 256).half()
    y = fn(x)
    assert len(rec.named("marlin_gemm")) == 1 and _same(y, rec.out)
    assert _same(rec.named("marlin_gemm")[0][5], b)


def test_installs_over_vllms_cuda_kernels():
    """The production install (CUDA dispatch key, vLLM's kernels kept with torch.library.get_kernel) works on the
    real vLLM without a GPU: registration needs none."""
    adapter_mod.uninstall()
    before = torch._C._dispatch_dump(f"_C::{GEN.gemm}")
    a = adapter_mod.install(VERSION)
    try:
        assert a is not None
        assert all(a.overrides.original(n) is not None for n in GEN.schemas)
        assert torch._C._dispatch_dump(f"_C::{GEN.gemm}") != before
    finally:
        adapter_mod.uninstall()
    assert torch._C._dispatch_dump(f"_C::{GEN.gemm}") == before
