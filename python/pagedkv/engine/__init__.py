"""The engine: LLM, LLMEngine, SamplingParams, outputs, sampler, model runner, tokenizer."""
