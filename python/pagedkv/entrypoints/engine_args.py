"""Engine and sampling flags shared by the CLI commands (generate, chat, bench, serve; simulate
takes the scheduler's), with vLLM's names. Each flag is defined once, in ``ENGINE_FLAGS``."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence

from pagedkv import ops
from pagedkv.engine.vllm_args import CLI_REFUSED_ARGS, VLLM_ONLY_ARGS, check_vllm_arg
from pagedkv.entrypoints import arg_types as t
from pagedkv.entrypoints.arg_types import CLIError
from pagedkv.models.lora import LORA_KERNELS

# vLLM's --kv-cache-dtype choices: the kernels' one list (include/pagedkv/ops.h, read through
# pagedkv.ops, which does not import torch).
KV_CACHE_DTYPE_CHOICES = ops.KV_CACHE_DTYPES
KV_CACHE_DTYPE_HELP = (
    "KV-cache element type: 'auto' (the model dtype), or fp8 at 1 byte per "
    "element, which doubles the cached tokens of a 16-bit model: 'fp8' = "
    "'fp8_e4m3' (3-bit mantissa) or 'fp8_e5m2' (wider range, 2-bit mantissa); "
    "scales 1.0, no calibration"
)


@dataclass(frozen=True)
class Flag:
    """One flag: ``kind`` is "value" (takes a value), "toggle" (--x / --no-x) or "switch"
    (store_true). ``shown`` is how the help states the default where ``str(default)`` would
    not say it well (None, True, or 'auto' meaning something)."""

    dest: str
    default: Any
    help: str
    type: Optional[Callable[[str], Any]] = None
    kind: str = "value"
    shown: Optional[str] = None
    metavar: Optional[str] = None

    @property
    def option(self) -> str:
        return "--" + self.dest.replace("_", "-")

    @property
    def full_help(self) -> str:
        if self.kind == "switch":
            return self.help
        return f"{self.help} (default: {self.shown if self.shown is not None else self.default})"


ENGINE_FLAGS = (
    Flag(
        "model",
        None,
        "model: 'smollm2', a Hugging Face checkpoint directory, a .gguf file or "
        "a hub id (org/name: the HF cache first, else downloaded)",
        shown="smollm2, the packaged SmolLM2-135M-Instruct",
    ),
    Flag("tokenizer", None, "tokenizer path or hub id", shown="the model's"),
    Flag(
        "device",
        "auto",
        "'auto' (a CUDA GPU if usable, else the CPU), 'cpu', 'cuda' or 'cuda:N'",
        type=t.device,
    ),
    Flag(
        "dtype",
        "auto",
        "weights and activations type: 'auto' is float32 on the CPU and on "
        "a GPU the checkpoint's 16-bit type, else bfloat16",
        type=t.dtype,
        metavar="{" + ",".join(t.DTYPE_CHOICES) + "}",
    ),
    Flag(
        "max_model_len",
        None,
        "longest prompt + output in tokens (also 32k = 32000, 32K = 32768, as vLLM)",
        type=t.token_count_at_least(2),
        shown="the model's context length",
    ),
    Flag("block_size", 16, "tokens per KV-cache block", type=t.power_of_two(256)),
    Flag(
        "gpu_memory_utilization",
        0.9,
        "fraction of GPU memory for weights, activations and "
        "KV cache; the KV cache gets what the rest leaves (ignored on the CPU)",
        type=t.float_in(0.0, 1.0, lo_open=True),
    ),
    Flag(
        "kv_cache_space",
        None,
        "GiB of KV cache when running on the CPU; ignored on a GPU, "
        "where --gpu-memory-utilization sizes the cache",
        type=t.float_in(0.0, lo_open=True),
        shown="4 GiB",
    ),
    Flag(
        "kv_cache_dtype",
        "auto",
        KV_CACHE_DTYPE_HELP,
        type=t.choice_of(KV_CACHE_DTYPE_CHOICES),
        metavar="{" + ",".join(KV_CACHE_DTYPE_CHOICES) + "}",
    ),
    Flag(
        "quantization",
        None,
        "weight quantization, as vLLM's: 'fp8' (also quantises an "
        "unquantised checkpoint at load), 'awq' or 'gptq'; other methods are refused by name",
        shown="the checkpoint's quantization_config, if any",
    ),
    Flag("max_num_seqs", 256, "most sequences in one engine step", type=t.int_at_least(1)),
    Flag(
        "max_num_batched_tokens",
        None,
        "token budget of one engine step (32k-style counts too)",
        type=t.token_count_at_least(1),
        shown="2048 on the CPU, 8192 on a GPU; at least --max-model-len without chunked prefill",
    ),
    Flag(
        "enable_prefix_caching",
        True,
        "reuse the KV blocks of shared prompt prefixes",
        kind="toggle",
        shown="on",
    ),
    Flag(
        "enable_chunked_prefill",
        True,
        "split long prefills across steps, batched with decodes",
        kind="toggle",
        shown="on",
    ),
    Flag(
        "preemption_mode",
        "recompute",
        "what happens to a sequence preempted when KV blocks "
        "run out: its KV is recomputed later, or swapped to host memory",
        type=t.choice_of(("recompute", "swap")),
        metavar="{recompute,swap}",
    ),
    Flag(
        "swap_space",
        4.0,
        "GiB of host memory for swapped-out blocks (used by --preemption-mode swap)",
        type=t.float_in(0.0),
    ),
    Flag("enforce_eager", False, "do not capture CUDA graphs for decode steps", kind="switch"),
    Flag(
        "max_seq_len_to_capture",
        8192,
        "CUDA graphs cover decode steps whose sequences are at most this long (longer: eager)",
        type=t.int_at_least(1),
    ),
    Flag(
        "num_gpu_blocks_override",
        None,
        "KV-cache blocks on the device, instead of what memory allows (to reproduce a run)",
        type=t.int_at_least(1),
        shown="from free memory",
    ),
    Flag(
        "disable_cascade_attn",
        False,
        "no cascade attention: decode rows sharing cached prefix blocks read them each",
        kind="switch",
    ),
    Flag(
        "cascade_cuda_graphs",
        False,
        "capture the decode CUDA graphs' cascade variant too (replayed on steps whose rows "
        "share a cached prefix)",
        kind="switch",
    ),
    Flag(
        "async_scheduling",
        None,
        "schedule and launch the next step while the device runs the current one (same "
        "outputs as the serial loop); auto: on, except with speculative decoding or pooling, "
        "which run the serial loop, and with tensor/pipeline parallelism (opt in there)",
        kind="toggle",
        shown="auto",
    ),
    Flag(
        "max_logprobs",
        20,
        "most logprobs (and prompt logprobs) a request may ask for; -1: the vocabulary size",
        type=t.int_at_least(-1),
    ),
    Flag("seed", 0, "seed of the engine's random draws", type=int),
    Flag(
        "scheduling_policy",
        "fcfs",
        "which waiting request runs first: 'fcfs' (arrival order) "
        "or 'priority' (the request's priority, lower first, then arrival; a server request "
        "with a priority other than 0 is refused under fcfs)",
        type=t.choice_of(("fcfs", "priority")),
        metavar="{fcfs,priority}",
    ),
    Flag(
        "tensor_parallel_size",
        1,
        "ranks each layer is split over (one process per rank, "
        "each on its own GPU, or on the CPU with gloo)",
        type=t.int_at_least(1),
    ),
    Flag(
        "pipeline_parallel_size",
        1,
        "pipeline stages the layers are split into (ranks = "
        "tensor x pipeline parallel size; under torchrun, its WORLD_SIZE)",
        type=t.int_at_least(1),
    ),
    Flag(
        "pipeline_micro_batch_tokens",
        256,
        "under pipeline parallelism, a step with at least twice this many prefill tokens "
        "runs as micro-batches of at least this many (at most one per stage), so the stages "
        "overlap; 0: never (decode-only steps always run whole)",
        type=t.int_at_least(0),
    ),
    Flag(
        "tp_all_reduce",
        "nccl",
        "the tensor-parallel all-reduce: nccl (the process group's; gloo on the CPU) or "
        "one_shot (CUDA: a symmetric-memory one-shot all-reduce over NVLink for messages "
        "up to 4 MiB, NCCL above)",
        type=t.choice_of(("nccl", "one_shot")),
        metavar="{nccl,one_shot}",
    ),
    Flag(
        "enable_lora",
        False,
        "serve LoRA adapters (PEFT folders) next to the base model",
        kind="switch",
    ),
    Flag(
        "max_loras",
        1,
        "LoRA adapter slots on the device: the most adapters one step runs",
        type=t.int_at_least(1),
    ),
    Flag("max_lora_rank", 16, "largest LoRA rank an adapter may have", type=t.int_at_least(1)),
    Flag(
        "max_cpu_loras",
        None,
        "LoRA adapters kept in host memory",
        type=t.int_at_least(1),
        shown="--max-loras",
    ),
    Flag(
        "lora_kernel",
        "auto",
        "how the adapters' deltas run: 'pagedkv' (the core's BGMV ops, every device and "
        "dtype), 'pagedkv_tiled' (their tiled CUDA variant), 'grouped_mm' (torch._grouped_mm "
        "SGMV, bf16 on sm90+), 'dense' (GEMMs over all slots under a one-hot slot mask), "
        "'auto': dense on CUDA while all slots add at most 50%% of a layer's weight bytes, "
        "else grouped_mm where it applies, else pagedkv",
        type=t.choice_of(LORA_KERNELS),
        metavar="{" + ",".join(LORA_KERNELS) + "}",
    ),
    # Pooling models (embeddings, classifiers, cross-encoders): vLLM's names.
    Flag(
        "task",
        "auto",
        "what the model serves: 'generate', or a pooling task: 'embed' (/v1/embeddings), "
        "'classify' (/classify), 'score' (/score, /rerank), 'reward' (/pooling); 'auto': from "
        "the checkpoint (a *ForSequenceClassification classifies, a bare *Model embeds)",
        type=t.choice_of(("auto", "generate", "embed", "embedding", "classify", "score", "reward")),
        metavar="{auto,generate,embed,classify,score,reward}",
    ),
    Flag(
        "runner",
        "auto",
        "'generate' or 'pooling' (the pooling task follows the checkpoint)",
        type=t.choice_of(("auto", "generate", "pooling")),
        metavar="{auto,generate,pooling}",
    ),
    Flag(
        "convert",
        "auto",
        "serve a causal LM as a pooling model: 'embed' (last-token hidden states)",
        type=t.choice_of(("auto", "none", "embed", "classify", "reward")),
        metavar="{auto,none,embed,classify,reward}",
    ),
    Flag(
        "pooler_config",
        None,
        "JSON object of pooler settings over the checkpoint's, e.g. "
        '\'{"pooling_type": "MEAN", "normalize": false}\'',
        type=t.json_object,
        shown="the checkpoint's sentence-transformers config, else vLLM's defaults",
    ),
    Flag(
        "override_pooler_config",
        None,
        "older name of --pooler-config",
        type=t.json_object,
        shown="none",
    ),
    Flag(
        "limit_mm_per_prompt",
        None,
        "JSON object: the most items of each modality one prompt may carry, e.g. '{\"image\": 2}'",
        type=t.json_object,
        shown="999 per modality (vLLM's)",
    ),
    Flag(
        "allowed_local_media_path",
        None,
        "directory whose image files chat image_url parts may name as file:// URLs (symlinks "
        "and '..' resolved first)",
        type=t.existing_dir,
        shown="none: file:// URLs are refused",
        metavar="DIR",
    ),
    # Where the model comes from and how its config is read.
    Flag("revision", None, "hub branch, tag or commit of the model", shown="main"),
    Flag(
        "tokenizer_revision",
        None,
        "hub revision of the tokenizer",
        shown="--revision for the model's own tokenizer",
    ),
    Flag(
        "download_dir",
        None,
        "Hugging Face cache folder to read and download models into",
        shown="HF_HUB_CACHE, or HF_HOME/hub",
    ),
    Flag(
        "hf_overrides",
        None,
        "JSON object of config.json keys to replace, e.g. '{\"max_position_embeddings\": 4096}'",
        type=t.json_object,
        shown="none",
    ),
    Flag(
        "rope_scaling",
        None,
        "JSON object replacing config.json's rope_scaling, e.g. "
        '\'{"rope_type": "yarn", "factor": 4.0, '
        '"original_max_position_embeddings": 32768}\'',
        type=t.json_object,
        shown="the config's",
    ),
    Flag(
        "rope_theta",
        None,
        "rope base replacing config.json's rope_theta",
        type=t.float_in(0.0, lo_open=True),
        shown="the config's",
    ),
    Flag(
        "generation_config",
        "auto",
        "sampling defaults: 'auto' reads the model's "
        "generation_config.json, 'vllm' ignores it, or a folder holding one",
    ),
    Flag(
        "override_generation_config",
        None,
        "JSON object of generation-config keys replaced (e.g. '{\"temperature\": 0.5}')",
        type=t.json_object,
        shown="none",
    ),
    Flag(
        "speculative_config",
        None,
        "JSON object of vLLM's speculative config: n-gram prompt lookup, e.g. "
        '\'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, '
        '"prompt_lookup_min": 2}\', or a draft model with the same vocabulary, e.g. '
        '\'{"model": "path/or/hub-id", "num_speculative_tokens": 3}\'',
        type=t.json_object,
        shown="none (no speculation)",
    ),
    # vLLM flags that change nothing here, accepted so that vLLM command lines run unchanged.
    Flag(
        "trust_remote_code",
        False,
        "accepted for vLLM compatibility: pagedkv runs its own "
        "model code, never a checkpoint's, so this changes nothing",
        kind="switch",
    ),
    Flag(
        "disable_log_stats",
        False,
        "accepted for vLLM compatibility: pagedkv logs no periodic stats",
        kind="switch",
    ),
)
ENGINE_FLAG = {f.dest: f for f in ENGINE_FLAGS}
ENGINE_DEFAULTS: Dict[str, Any] = {f.dest: f.default for f in ENGINE_FLAGS}

# Spellings that earlier versions accepted: still parsed, hidden from --help, and warned about.
DEPRECATED_ALIASES = {
    "--no-prefix-caching": "--no-enable-prefix-caching",
    "--no-chunked-prefill": "--no-enable-chunked-prefill",
}


class _Toggle(argparse.BooleanOptionalAction):
    """--x / --no-x. Python < 3.11 appends its own "(default: True)"; ours states it once."""

    def __init__(self, *args: Any, help: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(*args, help=help, **kwargs)
        self.help = help


class _DeprecatedOff(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        print(f"warning: {option} is deprecated; use {DEPRECATED_ALIASES[option]}", file=sys.stderr)
        setattr(namespace, self.dest, False)


def add_flag(group: Any, flag: Flag, suppress: bool = False, **override: Any) -> None:
    """Adds ``flag``; ``suppress`` leaves it out of the namespace unless given (``serve`` layers
    a config file under the command line), and the help still states the real default."""
    if override:
        flag = dataclasses.replace(flag, **override)
    default = argparse.SUPPRESS if suppress else flag.default
    if flag.kind == "toggle":
        group.add_argument(flag.option, action=_Toggle, default=default, help=flag.full_help)
        for old, new in DEPRECATED_ALIASES.items():
            if new == "--no-" + flag.option[2:]:
                group.add_argument(old, dest=flag.dest, action=_DeprecatedOff)
    elif flag.kind == "switch":
        group.add_argument(flag.option, action="store_true", default=default, help=flag.full_help)
    else:
        group.add_argument(
            flag.option, type=flag.type, default=default, metavar=flag.metavar, help=flag.full_help
        )


def add_engine_arguments(parser: argparse.ArgumentParser, suppress: bool = False) -> None:
    g = parser.add_argument_group("engine")
    for flag in ENGINE_FLAGS:
        add_flag(g, flag, suppress)
    add_vllm_only_flags(parser)


class _VllmOnly(argparse.Action):
    """A vLLM engine flag pagedkv does not have (pagedkv.engine.vllm_args): accepted with a
    value that changes nothing (its vLLM default), refused with the reason otherwise. Never
    stored: the engine has no such setting."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        value: Any = True if values is None else _json_or_text(values)
        try:
            check_vllm_arg(self.dest, value)
        except ValueError as e:
            raise argparse.ArgumentError(self, str(e)) from None


def _json_or_text(text: str) -> Any:
    """A flag's value as vLLM reads JSON-valued flags ('{}', '0', 'false'), else the text."""
    import json

    try:
        return json.loads(text)
    except ValueError:
        return text


def add_vllm_only_flags(parser: argparse.ArgumentParser) -> None:
    """Every vLLM engine flag that pagedkv refuses, hidden from --help (the table in
    pagedkv.engine.vllm_args says why for each), and the fields only LLM() takes."""
    for name in [*VLLM_ONLY_ARGS, *CLI_REFUSED_ARGS]:
        if name in ENGINE_FLAG:  # honoured since (an engine flag of its own): not refused
            continue
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            action=_VllmOnly,
            nargs="?",
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )


def engine_kwargs(args: argparse.Namespace) -> Dict[str, Any]:
    return {f.dest: getattr(args, f.dest) for f in ENGINE_FLAGS}


def check_engine_args(opts: Any) -> None:
    """Checks that need more than one flag, or the machine; run before loading the model."""
    if opts.preemption_mode == "swap" and not opts.swap_space > 0:
        raise CLIError(
            "--swap-space", f"must be > 0 GiB with --preemption-mode swap, got {opts.swap_space!r}"
        )
    if str(opts.device).startswith("cuda"):
        import torch

        import pagedkv

        if not (torch.cuda.is_available() and pagedkv.cuda_available()):
            raise CLIError(
                "--device",
                f"{opts.device!r}: no usable CUDA GPU here (pagedkv "
                f"built with CUDA: {pagedkv.build_info()['with_cuda']}, "
                f"torch sees one: {torch.cuda.is_available()})",
            )
        index = int(opts.device.split(":")[1]) if ":" in opts.device else 0
        if index >= torch.cuda.device_count():
            raise CLIError(
                "--device",
                f"{opts.device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)",
            )


_MAPPED = (ValueError, TypeError, FileNotFoundError)


def engine_error(err: BaseException, opts: Any = None) -> Optional[CLIError]:
    """An error raised while building the engine, as a CLIError naming the flag it is about
    (the engine's messages name the field: ``max_model_len=... is larger than ...``); None for
    an error that is not about a flag value. Where the message names several fields, or quotes
    a path, the flag the user set (``opts``) is the one named."""
    text = str(err).strip("'\"")
    mapped = isinstance(err, _MAPPED)
    # A RuntimeError counts only where it names a field (torch's own say "device" too).
    named = [w for w in re.findall(r"[a-z_]+", text) if w in ENGINE_FLAG and (mapped or "_" in w)]
    if opts is not None:
        given = [d for d in ENGINE_FLAG if getattr(opts, d, None) != ENGINE_DEFAULTS[d]]
        quoted = [
            d for d in given if isinstance(getattr(opts, d), str) and repr(getattr(opts, d)) in text
        ]
        named = quoted + [d for d in named if d in given] + named
    if named:
        return CLIError(ENGINE_FLAG[named[0]].option, text)
    return CLIError(None, text) if mapped else None


def build_llm(args: argparse.Namespace) -> Any:
    """``LLM(**engine_kwargs(args))`` with setup errors reported as flag errors. Its callers
    (generate, chat, bench) generate text: they ask for a generation engine (runner
    'generate'), so that a pooling model is refused as a --model error from its config alone,
    before its weights are loaded (runner_choice.engine_task)."""
    from pagedkv.engine.llm import LLM
    from pagedkv.engine.runner_choice import PoolingOnlyModelError

    check_engine_args(args)
    for flag, dest, generative in _POOLING_FLAGS:
        value = getattr(args, dest)
        if value not in generative:
            raise CLIError(
                flag,
                f"this command generates text; {value!r} asks for a pooling model (serve it "
                "with `pagedkv serve`: /v1/embeddings, /classify, /score, ...)",
            )
    try:
        return LLM(**dict(engine_kwargs(args), runner="generate"))
    except PoolingOnlyModelError as e:
        raise CLIError(
            "--model",
            f"this command generates text, but the model ({e.architecture}) serves the "
            f"pooling task {e.task!r} (serve it with `pagedkv serve`: /v1/embeddings, "
            "/classify, /score, ...)",
        ) from e
    except (*_MAPPED, RuntimeError) as e:
        mapped = engine_error(e, args)
        if mapped is None:
            raise
        raise mapped from e


# The flags that would make build_llm's engine a pooling one, with their generative values.
_POOLING_FLAGS = (
    ("--task", "task", ("auto", "generate")),
    ("--runner", "runner", ("auto", "generate")),
    ("--convert", "convert", ("auto", "none")),
)


# SamplingParams field -> flag (SamplingParams' messages name the field).
SAMPLING_FLAGS = {
    "max_tokens": "--max-tokens",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "min_p": "--min-p",
    "repetition_penalty": "--repetition-penalty",
    "seed": "--sampling-seed",
    "stop": "--stop",
    "n": "-n",
}


def add_sampling_arguments(
    parser: argparse.ArgumentParser, max_tokens: int = 128, temperature: float = 0.7
) -> None:
    g = parser.add_argument_group("sampling")
    a = g.add_argument
    a("--max-tokens", type=t.int_at_least(1), default=max_tokens, help="tokens to generate at most")
    a(
        "--temperature",
        type=t.float_in(0.0),
        default=temperature,
        help="sampling temperature; 0 = greedy",
    )
    a(
        "--top-p",
        type=t.float_in(0.0, 1.0, lo_open=True),
        default=1.0,
        help="nucleus sampling: keep the most likely tokens up to this probability mass",
    )
    a(
        "--top-k",
        type=t.int_at_least(-1),
        default=0,
        help="keep the k most likely tokens (0 or -1 = off)",
    )
    a(
        "--min-p",
        type=t.float_in(0.0, 1.0),
        default=0.0,
        help="drop tokens less likely than this fraction of the most likely one",
    )
    a(
        "--repetition-penalty",
        type=t.float_in(0.0, lo_open=True),
        default=1.0,
        help="> 1 discourages repeating prompt or output tokens",
    )
    a(
        "--sampling-seed",
        type=int,
        default=None,
        help="seed of this request's sampling, for reproducible output (default: random)",
    )
    a(
        "--stop",
        action="append",
        default=None,
        help="stop string; repeat the flag for several (default: none)",
    )


def sampling_params(args: argparse.Namespace, **overrides: Any) -> Any:
    """SamplingParams from the flags; a value it rejects is reported as a flag error."""
    from pagedkv.engine.sampling_params import SamplingParams

    kw = dict(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.sampling_seed,
        stop=args.stop,
    )
    kw.update(overrides)
    try:
        return SamplingParams(**kw)
    except ValueError as e:
        name = str(e).split()[0]
        raise CLIError(SAMPLING_FLAGS.get(name), str(e)) from e
