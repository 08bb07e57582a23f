"""Check one exercise from a notebook (or a Python prompt) with the same tests CI runs.

    import sys; sys.path.insert(0, "..")          # in a notebook: the repository root, relative
    from lessons.exercises.check import check
    check("E01.1")                                # your stub; prints a one-line verdict, returns True/False
    check("E01.1", impl="reference")              # the reference solution, for comparison

It runs `pytest tests/exercises/test_eNN_*.py -k eNN_k --impl=...` in this process; the tests live in
tests/exercises/ and compare your code with the engine's own.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def check(exercise_id: str, impl: str = "learner", verbose: bool = False) -> bool:
    """Run the tests of `exercise_id` ("E01.1") against your code (or `impl="reference"`); True if all pass."""
    import pytest

    m = re.fullmatch(r"E(\d\d)\.(\d+)", exercise_id)
    if not m:
        raise ValueError(f"exercise ids look like 'E01.1', got {exercise_id!r}")
    tests = sorted((ROOT / "tests" / "exercises").glob(f"test_e{m.group(1)}_*.py"))
    if not tests:
        raise ValueError(f"no tests for {exercise_id} in tests/exercises/")
    # no cache folder, and no nbval: it is only for running notebooks, and slow to import
    args = [str(tests[0]), "-q", "-p", "no:cacheprovider", "-p", "no:nbval", "-k", f"e{m.group(1)}_{m.group(2)}",
            f"--impl={impl}", f"--rootdir={ROOT}"]
    # forget earlier imports, so an edited stub is read again
    for name in [n for n in sys.modules if n.startswith("lessons.exercises.e") or n.startswith("test_e")
                 or n.startswith("lessons.exercises.solutions.")]:
        del sys.modules[name]
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        code = pytest.main(args)
    lines = output.getvalue().strip().splitlines()
    print(output.getvalue() if verbose or code != 0 else (lines[-1] if lines else ""))
    return code == 0
