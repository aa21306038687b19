"""`pagedkv generate / chat / bench` on a pooling-only checkpoint (an encoder, a bare model, a
classifier) are refused from its config alone: a --model error (exit code 2) naming the
pooling task, before any weight is read and with EngineConfig built once. The same rule
(runner_choice.engine_task) refuses LLM(..., runner='generate') on such a checkpoint, and a
pooling flag given to a generating command is refused by its name."""

from __future__ import annotations

import logging
from typing import Any, List

import pytest
from support.deps import need

need("torch")
need("transformers")

from pagedkv import LLM  # noqa: E402
from pagedkv.engine import llm_engine, pooling_engine  # noqa: E402
from pagedkv.engine.config import EngineConfig  # noqa: E402
from pagedkv.engine.runner_choice import PoolingOnlyModelError  # noqa: E402
from pagedkv.entrypoints.cli import main  # noqa: E402
from pagedkv.testing import save_random_encoder, save_random_model  # noqa: E402

ENGINE = ["--kv-cache-space", "0.01", "--max-model-len", "32"]
COMMANDS = [
    ["generate", "hi"],
    ["chat"],
    ["bench", "--num-prompts", "1", "--input-len", "4", "--output-len", "2"],
]


@pytest.fixture(autouse=True)
def _keep_pagedkv_logger():
    """main() in process gives the "pagedkv" logger a handler on the captured stderr."""
    logger = logging.getLogger("pagedkv")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("pool2_cli")
    return {
        "encoder": (save_random_encoder(str(root / "bert"), "bert"), "BertModel", "embed"),
        "classifier": (
            save_random_encoder(str(root / "xlmr"), "xlm-roberta", num_labels=2),
            "XLMRobertaForSequenceClassification",
            "classify",
        ),
        "causal": (
            save_random_model(str(root / "llama"), "tiny-llama", seed=1, head_dim=32),
            "",
            "",
        ),
    }


@pytest.fixture
def no_loading(monkeypatch) -> List[Any]:
    """Records EngineConfig builds; loading any model fails the test."""
    built: List[Any] = []
    real = EngineConfig.from_kwargs.__func__  # type: ignore[attr-defined]

    def recording(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
        built.append(real(cls, *args, **kwargs))
        return built[-1]

    def load(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(EngineConfig, "from_kwargs", classmethod(recording))
    for module in (llm_engine, pooling_engine):  # (each engine's parts: its weights)
        monkeypatch.setattr(module, "build_engine_parts", load)
    return built


@pytest.mark.parametrize("argv", COMMANDS)
@pytest.mark.parametrize("kind", ["encoder", "classifier"])
def test_refused_from_the_config_alone(checkpoints, kind, argv, no_loading, capsys) -> None:
    path, arch, task = checkpoints[kind]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--model", path, *ENGINE])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --model: this command generates text" in err
    assert f"({arch}) serves the pooling task {task!r}" in err
    assert len(no_loading) == 1  # EngineConfig built once


@pytest.mark.parametrize(
    "flag,value", [("--task", "embed"), ("--runner", "pooling"), ("--convert", "embed")]
)
def test_a_pooling_flag_is_refused_by_name(checkpoints, flag, value, no_loading, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "hi", "--model", checkpoints["causal"][0], *ENGINE, flag, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: this command generates text; {value!r} asks for a pooling" in err
    assert not no_loading  # refused before EngineConfig


@pytest.mark.parametrize("kwarg", [{"runner": "generate"}, {"task": "generate"}])
def test_llm_generate_runner_refuses_a_pooling_checkpoint(checkpoints, kwarg, no_loading) -> None:
    path, arch, _ = checkpoints["encoder"]
    with pytest.raises(
        PoolingOnlyModelError,
        match=f"{arch} is an encoder model.*cannot generate text.*task='embed'",
    ):
        LLM(path, device="cpu", kv_cache_space=0.01, **kwarg)


def test_a_causal_model_still_generates(checkpoints, capsys) -> None:
    path = checkpoints["causal"][0]
    assert main(["generate", "hi", "--model", path, *ENGINE, "--max-tokens", "2"]) == 0
    assert capsys.readouterr().out.startswith("hi")
