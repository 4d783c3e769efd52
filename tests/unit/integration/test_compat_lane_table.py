"""The compatibility lane's whole-suite table (scripts/compat_lane.py ``--whole-suite``): one row per test file,
read from the JUnit XML that pytest itself writes for a small suite made here, whose outcomes are known by
construction (a pass, a parametrised failure, a skip, a teardown error, a module that does not import)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

_OK = '''
import pytest

class TestA:
    def test_x(self):
        pass

@pytest.mark.parametrize("a", [1, 2, 3])
def test_p(a):
    assert a != 2

def test_s():
    pytest.skip("a reason")

@pytest.fixture
def broken():
    yield
    raise RuntimeError("teardown")

def test_teardown(broken):
    pass
'''


def _lane():
    spec = importlib.util.spec_from_file_location("compat_lane", ROOT / "scripts" / "compat_lane.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_whole_suite_table_has_a_row_per_file_with_each_outcome_counted(tmp_path: Path) -> None:
    suite = tmp_path / "tests" / "sub"
    suite.mkdir(parents=True)
    (suite / "test_ok.py").write_text(_OK)
    (suite / "test_bad.py").write_text("import a_module_that_is_not_there\n")
    junit = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
                    "--continue-on-collection-errors", f"--junitxml={junit}", "tests"],
                   cwd=tmp_path, capture_output=True, check=False, timeout=120)
    table = _lane().per_file(junit)
    counts = {name: {key: int(value) for key, value in row.items() if key != "seconds"} for name, row in table.items()}
    assert counts == {
        "tests/sub/test_bad.py": {"passed": 0, "failed": 0, "errors": 1, "skipped": 0},
        # TestA.test_x, test_p[1], test_p[3] pass; test_p[2] fails; test_teardown's error is its one row
        "tests/sub/test_ok.py": {"passed": 3, "failed": 1, "errors": 1, "skipped": 1},
    }
