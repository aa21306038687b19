"""Speculative decoding: draft proposers and the rejection sampler that keeps the target
model's distribution. The engine path (scheduling k+1 query tokens, rolling back rejected
slots) is not wired yet: LLM(speculative_config=...) is still refused (engine/vllm_args.py)."""
