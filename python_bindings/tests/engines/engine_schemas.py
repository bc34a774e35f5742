"""Reads an engine's live op schemas (the ops w4a16's adapters replace, and the MoE ops they leave alone) into the
record kept under tests/engines/schemas/. `python engine_schemas.py vllm > record.json` (with the stub driver loaded,
as conftest.py does) writes a new record; the tests compare the live engine with the stored one."""

import importlib
import importlib.metadata
import json
import sys

import torch

# op names (namespace::name) that w4a16's vLLM adapter relies on or deliberately leaves to vLLM
VLLM_OPS = (
    "_C::marlin_gemm",
    "_C::gptq_marlin_gemm",
    "_C::gptq_marlin_repack",
    "_C::awq_marlin_repack",
    "_C::awq_gemm",
    "_C::awq_dequantize",
    "_C::marlin_int4_fp8_preprocess",
    "_moe_C::moe_wna16_marlin_gemm",
    "_C::moe_wna16_marlin_gemm",
)


def _schema(qualname):
    ns, name = qualname.split("::")
    try:
        return str(getattr(getattr(torch.ops, ns), name).default._schema)
    except (AttributeError, RuntimeError):
        return None


def vllm_record():
    import vllm._custom_ops  # noqa: F401

    for ext in ("vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C", "vllm._moe_C_stable_libtorch"):
        try:
            importlib.import_module(ext)
        except ImportError:
            pass
    from vllm.scalar_type import scalar_types

    ops = {q: s for q in VLLM_OPS if (s := _schema(q)) is not None}
    return {
        "engine": "vllm",
        "version": importlib.metadata.version("vllm"),
        "torch": torch.__version__.split("+")[0],
        "ops": ops,
        "scalar_type_ids": {
            t: getattr(scalar_types, t).id
            for t in ("uint4", "uint4b8", "uint8b128", "float4_e2m1f")
            if hasattr(scalar_types, t)
        },
    }


if __name__ == "__main__":
    rec = {"vllm": vllm_record}[sys.argv[1]]()
    with open(sys.argv[2], "w") as f:
        json.dump(rec, f, indent=1, sort_keys=True)
        f.write("\n")
