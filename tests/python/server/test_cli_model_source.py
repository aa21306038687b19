"""The model-source flags (vLLM's names) reach EngineConfig as typed values: --revision,
--tokenizer-revision, --download-dir, --hf-overrides / --rope-scaling (JSON objects),
--rope-theta, --generation-config, --override-generation-config."""

from __future__ import annotations

import pytest
from pagedkv.engine.config import EngineConfig
from pagedkv.entrypoints.cli import build_parser
from pagedkv.entrypoints.engine_args import engine_kwargs


def test_flags_reach_the_engine_config(tmp_path) -> None:
    args = build_parser().parse_args(
        [
            "generate",
            "Hi",
            "--model",
            "org/name",
            "--revision",
            "dev",
            "--tokenizer-revision",
            "v1",
            "--download-dir",
            str(tmp_path),
            "--hf-overrides",
            '{"max_position_embeddings": 64}',
            "--rope-scaling",
            '{"rope_type": "linear", "factor": 2.0}',
            "--rope-theta",
            "5e5",
            "--generation-config",
            "vllm",
            "--override-generation-config",
            '{"temperature": 0.5}',
        ]
    )
    kw = engine_kwargs(args)
    cfg = EngineConfig.from_kwargs(**kw)
    assert (cfg.model, cfg.revision, cfg.tokenizer_revision) == ("org/name", "dev", "v1")
    assert cfg.download_dir == str(tmp_path) and cfg.generation_config == "vllm"
    assert cfg.override_generation_config == {"temperature": 0.5}
    assert cfg.config_overrides() == {
        "max_position_embeddings": 64,
        "rope_theta": 5e5,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    }


@pytest.mark.parametrize(
    "flag,value",
    [("--hf-overrides", "[1, 2]"), ("--rope-scaling", "not json"), ("--rope-theta", "-1")],
)
def test_bad_values_are_flag_errors(flag: str, value: str, capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", flag, value])
    assert f"argument {flag}" in capsys.readouterr().err
