"""The engine: LLM, LLMEngine, sampling, tokenizer and detokenizer."""
