"""w4a16.moe's torch ops without a GPU (they need PyTorch, which the engine venvs have; no engine is used): the
argument checks that run before any device is touched, and each op's contract with torch (what it declares it
mutates, what it returns)."""

import re

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

from w4a16 import moe  # noqa: E402

E, K, N, G, M, TOP_K = 2, 128, 64, 32, 3, 2


class _Stop(Exception):
    pass


def _raises(text):
    return pytest.raises(ValueError, match=re.escape(text))


def test_permute_scales_checks_the_rows():
    # one scale row too many: the converter would have read and written past s and its output
    s = torch.zeros(E, K // G + 1, N, dtype=torch.float16)
    with _raises("s has shape (2, 5, 64), expected [E, size_k/group_size, size_n] = (2, 4, 64)"):
        moe.marlin_moe_permute_scales(s, K, N, G)
    with _raises("group_size=96 is not one of"):
        moe.marlin_moe_permute_scales(torch.zeros(E, 1, N, dtype=torch.float16), K, N, 96)


def test_zero_points_check_the_columns():
    z = torch.zeros(E, K // G, N // 8 + 1, dtype=torch.int32)
    with _raises("q_zp_packed has shape (2, 4, 9), expected [E, size_k, size_n/8] = (2, 4, 8)"):
        moe.moe_awq_to_marlin_zero_points(z, K // G, N, 4)


def _grouped_args():
    """The grouped GEMM's tensors with valid shapes (CPU; only the checks run)."""
    return dict(
        a=torch.randn(M, K).half(),
        w=torch.zeros(E, K // 16, 2 * N, dtype=torch.int32),
        scales=torch.rand(E, K // G, N).half(),
        zeros=torch.zeros(E, K // G, N // 8, dtype=torch.int32),
        sorted_ids=torch.zeros(64, dtype=torch.int32),
        expert_ids=torch.zeros(4, dtype=torch.int32),
        npp=torch.zeros(1, dtype=torch.int32),
        tw=torch.rand(M * TOP_K),
    )


def _grouped(t, c=None, scales=None):
    return moe._grouped(
        "marlin",
        t["a"],
        c,
        t["w"],
        None,
        t["scales"] if scales is None else scales,
        t["zeros"],
        t["sorted_ids"],
        t["expert_ids"],
        t["npp"],
        t["tw"],
        True,
        16,
        TOP_K,
        M,
        N,
        K,
    )


def test_grouped_gemm_checks_scale_rows():
    t = _grouped_args()
    with _raises("b_scales has 3 rows for K=128"):
        _grouped(t, scales=torch.rand(E, 3, N).half())


def test_every_op_checks_devices_and_alignment(monkeypatch):
    """Each op hands all its tensors to the one device / alignment check (CUDA, one device, aligned) before
    anything runs; recorded here, since without a GPU every tensor would fail it."""
    seen = []

    def devices(op, named, align=None):
        seen.append((op, {n for n, v in named.items() if v is not None}))
        raise _Stop

    monkeypatch.setattr(moe.ct, "devices", devices)
    t = _grouped_args()
    c = torch.zeros(M * TOP_K, N).half()
    with pytest.raises(_Stop):
        _grouped(t, c=c)
    expected = {"a", "b_q_weight", "b_scales", "b_zeros", "topk_weights", "c"}
    assert seen[-1][1] == expected | {"sorted_token_ids", "expert_ids", "num_tokens_past_padded"}
    i32 = torch.int32
    with pytest.raises(_Stop):
        moe.moe_align_block_size(torch.zeros(M, TOP_K, dtype=i32), E, 16, t["sorted_ids"], t["expert_ids"], t["npp"])
    assert seen[-1][1] == {"topk_ids", "sorted_token_ids", "experts_ids", "num_tokens_post_pad"}
    with pytest.raises(_Stop):
        moe.gptq_marlin_moe_repack(torch.zeros(E, K // 8, N, dtype=i32), torch.zeros(E, K, dtype=i32), K, N, 4)
    assert seen[-1][1] == {"b_q_weight", "perm"}
    with pytest.raises(_Stop):
        moe.awq_marlin_moe_repack(torch.zeros(E, K, N // 8, dtype=i32), None, K, N, 4)
    assert seen[-1][1] == {"b_q_weight"}
    with pytest.raises(_Stop):
        moe.marlin_moe_permute_scales(t["scales"], K, N, G)
    assert seen[-1][1] == {"s"}
    with pytest.raises(_Stop):
        moe.moe_awq_to_marlin_zero_points(t["zeros"], K // G, N, 4)
    assert seen[-1][1] == {"q_zp_packed"}


def _vllm_op_args(name, c):
    t = _grouped_args()
    values = dict(
        a=t["a"],
        c_or_none=c,
        b_q_weight=t["w"],
        b_scales=t["scales"],
        b_zeros_or_none=t["zeros"],
        workspace=torch.zeros(16, dtype=torch.int32),
        sorted_token_ids=t["sorted_ids"],
        expert_ids=t["expert_ids"],
        num_tokens_past_padded=t["npp"],
        topk_weights=t["tw"],
        moe_block_size=16,
        top_k=TOP_K,
        mul_topk_weights=False,
        b_type_id=0,
        size_m=M,
        size_n=N,
        size_k=K,
        is_full_k=True,
        use_atomic_add=False,
        use_fp32_reduce=True,
        is_zp_float=False,
        thread_k=-1,
        thread_n=-1,
        blocks_per_sm=-1,
    )
    schema = getattr(torch.ops.w4a16, name).default._schema
    return schema, [values.get(a.name) for a in schema.arguments]


@pytest.mark.parametrize("name", ["moe_wna16_marlin_gemm", "moe_wna16_marlin_gemm_v0_15"])
def test_vllm_ops_with_c(monkeypatch, name):
    """Given c_or_none, the op writes into it as vLLM's does; torch must be told (torch.compile would otherwise
    drop or reorder the write), and the returned tensor may not alias c (torch refuses that of a custom op)."""

    def grouped(layout, a, c, *rest):  # what the real one does with c: writes every row, returns it
        if c is None:
            return torch.full((M * TOP_K, N), 5, dtype=a.dtype)
        c.fill_(3)
        return c

    monkeypatch.setattr(moe, "_grouped", grouped)
    c = torch.zeros(M * TOP_K, N).half()
    schema, args = _vllm_op_args(name, c)
    assert schema.arguments[1].name == "c_or_none" and schema.arguments[1].alias_info.is_write
    out = getattr(torch.ops.w4a16, name)(*args)
    assert out.data_ptr() != c.data_ptr() and (c == 3).all() and (out == 3).all()
    # torch's own checks of a custom op: declared mutations and fake (meta) implementation match the real one
    torch.library.opcheck(getattr(torch.ops.w4a16, name).default, args, test_utils=("test_schema", "test_faketensor"))
    _, args = _vllm_op_args(name, None)
    assert (getattr(torch.ops.w4a16, name)(*args) == 5).all()


def test_prepare_refuses_to_create_the_workspace_in_a_capture(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(moe, "_workspaces", {})
    with pytest.raises(RuntimeError, match=re.escape("MoE workspace of cuda:0 does not exist yet")):
        moe.prepare("cuda:0")
