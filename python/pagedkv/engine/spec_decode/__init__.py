"""Speculative decoding: the draft proposers (n-gram prompt lookup, a draft model with its own
KV cache on the shared block ids), the rejection sampler that keeps the target model's
distribution, and the engine's per-step speculator (speculator.py)."""
