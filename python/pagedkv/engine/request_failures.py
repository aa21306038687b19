"""Which request a step's failure belongs to: per-request work runs under a guard naming its
request, so that an error there (a user's logits processor, a grammar matcher, a penalty the
sampler cannot take, the detokenizer) fails that request alone while the step goes on for the
others. Device faults belong to no request: they are never caught here (the engine cannot go on
after one, see AsyncLLMEngine)."""

from __future__ import annotations

import contextlib
import enum
from typing import (
    AbstractSet,
    Callable,
    Dict,
    Generic,
    Iterator,
    KeysView,
    List,
    Literal,
    Protocol,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

# Text of the errors torch raises for a broken device (its error types vary by version).
_DEVICE_ERROR_MARKS = (
    "CUDA error",
    "CUBLAS_STATUS",
    "CUDNN_STATUS",
    "cuDNN error",
    "device-side assert",
    "NCCL error",
    "an illegal memory access",
)


class EngineDownError(RuntimeError):
    """The engine can no longer run steps (a tensor/pipeline-parallel rank is gone or out of
    step): like a device fault, nobody's request is to blame."""


def is_device_error(exc: BaseException) -> bool:
    """A fault of the device, not of a request: the engine cannot go on after it."""
    import torch

    if isinstance(exc, EngineDownError):
        return True

    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    text = str(exc)
    return any(mark in text for mark in _DEVICE_ERROR_MARKS)


T = TypeVar("T")
R = TypeVar("R")


class OwnsWork(Protocol):
    """What a failure is blamed on: a request (RequestState, a pooling engine's request)."""

    @property
    def request_id(self) -> str: ...


Req = TypeVar("Req", bound=OwnsWork)


class Failed(enum.Enum):
    """try_batch's answer where the batch raised (a value, unlike None, that no batch returns)."""

    FAILED = 0


FAILED = Failed.FAILED


def try_batch(batch: Callable[[], R]) -> Union[R, Literal[Failed.FAILED]]:
    """``batch()``: the work of a step's requests done at once; FAILED where it raised an error
    that is not the device's. The caller then redoes the work request by request, each under
    RequestFailures.guard, so that only the requests whose own work raises fail (the batch's
    error is dropped: theirs name the culprits). The one rule for which batch errors are
    retried that way, for every batched part of a step (sampler, bitmask, prompt logprobs,
    speculative knobs, pooling forward and heads)."""
    try:
        return batch()
    except Exception as exc:
        if is_device_error(exc):
            raise
    return FAILED


class RequestFailedError(RuntimeError):
    """A request's own work raised during a step: the engine aborted it (the others go on)."""


def raise_request_errors(errors: Dict[str, Exception], wanted: AbstractSet[str]) -> None:
    """A request of an offline call (LLM.generate, LLM.embed, ...) failed alone (its own work
    raised): the call cannot return its output, so it raises that error, naming the request."""
    mine = [rid for rid in errors if rid in wanted]
    if mine:
        rid = mine[0]
        raise RequestFailedError(f"request {rid!r} failed: {errors[rid]!r}") from errors[rid]


class RequestFailures(Generic[Req]):
    """The requests whose own work raised in a step, each with its first error."""

    def __init__(self) -> None:
        self._errors: Dict[str, Tuple[Req, Exception]] = {}
        # The failed requests' ids, a live view: the per-token loops of a step test
        # `req.request_id in failures.request_ids` (a C-level lookup, no Python call per token).
        self.request_ids: KeysView[str] = self._errors.keys()

    @contextlib.contextmanager
    def guard(self, req: Req) -> Iterator[None]:
        """Runs a block of ``req``'s own work; an Exception there is recorded against ``req``
        and swallowed (BaseExceptions such as KeyboardInterrupt, and device errors, pass)."""
        try:
            yield
        except Exception as exc:
            if is_device_error(exc):
                raise
            self.blame(req, exc)

    def each(
        self,
        items: Sequence[T],
        request_of: Callable[[T], Req],
        work: Callable[[T], None],
    ) -> None:
        """``work(item)`` for every item whose request has not failed, as guard() would run
        each: an Exception fails that item's request and the loop resumes at the next item.
        For the per-token loops of a step: one ``try`` per run of items instead of a context
        manager per item (a guard costs about a microsecond: two per request per step were
        0.8 ms of a batch-256 decode step, 18 % of the 1B engine's H200 throughput)."""
        i, n, failed = 0, len(items), self._errors
        while i < n:
            try:
                while i < n:
                    item = items[i]
                    # (no lookup per item while nothing has failed: the common step)
                    if not failed or request_of(item).request_id not in failed:
                        work(item)
                    i += 1
            except Exception as exc:
                if is_device_error(exc):
                    raise
                self.blame(request_of(items[i]), exc)
                i += 1

    def blame(self, req: Req, exc: Exception) -> None:
        self._errors.setdefault(req.request_id, (req, exc))

    def __contains__(self, req: Req) -> bool:
        return req.request_id in self._errors

    def __bool__(self) -> bool:
        return bool(self._errors)

    def items(self) -> List[Tuple[Req, Exception]]:
        return list(self._errors.values())

    def errors(self) -> Dict[str, Exception]:
        """Each failed request's id with its error (take_request_errors' answer)."""
        return {rid: exc for rid, (_, exc) in self._errors.items()}

    def merge(self, other: RequestFailures[Req]) -> None:
        for req, exc in other.items():
            self.blame(req, exc)
