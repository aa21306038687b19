"""`pagedkv generate / chat / bench` on a pooling model (an encoder or a classifier): bench died
with a traceback and chat started its prompt loop, to fail at the first message. Each now
stops with a --model error, as argparse reports one (exit code 2)."""

from __future__ import annotations

import logging

import pytest
from support.deps import need

need("torch")
need("transformers")

from pagedkv.entrypoints.cli import main  # noqa: E402
from pagedkv.testing import save_random_encoder  # noqa: E402


@pytest.fixture(autouse=True)
def _keep_pagedkv_logger():
    """main() in process gives the "pagedkv" logger a handler on the captured stderr, which
    later tests would write to after capsys closed it: restored afterwards."""
    logger = logging.getLogger("pagedkv")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> str:
    return save_random_encoder(str(tmp_path_factory.mktemp("audit3_cli_enc")), "bert")


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "hi"],
        ["chat"],
        ["bench", "--num-prompts", "1", "--input-len", "4", "--output-len", "2"],
    ],
)
def test_generation_commands_refuse_pooling_models(encoder: str, argv, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--model", encoder, "--kv-cache-space", "0.01", "--max-model-len", "32"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --model: this command generates text" in err and "'embed'" in err
