"""PTX's warp-level matrix instructions as numpy, for the lane-level models of the tensor-core
kernels (decode_mma_model.py, prefill_mma_model.py): they check that a kernel's fragment index
expressions (ldmatrix row addresses, mma operand order) compute the right products."""

from __future__ import annotations

from typing import Callable

import numpy as np


def ldmatrix_x4(
    smem: np.ndarray, row_start: Callable[[int], int], trans: bool = False
) -> np.ndarray:
    """ldmatrix.sync.aligned.m8n8.x4(.trans).b16 on a flat element array: lane l supplies the
    start (flat offset) of row l % 8 of matrix l // 8; lane l receives elements
    (l // 4, 2 (l % 4) + {0, 1}) of each 8 x 8 matrix (of its transpose with .trans).
    Returns regs[lane, matrix, 2]."""
    regs = np.zeros((32, 4, 2))
    for i in range(4):
        m = np.array([smem[row_start(8 * i + r) : row_start(8 * i + r) + 8] for r in range(8)])
        m = m.T if trans else m
        for lane in range(32):
            regs[lane, i] = m[lane // 4, 2 * (lane % 4) : 2 * (lane % 4) + 2]
    return regs


def ldmatrix_x4_b8(
    smem: np.ndarray, row_start: Callable[[int], int], trans: bool = False
) -> np.ndarray:
    """ldmatrix_x4 on a flat array of bytes (one element per byte, e.g. fp8 values): every b16
    element is two neighbouring bytes, kept together by .trans. Returns regs[lane, matrix, 4],
    the 4 bytes of each register, lowest first."""
    regs = np.zeros((32, 4, 4))
    for i in range(4):
        m = np.array(
            [smem[row_start(8 * i + r) : row_start(8 * i + r) + 16] for r in range(8)]
        ).reshape(8, 8, 2)
        m = m.transpose(1, 0, 2) if trans else m
        for lane in range(32):
            regs[lane, i] = m[lane // 4, 2 * (lane % 4) : 2 * (lane % 4) + 2].reshape(4)
    return regs


def mma_16816(c: np.ndarray, a: np.ndarray, b0: np.ndarray, b1: np.ndarray) -> None:
    """mma.sync.aligned.m16n8k16.row.col: c[lane, 4] += A (16 x 16) B (16 x 8), operands in the
    PTX fragment layouts (a[lane, 4, 2]: rows g / g + 8, k pairs q / q + 8; b: k pairs q / q + 8
    of column g; c: row g cols q, q + 1, then row g + 8), g = lane / 4, q = 2 (lane % 4)."""
    am, bm = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(32):
        g, q = lane // 4, 2 * (lane % 4)
        am[g, q : q + 2], am[g + 8, q : q + 2] = a[lane, 0], a[lane, 1]
        am[g, q + 8 : q + 10], am[g + 8, q + 8 : q + 10] = a[lane, 2], a[lane, 3]
        bm[q : q + 2, g], bm[q + 8 : q + 10, g] = b0[lane], b1[lane]
    cm = am @ bm
    for lane in range(32):
        g, q = lane // 4, 2 * (lane % 4)
        c[lane, 0:2] += cm[g, q : q + 2]
        c[lane, 2:4] += cm[g + 8, q : q + 2]


def movmatrix_trans(x: np.ndarray) -> np.ndarray:
    """movmatrix.sync.aligned.m8n8.trans.b16: x[lane, 2] holds elements (l // 4, 2 (l % 4) + {0,
    1}) of an 8 x 8 matrix; returns the same fragment of its transpose."""
    m = np.zeros((8, 8))
    for lane in range(32):
        m[lane // 4, 2 * (lane % 4) : 2 * (lane % 4) + 2] = x[lane]
    t = m.T
    return np.array([t[lane // 4, 2 * (lane % 4) : 2 * (lane % 4) + 2] for lane in range(32)])


def byte_perm(a: list, b: list, selector: int) -> list:
    """__byte_perm / prmt.b32 on 4-element words (element i = byte i): result byte i is byte
    (selector >> 4 i) & 7 of b:a."""
    src = list(a) + list(b)
    return [src[(selector >> (4 * i)) & 7] for i in range(4)]
