"""PTX's warpgroup MMA (wgmma.mma_async m64nNk16, fp32 accumulators) as numpy over a byte-addressed
shared memory, for the lane-level model of the Hopper prefill kernel
(src/ops/cuda/prefill_wgmma_kernel.cuh, wgmma.cuh): the kernel's swizzled stores, descriptor
fields and per-k-step start addresses must make the hardware read the intended matrices.

Semantics modelled (PTX ISA, "Shared Memory Matrix Layout" / "Matrix Descriptor"): descriptor
bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4,
62-63 swizzle mode (1 = 128B). With 128B swizzle the 16-byte chunk bits [4:6] of every computed
byte address are XORed with bits [7:9]. A K-major operand (16 K elements per row of the
instruction): row m at (m // 8) * SBO + (m % 8) * 128, element k at 2 k. An MN-major operand:
element n at (n // 64) * LBO + 2 (n % 64), k-row at (k // 8) * SBO + (k % 8) * 128."""

from __future__ import annotations

import numpy as np


def desc_sw128(saddr: int, lbo: int, sbo: int) -> int:
    """The kernel's wgmma::desc_sw128."""
    return (
        ((saddr & 0x3FFFF) >> 4)
        | (((lbo & 0x3FFFF) >> 4) << 16)
        | (((sbo & 0x3FFFF) >> 4) << 32)
        | (1 << 62)
    )


def decode(desc: int) -> tuple[int, int, int, int]:
    """(start, LBO, SBO) in bytes and the swizzle mode, per the PTX field table."""
    field = lambda lo: (desc >> lo) & 0x3FFF  # noqa: E731
    return field(0) << 4, field(16) << 4, field(32) << 4, (desc >> 62) & 3


def sw128(r: int, c: int, rows: int) -> int:
    """The kernel's wgmma::sw128: byte address of 16-byte chunk c of row r in a [cols / 64][rows]
    [64] tile of 16-bit elements."""
    return (c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4)


def swizzle(addr: int) -> int:
    return addr ^ (((addr >> 7) & 7) << 4)


def _elem(smem: np.ndarray, addr: int) -> float:
    assert addr % 2 == 0
    return float(smem[swizzle(addr) // 2])


def read_k_major(smem: np.ndarray, desc: int, rows: int) -> np.ndarray:
    """The rows x 16 operand a K-major descriptor addresses (A: rows = 64, B: rows = N)."""
    start, _, sbo, mode = decode(desc)
    assert mode == 1
    return np.array(
        [
            [_elem(smem, start + (m // 8) * sbo + (m % 8) * 128 + 2 * k) for k in range(16)]
            for m in range(rows)
        ]
    )


def read_mn_major(smem: np.ndarray, desc: int, n: int) -> np.ndarray:
    """The 16 x n B operand (k, n) an MN-major (transposed) descriptor addresses."""
    start, lbo, sbo, mode = decode(desc)
    assert mode == 1
    return np.array(
        [
            [
                _elem(smem, start + (j // 64) * lbo + 2 * (j % 64) + (k // 8) * sbo + (k % 8) * 128)
                for j in range(n)
            ]
            for k in range(16)
        ]
    )


def acc_index(tid: int, j: int, e: int) -> tuple[int, int]:
    """(row, column) of accumulator d[j][e] of warpgroup thread tid (0..127)."""
    warp, lane = tid // 32, tid % 32
    return 16 * warp + lane // 4 + 8 * (e >> 1), 8 * j + 2 * (lane % 4) + (e & 1)


def a_index(tid: int, reg: int, half: int) -> tuple[int, int]:
    """(row, k) of element `half` of register `reg` of the register A operand (m64 x k16)."""
    warp, lane = tid // 32, tid % 32
    return (16 * warp + lane // 4 + 8 * (reg & 1), 8 * (reg >> 1) + 2 * (lane % 4) + half)


def wgmma(d: np.ndarray, a: np.ndarray, b: np.ndarray, scale_d: bool = True) -> None:
    """d[128, N/8, 4] (per-thread accumulators) = A (64 x 16) B (16 x N) + (scale_d ? d : 0)."""
    prod = a @ b
    for tid in range(128):
        for j in range(d.shape[1]):
            for e in range(4):
                r, c = acc_index(tid, j, e)
                d[tid, j, e] = prod[r, c] + (d[tid, j, e] if scale_d else 0.0)


def regs_to_a(regs: np.ndarray) -> np.ndarray:
    """regs[128, 4, 2] register A fragments -> the 64 x 16 matrix they hold."""
    a = np.full((64, 16), np.nan)
    for tid in range(128):
        for reg in range(4):
            for half in range(2):
                a[a_index(tid, reg, half)] = regs[tid, reg, half]
    assert not np.isnan(a).any()
    return a


def tma_store_sw128(smem: np.ndarray, dst: int, box: np.ndarray) -> None:
    """A TMA tensor copy with CU_TENSOR_MAP_SWIZZLE_128B of a box of rows x 64 16-bit elements
    (one 128-byte row per box row) to shared address dst: 16-byte unit u of box row r lands at
    unit u ^ (r % 8) of row r, the pattern repeating every 8 rows (1024 bytes). The kernel only
    targets 1024-byte aligned destinations, where this is the documented layout."""
    assert dst % 1024 == 0 and box.shape[1] == 64
    for r in range(box.shape[0]):
        for u in range(8):
            addr = dst + r * 128 + ((u ^ (r % 8)) << 4)
            smem[addr // 2 : addr // 2 + 8] = box[r, 8 * u : 8 * u + 8]
