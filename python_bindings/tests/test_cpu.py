"""CPU tests of the Python package (run on CI): loading, version, errors as exceptions with the library's message,
argument checks of the framework-free layer, and the numpy formats against hand-computed words."""

import os
import re

import numpy as np
import pytest
import w4a16
from w4a16 import formats

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_version_matches_header():
    text = open(os.path.join(ROOT, "include", "w4a16.h")).read()
    parts = [int(re.search(rf"#define W4A16_VERSION_{p} (\d+)", text).group(1)) for p in ("MAJOR", "MINOR", "PATCH")]
    assert w4a16.version() == ".".join(map(str, parts))
    assert w4a16.version_number() == parts[0] * 10000 + parts[1] * 100 + parts[2]


def test_status_names_match_header():
    text = open(os.path.join(ROOT, "include", "w4a16.h")).read()
    for name, value in re.findall(r"X\((W4A16_\w+), (\d+),", text):
        assert w4a16.STATUS_NAMES[int(value)] == name
        assert len(w4a16.status_string(int(value))) > 5


def test_compiled_archs_and_profiles():
    assert "ptx:" in w4a16.compiled_archs()
    assert w4a16.profile_names() == ["sm80", "sm86", "sm89", "sm90", "sm100", "sm120", "sm121"]


def test_error_is_exception_with_message():
    # all pointers NULL: rejected by validation before any device is touched
    with pytest.raises(w4a16.W4A16Error) as e:
        w4a16.awq_gemm(0, 0, 0, 0, 0, 0, 1, 64, 128, 128, w4a16.FP16, 0, 0)
    assert e.value.status == 1 and e.value.name == "W4A16_ERR_NULL_POINTER"
    assert "A is NULL" in str(e.value) and "w4a16_awq_gemm" in str(e.value)


def test_gemm_flags():
    fake = 1 << 20  # aligned, never dereferenced: validation fails first
    with pytest.raises(w4a16.W4A16Error) as e:  # an unknown bit
        w4a16.marlin_gemm(fake, fake, fake, 0, 0, fake, 1, 64, 128, 128, w4a16.FP16, 0, 0, flags=4)
    assert e.value.status == 8 and "flags=0x4 has unknown bits" in e.value.detail
    with pytest.raises(w4a16.W4A16Error) as e:  # both known flags pass; the group size is checked next
        w4a16.awq_gemm(
            fake,
            fake,
            fake,
            fake,
            0,
            fake,
            1,
            64,
            128,
            48,
            w4a16.FP16,
            0,
            0,
            flags=w4a16.FLAG_PDL | w4a16.FLAG_REDUCE_IN_DTYPE,
        )
    assert e.value.status == 4 and "group_size=48" in e.value.detail


@pytest.mark.parametrize(
    "kwargs,status,text",
    [
        (dict(N=100), 3, "N=100 must be a positive multiple of 64"),
        (dict(K=4000), 3, "K=4000 is not a multiple of group_size=128"),
        (dict(G=48), 4, "group_size=48"),
        (dict(M=0), 3, "M=0 must be at least 1"),
        (dict(dtype=9), 5, "dtype=9"),
    ],
)
def test_argument_checks(kwargs, status, text):
    a = dict(M=1, N=64, K=128, G=128, dtype=w4a16.FP16)
    a.update(kwargs)
    fake = 1 << 20  # aligned, never dereferenced: every call here fails validation first
    with pytest.raises(w4a16.W4A16Error) as e:
        w4a16.awq_gemm(fake, fake, fake, fake, 0, fake, a["M"], a["N"], a["K"], a["G"], a["dtype"], 0, 0)
    assert e.value.status == status and text in e.value.detail


def test_workspace_size_staged_checks_shape_first():
    with pytest.raises(w4a16.W4A16Error) as e:
        w4a16.workspace_size_staged(100, 4096)
    assert e.value.status == 3 and "N=100" in e.value.detail


def test_force_profile_unknown_name():
    with pytest.raises(w4a16.W4A16Error) as e:
        w4a16.force_profile("sm999")
    assert e.value.status == 8


def test_awq_pack_hand_computed():
    q = np.tile(np.arange(8, dtype=np.uint8), (1, 2))  # column j holds j % 8
    assert formats.awq_pack(q).view(np.uint32).tolist() == [[0x75316420, 0x75316420]]
    q = np.zeros((1, 8), dtype=np.uint8)
    q[0, 1] = 0xA  # column 1 lives in nibble 4
    assert formats.awq_pack(q).view(np.uint32)[0, 0] == 0x000A0000


def test_gptq_pack_hand_computed():
    q = np.stack([np.arange(8), 15 - np.arange(8)], axis=1).astype(np.uint8)
    assert formats.gptq_pack(q).view(np.uint32).tolist() == [[0x76543210, 0x89ABCDEF]]


def test_round_trips_and_marlin():
    rng = np.random.default_rng()
    q = rng.integers(0, 16, size=(256, 192), dtype=np.uint8)
    assert (formats.awq_unpack(formats.awq_pack(q)) == q).all()
    assert (formats.gptq_unpack(formats.gptq_pack(q)) == q).all()
    m1 = formats.marlin_repack_awq(formats.awq_pack(q))
    m2 = formats.marlin_repack_gptq(formats.gptq_pack(q))
    assert m1.shape == (16, 384) and (m1 == m2).all()
    perm = formats.marlin_perm()
    assert sorted(perm) == list(range(1024))
    assert perm[:8].tolist() == [0, 128, 8, 136, 16, 144, 24, 152]


def test_quantize_error_bound():
    rng = np.random.default_rng()
    w = rng.uniform(-1, 1, size=(256, 128)).astype(np.float32)
    qw, qz, s = formats.awq_quantize(w, 128)
    d = formats.awq_dequantize(qw, qz, s, 128).astype(np.float32)
    err = np.abs(d - w) / np.repeat(s.astype(np.float32), 128, axis=0)
    assert 0.3 < err.max() <= 1.02


def test_vllm_plugin_without_vllm(monkeypatch):
    from w4a16 import vllm_plugin

    monkeypatch.setenv("W4A16_VLLM", "0")
    assert vllm_plugin.register() is False  # opted out
    monkeypatch.setenv("W4A16_VLLM", "1")
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        assert vllm_plugin.register() is False  # nothing to patch, and no error


def test_vllm_plugin_entry_point_declared():
    text = open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml")).read()
    assert '[project.entry-points."vllm.general_plugins"]' in text
    assert 'w4a16 = "w4a16.vllm_plugin:register"' in text


def test_python_doctor_without_gpu_says_so():
    import subprocess
    import sys

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-m", "w4a16"], capture_output=True, text=True, env=env)
    assert out.returncode == 1 and "verdict: NOT USABLE" in out.stdout
