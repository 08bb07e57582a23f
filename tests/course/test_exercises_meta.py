"""CI-side checks of the exercises (lessons/CONTRIBUTING.md, "Exercises"): stubs keep the reference's signatures and are
still unsolved. That the reference passes is checked by tests/exercises itself, which runs against the
reference unless told `--impl=learner` (the last test here pins that default).

Both checks are functions returning problems, so the fixture tests at the end can show each one failing
on a small broken pair of modules."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import textwrap
import types
from pathlib import Path

import pytest
from course_plan import LESSONS

WITH_EXERCISES = [lesson for lesson in LESSONS if lesson.exercises]


def public_api(module: types.ModuleType) -> dict[str, object]:
    """Functions and classes a module defines itself (not those it imports), by name."""
    return {name: obj for name, obj in vars(module).items()
            if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
            and obj.__module__ == module.__name__}


def class_methods(cls: type) -> dict[str, object]:
    """`__init__` and the public methods and properties a class defines, as plain functions."""
    out = {}
    for name, member in vars(cls).items():
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(member, property):
            out[name] = member.fget
        elif isinstance(member, (staticmethod, classmethod)):
            out[name] = member.__func__
        elif inspect.isfunction(member):
            out[name] = member
    return out


def signature_problems(stub: types.ModuleType, reference: types.ModuleType) -> list[str]:
    """Names of the reference's API that the stub lacks or declares differently."""
    problems = []
    api = public_api(reference)
    if not api:
        return [f"{reference.__name__} defines no function or class"]
    for name, ref_obj in api.items():
        stub_obj = getattr(stub, name, None)
        if stub_obj is None:
            problems.append(f"{stub.__name__} lacks {name}")
        elif inspect.isclass(ref_obj) != inspect.isclass(stub_obj):
            problems.append(f"{name}: a class in one module, a function in the other")
        elif inspect.isclass(ref_obj):
            ref_methods, stub_methods = class_methods(ref_obj), class_methods(stub_obj)
            for method in sorted(set(ref_methods) ^ set(stub_methods)):
                problems.append(f"{name}.{method} is in only one of stub and reference")
            for method in sorted(set(ref_methods) & set(stub_methods)):
                if inspect.signature(stub_methods[method]) != inspect.signature(ref_methods[method]):
                    problems.append(f"{name}.{method}: stub {inspect.signature(stub_methods[method])} != "
                                    f"reference {inspect.signature(ref_methods[method])}")
        elif inspect.signature(stub_obj) != inspect.signature(ref_obj):
            problems.append(f"{name}: stub {inspect.signature(stub_obj)} != reference {inspect.signature(ref_obj)}")
    return problems


def dummy_call(func):
    """Call `func` with None for each required argument: a stub raises before it reads any."""
    params = list(inspect.signature(func).parameters.values())
    args = [None for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    kwargs = {p.name: None for p in params if p.default is p.empty and p.kind is p.KEYWORD_ONLY}
    return func(*args, **kwargs)


def unsolved_problems(stub: types.ModuleType, reference: types.ModuleType, exercise_ids: set[str]) -> list[str]:
    """Every exercise function of the stub must raise NotImplementedError("ENN.k ...") before reading its
    arguments; a class must raise when constructed (or, if its constructor is given, in every method).
    Together they must raise exactly the exercise ids the plan lists for the lesson."""
    problems, raised = [], set()

    def expect_unsolved(label: str, func) -> None:
        try:
            dummy_call(func)
        except NotImplementedError as error:
            m = re.match(r"^(E\d\d\.\d+)\b", str(error))
            if m:
                raised.add(m.group(1))
            else:
                problems.append(f'{label} raises NotImplementedError({str(error)!r}): start the message with the id')
        except Exception as error:  # anything else means the stub ran some code
            problems.append(f"{label} is no longer a stub: it raised {type(error).__name__}, not NotImplementedError")
        else:
            problems.append(f"{label} is no longer a stub: it returned instead of raising NotImplementedError")

    for name in public_api(reference):
        obj = getattr(stub, name, None)
        if obj is None:
            continue  # signature_problems reports it
        if inspect.isclass(obj):
            try:
                dummy_call(obj)
            except NotImplementedError:
                expect_unsolved(name, obj)
                continue
            except Exception:  # a given constructor may dislike None: check the methods instead
                pass
            for method, func in class_methods(obj).items():
                if method != "__init__":
                    expect_unsolved(f"{name}.{method}", func)  # `self` is None too
        else:
            expect_unsolved(name, obj)
    if raised != exercise_ids:
        problems.append(f"the stubs raise {sorted(raised)}, the plan lists {sorted(exercise_ids)}")
    return problems


# ---- the real exercises -------------------------------------------------------------------------------

def _modules(stem: str):
    return (importlib.import_module(f"lessons.exercises.{stem}"),
            importlib.import_module(f"lessons.exercises.solutions.{stem}"))


@pytest.mark.parametrize("lesson", WITH_EXERCISES, ids=lambda lesson: lesson.exercise_module)
def test_stubs_keep_the_reference_signatures(lesson):
    assert signature_problems(*_modules(lesson.exercise_module)) == []


@pytest.mark.parametrize("lesson", WITH_EXERCISES, ids=lambda lesson: lesson.exercise_module)
def test_stubs_are_unsolved(lesson):
    assert unsolved_problems(*_modules(lesson.exercise_module), {ex.id for ex in lesson.exercises}) == []


def test_exercise_tests_default_to_the_reference():
    path = Path(__file__).parents[1] / "exercises" / "conftest.py"
    spec = importlib.util.spec_from_file_location("exercise_conftest", path)
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)

    class Parser:
        def addoption(self, name, **kwargs):
            self.name, self.kwargs = name, kwargs

    parser = Parser()
    conftest.pytest_addoption(parser)
    assert parser.name == "--impl" and parser.kwargs["default"] == "reference"


# ---- the checks fail on broken fixtures ---------------------------------------------------------------

def module(name: str, source: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    exec(textwrap.dedent(source), mod.__dict__)  # fixture code written right here
    return mod


REFERENCE = module("ref", """
    def f(x: int, y: int = 2) -> int:
        return x + y

    class A:
        def __init__(self, n: int) -> None:
            self.n = n

        @property
        def size(self) -> int:
            return self.n

        def grow(self, k: int) -> None:
            self.n += k
    """)

GOOD_STUB = """
    def f(x: int, y: int = 2) -> int:
        raise NotImplementedError("E09.1: f")

    class A:
        def __init__(self, n: int) -> None:
            raise NotImplementedError("E09.2: A")

        @property
        def size(self) -> int:
            raise NotImplementedError("E09.2: size")

        def grow(self, k: int) -> None:
            raise NotImplementedError("E09.2: grow")
    """


def test_good_fixture_stub_passes():
    stub = module("stub", GOOD_STUB)
    assert signature_problems(stub, REFERENCE) == []
    assert unsolved_problems(stub, REFERENCE, {"E09.1", "E09.2"}) == []


@pytest.mark.parametrize("old, new, fragment", [
    ("def f(x: int, y: int = 2)", "def f(x: int, y: int = 3)", "f: stub"),
    ("def f(x: int, y: int = 2)", "def g(x: int, y: int = 2)", "lacks f"),
    ("def grow(self, k: int)", "def grow(self, k: float)", "A.grow: stub"),
    ("def grow(self, k: int)", "def expand(self, k: int)", "A.grow is in only one"),
])
def test_changed_signature_fails(old, new, fragment):
    problems = signature_problems(module("stub", GOOD_STUB.replace(old, new)), REFERENCE)
    assert any(fragment in p for p in problems), problems


SOLVED_INIT = ('raise NotImplementedError("E09.2: A")', "self.n = n")


@pytest.mark.parametrize("edits, fragment", [
    ([('raise NotImplementedError("E09.1: f")', "return 0")], "f is no longer a stub: it returned"),
    ([('raise NotImplementedError("E09.1: f")', "return x + 1")], "f is no longer a stub: it raised TypeError"),
    ([('raise NotImplementedError("E09.1: f")', 'raise NotImplementedError("todo")')], "start the message with the id"),
    ([('raise NotImplementedError("E09.1: f")', 'raise NotImplementedError("E09.2: f")')], "the plan lists"),
    ([SOLVED_INIT, ('raise NotImplementedError("E09.2: grow")', "self.n += k")], "A.grow is no longer a stub"),
])
def test_solved_stub_fails(edits, fragment):
    source = GOOD_STUB
    for old, new in edits:
        source = source.replace(old, new)
    problems = unsolved_problems(module("stub", source), REFERENCE, {"E09.1", "E09.2"})
    assert any(fragment in p for p in problems), problems


def test_stub_class_with_given_constructor_is_still_unsolved():
    stub = module("stub", GOOD_STUB.replace(*SOLVED_INIT))
    assert unsolved_problems(stub, REFERENCE, {"E09.1", "E09.2"}) == []


def test_notebook_check_helper_runs_the_same_tests():
    """`lessons.exercises.check.check`, what notebooks call, finds an exercise's tests and runs them (the
    reference here: the stubs' failures are the same code path with another `--impl`)."""
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, '..')\n"
            "from lessons.exercises.check import check\n"
            "assert check('E02.2', impl='reference')\n")
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root / "notebooks", capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
