"""Serving Lab exercises: your stubs live here, one module per lesson (`eNN_<lesson slug>.py`).

Each exercise `ENN.k` is a function or class that raises `NotImplementedError("ENN.k ...")` until you
write it; its statement is the docstring (the lesson repeats it under the anchor `#eNN-k`). A *debug*
exercise is the other way round: its code is written and runs, its docstring starts with "ENN.k (debug)",
and it has a bug that its tests expose; fix the code in place. Check your work from the repository root:

    pytest tests/exercises --impl=learner                 # all exercises, against your code
    pytest tests/exercises --impl=learner -k e01_1        # one exercise
    pytest tests/exercises                                # the reference solutions (what CI runs)

or, from a notebook, `from lessons.exercises.check import check; check("E01.1")`.

How this folder is imported: `lessons/` is a namespace package (it holds Markdown, so it has no
`__init__.py`), while `lessons/exercises/` and `lessons/exercises/solutions/` are regular packages. Tests
put the repository root on `sys.path` (tests/exercises/conftest.py), so `import lessons.exercises.e01_...`
works without installing anything; notebooks do `sys.path.insert(0, "..")` for the same reason.

Reference solutions are in `solutions/`. Where the engine already implements the idea, the reference is
a thin wrapper around the engine's own code, so reading it sends you to the real thing.
"""
