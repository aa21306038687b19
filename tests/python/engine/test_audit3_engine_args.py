"""Engine arguments a generation engine would have accepted and ignored, or checked only at the
first request: pooler_config on a model that generates (no pooler to set), and an
override_generation_config whose sampling defaults every request would then fail on."""

from __future__ import annotations

import pytest
from support.deps import need

need("torch")

from pagedkv import LLM  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return save_random_model(
        str(tmp_path_factory.mktemp("audit3_args")),
        "tiny-llama",
        seed=3,
        tokenizer=False,
        head_dim=32,
    )


KW = dict(device="cpu", kv_cache_space=0.01, max_model_len=64, skip_tokenizer_init=True)


@pytest.mark.parametrize("name", ["pooler_config", "override_pooler_config"])
@pytest.mark.parametrize("task", [{}, {"task": "generate"}])
def test_pooler_config_is_refused_on_a_generation_engine(model: str, name: str, task) -> None:
    with pytest.raises(ValueError, match=f"{name} applies to pooling models"):
        LLM(model, **{name: {"pooling_type": "MEAN"}}, **task, **KW)


@pytest.mark.parametrize(
    ("override", "message"),
    [({"temperature": -1}, "temperature must be >= 0"), ({"max_new_tokens": 0}, "max_tokens")],
)
def test_bad_generation_override_is_refused_at_start(model: str, override, message) -> None:
    with pytest.raises(ValueError, match=f"override_generation_config: {message}"):
        LLM(model, override_generation_config=override, **KW)


def test_good_generation_override_sets_the_defaults(model: str) -> None:
    llm = LLM(model, override_generation_config={"temperature": 0.25}, **KW)
    assert llm.get_default_sampling_params().temperature == 0.25
