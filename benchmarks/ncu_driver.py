"""One attention call on gpu_attention.py's data, for Nsight Compute (a handful of launches, so
`ncu -k regex:... -c 1` profiles the steady-state kernel, not the warm-up).

    python benchmarks/ncu_driver.py decode B L [auto|fp8]
    python benchmarks/ncu_driver.py prefill B L
"""

from __future__ import annotations

import sys

import gpu_attention as ga
import torch


def main() -> None:
    kind, b, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if kind == "decode":
        kv = sys.argv[4] if len(sys.argv) > 4 else "auto"
        ga.bench_decode_ours(b, length, torch.cuda.get_device_properties(0).multi_processor_count,
                             kv)
    else:
        ga.bench_prefill_ours(b, length)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
