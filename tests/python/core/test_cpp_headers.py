"""The public C++ headers compile on their own and next to another copy of DLPack.

A C++ program that hands libtorch tensors to pagedkv includes ATen/DLConvertor.h, hence
ATen/dlpack.h; pagedkv's headers used to declare their own partial, unguarded DLPack and the
two collided ("'kDLCPU' conflicts with a previous declaration") in either include order.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
INCLUDE = ROOT / "include"
CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")


def compile_snippet(tmp_path: Path, source: str, *include_dirs: Path) -> str:
    """Compiler diagnostics of `source` (syntax only); '' when it compiles cleanly."""
    src = tmp_path / "snippet.cpp"
    src.write_text(source)
    args = [
        str(CXX),
        "-std=c++17",
        "-fsyntax-only",
        "-Wall",
        "-Wextra",
        "-Werror",
        f"-I{INCLUDE}",
        *(f"-I{d}" for d in include_dirs),
        str(src),
    ]
    proc = subprocess.run(args, capture_output=True, text=True)
    return "" if proc.returncode == 0 else proc.stderr[-3000:]


@pytest.mark.parametrize("header", sorted(p.name for p in (INCLUDE / "pagedkv").glob("*.h")))
def test_each_header_is_self_contained(tmp_path: Path, header: str) -> None:
    assert (
        compile_snippet(
            tmp_path, f"#include <pagedkv/{header}>\n#include <pagedkv/{header}>\nint main() {{}}\n"
        )
        == ""
    )


def other_dlpack(tmp_path: Path) -> Path:
    """An include dir holding `other/dlpack.h`, a copy of libtorch's ATen/dlpack.h (skips
    without torch)."""
    torch = pytest.importorskip("torch")
    aten = Path(torch.__file__).parent / "include" / "ATen" / "dlpack.h"
    if not aten.is_file():
        pytest.skip("torch ships no ATen/dlpack.h")
    (tmp_path / "other").mkdir()
    shutil.copy(aten, tmp_path / "other" / "dlpack.h")
    return tmp_path


USE_BOTH = """
int main() {
  // DLPack 1.x API from the other header, pagedkv's view of a DLTensor from ours.
  DLManagedTensorVersioned* versioned = nullptr;
  (void)versioned;
  float x = 1.0f;
  int64_t shape[1] = {1};
  DLTensor t{};
  t.data = &x;
  t.ndim = 1;
  t.shape = shape;
  t.dtype = DLDataType{kDLFloat, 32, 1};
  t.device = DLDevice{kDLCPU, 0};
  return static_cast<int>(pagedkv::TensorView::from_dlpack(t, "t").numel()) - 1;
}
"""


@pytest.mark.parametrize("order", ["other_first", "pagedkv_first"])
def test_headers_coexist_with_another_dlpack(tmp_path: Path, order: str) -> None:
    extra = other_dlpack(tmp_path)
    includes = ["#include <other/dlpack.h>", "#include <pagedkv/pagedkv.h>"]
    if order == "pagedkv_first":
        includes.reverse()
    assert compile_snippet(tmp_path, "\n".join(includes) + "\n" + USE_BOTH, extra) == ""


def test_vendored_dlpack_names_the_fp8_codes(tmp_path: Path) -> None:
    """The vendored header is DLPack >= 1.1: fp8 type codes have names (torch.float8_e4m3fn is
    kDLFloat8_e4m3fn = 10), which src/common/tensor.cpp uses."""
    source = (
        "#include <pagedkv/dlpack.h>\n"
        'static_assert(kDLFloat8_e4m3fn == 10, "DLPack 1.1 code");\n'
        'static_assert(DLPACK_MAJOR_VERSION == 1 && DLPACK_MINOR_VERSION >= 1, "1.1+");\n'
        "int main() {}\n"
    )
    assert compile_snippet(tmp_path, source) == ""
