"""vLLM engine arguments that were neither honoured nor refused (issue #25: "every engine
argument of vLLM's EngineArgs either honoured or refused by name with the reason"): LLM(...)
said "unexpected engine argument" and `pagedkv serve --flag` "unrecognized arguments", with no
reason. Each is now refused naming itself and why, and its vLLM default is accepted, offline
and on the serve command line."""

from __future__ import annotations

import pytest
from pagedkv.engine.config import EngineConfig

# name -> (vLLM's default, a value that would change something)
ARGS = {
    "num_scheduler_steps": (1, 8),
    "logits_processor_pattern": (None, ".*"),
    "disable_async_output_proc": (False, "x"),
    "mm_processor_cache_gb": (4, 16),
    "enable_eplb": (False, True),
    "lora_extra_vocab_size": (256, 512),
    "skip_mm_profiling": (False, "x"),
    "interleave_mm_strings": (False, True),
    "media_io_kwargs": ({}, {"video": {"num_frames": 4}}),
    "mm_encoder_tp_mode": ("weights", "data"),
    "io_processor_plugin": (None, "plugin"),
    "enable_mm_embeds": (False, True),
    "video_pruning_rate": (None, 0.5),
    "mm_shm_cache_max_object_size_mb": (128, 512),
    "enable_return_routed_experts": (False, True),
}


@pytest.mark.parametrize("name", sorted(ARGS))
def test_refused_by_name_with_the_reason(name: str) -> None:
    default, other = ARGS[name]
    EngineConfig.from_kwargs(**{name: default})
    with pytest.raises(ValueError, match=rf"^{name}=.* is not supported: \w+"):
        EngineConfig.from_kwargs(**{name: other})


def test_serve_refuses_them_by_name(capsys: pytest.CaptureFixture) -> None:
    from pagedkv.entrypoints.cli import build_parser

    parser = build_parser()
    for name in ("num_scheduler_steps", "enable_eplb"):
        flag = "--" + name.replace("_", "-")
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(["serve", flag, "8" if name == "num_scheduler_steps" else "true"])
        assert exc.value.code == 2
        assert f"argument {flag}: {name}=" in capsys.readouterr().err
    parser.parse_args(["serve", "--num-scheduler-steps", "1"])  # vLLM's default passes
