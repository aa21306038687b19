"""The driver's commands to the workers as flat bytes: no pickles, one memcpy per array.

A command is a method name and its arguments (worker.py's Worker methods). Arguments may be
None, bool, int, float, str, numpy arrays, tuples / lists of these, and PlanArrays (the step
plan: scalars and the metadata contract's flat arrays). Anything else is refused (TypeError):
a new command either fits this vocabulary or extends it here.

Layout (little-endian, 8-byte aligned):
    [int64 n_words] [int64 words x n_words] [array 0] [array 1] ...
The words describe the value tree (tag, then the tag's fields); an array's words are its dtype
code, ndim and shape, its bytes follow the words in order of appearance, each 8-byte aligned.
encode() returns the size and (offset, array) pieces, so a carrier copies each array straight
into its buffer; decode() copies the buffer once (the carrier then reuses it) and returns
arrays viewing that copy. A PlanArrays (the step's plan, in every step's command) is written
untagged: its scalars as words, then its arrays in field order.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, List, Sequence, Tuple

import numpy as np

from pagedkv.engine.plan_arrays import SCALAR_FIELDS, PlanArrays

_NONE, _FALSE, _TRUE, _INT, _FLOAT, _STR, _ARRAY, _SEQ, _PLAN = range(9)
_DTYPES = [
    np.dtype(t)
    for t in ("int8", "uint8", "int16", "int32", "int64", "float16", "float32", "float64", "bool")
]
_DTYPE_CODE = {dt: i for i, dt in enumerate(_DTYPES)}
_PLAN_FIELDS = [f.name for f in dataclasses.fields(PlanArrays)]
_PLAN_ARRAYS = [name for name in _PLAN_FIELDS if name not in SCALAR_FIELDS]
_NUM_SCALARS = len(SCALAR_FIELDS)

Pieces = List[Tuple[int, np.ndarray]]


def _align(n: int) -> int:
    return (n + 7) & ~7


class _Encoder:
    def __init__(self) -> None:
        self.words: List[int] = []
        self.arrays: List[np.ndarray] = []

    def value(self, v: Any) -> None:
        w = self.words
        t = type(v)  # (the common types first)
        if t is np.ndarray:
            w.append(_ARRAY)
            self.array(v)
        elif t is PlanArrays:
            self.plan(v)
        elif t is int:
            w += [_INT, v]
        elif v is None:
            w.append(_NONE)
        elif isinstance(v, (bool, np.bool_)):
            w.append(_TRUE if v else _FALSE)
        elif isinstance(v, (int, np.integer)):
            w += [_INT, int(v)]
        elif isinstance(v, (float, np.floating)):
            w += [_FLOAT, int(np.float64(v).view(np.int64))]
        elif isinstance(v, str):
            w.append(_STR)
            self.array(np.frombuffer(v.encode(), dtype=np.uint8))
        elif isinstance(v, np.ndarray):
            w.append(_ARRAY)
            self.array(v)
        elif isinstance(v, (tuple, list)):
            w += [_SEQ, len(v)]
            for item in v:
                self.value(item)
        elif isinstance(v, PlanArrays):
            self.plan(v)
        else:
            raise TypeError(f"a worker command cannot carry {type(v).__name__} values")

    def plan(self, p: PlanArrays) -> None:
        """A step's plan, every step: its scalars as words, then its arrays (no tags)."""
        self.words += [_PLAN, *[int(getattr(p, k)) for k in SCALAR_FIELDS]]
        for name in _PLAN_ARRAYS:
            self.array(np.asarray(getattr(p, name)))

    def array(self, a: np.ndarray) -> None:
        code = _DTYPE_CODE.get(a.dtype)
        if code is None:
            raise TypeError(f"a worker command cannot carry {a.dtype} arrays")
        self.words += [code, a.ndim, *a.shape]
        self.arrays.append(np.ascontiguousarray(a))


def encode(name: str, args: Sequence[Any]) -> Tuple[int, Pieces]:
    """The command's size in bytes and its pieces: (byte offset, array to copy there)."""
    enc = _Encoder()
    enc.value((name, tuple(args)))
    head = np.array([len(enc.words), *enc.words], dtype=np.int64)
    pieces: Pieces = [(0, head)]
    offset = head.nbytes
    for a in enc.arrays:
        pieces.append((offset, a))
        offset = _align(offset + a.nbytes)
    return offset, pieces


def write(buf: np.ndarray, pieces: Pieces) -> None:
    """Copies the pieces into ``buf`` (uint8, at least the encoded size)."""
    for offset, a in pieces:
        if a.nbytes:
            buf[offset : offset + a.nbytes] = a.reshape(-1).view(np.uint8)


class _Decoder:
    def __init__(self, buf: np.ndarray) -> None:
        n = int(buf[:8].view(np.int64)[0])
        # One copy of the whole command (the carrier reuses ``buf``); the arrays are views of it.
        self.buf = buf.copy()
        self.words = buf[8 : 8 * (n + 1)].view(np.int64).tolist()
        self.word = iter(self.words).__next__
        self.offset = 8 * (n + 1)

    def value(self) -> Any:
        tag = self.word()
        if tag == _ARRAY:
            return self.array()
        if tag == _INT:
            return self.word()
        if tag == _SEQ:
            return tuple([self.value() for _ in range(self.word())])
        if tag == _PLAN:
            word = self.word
            fields = {name: word() for name in SCALAR_FIELDS}
            for name in _PLAN_ARRAYS:
                fields[name] = self.array()
            return PlanArrays(**fields)
        if tag == _NONE:
            return None
        if tag in (_FALSE, _TRUE):
            return tag == _TRUE
        if tag == _FLOAT:
            return float(np.int64(self.word()).view(np.float64))
        if tag == _STR:
            return self.array().tobytes().decode()
        raise ValueError(f"corrupt worker command (tag {tag})")

    def array(self) -> np.ndarray:
        dtype = _DTYPES[self.word()]
        shape = tuple([self.word() for _ in range(self.word())])
        count = math.prod(shape)
        start = self.offset
        self.offset = _align(start + dtype.itemsize * count)
        return np.frombuffer(self.buf, dtype, count, start).reshape(shape)


def decode(buf: np.ndarray) -> Tuple[str, Tuple[Any, ...]]:
    """(name, args) of the command in ``buf`` (uint8; copied: the result does not view it)."""
    name, args = _Decoder(buf).value()
    return name, args
