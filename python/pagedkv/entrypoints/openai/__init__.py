"""OpenAI-compatible HTTP server (FastAPI + uvicorn) over :class:`AsyncLLMEngine`."""
