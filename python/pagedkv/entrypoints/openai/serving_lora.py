"""LoRA adapters on the server: ``--lora-modules`` (``name=path`` or vLLM's JSON form
``{"name": ..., "path": ..., "base_model_name": ...}``), the adapters a request's ``model`` may
name, their ``/v1/models`` cards (root = the adapter folder, parent = the base model), and
``/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``, served only when
PAGEDKV_ALLOW_RUNTIME_LORA_UPDATING (or vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING) is true."""

from __future__ import annotations

import json
import threading
from typing import Any, Dict, List, Optional, Sequence

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from pagedkv import envs
from pagedkv.entrypoints.openai.errors import APIError, bad_request
from pagedkv.lora.request import LoRARequest


def parse_lora_module(text: str) -> LoRARequest:
    """One --lora-modules entry -> a LoRARequest (its id assigned by the registry)."""
    text = text.strip()
    if text.startswith("{"):
        try:
            d = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"--lora-modules: invalid JSON {text!r}: {exc}") from None
        unknown = set(d) - {"name", "path", "base_model_name"}
        if not isinstance(d, dict) or unknown or "name" not in d or "path" not in d:
            raise ValueError(
                f"--lora-modules: a JSON entry needs 'name' and 'path' (and "
                f"optionally 'base_model_name'), got {text!r}"
            )
        return LoRARequest(str(d["name"]), 1, str(d["path"]), d.get("base_model_name"))
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--lora-modules: expected name=path or a JSON object, got {text!r}")
    return LoRARequest(name, 1, path)


def runtime_updates_allowed() -> bool:
    value = envs.getenv("PAGEDKV_ALLOW_RUNTIME_LORA_UPDATING") or ""
    return value.strip().lower() in ("1", "true", "yes", "on")


class LoRARegistry:
    """The adapters served by name; ids are assigned here, one per name."""

    def __init__(self, engine: Any, reserved: Sequence[str] = ()) -> None:
        """``reserved``: the base model's served names and aliases, which an adapter may not
        take (its requests would silently run the adapter instead of the base model)."""
        self.engine = engine
        self.reserved = frozenset(reserved)
        self.adapters: Dict[str, LoRARequest] = {}
        self._lock = threading.Lock()
        # Ids continue past those the engine already knows (it keys its slots and prefix-cache
        # entries by id); a name unloaded and loaded again gets a fresh one. Read once, here:
        # the engine thread changes the manager's tables while serving.
        manager = _lora_manager(engine)
        known = [r.lora_int_id for r in manager.list_adapters()] if manager is not None else []
        self._last_id = max(known, default=0)

    def _next_id(self) -> int:
        self._last_id += 1
        return self._last_id

    def add(self, req: LoRARequest) -> LoRARequest:
        with self._lock:
            if req.lora_name in self.adapters:
                raise ValueError(f"The lora adapter '{req.lora_name}' has already been loaded.")
            if req.lora_name in self.reserved:
                raise ValueError(
                    f"The lora adapter name '{req.lora_name}' is a name of the base model."
                )
            req = LoRARequest(req.lora_name, self._next_id(), req.lora_path, req.base_model_name)
            self.adapters[req.lora_name] = req
            return req

    def remove(self, name: str) -> LoRARequest:
        with self._lock:
            req = self.adapters.pop(name, None)
        if req is None:
            raise ValueError(f"The lora adapter '{name}' cannot be found.")
        return req

    def get(self, model: Optional[str]) -> Optional[LoRARequest]:
        return self.adapters.get(model) if model else None

    def cards(self, base: str, max_model_len: int) -> List[Dict[str, Any]]:
        from pagedkv.entrypoints.openai.protocol import ModelCard, ModelPermission

        return [
            ModelCard(
                id=r.lora_name,
                root=r.lora_path,
                parent=r.base_model_name or base,
                max_model_len=max_model_len,
                permission=[ModelPermission()],
            ).model_dump()
            for r in self.adapters.values()
        ]


def _lora_manager(engine: Any) -> Any:
    inner = getattr(engine, "engine", engine)
    return getattr(getattr(inner, "runner", None), "lora", None)


def check_adapter(engine: Any, req: LoRARequest) -> None:
    """Reads and checks the adapter now (a bad folder fails at start-up or at load, not at a
    request). It is not stored: this runs off the engine thread, which alone changes the
    manager's tables (the engine loads the adapter at its first request)."""
    manager = _lora_manager(engine)
    if manager is None:
        raise ValueError("LoRA adapters need --enable-lora")
    manager.read_adapter(req)


class LoadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_int_id: Optional[int] = None


def add_lora_routes(app: FastAPI, registry: LoRARegistry) -> None:
    if not runtime_updates_allowed():
        return

    @app.post("/v1/load_lora_adapter")
    async def load(body: LoadLoRAAdapterRequest) -> Any:
        try:
            req = registry.add(LoRARequest(body.lora_name, 1, body.lora_path))
        except ValueError as exc:
            raise bad_request(str(exc), param="lora_name") from None
        try:
            check_adapter(registry.engine, req)
        except (ValueError, OSError) as exc:
            registry.remove(req.lora_name)
            raise bad_request(str(exc), param="lora_path") from None
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload(body: UnloadLoRAAdapterRequest) -> Any:
        try:
            registry.remove(body.lora_name)
        except ValueError as exc:
            raise APIError(404, str(exc), param="lora_name") from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
