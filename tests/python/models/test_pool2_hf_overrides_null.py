"""hf_overrides that are not a JSON object, or that null a key the model needs, are refused by
name (issue #25): `--hf-overrides null` / a list / a string is a flag error (exit code 2),
LLM(hf_overrides=<not a dict>) a TypeError naming hf_overrides. A null key stands for "unset"
(sliding_window: null turns the window off); before, nulling a required key failed later with
an unnamed TypeError (vocab_size, intermediate_size, rope_theta), blamed config.json under an
alias (hidden_size -> 'n_embd'), or was silently taken (rms_norm_eps=None)."""

from __future__ import annotations

import logging

import pytest
from support.deps import need

need("torch")

from pagedkv import LLM  # noqa: E402
from pagedkv.entrypoints.cli import main  # noqa: E402
from pagedkv.models.config import ModelConfig  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("pool2_hfo")
    return save_random_model(str(root), "tiny-llama", seed=1, head_dim=32)


@pytest.fixture(autouse=True)
def _keep_pagedkv_logger():
    """main() in process gives the "pagedkv" logger a handler on the captured stderr."""
    logger = logging.getLogger("pagedkv")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


@pytest.mark.parametrize("text", ["null", "[1]", '"x"', "3", "{"])
def test_flag_must_be_a_json_object(model_dir, text, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "hi", "--model", model_dir, "--hf-overrides", text])
    assert exit_info.value.code == 2
    assert "argument --hf-overrides: must be a JSON object" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["x", [1], 3, True])
def test_api_refuses_a_non_dict(model_dir, value) -> None:
    with pytest.raises(TypeError, match="hf_overrides must be a dict"):
        LLM(model_dir, device="cpu", kv_cache_space=0.01, hf_overrides=value)


@pytest.mark.parametrize(
    "key",
    ["vocab_size", "hidden_size", "intermediate_size", "rms_norm_eps", "rope_theta", "hidden_act"],
)
def test_nulling_a_required_key_is_refused_by_name(model_dir, key) -> None:
    with pytest.raises(ValueError, match=f"hf_overrides sets '{key}' to null, which the model"):
        ModelConfig.from_hf_dir(model_dir, {key: None})


def test_null_for_an_optional_key_unsets_it(model_dir) -> None:
    cfg = ModelConfig.from_hf_dir(model_dir, {"sliding_window": None, "eos_token_id": None})
    assert cfg.sliding_window is None and cfg.eos_token_id is None
    assert ModelConfig.from_hf_dir(model_dir, None) == ModelConfig.from_hf_dir(model_dir, {})


def test_cli_names_the_flag(model_dir, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "hi", "--model", model_dir, "--hf-overrides", '{"vocab_size": null}'])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --hf-overrides: hf_overrides sets 'vocab_size' to null" in err
