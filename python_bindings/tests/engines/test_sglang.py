"""w4a16's SGLang adapter against the real SGLang package, without a GPU.

Run with the SGLang venv's python (tests/engines/sglang.spec), w4a16 importable and libw4a16 built:
    PYTHONPATH=python_bindings W4A16_LIBRARY=build/libw4a16.so <venv>/bin/python -m pytest \
        python_bindings/tests/engines/test_sglang.py
Skipped where SGLang is not installed.

The plugin is loaded through SGLang's own load_plugins() from the entry point that python_bindings/pyproject.toml
declares; SGLang's real AWQ-Marlin and GPTQ-Marlin layers (ReplicatedLinear + the config's linear method) load
checkpoint tensors and run forward on CPU tensors, with libw4a16's entry points replaced by recorders that read the
arguments from host memory. Each argument is compared bit for bit with w4a16.formats computed from the same
checkpoint tensors; the GEMM recorder writes a reference product, so the layer's output shows where the bias went.
Pass-through cases run SGLang's own functions down to its JIT module, replaced by a recorder."""

import ctypes
import importlib
import json
import logging
import os
import pathlib
import sys
import types

import numpy as np
import pytest

if os.environ.get("W4A16_ENGINE_NAME", "").startswith("sglang"):
    import sglang  # an SGLang venv (tools/engine-test): failing to import it is a failure, not a skip
else:
    sglang = pytest.importorskip("sglang", reason="not an SGLang venv (tests/engines/sglang.spec)")
torch = pytest.importorskip("torch")

import w4a16  # noqa: E402
import w4a16.torch as wt  # noqa: E402
from w4a16 import formats  # noqa: E402
from w4a16.engines import sglang as adapter  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[3]
SCHEMAS = REPO / "tests" / "engines" / "schemas"
SMS = 132


def _fake_gpu(mp):
    # SGLang chooses its CUDA code paths from torch.cuda at import and load time; this machine has no GPU
    mp.setattr(torch.cuda, "is_available", lambda: True)
    mp.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    mp.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device=None: types.SimpleNamespace(multi_processor_count=SMS, major=9, minor=0, name="none"),
    )


def _driver(tmp):
    """libcuda.so.1 for sgl-kernel's extension: the machine's driver, else the stub built from
    tests/engines/stub_libcuda.c and loaded first, so that the extension's dependency resolves to it."""
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
        return "driver"
    except OSError:
        pass
    import subprocess

    out = tmp / "libcuda.so.1"
    subprocess.run(
        [
            os.environ.get("CC", "cc"),
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            str(out),
            str(REPO / "tests" / "engines" / "stub_libcuda.c"),
        ],
        check=True,
    )
    ctypes.CDLL(str(out), mode=ctypes.RTLD_GLOBAL)
    return "stub"


@pytest.fixture(scope="module")
def sgl(tmp_path_factory):
    """SGLang's modules as on a CUDA machine (sgl-kernel's extension loaded on the real or stub driver first)."""
    _driver(tmp_path_factory.mktemp("driver"))
    importlib.import_module("sgl_kernel")  # its compiled ops; SGLang takes its weight types from it
    mp = pytest.MonkeyPatch()
    _fake_gpu(mp)
    mods = types.SimpleNamespace()
    for name, path in [
        ("marlin_utils", "sglang.srt.layers.quantization.marlin_utils"),
        ("awq", "sglang.srt.layers.quantization.awq.awq"),
        ("gptq", "sglang.srt.layers.quantization.gptq.gptq"),
        ("awq_kernels", "sglang.srt.hardware_backend.gpu.quantization.awq_kernels"),
        ("gptq_kernels", "sglang.srt.hardware_backend.gpu.quantization.gptq_kernels"),
        ("linear", "sglang.srt.layers.linear"),
        ("gemm_op", "sglang.kernels.ops.gemm.gptq_marlin"),
        ("awq_repack_op", "sglang.kernels.ops.quantization.awq_marlin_repack"),
        ("gptq_repack_op", "sglang.kernels.ops.quantization.gptq_marlin_repack"),
        ("plugins", "sglang.srt.plugins"),
        ("hooks", "sglang.srt.plugins.hook_registry"),
        ("moe_gemm_op", "sglang.kernels.ops.moe.moe_wna16_marlin"),
        ("fused_marlin_moe", "sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe"),
        ("marlin_runner", "sglang.srt.layers.moe.moe_runner.marlin"),
    ]:
        setattr(mods, name, importlib.import_module(path))
    mods.original = {n: getattr(importlib.import_module(m), n) for n, m in adapter.TARGETS.items()}
    mods.original_sort = mods.marlin_utils.marlin_sort_g_idx
    mods.original_moe = {n: getattr(importlib.import_module(m), n) for n, m in adapter.MOE_TARGETS.items()}
    mp.undo()  # the tests pretend again only while a layer loads (torch.compile must see this machine as it is)
    return mods


def _dist_info(tmp, entry_points):
    """A distribution on sys.path carrying pyproject.toml's entry points, as `pip install` would write them."""
    d = tmp / "w4a16-0.0.0.dist-info"
    d.mkdir()
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: w4a16\nVersion: 0.0.0\n")
    (d / "entry_points.txt").write_text(entry_points)
    return str(tmp)


def _pyproject_entry_points():
    import tomllib

    project = tomllib.loads((REPO / "python_bindings" / "pyproject.toml").read_text())["project"]
    groups = project["entry-points"]
    return "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for g, eps in groups.items())


@pytest.fixture(scope="module")
def plugin(sgl, tmp_path_factory):
    """Load the plugins the way every SGLang process does, keep the log, undo the hooks afterwards."""
    path = _dist_info(tmp_path_factory.mktemp("dist"), _pyproject_entry_points())
    sys.path.insert(0, path)
    importlib.invalidate_caches()
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        sgl.hooks.HookRegistry.reset()
        sgl.plugins._plugins_loaded = False
        sgl.plugins.load_plugins()
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        sys.path.remove(path)
    yield [r.getMessage() for r in records]
    _restore(sgl)


def _restore(sgl):
    """Put SGLang's functions back everywhere the hooks went (defining modules and `from ... import` copies)."""
    originals = dict(sgl.original, marlin_sort_g_idx=sgl.original_sort, **sgl.original_moe)
    for mod in list(sys.modules.values()):
        if not isinstance(mod, types.ModuleType):
            continue
        for name, fn in originals.items():
            cur = getattr(mod, name, None) if name in getattr(mod, "__dict__", {}) else None
            if cur is not None and cur is not fn and getattr(cur, "__wrapped__", None) is fn:
                setattr(mod, name, fn)
    sgl.hooks.HookRegistry.reset()


# ------------------------------------------------------------------ host-memory view of libw4a16's arguments
def _host(ptr, shape, ctype=ctypes.c_int32, dtype=np.int32):
    n = int(np.prod(shape))
    return np.ctypeslib.as_array((ctype * n).from_address(ptr)).view(dtype).reshape(shape)


def _bits(t):
    """A tensor's raw bits as a numpy array (fp16 / bf16 as uint16)."""
    t = t.detach().contiguous()
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


class Lib:
    """Recorders in place of libw4a16's entry points (w4a16._lib), on CPU tensors."""

    def __init__(self, mp, reference):
        self.calls = []
        self.reference = reference  # (A bits, M, K, dtype) -> C [M, N] as the GEMM output
        # the ops check shapes, dtypes and contiguity as they would on a GPU; only the CUDA-device check goes
        mp.setattr(wt._checks, "devices", self._devices)
        mp.setattr(wt, "prepare", lambda device=None: self.workspace)
        mp.setattr(wt, "_stream", lambda t: 0)
        mp.setattr(wt, "_dev_index", lambda t: 0)
        mp.setattr(torch.cuda, "device", lambda idx: _Null())
        self.workspace = torch.zeros(4096, dtype=torch.uint8)
        for name in (
            "marlin_repack_awq",
            "marlin_repack_gptq",
            "marlin_gemm",
            "permute_cols",
            "awq_gemm",
            "marlin_permute_scales",
            "marlin_awq_zero_points",
        ):
            mp.setattr(wt._lib, name, getattr(self, name, self._unexpected(name)))

    @staticmethod
    def _devices(op, named, align=None):
        devs = {t.device for t in named.values() if t is not None}
        assert devs <= {torch.device("cpu")}, (op, devs)

    def _unexpected(self, name):
        def call(*args, **kwargs):
            raise AssertionError(f"unexpected libw4a16 call {name}{args}")

        return call

    def marlin_repack_awq(self, qweight, out, K, N, stream=0):
        src = _host(qweight, (K, N // 8)).copy()
        self.calls.append(("repack_awq", dict(qweight=src, K=K, N=N, stream=stream)))
        _host(out, (K // 16, 2 * N))[...] = formats.marlin_repack_awq(src)

    def marlin_repack_gptq(self, qweight, perm, out, K, N, stream=0):
        src = _host(qweight, (K // 8, N)).copy()
        p = _host(perm, (K,)).copy() if perm else None
        self.calls.append(("repack_gptq", dict(qweight=src, perm=p, K=K, N=N, stream=stream)))
        _host(out, (K // 16, 2 * N))[...] = formats.marlin_repack_gptq(src, p)

    def permute_cols(self, A, perm, A_out, M, K_in, K_out, dtype, stream=0):
        a = _host(A, (M, K_in), ctypes.c_uint16, np.uint16).copy()
        p = _host(perm, (K_out,)).copy()
        self.calls.append(("permute_cols", dict(A=a, perm=p, M=M, K_in=K_in, K_out=K_out, dtype=dtype)))
        _host(A_out, (M, K_out), ctypes.c_uint16, np.uint16)[...] = a[:, p]

    def marlin_gemm(
        self,
        A,
        weight,
        scales,
        zeros,
        bias,
        C,
        M,
        N,
        K,
        group_size,
        dtype,
        workspace,
        workspace_bytes,
        stream=0,
        flags=0,
    ):
        G = K if group_size == -1 else group_size
        rec = dict(
            A=_host(A, (M, K), ctypes.c_uint16, np.uint16).copy(),
            weight=_host(weight, (K // 16, 2 * N)).copy(),
            scales=_host(scales, (K // G, N), ctypes.c_uint16, np.uint16).copy(),
            zeros=_host(zeros, (K // G, N // 8)).copy() if zeros else None,
            bias=bias,
            M=M,
            N=N,
            K=K,
            group_size=group_size,
            dtype=dtype,
            workspace=workspace,
            workspace_bytes=workspace_bytes,
            flags=flags,
        )
        self.calls.append(("marlin_gemm", rec))
        _host(C, (M, N), ctypes.c_uint16, np.uint16)[...] = self.reference(M, N)

    def names(self):
        return [c[0] for c in self.calls]

    def get(self, name):
        found = [c[1] for c in self.calls if c[0] == name]
        assert len(found) == 1, (name, self.names())
        return found[0]


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class JitRecorder:
    """SGLang's JIT Marlin modules, replaced: what SGLang's own functions pass to their CUDA kernels."""

    def __init__(self, mp, sgl):
        self.calls = []
        mod = types.SimpleNamespace(
            gptq_marlin_gemm=self._call("gptq_marlin_gemm"),
            awq_marlin_repack=self._call("awq_marlin_repack"),
            gptq_marlin_repack=self._call("gptq_marlin_repack"),
        )
        mp.setattr(sgl.gemm_op, "_jit_gptq_marlin_module", lambda dtype: mod)
        mp.setattr(sgl.awq_repack_op, "_jit_awq_marlin_repack_module", lambda: mod)
        mp.setattr(sgl.gptq_repack_op, "_jit_gptq_marlin_repack_module", lambda: mod)

    def _call(self, name):
        def call(*args):
            self.calls.append((name, args))

        return call

    def names(self):
        return [c[0] for c in self.calls]


# ------------------------------------------------------------------ checkpoints
def _awq_checkpoint(rng, K, N, G, dtype):
    w = rng.standard_normal((K, N)).astype(np.float32)
    qweight, qzeros, scales = formats.awq_quantize(w, G)
    wdq = formats.awq_dequantize(qweight, qzeros, scales, G).astype(np.float32)
    return dict(qweight=qweight, qzeros=qzeros, scales=scales), wdq


def _gptq_checkpoint(rng, K, N, G, act_order=False):
    g = K if G == -1 else G
    q = rng.integers(0, 16, size=(K, N)).astype(np.uint8)
    scales = (rng.random((K // g, N)) * 0.02 + 0.005).astype(np.float16)
    if act_order:  # GPTQ desc_act: row k belongs to group g_idx[k], each group has G rows, in shuffled order
        g_idx = rng.permutation(np.arange(K) // g).astype(np.int32)
    else:
        g_idx = (np.arange(K) // g).astype(np.int32)
    wdq = (q.astype(np.float32) - 8) * scales.astype(np.float32)[g_idx]
    qzeros = formats.awq_pack(np.full((K // g, N), 7, np.uint8))  # GPTQ's stored zero (8 - 1); Marlin ignores it
    return dict(qweight=formats.gptq_pack(q), qzeros=qzeros, scales=scales, g_idx=g_idx), wdq


def _config(sgl, kind, G, desc_act=False, bits=4):
    if kind == "awq":
        cfg = dict(quant_method="awq", bits=bits, group_size=G, zero_point=True)
        return sgl.awq.AWQMarlinConfig.from_config(cfg)
    cfg = dict(quant_method="gptq", bits=bits, group_size=G, desc_act=desc_act, sym=True, lm_head=False)
    return sgl.gptq.GPTQMarlinConfig.from_config(cfg)


def _layer(sgl, kind, K, N, G, dtype, bias, ckpt, desc_act=False, bits=4):
    """SGLang's ReplicatedLinear under the Marlin config, checkpoint tensors loaded by its weight loaders."""
    layer = sgl.linear.ReplicatedLinear(
        K,
        N,
        bias=bias is not None,
        params_dtype=dtype,
        quant_config=_config(sgl, kind, G, desc_act, bits),
        prefix="model.proj",
    )
    params = dict(layer.named_parameters())
    for name, value in ckpt.items():
        if name not in params:
            continue
        t = torch.from_numpy(np.ascontiguousarray(value))
        if name == "scales":
            t = t.to(torch.float32).to(dtype)
        params[name].weight_loader(params[name], t)
    if bias is not None:
        layer.weight_loader(layer.bias, bias)
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def _ref_output(x, wdq, dtype):
    return (x.to(torch.float32) @ torch.from_numpy(wdq)).to(dtype)


DT = {torch.float16: w4a16.FP16, torch.bfloat16: w4a16.BF16}


# ------------------------------------------------------------------ tests
def test_recorded_schema_matches_installed(sgl):
    live = adapter.live_schema()
    path = SCHEMAS / f"sglang-{live['sglang']}.json"
    assert path.exists(), (
        f"SGLang {live['sglang']} has no record: read its schema (adapter.live_schema()), check "
        f"the adapter against its layer code, and add {path.name} and a KNOWN entry"
    )
    recorded = json.loads(path.read_text())
    assert live == recorded, "the installed SGLang differs from its record: the adapter must be re-checked"
    assert dict(adapter.KNOWN.get(live["sglang"], {}), sglang=live["sglang"]) == recorded, "adapter.KNOWN != record"
    assert adapter.check(live) == ""


def test_plugin_loads_through_sglang(sgl, plugin):
    served = [m for m in plugin if "ops now served by w4a16" in m]
    assert len(served) == 1, plugin
    assert f"SGLang {sglang.__version__}" in served[0]
    assert "gptq_marlin_gemm, awq_marlin_repack, gptq_marlin_repack" in served[0]
    assert any(m.startswith("Executed general plugin: w4a16") for m in plugin), plugin
    for name, module in list(adapter.TARGETS.items()) + [adapter.SORT_G_IDX]:
        assert any(f"to {module}.{name} (from: plugin=w4a16" in m for m in plugin), (name, plugin)
    # every place SGLang's layers look the functions up now holds the hook around the original
    for mod, name in [
        (sgl.marlin_utils, "gptq_marlin_gemm"),
        (sgl.gemm_op, "gptq_marlin_gemm"),
        (sgl.awq_kernels, "awq_marlin_repack"),
        (sgl.awq_repack_op, "awq_marlin_repack"),
        (sgl.gptq_kernels, "gptq_marlin_repack"),
        (sgl.gptq_repack_op, "gptq_marlin_repack"),
        (sgl.gptq_kernels, "marlin_sort_g_idx"),
    ]:
        fn = getattr(mod, name)
        original = sgl.original_sort if name == "marlin_sort_g_idx" else sgl.original[name]
        assert fn is not original and fn.__wrapped__ is original, (mod.__name__, name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("kind,G", [("awq", 128), ("awq", 64), ("gptq", 128), ("gptq", -1), ("gptq_act", 128)])
def test_linear_layer(sgl, plugin, kind, G, dtype, with_bias):
    K, N, M = 256, 192, 5
    rng = np.random.default_rng(hash((kind, G, str(dtype), with_bias)) % 2**32)
    act = kind == "gptq_act"
    if kind == "awq":
        ckpt, wdq = _awq_checkpoint(rng, K, N, G, dtype)
    else:
        ckpt, wdq = _gptq_checkpoint(rng, K, N, G, act)
    if dtype == torch.bfloat16:  # dequantised with bf16 scales: what the layer computes from
        sc = torch.from_numpy(ckpt["scales"]).float().to(dtype).float().numpy()
        if kind == "awq":
            wdq = (
                formats.awq_unpack(ckpt["qweight"]).astype(np.float32)
                - formats.awq_unpack(ckpt["qzeros"]).astype(np.float32)[np.arange(K) // G]
            ) * sc[np.arange(K) // G]
        else:
            wdq = (formats.gptq_unpack(ckpt["qweight"]).astype(np.float32) - 8) * sc[ckpt["g_idx"]]
    bias = torch.from_numpy(rng.standard_normal(N).astype(np.float32)).to(dtype) if with_bias else None
    x = torch.from_numpy(rng.standard_normal((M, K)).astype(np.float32)).to(dtype)
    ref = _ref_output(x, wdq, dtype)

    mp = pytest.MonkeyPatch()
    try:
        _fake_gpu(mp)
        lib = Lib(mp, lambda m, n: _bits(ref))
        jit = JitRecorder(mp, sgl)
        layer = _layer(sgl, "awq" if kind == "awq" else "gptq", K, N, G, dtype, bias, ckpt, desc_act=act)
        out, out_bias = layer(x.reshape(1, M, K))
    finally:
        mp.undo()

    assert jit.calls == [], jit.names()  # nothing reached SGLang's own kernels
    g = K if G == -1 else G
    scales_ck = torch.from_numpy(ckpt["scales"]).float().to(dtype)
    if kind == "awq":
        rp = lib.get("repack_awq")
        np.testing.assert_array_equal(rp["qweight"], ckpt["qweight"])
        marlin_w = formats.marlin_repack_awq(ckpt["qweight"])
        perm = None
    else:
        rp = lib.get("repack_gptq")
        np.testing.assert_array_equal(rp["qweight"], ckpt["qweight"])
        perm = rp["perm"]
        if act:  # SGLang's argsort of g_idx: any order that sorts the rows by group
            assert sorted(perm.tolist()) == list(range(K))
            assert (np.diff(ckpt["g_idx"][perm]) >= 0).all()
        else:
            assert perm is None
        marlin_w = formats.marlin_repack_gptq(ckpt["qweight"], perm)
    assert (rp["K"], rp["N"]) == (K, N)

    gemm = lib.get("marlin_gemm")
    assert (gemm["M"], gemm["N"], gemm["K"], gemm["dtype"]) == (M, N, K, DT[dtype])
    assert gemm["group_size"] == (-1 if G == -1 else G)
    np.testing.assert_array_equal(gemm["weight"], marlin_w)
    np.testing.assert_array_equal(
        gemm["scales"], _bits(torch.from_numpy(formats.marlin_permute_scales(_bits(scales_ck), K, N, G)))
    )
    if kind == "awq":
        np.testing.assert_array_equal(gemm["zeros"], formats.awq_to_marlin_zero_points(ckpt["qzeros"], K // g, N))
    else:
        assert gemm["zeros"] is None
    assert gemm["bias"] == 0  # SGLang adds the bias after the GEMM, in natural column order
    assert gemm["workspace"] == lib.workspace.data_ptr() and gemm["workspace_bytes"] == lib.workspace.numel()
    if act:
        pc = lib.get("permute_cols")
        np.testing.assert_array_equal(pc["A"], _bits(x))
        np.testing.assert_array_equal(pc["perm"], perm)
        np.testing.assert_array_equal(gemm["A"], _bits(x)[:, perm])
        assert lib.names() == ["repack_gptq", "permute_cols", "marlin_gemm"]
    else:
        np.testing.assert_array_equal(gemm["A"], _bits(x))
        assert lib.names() == [rp_name for rp_name in ("repack_awq", "repack_gptq") if rp_name in lib.names()] + [
            "marlin_gemm"
        ]

    assert out.shape == (1, M, N) and out.dtype == dtype and out_bias is None
    expect = ref.clone()
    if bias is not None:
        expect.add_(bias)
    np.testing.assert_array_equal(_bits(out.reshape(M, N)), _bits(expect))


# ------------------------------------------------------------------ what stays on SGLang's kernels
def _scheme_layer(sgl, K_full, K, N, G, dtype, ckpt, desc_act, bits=4):
    """A GPTQ-Marlin layer driven through the scheme SGLang attaches to a linear layer, for a shard of K_full."""
    scheme = _config(sgl, "gptq", G, desc_act, bits).get_linear_scheme(None)  # GPTQMarlinLinearScheme
    layer = torch.nn.Module()
    scheme.create_weights(
        layer=layer,
        input_size_per_partition=K,
        output_partition_sizes=[N],
        input_size=K_full,
        output_size=N,
        params_dtype=dtype,
        weight_loader=None,
    )
    for name, value in ckpt.items():
        t = torch.from_numpy(np.ascontiguousarray(value))
        getattr(layer, name).data.copy_(t.to(torch.float32).to(dtype) if name == "scales" else t)
    scheme.process_weights_after_loading(layer)
    return scheme, layer


def _fresh_state(mp):
    mp.setattr(adapter, "_state", {"act_order_whole": True, "act_order_groups": set(), "logged": set()})


def test_row_parallel_act_order_gemm_stays_on_sglang(sgl, plugin):
    """is_k_full=False: SGLang's kernel runs the GEMM, on the weight w4a16 repacked (the same Marlin layout)."""
    K, N, M, G = 256, 128, 3, 64
    rng = np.random.default_rng(7)
    full, _ = _gptq_checkpoint(rng, 2 * K, N, G, act_order=True)
    # rank 0 of 2: the first K rows; act-order scales and zero points are kept whole on every rank
    ckpt = dict(full, qweight=full["qweight"][: K // 8], g_idx=full["g_idx"][:K])
    x = torch.from_numpy(rng.standard_normal((M, K)).astype(np.float32)).to(torch.float16)
    mp = pytest.MonkeyPatch()
    try:
        _fake_gpu(mp)
        _fresh_state(mp)
        lib = Lib(mp, None)
        jit = JitRecorder(mp, sgl)
        scheme, layer = _scheme_layer(sgl, 2 * K, K, N, G, torch.float16, ckpt, desc_act=True)
        assert scheme.kernel.is_k_full is False
        scheme.apply_weights(layer, x, None)
    finally:
        mp.undo()
    assert lib.names() == ["repack_gptq"] and jit.names() == ["gptq_marlin_gemm"]
    perm = lib.get("repack_gptq")["perm"]
    args = jit.calls[0][1]  # SGLang's JIT call: a, b_q_weight, b_scales, global_scale, b_zeros, g_idx, perm, c, ...
    np.testing.assert_array_equal(args[1].numpy(), formats.marlin_repack_gptq(ckpt["qweight"], perm))
    np.testing.assert_array_equal(args[6].numpy(), perm)
    assert args[12] is False  # is_k_full


def test_uneven_act_order_groups_stay_on_sglang(sgl, plugin):
    K, N, M, G = 256, 128, 2, 64
    rng = np.random.default_rng(8)
    ckpt, _ = _gptq_checkpoint(rng, K, N, G, act_order=True)
    g_idx = ckpt["g_idx"].copy()
    g_idx[np.flatnonzero(g_idx == 1)[0]] = 0  # group 0 gets G + 1 rows, group 1 G - 1
    ckpt["g_idx"] = g_idx
    x = torch.from_numpy(rng.standard_normal((M, K)).astype(np.float32)).to(torch.bfloat16)
    mp = pytest.MonkeyPatch()
    try:
        _fake_gpu(mp)
        _fresh_state(mp)
        lib = Lib(mp, None)
        jit = JitRecorder(mp, sgl)
        scheme, layer = _scheme_layer(sgl, K, K, N, G, torch.bfloat16, ckpt, desc_act=True)
        assert scheme.kernel.is_k_full is True
        scheme.apply_weights(layer, x, None)
        assert adapter._state["act_order_whole"] is False
    finally:
        mp.undo()
    assert lib.names() == ["repack_gptq"] and jit.names() == ["gptq_marlin_gemm"]


def test_8bit_gptq_stays_on_sglang(sgl, plugin):
    K, N, M, G = 256, 128, 4, 128
    rng = np.random.default_rng(9)
    q = rng.integers(0, 256, size=(K, N)).astype(np.uint32)
    qweight = np.zeros((K // 4, N), np.uint32)
    for i in range(4):
        qweight |= q[i::4] << np.uint32(8 * i)
    ckpt = dict(
        qweight=qweight.view(np.int32),
        scales=(rng.random((K // G, N)) * 0.01).astype(np.float16),
        g_idx=(np.arange(K) // G).astype(np.int32),
    )
    x = torch.from_numpy(rng.standard_normal((M, K)).astype(np.float32)).to(torch.float16)
    mp = pytest.MonkeyPatch()
    try:
        _fake_gpu(mp)
        lib = Lib(mp, None)
        jit = JitRecorder(mp, sgl)
        scheme, layer = _scheme_layer(sgl, K, K, N, G, torch.float16, ckpt, desc_act=False, bits=8)
        scheme.apply_weights(layer, x, None)
    finally:
        mp.undo()
    assert lib.names() == [] and jit.names() == ["gptq_marlin_repack", "gptq_marlin_gemm"]
    np.testing.assert_array_equal(jit.calls[0][1][0].numpy(), ckpt["qweight"])  # the checkpoint, untouched


# ------------------------------------------------------------------ when the adapter leaves SGLang alone
def _register(sgl, mp, live=None, env=None):
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    adapter.log.addHandler(handler)
    adapter.log.setLevel(logging.INFO)
    before = {k: list(v) for k, v in sgl.hooks.HookRegistry._hooks.items()}
    try:
        if live is not None:
            mp.setattr(adapter, "live_schema", lambda: live)
        if env is not None:
            mp.setenv("W4A16_SGLANG", env)
        done = adapter.register()
    finally:
        adapter.log.removeHandler(handler)
    after = {k: list(v) for k, v in sgl.hooks.HookRegistry._hooks.items()}
    added = {k: v[len(before.get(k, [])) :] for k, v in after.items() if len(v) > len(before.get(k, []))}
    # nothing registered is left behind for SGLang to apply
    for target, hooks in added.items():
        sgl.hooks.HookRegistry._hooks[target] = sgl.hooks.HookRegistry._hooks[target][: len(before.get(target, []))]
    return done, [r.getMessage() for r in records], added


def _live():
    return json.loads((SCHEMAS / f"sglang-{sglang.__version__}.json").read_text())


@pytest.mark.parametrize(
    "change,expect",
    [
        (lambda s: s.update(sglang="0.5.99"), "SGLang 0.5.99 is not a release w4a16 was checked against"),
        (lambda s: s.update(sglang_kernel="0.4.11"), "sglang-kernel 0.4.11 is not the release recorded"),
        (
            lambda s: s["params"].update(gptq_marlin_gemm=s["params"]["gptq_marlin_gemm"].replace("b_scales, ", "")),
            "gptq_marlin_gemm(a, c, b_q_weight, global_scale",
        ),
        (
            lambda s: s["params"].update(awq_marlin_repack="b_q_weight, size_k, size_n, num_bits, is_a_8bit=False"),
            "awq_marlin_repack(b_q_weight, size_k, size_n, num_bits, is_a_8bit=False) differs",
        ),
        (lambda s: s["scalar_type_ids"].update(uint4=1), "scalar type uint4 id 1"),
        (lambda s: s["sgl_kernel_marlin_ops"].update({"sgl_kernel::gptq_marlin_gemm": "..."}), "Marlin ops"),
    ],
    ids=["sglang", "sglang-kernel", "gemm-params", "repack-params", "scalar-type", "sgl-kernel-op"],
)
def test_unknown_release_left_untouched(sgl, change, expect):
    live = _live()
    change(live)
    mp = pytest.MonkeyPatch()
    try:
        done, log, added = _register(sgl, mp, live=live)
    finally:
        mp.undo()
    assert done is False and added == {}
    assert len(log) == 1 and "SGLang left untouched" in log[0] and expect in log[0], log


def test_turned_off(sgl):
    mp = pytest.MonkeyPatch()
    try:
        done, log, added = _register(sgl, mp, env="0")
    finally:
        mp.undo()
    assert done is False and added == {} and log == ["w4a16: W4A16_SGLANG=0, keeping SGLang's kernels"]


def test_recorded_release_registers(sgl):
    mp = pytest.MonkeyPatch()
    try:
        done, log, added = _register(sgl, mp)
    finally:
        mp.undo()
    assert done is True and len(log) == 1 and "ops now served by w4a16" in log[0], log
    assert "moe_wna16_marlin_gemm" in log[0]
    targets = list(adapter.TARGETS.items()) + [adapter.SORT_G_IDX] + list(adapter.MOE_TARGETS.items())
    assert sorted(added) == sorted(f"{m}.{n}" for n, m in targets)


# ------------------------------------------------------------------ torch.compile
def test_fullgraph_compile(sgl, plugin):
    """SGLang's AWQ-Marlin and act-order GPTQ-Marlin forward through the hooks traces as one graph."""
    K, N, M, G = 256, 128, 4, 128
    rng = np.random.default_rng(10)
    mp = pytest.MonkeyPatch()
    try:
        for kind in ("awq", "gptq_act"):
            dtype = torch.float16
            if kind == "awq":
                ckpt, wdq = _awq_checkpoint(rng, K, N, G, dtype)
            else:
                ckpt, wdq = _gptq_checkpoint(rng, K, N, G, act_order=True)
            x = torch.from_numpy(rng.standard_normal((M, K)).astype(np.float32)).to(dtype)
            bias = torch.from_numpy(rng.standard_normal(N).astype(np.float32)).to(dtype)
            ref = _ref_output(x, wdq, dtype)
            lib = Lib(mp, lambda m, n: _bits(ref))
            jit = JitRecorder(mp, sgl)
            gpu = pytest.MonkeyPatch()  # only while loading: torch.compile must see this machine as it is
            try:
                _fake_gpu(gpu)
                layer = _layer(
                    sgl, "awq" if kind == "awq" else "gptq", K, N, G, dtype, bias, ckpt, desc_act=kind != "awq"
                )
            finally:
                gpu.undo()
            torch._dynamo.reset()
            f = torch.compile(lambda t: layer(t)[0], fullgraph=True, backend="eager")
            out = f(x)
            assert jit.calls == [] and lib.names()[-1] == "marlin_gemm", lib.names()
            np.testing.assert_array_equal(_bits(out), _bits(ref + bias))
    finally:
        mp.undo()
        torch._dynamo.reset()


def test_library_missing_left_untouched(sgl):
    def missing(*args):
        raise w4a16.LibraryNotFound("w4a16: could not load libw4a16.so")

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(adapter, "make_hooks", missing)
        done, log, added = _register(sgl, mp)
    finally:
        mp.undo()
    assert done is False and added == {}
    assert log == ["w4a16: SGLang left untouched: LibraryNotFound: w4a16: could not load libw4a16.so"]
