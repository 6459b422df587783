"""What CI runs, it runs: a missing package, binary or kernel interpreter fails under ``CI=true``.

Elsewhere the same test is skipped and says why. Each case runs pytest in a process of its own,
on a small test file, with and without ``CI=true``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: pytest's exit codes for "nothing failed": a module skipped whole leaves no test collected.
PASSED_OR_ALL_SKIPPED = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)

NEEDS_WHAT_IS_MISSING = """
import sys

from tests.services import require_binary, require_module


def test_a_package_that_is_not_installed():
    require_module("advmon_no_such_package")


def test_an_installed_package_hidden_from_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml raises ModuleNotFoundError now
    require_module("yaml")


def test_a_binary_that_is_not_installed():
    require_binary("advmon-no-such-binary")
"""

MODULE_NEEDS_WHAT_IS_MISSING = """
from tests.services import require_module

require_module("advmon_no_such_package")


def test_never_collected():
    pass
"""


def pytest_in(directory: Path, args: list[str], ci: bool, **variables: str) -> subprocess.CompletedProcess:
    """``python -m pytest args`` in ``directory`` with this repository importable, ``CI=true`` or no CI at all."""
    environment = {key: value for key, value in os.environ.items() if key != "CI"}
    environment["PYTHONPATH"] = str(ROOT)
    environment.update(variables)
    if ci:
        environment["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args],
                          cwd=directory, env=environment, capture_output=True, text=True, timeout=300)


def test_a_missing_package_or_binary_fails_in_ci_and_is_skipped_elsewhere(tmp_path):
    (tmp_path / "test_needs.py").write_text(NEEDS_WHAT_IS_MISSING)
    (tmp_path / "test_module_needs.py").write_text(MODULE_NEEDS_WHAT_IS_MISSING)
    missing = ("advmon_no_such_package is not installed", "yaml is not installed",
               "advmon-no-such-binary is not installed")
    elsewhere = pytest_in(tmp_path, ["test_needs.py", "test_module_needs.py"], ci=False)
    assert elsewhere.returncode == pytest.ExitCode.OK and "4 skipped" in elsewhere.stdout, elsewhere.stdout
    assert "failed" not in elsewhere.stdout and all(reason in elsewhere.stdout for reason in missing)
    # A module's collection error stops the session before any test runs: let it go on to see all four.
    in_ci = pytest_in(tmp_path, ["--continue-on-collection-errors", "test_needs.py", "test_module_needs.py"], ci=True)
    assert in_ci.returncode == pytest.ExitCode.TESTS_FAILED, in_ci.stdout
    assert "3 failed" in in_ci.stdout and "1 error" in in_ci.stdout and "skipped" not in in_ci.stdout, in_ci.stdout
    assert all(reason in in_ci.stdout for reason in missing)


def test_an_inherited_triton_interpret_0_no_longer_skips_the_kernel_tests():
    """Regression: TRITON_INTERPRET=0 from the environment skipped 22 kernel tests without a word in CI."""
    # Two kernel tests that run the interpreter and skip with the bug; quick ones (the multi-block test it once
    # ran here takes 12 s of CPU, which the suite spends on it anyway).
    chosen = ["tests/test_triton_kernels.py::test_views_read_where_they_lie",
              "tests/test_triton_kernels.py::test_the_row_hash_kernel_is_the_torch_paths_hash_bit_for_bit"
              "[every-other-row-torch.float32]"]
    done = pytest_in(ROOT, chosen, ci=True, TRITON_INTERPRET="0", CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 0 and "2 passed" in done.stdout and "skipped" not in done.stdout, done.stdout


def test_kernels_defined_without_the_interpreter_fail_in_ci_where_there_is_no_gpu(tmp_path):
    """Where advmon's kernels were defined before the suite chose Triton's interpreter, they cannot run
    on CPU tensors: CI fails (elsewhere the tests are skipped and say why)."""
    run_first = tmp_path / "define_kernels_first.py"  # a plugin pytest imports before tests/conftest.py
    run_first.write_text(textwrap.dedent("""
        import os

        os.environ["TRITON_INTERPRET"] = "0"
        import advmon.stats.triton_sketch  # noqa: E402,F401 - the kernels are defined for a GPU compiler now
    """))
    chosen = "test_views_read_where_they_lie"
    args = ["-p", "define_kernels_first", "tests/test_triton_kernels.py", "-k", chosen]
    variables = {"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    in_ci = pytest_in(ROOT, args, ci=True, **variables)
    assert in_ci.returncode != 0 and "without Triton's interpreter" in in_ci.stdout, in_ci.stdout
    elsewhere = pytest_in(ROOT, args, ci=False, **variables)
    assert elsewhere.returncode in PASSED_OR_ALL_SKIPPED and "skipped" in elsewhere.stdout, elsewhere.stdout
    assert "without Triton's interpreter" in elsewhere.stdout
