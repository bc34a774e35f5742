"""Quantise a small random-initialised transformer MLP block (gate/up/down, SiLU) to int4 the AutoAWQ way, run it
through w4a16, and compare it (1) with the same MLP computed by torch on the dequantised weights -- what the
kernels must reproduce -- and (2) with the float original -- the int4 quantisation error itself (about 11% for
random uniform weights: a step of range/15 per group, over three layers).
    python python_bindings/examples/mlp.py"""

import torch
import w4a16.torch as wt


def run_mlp(dtype=torch.float16, hidden=1024, inter=2816, tokens=16, seed=0):
    """Returns (error vs the dequantised reference, error vs the float original), relative Frobenius."""
    torch.manual_seed(seed)
    lins = [
        torch.nn.Linear(a, b, bias=False).cuda().to(dtype)
        for a, b in ((hidden, inter), (hidden, inter), (inter, hidden))
    ]
    qlins = [wt.AWQLinear.from_float(l, 128, dtype) for l in lins]
    # the dequantised weights, through the library's own dequantiser on the AWQ tensors
    deq = []
    for l in lins:
        from w4a16.formats import awq_quantize

        qw, qz, s = awq_quantize(l.weight.detach().float().cpu().numpy().T.copy(), 128)
        t = lambda a: torch.from_numpy(a.copy()).cuda()
        deq.append(wt.awq_dequantize(t(qw), t(s).to(dtype), t(qz), 0, 0, 0))
    x = torch.randn(tokens, hidden, device="cuda", dtype=dtype)
    silu = torch.nn.functional.silu
    ref_float = lins[2](silu(lins[0](x)) * lins[1](x))
    ref_deq = (silu(x @ deq[0]) * (x @ deq[1])) @ deq[2]
    out = qlins[2](silu(qlins[0](x)) * qlins[1](x))
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()
    return rel(out, ref_deq), rel(out, ref_float)


if __name__ == "__main__":
    for dt in (torch.float16, torch.bfloat16):
        e_deq, e_float = run_mlp(dt)
        print(
            f"{dt}: int4 MLP through w4a16 vs torch on the dequantised weights: {e_deq:.2e}; "
            f"vs the float original (quantisation error): {e_float:.3f}"
        )
