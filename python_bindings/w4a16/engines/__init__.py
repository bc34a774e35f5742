"""Engine adapters: w4a16 under inference engines' own int4 ops, chosen from the running engine's version and live
op schemas (`vllm`, `sglang`; `_common` holds what they share)."""
