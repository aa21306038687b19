"""HF transformers' beam search as the reference of LLM.beam_search (float32, on the CPU)."""

from __future__ import annotations

import functools
from typing import Any


@functools.lru_cache(maxsize=2)
def hf_model(path: str) -> Any:
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_beams(
    path: str, prompt: list[int], width: int, lp: float, eos: bool, max_tokens: int
) -> list[tuple[list[int], float]]:
    """HF's hypotheses (generated tokens, EOS included) and scores, best first: EOS is
    config.json's (``eos``) or none."""
    import torch

    ref = hf_model(path)
    eos_ids = ref.config.eos_token_id if eos else None
    ref.generation_config.eos_token_id = eos_ids
    eos_ids = [eos_ids] if isinstance(eos_ids, int) else eos_ids or []
    with torch.no_grad():
        out = ref.generate(
            torch.tensor([prompt]),
            do_sample=False,
            num_beams=width,
            num_return_sequences=width,
            max_new_tokens=max_tokens,
            length_penalty=lp,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    beams = []
    for row, score in zip(out.sequences, out.sequences_scores):
        tokens = row[len(prompt) :].tolist()
        ends = [j for j, t in enumerate(tokens) if t in eos_ids]
        if ends:  # HF pads after the EOS
            tokens = tokens[: ends[0] + 1]
        beams.append((tokens, float(score)))
    return beams
