"""One attention call on gpu_attention.py's data, for Nsight Compute (a handful of launches, so
`ncu -k regex:... -c 1` profiles the steady-state kernel, not the warm-up).

    python benchmarks/ncu_driver.py decode B L [auto|fp8]
    python benchmarks/ncu_driver.py prefill B L
    python benchmarks/ncu_driver.py extend B PREFIX NEW [auto|fp8]
"""

from __future__ import annotations

import sys

import gpu_attention as ga
import torch


def extend(b: int, prefix: int, new: int, kv: str) -> None:
    """Three calls of gpu_attention's extend (new tokens over a paged prefix in `kv`)."""
    kc, vc, bt = ga.make_cache(b, prefix, kv)
    n = b * new
    q, out = (torch.randn(n, ga.HQ, ga.D, dtype=ga.DTYPE, device="cuda") for _ in range(2))
    k, v = (torch.randn(n, ga.HKV, ga.D, dtype=ga.DTYPE, device="cuda") for _ in range(2))
    qsl = torch.arange(0, n + 1, new, dtype=torch.int32, device="cuda")
    sl = torch.full((b,), prefix + new, dtype=torch.int32, device="cuda")
    for _ in range(3):
        ga.ops.context_attention_fwd(q, k, v, out, kv, kc, vc, bt, qsl, sl, None, new)


def main() -> None:
    kind, b, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if kind == "decode":
        kv = sys.argv[4] if len(sys.argv) > 4 else "auto"
        ga.bench_decode_ours(
            b, length, torch.cuda.get_device_properties(0).multi_processor_count, kv
        )
    elif kind == "extend":
        extend(b, length, int(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else "auto")
    else:
        ga.bench_prefill_ours(b, length)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
