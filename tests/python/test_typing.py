"""The installed package is typed: a py.typed marker, _C.pyi stubs that declare what
pagedkv/__init__.py imports from _C, lazily exported names visible to type checkers (through
TYPE_CHECKING imports) and to dir()."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pagedkv
from support.deps import need

PACKAGE = Path(pagedkv.__file__).parent


def test_py_typed_marker_and_stubs_are_installed() -> None:
    assert (PACKAGE / "py.typed").is_file(), "without py.typed type checkers ignore the stubs"
    stub = (PACKAGE / "_C.pyi").read_text()
    assert "\n__version__: str\n" in stub, "pagedkv/__init__.py imports __version__ from _C"


def test_every_exported_name_resolves_and_is_listed_by_dir() -> None:
    listed = dir(pagedkv)
    for name in pagedkv.__all__:
        assert name in listed, name
        assert getattr(pagedkv, name) is not None, name
    assert isinstance(pagedkv.__version__, str)


def test_lazy_names_are_listed_before_first_use() -> None:
    code = (
        "import pagedkv; assert 'LLM' not in vars(pagedkv); "
        "assert {'LLM', 'BlockAllocator', 'PagedAttention'} <= set(dir(pagedkv))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_mypy_sees_the_stubs_and_lazy_exports(tmp_path: Path) -> None:
    need("mypy")
    snippet = tmp_path / "use_pagedkv.py"
    snippet.write_text(
        "import pagedkv\n"
        "from pagedkv import ops\n"
        "version: str = pagedkv.__version__\n"
        "reveal_type(pagedkv.LLM)\n"
        "reveal_type(pagedkv.BlockAllocator)\n"
        "reveal_type(pagedkv.PagedAttention)\n"
        "reveal_type(pagedkv.SamplingParams)\n"
        "reveal_type(ops.paged_attention_v1)\n"
        # vLLM code passes output kinds as the enum or as its strings
        "kinds = [pagedkv.SamplingParams(output_kind='final_only'),\n"
        "         pagedkv.SamplingParams(output_kind=pagedkv.RequestOutputKind.DELTA)]\n"
    )
    # Run from tmp_path so that the installed package (not a source checkout) is checked.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(snippet),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "pagedkv.engine.llm.LLM" in out, out
    assert "pagedkv._C.BlockAllocator" in out, out
    assert "pagedkv.attention.PagedAttention" in out, out
    assert 'Revealed type is "Any"' not in out, out
