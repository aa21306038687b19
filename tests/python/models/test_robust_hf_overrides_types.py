"""hf_overrides values keep the JSON kind of the config.json value they replace (issue #25):
`{"num_hidden_layers": "x"}` failed later with an unnamed TypeError ('<' not supported between
'str' and 'int'); now it is refused naming the key, in the API and as a --hf-overrides flag error
(exit code 2). Numbers stay interchangeable (config.json spells rope_theta 10000 or 10000.0) and
null is let through (sliding_window: null turns it off)."""

from __future__ import annotations

import logging

import pytest
from support.deps import need

torch = need("torch")

from pagedkv import LLM  # noqa: E402
from pagedkv.entrypoints.cli import main  # noqa: E402
from pagedkv.models.config import ModelConfig, _merge  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return save_random_model(str(tmp_path_factory.mktemp("robust_hfo")), "tiny-llama", seed=1)


@pytest.fixture(autouse=True)
def _keep_pagedkv_logger():
    """main() in process gives the "pagedkv" logger a handler on the captured stderr."""
    logger = logging.getLogger("pagedkv")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


@pytest.mark.parametrize(
    "overrides,key,kind",
    [
        ({"num_hidden_layers": "x"}, "num_hidden_layers", "a number"),
        ({"rms_norm_eps": True}, "rms_norm_eps", "a number"),
        ({"tie_word_embeddings": 1}, "tie_word_embeddings", "a bool"),
        ({"hidden_act": 3}, "hidden_act", "a string"),
        ({"architectures": "LlamaForCausalLM"}, "architectures", "a list"),
    ],
)
def test_a_value_of_another_kind_is_refused_by_its_key(model_dir, overrides, key, kind) -> None:
    with pytest.raises(TypeError, match=rf"hf_overrides\['{key}'\] must be {kind}"):
        ModelConfig.from_hf_dir(model_dir, overrides)
    with pytest.raises(TypeError, match=rf"hf_overrides\['{key}'\]"):
        LLM(model_dir, device="cpu", kv_cache_space=0.01, hf_overrides=overrides)


def test_nested_keys_are_named_by_their_path(model_dir) -> None:
    # config.json's rope_scaling is null here: any JSON object may replace it (whole);
    # a nested object (a VLM's text_config) is merged, its keys named by their path.
    linear = {"rope_type": "linear", "factor": 2}
    cfg = ModelConfig.from_hf_dir(model_dir, {"rope_scaling": linear})
    assert cfg.rope_scaling == linear
    with pytest.raises(TypeError, match=r"\['text_config.factor'\] must be a number"):
        _merge({"text_config": {"factor": 2}}, {"text_config": {"factor": "4"}})


def test_a_token_id_may_become_a_list_and_back(model_dir) -> None:
    """eos_token_id 2 or [2, 7]: vLLM users widen it to a list (and ModelConfig takes both)."""
    wide = ModelConfig.from_hf_dir(model_dir, {"eos_token_id": [2, 7]})
    assert wide.eos_token_id == [2, 7]
    assert _merge({"eos_token_id": [2, 7]}, {"eos_token_id": 3}) == {"eos_token_id": 3}
    with pytest.raises(TypeError, match=r"\['eos_token_id'\] must be a number"):
        _merge({"eos_token_id": 2}, {"eos_token_id": ["2"]})


def test_same_kinds_numbers_and_null_pass(model_dir) -> None:
    cfg = ModelConfig.from_hf_dir(
        model_dir,
        {"rope_theta": 5e5, "max_position_embeddings": 96, "rms_norm_eps": 1, "new_key": "x"},
    )
    assert (cfg.rope_theta, cfg.max_position_embeddings, cfg.rms_norm_eps) == (5e5, 96, 1)


def test_cli_flag_error(model_dir, capsys) -> None:
    argv = ["generate", "hi", "--model", model_dir, "--kv-cache-space", "0.01"]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--hf-overrides", '{"num_hidden_layers": "x"}'])
    assert exit_info.value.code == 2
    assert "argument --hf-overrides: hf_overrides['num_hidden_layers']" in capsys.readouterr().err
