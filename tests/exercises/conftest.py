"""Run the exercise tests against the reference solutions (default) or against the learner's stubs.

    pytest tests/exercises                          # reference solutions: what CI runs
    pytest tests/exercises --impl=learner           # your code in lessons/exercises/
    pytest tests/exercises --impl=learner -k e01_1  # one exercise

A test file `test_eNN_slug.py` tests the module `eNN_slug`: the `impl` fixture returns
`lessons.exercises.solutions.eNN_slug` or `lessons.exercises.eNN_slug`. The repository root goes on
`sys.path` here, so `lessons.exercises` imports without installing anything (`lessons/` is a namespace
package; `lessons/exercises/` and its `solutions/` are regular packages).

`--impl` is registered here, so pass it with a path under tests/exercises (as above); pytest reads the
option from this file before it parses the command line only when the path names this folder.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

IMPLS = {"reference": "lessons.exercises.solutions", "learner": "lessons.exercises"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--impl", choices=sorted(IMPLS), default="reference",
                     help="exercise code to test: the reference solutions (default) or the learner's stubs")


@pytest.fixture(scope="module")
def impl(request: pytest.FixtureRequest):
    """The module under test: the reference solution or the learner's stub of this test file's lesson."""
    which = request.config.getoption("--impl", default="reference")
    module = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    return importlib.import_module(f"{IMPLS[which]}.{module}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A stub that is still a stub fails with one line ("E01.1: ... not written yet"), not a traceback."""
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(NotImplementedError) and report.failed:
        report.longrepr = f"not written yet: {call.excinfo.value}"
