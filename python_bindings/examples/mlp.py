"""Quantise a small random-initialised transformer MLP block (gate/up/down, SiLU) to int4 the AutoAWQ way, run it
through w4a16, and compare with the original in fp16/bf16.   python python_bindings/examples/mlp.py"""
import torch

import w4a16.torch as wt


def run_mlp(dtype=torch.float16, hidden=1024, inter=2816, tokens=16, seed=0):
    torch.manual_seed(seed)
    gate, up, down = (torch.nn.Linear(a, b, bias=False).cuda().to(dtype)
                      for a, b in ((hidden, inter), (hidden, inter), (inter, hidden)))
    qgate, qup, qdown = (wt.AWQLinear.from_float(l, 128, dtype) for l in (gate, up, down))
    x = torch.randn(tokens, hidden, device="cuda", dtype=dtype)
    ref = down(torch.nn.functional.silu(gate(x)) * up(x))
    out = qdown(torch.nn.functional.silu(qgate(x)) * qup(x))
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


if __name__ == "__main__":
    for dt in (torch.float16, torch.bfloat16):
        print(f"{dt}: relative error of the int4 MLP vs the original: {run_mlp(dt):.4f}")
