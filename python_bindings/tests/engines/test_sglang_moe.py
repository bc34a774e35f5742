"""w4a16's SGLang adapter on SGLang's real AWQ / GPTQ Marlin MoE path, without a GPU.

The plugin is loaded through SGLang's load_plugins() (test_sglang.py's fixtures). SGLang's own MoE schemes
(AWQMoEScheme, GPTQMarlinMoEScheme) create the expert parameters, the checkpoint tensors are copied in, their
process_weights_after_loading runs (SGLang's per-expert repacks reach w4a16's repack through the hooks, its scale
and zero-point conversions are its own), and their apply runs SGLang's Marlin runner function and fused_marlin_moe,
whose two moe_wna16_marlin_gemm calls must reach w4a16's grouped GEMM (w4a16.moe._grouped, replaced by a recorder
that writes rows the way the library does: only rows of blocks with an expert of this layer). What reaches it is
compared bit for bit with w4a16.formats per expert. Expert parallelism: SGLang's compressed-tensors W4A16 Marlin MoE
(the int4 MoE that passes an expert map, so that fused_marlin_moe calls the GEMM with is_ep=True) runs one rank's
experts with its dispatcher's local_expert_mapping; is_ep calls must reach w4a16 as the others do.

Stood in for, because they are CUDA-only: SGLang's routing kernel (moe_align_block_size, by a CPU twin of its output:
the -1 bucket first, each run padded with the pair count, [padded count, inactive blocks] where 0.5.23 asks for the
count), its SiLU-and-mul and top-k sum kernels, and its MoeRunner object (it reads the server arguments; the test calls
the Marlin runner function it would call). Pass-through cases run SGLang's own moe_wna16_marlin_gemm down to its JIT
module, replaced by a recorder."""

import importlib
import logging
import os
import types

import numpy as np
import pytest

if os.environ.get("W4A16_ENGINE_NAME", "").startswith("sglang"):
    import sglang  # noqa: F401  (an SGLang venv: failing to import it is a failure, not a skip)
else:
    pytest.importorskip("sglang", reason="not an SGLang venv (tests/engines/sglang.spec)")
torch = pytest.importorskip("torch")

import w4a16  # noqa: E402
import w4a16.moe  # noqa: E402
from test_sglang import Lib, _fake_gpu, _fresh_state, _live, _register  # noqa: E402

# test_sglang.py's fixtures, under the names its tests use (pytest registers an imported fixture under its alias)
from test_sglang import plugin as _plugin_fixture  # noqa: E402,F401
from test_sglang import sgl as _sgl_fixture  # noqa: E402,F401
from w4a16 import formats  # noqa: E402
from w4a16.engines import _common  # noqa: E402
from w4a16.engines import sglang as adapter  # noqa: E402

OP = "moe_wna16_marlin_gemm"


@pytest.fixture(scope="module")
def sgl(request):
    return request.getfixturevalue("_sgl_fixture")


@pytest.fixture(scope="module")
def plugin(request):
    return request.getfixturevalue("_plugin_fixture")


def _zero_inactive_output():
    """Whether the installed SGLang's MoE GEMM takes zero_inactive_output (0.5.23, whose fused_marlin_moe also routes
    with the inactive-prefix count and asks its down GEMM to zero inactive rows); 0.5.22 has neither (its record)."""
    return "zero_inactive_output" in _live()["moe_params"][OP]


def _call_zeroing(hooked, p, zero, has_zero, nothing_ran):
    """hooked(**p), with zero_inactive_output=True added to p when `zero`. Where the signature has no such parameter
    (SGLang 0.5.22) the hook binds the call by SGLang's own signature and refuses it as SGLang's function does, before
    anything runs: checked here. Returns (refused, the hook's output)."""
    if zero and not has_zero:
        with pytest.raises(TypeError, match="zero_inactive_output"):
            hooked(**p, zero_inactive_output=True)
        assert nothing_ran()
        return True, None
    if zero:
        p.update(zero_inactive_output=True)
    return False, hooked(**p)


def _scalar_types():
    from sglang.srt.layers.quantization.utils import get_scalar_types

    return get_scalar_types()[1]


# ---------------------------------------------------------------------------------------------- stand-ins
def align_twin(
    topk_ids, block_size, num_experts, ignore_invalid_expert=False, *, return_inactive_prefix_count=False, **kw
):
    """CPU twin of SGLang's moe_align_block_size output: its buffer sizes; the pairs routed to no expert (-1) in a
    first run of -1 blocks, then each expert's pairs, each run padded to a multiple of block_size with the pair
    count; the padded count (and the number of -1 blocks when asked). The tails past the runs hold row 0 and expert
    -1 (SGLang leaves them unwritten): only the runs may be read."""
    assert not ignore_invalid_expert
    numel = topk_ids.numel()
    if numel < num_experts + 1:
        cap = numel * block_size
    else:
        cap = numel + (num_experts + 1) * (block_size - 1)
    cap = (cap + 3) // 4 * 4
    sorted_ids = torch.zeros(cap, dtype=torch.int32)
    expert_ids = torch.full(((cap + block_size - 1) // block_size,), -1, dtype=torch.int32)
    flat, pos, inactive = topk_ids.flatten(), 0, 0
    for e in [-1] + list(range(num_experts)):
        idx = ((flat < 0) if e < 0 else (flat == e)).nonzero().flatten().to(torch.int32)
        if idx.numel():
            nb = (idx.numel() + block_size - 1) // block_size
            sorted_ids[pos : pos + nb * block_size] = numel
            sorted_ids[pos : pos + idx.numel()] = idx
            expert_ids[pos // block_size : pos // block_size + nb] = e
            inactive += nb if e < 0 else 0
            pos += nb * block_size
    npp = torch.tensor([pos, inactive] if return_inactive_prefix_count else [pos], dtype=torch.int32)
    return sorted_ids, expert_ids, npp


class Grouped:
    """Stands in for w4a16.moe._grouped (what the hook calls): records its arguments, then writes random rows where
    the library writes (entries < size_m * top_k of blocks b < padded / block_size whose expert is in [0, E)), into c
    or into a zeroed c it allocates, as the library's op does."""

    def __init__(self):
        self.calls = []

    def __call__(
        self, layout, a, c, w, bias, scales, zeros, sorted_ids, expert_ids, npp, tw, mul, block, top_k, m, n, k
    ):
        cl = lambda t: None if t is None else t.clone()  # noqa: E731
        rec = dict(
            layout=layout,
            a=cl(a),
            c=c,
            w=cl(w),
            bias=cl(bias),
            scales=cl(scales),
            zeros=cl(zeros),
            sorted_ids=cl(sorted_ids),
            expert_ids=cl(expert_ids),
            npp=cl(npp),
            topk_weights=tw,
            mul=mul,
            block=block,
            top_k=top_k,
            m=m,
            n=n,
            k=k,
        )
        self.calls.append(rec)
        out = c if c is not None else torch.zeros(m * top_k, n, dtype=a.dtype)
        E, written = w.shape[0], []
        for b in range(int(npp[0]) // block):
            e = int(expert_ids[b])
            if 0 <= e < E:
                rows = [int(i) for i in sorted_ids[b * block : (b + 1) * block] if int(i) < m * top_k]
                out[rows] = torch.randn(len(rows), n).to(a.dtype)
                written += rows
        rec["written"] = sorted(written)
        rec["out"] = out.clone()
        return out


class JitMoe:
    """SGLang's JIT MoE module, replaced: what SGLang's own moe_wna16_marlin_gemm passes to its CUDA kernel."""

    def __init__(self, mp, sgl):
        self.calls = []
        mod = types.SimpleNamespace(moe_wna16_marlin_gemm=lambda *args: self.calls.append(args))
        mp.setattr(sgl.moe_gemm_op, "_jit_moe_wna16_marlin_module", lambda *a, **k: mod)


def _cpu_kernels(mp, sgl):
    """CPU versions of the CUDA-only kernels fused_marlin_moe calls around the GEMMs, and the routing twin."""

    def silu_and_mul(x, out):
        n = x.shape[-1] // 2
        out.copy_(torch.nn.functional.silu(x[..., :n].float()) * x[..., n:].float())

    def moe_sum_reduce(x, out, factor):
        out.copy_(x.float().sum(dim=1) * factor)

    mp.setattr(sgl.fused_marlin_moe, "silu_and_mul", silu_and_mul)
    mp.setattr(sgl.fused_marlin_moe, "moe_sum_reduce", moe_sum_reduce)
    mp.setattr(importlib.import_module("sglang.srt.layers.moe.fused_moe_triton"), "moe_align_block_size", align_twin)
    # SGLang registers fused_marlin_moe as a torch op for CUDA only; its own Python body serves CPU tensors here
    lib = torch.library.Library("sglang", "IMPL")
    lib.impl("fused_marlin_moe", _fused_marlin_moe_body(sgl), "CPU")
    return lib


def _fused_marlin_moe_body(sgl):
    """fused_marlin_moe's own Python function. SGLang 0.5.23 exposes the registered op through an eager wrapper
    (functools.wraps: __wrapped__); 0.5.22 exposes torch.ops.sglang.fused_marlin_moe itself, whose dispatcher entry
    holds the function: found among the live functions of its module by name."""
    op = sgl.fused_marlin_moe.fused_marlin_moe
    if hasattr(op, "__wrapped__"):
        return op.__wrapped__
    import gc

    mod = sgl.fused_marlin_moe.__name__
    found = [
        o
        for o in gc.get_objects()
        # type(), not isinstance(): a dead weakref proxy among the objects raises on isinstance
        if type(o) is types.FunctionType and o.__module__ == mod and o.__qualname__ == "fused_marlin_moe"
    ]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture
def grouped(sgl, monkeypatch):
    """w4a16's grouped GEMM recorded; SGLang's JIT MoE module recorded too (never built), in `.jit`."""
    g = Grouped()
    g.jit = JitMoe(monkeypatch, sgl)
    monkeypatch.setattr(w4a16.moe, "_grouped", g)
    monkeypatch.setattr(_common, "device_supported", lambda device: True)
    _fresh_state(monkeypatch)
    return g


# ---------------------------------------------------------------------------------------------- checkpoints
def _experts(kind, E, K, N, G, dtype, seed):
    """Per-expert checkpoint tensors of a [K -> N] projection, stacked: AWQ (qweight [K, N/8], qzeros, scales) or
    symmetric GPTQ (qweight [K/8, N], scales, the stored zero 7 that Marlin ignores)."""
    rng = np.random.default_rng(seed)
    qws, qzs, ss = [], [], []
    for _ in range(E):
        if kind == "awq":
            qw, qz, s = formats.awq_quantize(rng.standard_normal((K, N)).astype(np.float32) * 0.05, G)
        else:
            qw = formats.gptq_pack(rng.integers(0, 16, size=(K, N), dtype=np.uint8))
            qz = formats.awq_pack(np.full((K // G, N), 7, np.uint8))
            s = rng.random((K // G, N)).astype(np.float32) * 0.01 + 0.002
        qws.append(qw)
        qzs.append(qz)
        ss.append(s)
    st = lambda xs: torch.from_numpy(np.stack(xs))  # noqa: E731
    return st(qws), st(qzs), st([s.astype(np.float32) for s in ss]).to(dtype)


def _want(kind, qw, qz, s, K, N, G):
    """w4a16.formats per expert, stacked: what must reach w4a16's grouped GEMM."""
    E = qw.shape[0]
    if kind == "awq":
        w = [formats.marlin_repack_awq(qw[e].numpy()) for e in range(E)]
        z = np.stack([formats.awq_to_marlin_zero_points(qz[e].numpy(), K // G, N) for e in range(E)])
    else:
        w, z = [formats.marlin_repack_gptq(qw[e].numpy()) for e in range(E)], None
    sc = np.stack([formats.marlin_permute_scales(s[e].float().numpy(), K, N, G) for e in range(E)])
    return np.stack(w), torch.from_numpy(sc).to(s.dtype), z


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


def _moe_layer(sgl, kind, E, H, inter, G, dtype, ckpt):
    """SGLang's MoE scheme of the AWQ-Marlin / GPTQ-Marlin config on a module, checkpoint loaded and processed."""
    from test_sglang import _config

    scheme = _config(sgl, kind, G).get_moe_scheme(None)
    layer = torch.nn.Module()
    layer.moe_tp_size = 1
    layer.intermediate_size_per_partition = inter
    scheme.create_weights(
        layer=layer,
        num_experts=E,
        hidden_size=H,
        intermediate_size_per_partition=inter,
        params_dtype=dtype,
        weight_loader=None,
    )
    for name, t in ckpt.items():
        p = getattr(layer, name)
        assert p.shape == t.shape, (name, p.shape, t.shape)
        p.data.copy_(t.to(p.dtype) if t.is_floating_point() else t)
    if kind == "gptq":  # plain group order (desc_act False): SGLang drops g_idx
        layer.w13_g_idx.data.copy_(torch.arange(H, dtype=torch.int32) // G)
        layer.w2_g_idx.data.copy_(torch.arange(inter, dtype=torch.int32) // G)
    scheme.process_weights_after_loading(layer)
    return scheme, layer


def _run(sgl, scheme, layer, x, topk_weights, topk_ids, E):
    """scheme.apply as SGLang's FusedMoE forward calls it, its runner answering with SGLang's Marlin runner function."""
    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    cfg = MoeRunnerConfig(num_experts=E, num_local_experts=E, top_k=topk_ids.shape[1], params_dtype=x.dtype)
    scheme.kernel.runner = types.SimpleNamespace(
        run=lambda d, q: sgl.marlin_runner.fused_experts_none_to_marlin(d, q, cfg)
    )
    topk = StandardTopKOutput(topk_weights=topk_weights, topk_ids=topk_ids, router_logits=torch.zeros(len(x), E))
    out = scheme.apply_weights(
        layer, StandardDispatchOutput(hidden_states=x, hidden_states_scale=None, topk_output=topk)
    )
    return out.hidden_states


# ---------------------------------------------------------------------------------------------- tests
def test_moe_hooks_installed(sgl, plugin):
    served = [m for m in plugin if "ops now served by w4a16" in m]
    assert len(served) == 1 and OP in served[0], plugin
    assert "expert-parallel" not in served[0], plugin  # is_ep calls are served
    assert not any("MoE layers stay on SGLang's kernels" in m for m in plugin), plugin
    for name, module in adapter.MOE_TARGETS.items():
        assert any(f"to {module}.{name} (from: plugin=w4a16" in m for m in plugin), (name, plugin)
    awq_kernels, gptq_kernels = sgl.awq_kernels, sgl.gptq_kernels
    for mod, name in [
        (sgl.moe_gemm_op, OP),
        (sgl.fused_marlin_moe, OP),  # `from ... import` copy fused_marlin_moe calls
        (sgl.marlin_utils, "marlin_moe_permute_scales"),
        (awq_kernels, "marlin_moe_permute_scales"),
        (gptq_kernels, "marlin_moe_permute_scales"),
    ]:
        fn = getattr(mod, name)
        assert fn is not sgl.original_moe[name] and fn.__wrapped__ is sgl.original_moe[name], (mod.__name__, name)


@pytest.mark.parametrize(
    "kind,dtype,G,inter,padded",
    [
        ("awq", torch.float16, 64, 128, False),
        ("awq", torch.bfloat16, 128, 256, True),
        ("gptq", torch.float16, 64, 128, True),
        ("gptq", torch.float16, 128, 256, False),
        # expert width = G (e.g. 512 at tensor parallelism 4, G = 128): SGLang permutes the gate/up scales for
        # size_k = the width, the one-group order; the hook must give them the grouped order the kernel reads
        ("awq", torch.float16, 128, 128, False),
        ("gptq", torch.float16, 64, 64, True),
    ],
    ids=[
        "awq-fp16-g64",
        "awq-bf16-g128-padded",
        "gptq-fp16-g64-padded",
        "gptq-fp16-g128",
        "awq-fp16-g128-width128",
        "gptq-fp16-g64-width64-padded",
    ],
)
def test_moe_layer_on_w4a16(sgl, plugin, grouped, kind, dtype, G, inter, padded):
    E, H, T, top_k = 4, 256, 7, 2
    seed = G + inter + (kind == "gptq") + 2 * padded
    qw13, qz13, s13 = _experts(kind, E, H, 2 * inter, G, dtype, seed)
    qw2, qz2, s2 = _experts(kind, E, inter, H, G, dtype, seed + 1)
    ckpt = dict(w13_qweight=qw13, w13_scales=s13, w2_qweight=qw2, w2_scales=s2)
    ckpt.update(w13_qzeros=qz13, w2_qzeros=qz2)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    topk_weights, topk_ids = torch.topk(torch.softmax(torch.randn(T, E, generator=g), -1), top_k, dim=-1)
    topk_ids = topk_ids.to(torch.int32)
    if padded:  # CUDA-graph padding: SGLang routes the padded tokens' pairs to expert -1 and zeroes their weights
        topk_ids[-2:] = -1
        topk_weights[-2:] = 0
    mp = pytest.MonkeyPatch()
    try:
        _fake_gpu(mp)
        lib = Lib(mp, None)
        jit = JitMoe(mp, sgl)
        lib_cpu = _cpu_kernels(mp, sgl)
        scheme, layer = _moe_layer(sgl, kind, E, H, inter, G, dtype, ckpt)
        y = _run(sgl, scheme, layer, x, topk_weights, topk_ids, E)
    finally:
        mp.undo()
        lib_cpu._destroy()

    assert jit.calls == [] and len(grouped.calls) == 2, (jit.calls, len(grouped.calls))
    assert adapter._state.get("moe_served") == 2
    assert set(lib.names()) == {"repack_awq" if kind == "awq" else "repack_gptq"}  # per expert, through the hooks
    c1, c2 = grouped.calls
    for c, (qw, qz, s, K, N) in ((c1, (qw13, qz13, s13, H, 2 * inter)), (c2, (qw2, qz2, s2, inter, H))):
        ww, ws, wz = _want(kind, qw, qz, s, K, N, G)
        assert c["layout"] == "marlin" and c["bias"] is None  # SGLang's AWQ / GPTQ MoE layers have no bias
        np.testing.assert_array_equal(c["w"].numpy(), ww)
        assert _same(c["scales"], ws)
        if wz is None:
            assert c["zeros"] is None
        else:
            np.testing.assert_array_equal(c["zeros"].numpy(), wz)
    sorted_ids, expert_ids, npp = align_twin(
        topk_ids, c1["block"], E, return_inactive_prefix_count=_zero_inactive_output()
    )
    for c in (c1, c2):
        assert torch.equal(c["sorted_ids"], sorted_ids) and torch.equal(c["expert_ids"], expert_ids)
        assert torch.equal(c["npp"], npp) and c["topk_weights"] is topk_weights and c["block"] == c2["block"]
    assert c1["block"] in (8, 16, 32, 48, 64)
    assert _same(c1["a"], x) and (c1["m"], c1["top_k"], c1["n"], c1["k"], c1["mul"]) == (T, top_k, 2 * inter, H, False)
    act = torch.empty(T * top_k, inter, dtype=dtype)
    n = inter
    active = torch.tensor(c1["written"], dtype=torch.int64)
    act[active] = (torch.nn.functional.silu(c1["out"][active, :n].float()) * c1["out"][active, n:].float()).to(dtype)
    assert _same(c2["a"][active], act[active])
    assert (c2["m"], c2["top_k"], c2["n"], c2["k"], c2["mul"]) == (T * top_k, 1, H, inter, True)
    assert c1["c"].shape == (T * top_k, 2 * inter) and c2["c"].shape == (T * top_k, H)
    live_pairs = [i for i in range(T * top_k) if int(topk_ids.flatten()[i]) >= 0]
    assert c1["written"] == live_pairs and c2["written"] == live_pairs
    rows = c2["out"].clone()
    rows[[i for i in range(T * top_k) if i not in live_pairs]] = 0  # what zero_inactive_output asks for
    want = rows.float().view(T, top_k, H).sum(dim=1).to(dtype)
    if _zero_inactive_output():
        assert _same(y, want)
    else:
        # SGLang 0.5.22 asks for no zeroing: the padded tokens' rows of its shared cache keep what the gate/up GEMM
        # left there (its own kernel computes them with expert id -1), so only the real tokens' outputs are defined
        real = [t for t in range(T) if all(t * top_k + j in live_pairs for j in range(top_k))]
        assert len(real) == T - 2 * padded
        assert _same(y[real], want[real])


def _call_args(dtype=torch.float16, type_name="uint4b8", block=16, K=128, N=128, E=4, M=3, top_k=2, G=64, **over):
    st = _scalar_types()
    g = torch.Generator().manual_seed(1)
    topk_ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(M)]).to(torch.int32)
    topk_ids[-1] = -1
    sorted_ids, expert_ids, npp = align_twin(topk_ids, block, E, return_inactive_prefix_count=_zero_inactive_output())
    p = dict(
        a=torch.randn(M, K, generator=g).to(dtype),
        c_or_none=None,
        b_q_weight=torch.randint(-(2**31), 2**31 - 1, (E, K // 16, 2 * N), dtype=torch.int32, generator=g),
        b_bias_or_none=None,
        b_scales=(torch.rand(E, K // G, N, generator=g) * 0.01).to(dtype),
        global_scale_or_none=None,
        b_zeros_or_none=(
            torch.randint(-(2**31), 2**31 - 1, (E, K // G, N // 8), dtype=torch.int32, generator=g)
            if type_name == "uint4"
            else None
        ),
        g_idx_or_none=None,
        perm_or_none=None,
        workspace=torch.zeros(64, dtype=torch.int32),
        sorted_token_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_post_padded=npp,
        topk_weights=torch.rand(M, top_k, generator=g),
        moe_block_size=block,
        top_k=top_k,
        mul_topk_weights=False,
        is_ep=False,
        b_q_type=getattr(st, type_name),
        size_m=M,
        size_n=N,
        size_k=K,
    )
    p.update(over)
    return p


def _hooked():
    return importlib.import_module(adapter.MOE_TARGETS[OP]).moe_wna16_marlin_gemm


def test_direct_call_served_with_bias_in_natural_order(sgl, plugin, grouped):
    from sglang.srt.layers.quantization.marlin_utils import marlin_permute_bias

    p = _call_args(type_name="uint4")
    bias = torch.randn(4, 128).to(torch.float16)
    p["b_bias_or_none"] = torch.stack([marlin_permute_bias(b) for b in bias])  # what SGLang's kernel takes
    out = _hooked()(**p)
    (c,) = grouped.calls
    assert grouped.jit.calls == []
    assert _same(c["bias"], bias), "the bias must reach w4a16 in natural column order"
    assert torch.equal(c["zeros"], p["b_zeros_or_none"]) and c["c"] is None
    assert out.shape == (3 * 2, 128) and _same(out, c["out"])


@pytest.mark.parametrize("zero", [False, True], ids=["keep", "zero_inactive_output"])
def test_inactive_rows(sgl, plugin, grouped, zero):
    """A caller's c: rows of -1 blocks stay as they are, or are zeroed when SGLang asks (zero_inactive_output);
    rows in no block stay as they are either way; the entries past the padded count are not read."""
    p = _call_args()
    M, top_k, N = 3, 2, 128
    c = torch.full((M * top_k, N), float("nan"), dtype=torch.float16)
    # pair 1 in no block at all (routed by a producer that dropped it): its row must stay NaN
    keep = p["sorted_token_ids"].clone()
    keep[keep == 1] = M * top_k
    p.update(c_or_none=c, sorted_token_ids=keep)
    refused, out = _call_zeroing(
        _hooked(), p, zero, _zero_inactive_output(), lambda: grouped.calls == [] and grouped.jit.calls == []
    )
    if refused:
        return
    assert out is c
    (call,) = grouped.calls
    assert grouped.jit.calls == []
    inactive = [4, 5]  # the last token's pairs, routed to -1
    assert call["written"] == [0, 2, 3]
    assert torch.isnan(c[1]).all()
    if zero:
        assert (c[inactive] == 0).all()
    else:
        assert torch.isnan(c[inactive]).all()
    assert not torch.isnan(c[call["written"]]).any() and (c[0] != 0).any()


@pytest.mark.parametrize("zero", [False, True], ids=["keep", "zero_inactive_output"])
@pytest.mark.parametrize("release", sorted(adapter.KNOWN))
def test_hook_under_each_recorded_signature(sgl, grouped, release, zero):
    """The MoE hook bound to each recorded release's moe_wna16_marlin_gemm (a stand-in with that parameter list, as
    tests/test_sglang_moe_standin_gpu.py makes them), whichever SGLang is installed: served with the routing as it
    comes; zero_inactive_output read where the signature has it (0.5.23) and refused as SGLang's function refuses it
    where it has not (0.5.22, whose fused_marlin_moe zeroes its caches itself)."""
    params = adapter.KNOWN[release]["moe_params"][OP]
    has_zero = "zero_inactive_output" in params
    seen = []
    scope = {"_seen": seen.append}
    exec(f"def {OP}({params}):\n    _seen(locals())\n", scope)
    standin = scope[OP]
    st = _scalar_types()
    hook = adapter.make_moe_hooks(st.uint4.id, st.uint4b8.id, standin, device_ok=lambda device: True)[OP]
    M, top_k, N = 3, 2, 128
    c = torch.full((M * top_k, N), float("nan"), dtype=torch.float16)
    p = _call_args(M=M, top_k=top_k, N=N)
    p.update(c_or_none=c)
    refused, out = _call_zeroing(
        lambda **kw: hook(standin, **kw), p, zero, has_zero, lambda: grouped.calls == [] and seen == []
    )
    if refused:
        return
    assert out is c and seen == [], "served by w4a16, not the stand-in of SGLang's function"
    (call,) = grouped.calls
    assert call["written"] == [0, 1, 2, 3] and not torch.isnan(c[:4]).any()
    if zero:
        assert (c[4:] == 0).all(), "the last token's pairs (-1 blocks) zeroed"
    else:
        assert torch.isnan(c[4:]).all(), "the last token's pairs (-1 blocks) left as they were"
    # a call SGLang's function would refuse reaches it (pass-through keeps the caller's arguments as they came)
    p.update(is_k_full=False)
    hook(standin, **p)
    assert len(seen) == 1 and seen[0]["is_k_full"] is False and seen[0]["c_or_none"] is c


def test_zero_inactive_rows_reads_only_the_runs():
    """Entries past the padded count (unwritten by SGLang's routing) are ignored, even where they name a row."""
    c = torch.ones(6, 64, dtype=torch.float16)
    sorted_ids = torch.tensor([4, 5, 6, 6, 0, 1, 2, 3, 0, 0, 1, 1], dtype=torch.int32)
    expert_ids = torch.tensor([-1, 0, -1], dtype=torch.int32)
    adapter.zero_inactive_rows(c, sorted_ids, expert_ids, torch.tensor([8, 1], dtype=torch.int32), 4, 4)
    assert (c[4:] == 0).all() and (c[:4] == 1).all()
    adapter.zero_inactive_rows(c, sorted_ids, torch.tensor([7, 0, 0], dtype=torch.int32), torch.tensor([8]), 4, 4)
    assert (c[:4] == 1).all()  # expert 7 is outside [0, E): its block's rows zeroed only because it is inactive
    c[:] = 1
    adapter.zero_inactive_rows(c, sorted_ids, torch.tensor([7, 0, 0], dtype=torch.int32), torch.tensor([8]), 4, 4)
    assert (c[4:] == 0).all() and (c[:4] == 1).all()


def _fp4():
    return _scalar_types().float4_e2m1f


PASS_THROUGH = {
    "global-scale": (dict(global_scale_or_none=torch.ones(1, dtype=torch.float16)), "global scale (fp4)"),
    "zp-float": (dict(type_name="uint4", is_zp_float=True), "float zero points"),
    "act-order": (
        dict(g_idx_or_none=torch.zeros(4, 128, dtype=torch.int32), perm_or_none=torch.zeros(4, 128, dtype=torch.int32)),
        "act-order experts (g_idx / perm)",
    ),
    "k-not-full": (dict(is_k_full=False), "act-order on a row-parallel shard (is_k_full=False)"),
    # is_ep=True is served (test_expert_parallel_*); it does not lift the other reasons
    "expert-parallel-act-order": (
        dict(
            is_ep=True,
            g_idx_or_none=torch.zeros(4, 128, dtype=torch.int32),
            perm_or_none=torch.zeros(4, 128, dtype=torch.int32),
        ),
        "act-order experts (g_idx / perm)",
    ),
    "expert-parallel-fp4": (dict(is_ep=True, type_name="float4_e2m1f"), "weight type float4_e2m1f"),
    "scales-dtype": (dict(b_scales=torch.ones(4, 2, 128, dtype=torch.bfloat16)), "with scales torch.bfloat16"),
    "fp32-activations": (dict(dtype=torch.float32), "activations torch.float32"),
    "8-bit": (dict(type_name="uint8b128"), "weight type uint8b128"),
    "fp4": (dict(type_name="float4_e2m1f"), "weight type float4_e2m1f"),
    "uint4-no-zeros": (dict(b_zeros_or_none=None, type_name="uint4"), "uint4 without zero points"),
    "uint4b8-zeros": (dict(b_zeros_or_none=torch.zeros(4, 2, 16, dtype=torch.int32)), "uint4b8 with zero points"),
    "block-128": (dict(block=128), "moe_block_size 128"),
    "block-12": (dict(block=12), "moe_block_size 12"),
    "n-96": (dict(N=96), "shape N=96 K=128"),
    "k-96": (dict(K=96, G=32), "shape N=128 K=96"),
    "topk-weights-fp16": (
        dict(mul_topk_weights=True, topk_weights=torch.rand(3, 2).half()),
        "topk_weights torch.float16",
    ),
}


@pytest.mark.parametrize("case", list(PASS_THROUGH) + ["device", "w4a16-refusal"])
def test_pass_through_to_sglang(sgl, plugin, grouped, monkeypatch, case):
    over, expect = PASS_THROUGH.get(case, ({}, None))
    over = dict(over)
    args = {k: over.pop(k) for k in ("dtype", "type_name", "block", "K", "N", "G") if k in over}
    p = _call_args(**args)
    p.update(over)
    if case == "device":
        monkeypatch.setattr(_common, "device_supported", lambda device: False)
        expect = "device cpu not served by w4a16"
    if case == "w4a16-refusal":

        def refuse(*a, **k):
            raise w4a16.W4A16Error(3, "w4a16: bad shape")

        monkeypatch.setattr(w4a16.moe, "_grouped", refuse)
        expect = "w4a16 refused it (W4A16_ERR_INVALID_SHAPE (3)"
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    adapter.log.addHandler(handler)
    adapter.log.setLevel(logging.INFO)
    mp = pytest.MonkeyPatch()
    try:
        _fake_gpu(mp)
        jit = JitMoe(mp, sgl)
        _hooked()(**p)
        _hooked()(**p)  # the reason is logged once
    finally:
        mp.undo()
        adapter.log.removeHandler(handler)
    assert grouped.calls == [] and len(jit.calls) == 2
    msgs = [r.getMessage() for r in records]
    assert len(msgs) == 1 and msgs[0].startswith(f"w4a16: {OP} ") and expect in msgs[0], msgs
    assert msgs[0].endswith("SGLang's own kernel")


def test_device_fault_is_raised_not_hidden(sgl, plugin, grouped, monkeypatch):
    def fail(*a, **k):
        raise w4a16.W4A16Error(24, "w4a16: CUDA error")  # W4A16_ERR_CUDA: not a refusal

    monkeypatch.setattr(w4a16.moe, "_grouped", fail)
    with pytest.raises(w4a16.W4A16Error):
        _hooked()(**_call_args())
    assert grouped.jit.calls == []


@pytest.mark.parametrize(
    "change,expect",
    [
        (
            lambda s: s["moe_params"].update({OP: s["moe_params"][OP].replace("is_ep, ", "")}),
            f"{OP}(a, c_or_none",
        ),
        (lambda s: s["moe_params"].update({OP: "missing (AttributeError)"}), f"{OP}(missing (AttributeError))"),
        (
            lambda s: s["moe_params"].update(marlin_moe_permute_scales="s, size_k, size_n, group_size, is_a_8bit"),
            "marlin_moe_permute_scales(s, size_k, size_n, group_size, is_a_8bit) differs",
        ),
    ],
    ids=["gemm-params", "gemm-missing", "scales-params"],
)
def test_changed_moe_signature_keeps_moe_on_sglang(sgl, change, expect):
    live = _live()
    change(live)
    mp = pytest.MonkeyPatch()
    try:
        done, log, added = _register(sgl, mp, live=live)
    finally:
        mp.undo()
    assert done is True, log  # the linear layers are still served
    assert len(log) == 2 and "its MoE layers stay on SGLang's kernels" in log[0] and expect in log[0], log
    assert "ops now served by w4a16" in log[1] and OP not in log[1].split(";")[0], log
    assert sorted(added) == sorted(f"{m}.{n}" for n, m in list(adapter.TARGETS.items()) + [adapter.SORT_G_IDX])


# ---------------------------------------------------------------------------------------------- expert parallelism
def _ep_routing(block, E, rows):
    """Routing of one EP rank as a producer with scattered inactive blocks would write it (SGLang's own routing puts
    them first; its kernel's is_ep path takes them anywhere): blocks of experts 0, -1, 2, -1, then past the padded
    count entries that name rows and an expert (must not be read)."""
    sorted_ids = torch.full((6 * block,), rows, dtype=torch.int32)
    sorted_ids[0:2] = torch.tensor([0, 3])  # expert 0
    sorted_ids[block : block + 2] = torch.tensor([1, 4])  # -1: another rank's expert
    sorted_ids[2 * block] = 2  # expert 2
    sorted_ids[3 * block] = 5  # -1
    sorted_ids[4 * block : 4 * block + 2] = torch.tensor([1, 5])  # past the padded count
    expert_ids = torch.tensor([0, -1, 2, -1, 1, -1], dtype=torch.int32)
    return sorted_ids, expert_ids, torch.tensor([4 * block], dtype=torch.int32)


@pytest.mark.parametrize("zero", [False, True], ids=["keep", "zero_inactive_output"])
def test_expert_parallel_call_served(sgl, plugin, grouped, zero):
    """is_ep=True (SGLang 0.5.23: other ranks' experts are -1 blocks, anywhere in the routing; its kernel skips them
    and writes no row for them, or zeroes those rows with zero_inactive_output) runs on w4a16's grouped GEMM with the
    routing as it comes; rows of -1 blocks stay as they are or are zeroed, as SGLang's kernel leaves them."""
    M, top_k, N, block = 3, 2, 128, 16
    sorted_ids, expert_ids, npp = _ep_routing(block, 4, M * top_k)
    c = torch.full((M * top_k, N), float("nan"), dtype=torch.float16)
    p = _call_args(block=block, M=M, top_k=top_k, N=N)
    p.update(
        c_or_none=c,
        sorted_token_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_post_padded=npp,
        is_ep=True,
    )
    refused, out = _call_zeroing(
        _hooked(), p, zero, _zero_inactive_output(), lambda: grouped.calls == [] and grouped.jit.calls == []
    )
    if refused:
        return
    assert out is c and grouped.jit.calls == [], "is_ep=True must not reach SGLang's kernel"
    (call,) = grouped.calls
    assert call["expert_ids"] is not None and torch.equal(call["expert_ids"], expert_ids)
    assert torch.equal(call["sorted_ids"], sorted_ids) and torch.equal(call["npp"], npp)
    assert call["written"] == [0, 2, 3]
    assert not torch.isnan(c[[0, 2, 3]]).any()
    if zero:
        assert (c[[1, 4, 5]] == 0).all(), "rows of -1 blocks zeroed (zero_inactive_output)"
    else:
        assert torch.isnan(c[[1, 4, 5]]).all(), "rows of -1 blocks left as they were"


def _ct_config(G):
    """SGLang's compressed-tensors config of a symmetric int4 group-quantized (W4A16) checkpoint."""
    from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig

    weights = dict(num_bits=4, type="int", symmetric=True, group_size=G, strategy="group", dynamic=False)
    group = dict(targets=["re:.*mlp.experts.*"], weights=dict(weights, actorder=None), input_activations=None)
    return CompressedTensorsConfig.from_config(
        dict(quant_method="compressed-tensors", format="pack-quantized", config_groups=dict(group_0=group))
    )


def _local_expert_mapping(E_global, ep_size, rank):
    """StandardDispatcher.dispatch's local_expert_mapping (token_dispatcher/standard.py, no shared experts): this
    rank's experts to 0..E_local-1, the others to -1."""
    E_local = E_global // ep_size
    mapping = torch.full((E_global,), -1, dtype=torch.int32)
    mapping[rank * E_local : (rank + 1) * E_local] = torch.arange(E_local, dtype=torch.int32)
    return mapping


@pytest.mark.parametrize(
    "dtype,ep",
    [(torch.float16, True), (torch.bfloat16, True), (torch.float16, False)],
    ids=["fp16-ep", "bf16-ep", "fp16"],
)
def test_expert_parallel_layer_on_w4a16(sgl, plugin, grouped, dtype, ep):
    """SGLang's compressed-tensors W4A16 Marlin MoE (CompressedTensorsWNA16MoE, the int4 MoE that passes an expert
    map) as one rank of expert parallelism runs it: rank 1 of 2 over 8 experts, its dispatcher's local_expert_mapping,
    the router's ids mapped by the dispatcher's own function, apply_weights calling fused_marlin_moe with the map, so
    both GEMMs get is_ep=True and routing over the 8 global experts (other ranks' pairs in -1 blocks). Both must
    reach w4a16 with this rank's checkpoint tensors; the layer's output must sum this rank's pairs only (the others'
    rows zeroed by zero_inactive_output). Without a map (ep=False) the same layer is served with is_ep=False."""
    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
    from sglang.srt.layers.moe.token_dispatcher import standard
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    # the dispatcher's own mapping function (0.5.23); 0.5.22 indexes the mapping inline (the same for ids >= 0)
    map_ids = getattr(standard, "_map_topk_ids_to_local_experts", lambda ids, mapping: mapping[ids])

    E_global, ep_size, rank, H, inter, G, T, top_k = 8, 2, 1, 256, 128, 64, 9, 2
    E = E_global // ep_size if ep else E_global
    seed = 11 + (dtype == torch.bfloat16) + 2 * ep
    qw13, _, s13 = _experts("gptq", E, H, 2 * inter, G, dtype, seed)
    qw2, _, s2 = _experts("gptq", E, inter, H, G, dtype, seed + 1)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    topk_weights, global_ids = torch.topk(torch.softmax(torch.randn(T, E_global, generator=g), -1), top_k, dim=-1)
    global_ids = global_ids.to(torch.int32)
    global_ids[2] = torch.tensor([4, 0])  # one pair on each side of the rank boundary, at least
    spy = []
    hooked = getattr(sgl.fused_marlin_moe, OP)

    def is_ep_spy(*args, **kwargs):  # what fused_marlin_moe passes to the (hooked) GEMM
        spy.append(kwargs.get("is_ep"))
        return hooked(*args, **kwargs)

    mp = pytest.MonkeyPatch()
    try:
        _fake_gpu(mp)
        lib = Lib(mp, None)
        jit = JitMoe(mp, sgl)
        lib_cpu = _cpu_kernels(mp, sgl)
        mp.setattr(sgl.fused_marlin_moe, OP, is_ep_spy)
        layer = torch.nn.Module()
        layer.moe_tp_size = 1
        scheme = _ct_config(G).get_moe_scheme(layer, "model.layers.0.mlp.experts")
        assert type(scheme).__name__ == "CompressedTensorsWNA16MoE"
        scheme.create_weights(
            layer=layer, num_experts=E, hidden_size=H, intermediate_size_per_partition=inter, params_dtype=dtype
        )
        ckpt = dict(w13_weight_packed=qw13, w13_weight_scale=s13, w2_weight_packed=qw2, w2_weight_scale=s2)
        for name, t in ckpt.items():
            getattr(layer, name).data.copy_(t)
        scheme.process_weights_after_loading(layer)
        mapping = _local_expert_mapping(E_global, ep_size, rank) if ep else None
        layer.dispatcher = types.SimpleNamespace(local_expert_mapping=mapping)
        scheme.moe_runner_config = MoeRunnerConfig(
            num_experts=E_global, num_local_experts=E, top_k=top_k, params_dtype=dtype
        )
        topk_ids = map_ids(global_ids, mapping) if ep else global_ids
        topk = StandardTopKOutput(topk_weights=topk_weights, topk_ids=topk_ids, router_logits=torch.zeros(T, E_global))
        y = scheme.apply_weights(
            layer, StandardDispatchOutput(hidden_states=x, hidden_states_scale=None, topk_output=topk)
        ).hidden_states
    finally:
        mp.undo()
        lib_cpu._destroy()

    assert spy == [ep, ep], spy
    assert jit.calls == [] and len(grouped.calls) == 2, (len(jit.calls), len(grouped.calls))
    assert set(lib.names()) == {"repack_gptq"}  # per expert, through the hooks
    c1, c2 = grouped.calls
    for c, (qw, s, K, N) in ((c1, (qw13, s13, H, 2 * inter)), (c2, (qw2, s2, inter, H))):
        ww, ws, _ = _want("gptq", qw, None, s, K, N, G)
        np.testing.assert_array_equal(c["w"].numpy(), ww)
        assert _same(c["scales"], ws) and c["zeros"] is None and c["bias"] is None
    # SGLang's routing of the local ids (-1: another rank's expert) over the global expert count; with a map it asks
    # for no inactive-prefix count (the sorted hints are off under is_ep; 0.5.22 never asks for one)
    prefix = not ep and _zero_inactive_output()
    want = align_twin(topk_ids, c1["block"], E_global if ep else E, return_inactive_prefix_count=prefix)
    for c in (c1, c2):
        for got, w in zip((c["sorted_ids"], c["expert_ids"], c["npp"]), want):
            assert torch.equal(got, w)
    blocks = c1["expert_ids"][: int(c1["npp"][0]) // c1["block"]]
    mine = [i for i in range(T * top_k) if int(topk_ids.flatten()[i]) >= 0]
    assert ((blocks >= -1) & (blocks < E)).all()
    if ep:
        assert (blocks == -1).any() and len(mine) < T * top_k, "some pairs on the other rank"
    assert c1["written"] == mine and c2["written"] == mine
    rows = c2["out"].clone()
    rows[[i for i in range(T * top_k) if i not in mine]] = 0  # zero_inactive_output (0.5.22: the cache's zero_())
    assert _same(y, rows.float().view(T, top_k, H).sum(dim=1).to(dtype))
