"""Engine adapters: plugins that route an inference engine's int4 ops to w4a16 (one module per engine)."""
