"""CI-side checks of the exercises (lessons/CONTRIBUTING.md, "Exercises"): stubs keep the reference's signatures and are
still unsolved. That the reference passes is checked by tests/exercises itself, which runs against the
reference unless told `--impl=learner` (the last test here pins that default).

"Unsolved" means two things. An exercise to write (implement, estimate, predict-then-run, design) is a stub
that raises NotImplementedError("ENN.k ...") before it reads its arguments. A *debug* exercise is working
but buggy code, stated by a docstring that starts with its id: it raises nothing, so it is unsolved when its
own tests still fail against it (`planted_bug_problems`, which runs them in a subprocess).

The checks are functions returning problems, so the fixture tests at the end can show each one failing
on a small broken pair of modules."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable
from pathlib import Path

import pytest
from course_reader import Course

LESSONS = Course().lessons
WITH_EXERCISES = [lesson for lesson in LESSONS if lesson.exercises]
DEBUG_EXERCISES = [(lesson, ex) for lesson in LESSONS for ex in lesson.exercises if ex.kind == "debug"]
ROOT = Path(__file__).resolve().parents[2]


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


def stated_debug_id(obj: object, debug_ids: set[str]) -> str | None:
    """The debug exercise id that opens `obj`'s docstring ("E02.3 (debug): ..."), if it is one of `debug_ids`."""
    m = re.match(r"^(E\d\d\.\d+)\b", inspect.getdoc(obj) or "")
    return m.group(1) if m and m.group(1) in debug_ids else None


def unsolved_problems(stub: types.ModuleType, reference: types.ModuleType, exercise_ids: set[str],
                      debug_ids: set[str] = frozenset()) -> list[str]:
    """Every exercise function of the stub must raise NotImplementedError("ENN.k ...") before reading its
    arguments; a class must raise when constructed (or, if its constructor is given, in every method).
    Together they must raise exactly the exercise ids the lesson states (its `### ENN.k` headings), except the debug
    exercises (`debug_ids`): their code runs, and each must be stated by a function or class whose
    docstring starts with its id (whether its bug is still there is `planted_bug_problems`' job)."""
    problems, raised, stated = [], set(), set()

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
        debug_id = stated_debug_id(obj, debug_ids)
        if debug_id:
            stated.add(debug_id)
            continue
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
    if raised != exercise_ids - debug_ids:
        problems.append(f"the stubs raise {sorted(raised)}, the lesson lists {sorted(exercise_ids - debug_ids)}")
    for debug_id in sorted(debug_ids - stated):
        problems.append(f'debug exercise {debug_id}: no function or class of the stub has a docstring that '
                        f'starts with "{debug_id}"')
    return problems


def run_exercise_tests(exercise_id: str, module: str, root: Path = ROOT, impl: str = "learner") -> int:
    """pytest's exit status for the tests of one exercise (`-k eNN_k`) against `impl`, in a subprocess
    started in `root` (0: all passed, 1: some failed, 5: none selected). `-x` stops at the first failure:
    one is all a planted bug needs to show, and shrinking more failing examples would only take time."""
    selector = exercise_id.lower().replace(".", "_")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the tests put `root` on sys.path
    result = subprocess.run(
        [sys.executable, "-m", "pytest", f"tests/exercises/test_{module}.py", "-q", "-p", "no:cacheprovider",
         "-p", "no:nbval", "-x", "-k", selector, f"--impl={impl}"], cwd=root, env=env, capture_output=True, text=True)
    return result.returncode


def planted_bug_problems(exercise_id: str, run_tests: Callable[[], int]) -> list[str]:
    """A debug stub is unsolved while its tests fail against it. `run_tests` runs them on the stub and
    returns pytest's exit status: 1 (some failed) is the only good answer."""
    status = run_tests()
    if status == 1:
        return []
    if status == 0:
        return [f"{exercise_id}: the committed stub passes its tests, so its planted bug is gone (restore it)"]
    if status == 5:
        return [f"{exercise_id}: no test selected by -k {exercise_id.lower().replace('.', '_')}"]
    return [f"{exercise_id}: its tests could not run against the stub (pytest exit status {status})"]


# ---- the real exercises -------------------------------------------------------------------------------

def _modules(stem: str):
    return (importlib.import_module(f"lessons.exercises.{stem}"),
            importlib.import_module(f"lessons.exercises.solutions.{stem}"))


@pytest.mark.parametrize("lesson", WITH_EXERCISES, ids=lambda lesson: lesson.exercise_module)
def test_stubs_keep_the_reference_signatures(lesson):
    assert signature_problems(*_modules(lesson.exercise_module)) == []


@pytest.mark.parametrize("lesson", WITH_EXERCISES, ids=lambda lesson: lesson.exercise_module)
def test_stubs_are_unsolved(lesson):
    debug_ids = {ex.id for ex in lesson.exercises if ex.kind == "debug"}
    assert unsolved_problems(*_modules(lesson.exercise_module), {ex.id for ex in lesson.exercises}, debug_ids) == []


@pytest.mark.parametrize("lesson, exercise", DEBUG_EXERCISES, ids=[ex.id for _, ex in DEBUG_EXERCISES])
def test_debug_stubs_still_fail_their_tests(lesson, exercise):
    assert planted_bug_problems(exercise.id, lambda: run_exercise_tests(exercise.id, lesson.exercise_module)) == []


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
    ([('raise NotImplementedError("E09.1: f")', 'raise NotImplementedError("E09.2: f")')], "the lesson lists"),
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


# ---- debug exercises: buggy code, stated by its docstring, unsolved while its tests fail --------------

DEBUG_STUB = GOOD_STUB.replace(
    '        raise NotImplementedError("E09.1: f")',
    '        """E09.1 (debug): f should add y; a failing test shows it does not."""\n        return x - y')


def test_debug_fixture_stub_is_unsolved_by_its_statement():
    stub = module("stub", DEBUG_STUB)
    assert signature_problems(stub, REFERENCE) == []
    assert unsolved_problems(stub, REFERENCE, {"E09.1", "E09.2"}, {"E09.1"}) == []
    # the same stub, read as if E09.1 were an exercise to write: its code runs, so it is "no longer a stub"
    problems = unsolved_problems(stub, REFERENCE, {"E09.1", "E09.2"})
    assert any("f is no longer a stub" in p for p in problems), problems


def test_debug_stub_without_its_statement_fails():
    stub = module("stub", DEBUG_STUB.replace('"""E09.1 (debug): f should add y; a failing test shows it does not."""',
                                             "pass"))
    problems = unsolved_problems(stub, REFERENCE, {"E09.1", "E09.2"}, {"E09.1"})
    assert any('debug exercise E09.1: no function or class' in p for p in problems), problems


@pytest.mark.parametrize("status, fragment", [
    (1, None), (0, "planted bug is gone"), (5, "no test selected"), (2, "could not run"),
])
def test_planted_bug_problems_reads_the_exit_status(status, fragment):
    problems = planted_bug_problems("E09.1", lambda: status)
    assert problems == [] if fragment is None else any(fragment in p for p in problems), problems


def test_planted_bug_check_runs_the_exercise_tests(tmp_path):
    """End to end on a tiny course in tmp_path: the buggy stub fails its test, the reference passes, and a
    stub whose bug was fixed before committing is reported."""
    files = {
        "lessons/exercises/__init__.py": "",
        "lessons/exercises/solutions/__init__.py": "",
        "lessons/exercises/e09_demo.py": 'def add(x, y):\n    """E09.1 (debug): add."""\n    return x - y\n',
        "lessons/exercises/solutions/e09_demo.py": "def add(x, y):\n    return x + y\n",
        "tests/exercises/conftest.py": (ROOT / "tests" / "exercises" / "conftest.py").read_text(encoding="utf-8"),
        "tests/exercises/test_e09_demo.py": "def test_e09_1_adds(impl):\n    assert impl.add(2, 3) == 5\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    assert run_exercise_tests("E09.1", "e09_demo", root=tmp_path, impl="reference") == 0
    assert planted_bug_problems("E09.1", lambda: run_exercise_tests("E09.1", "e09_demo", root=tmp_path)) == []
    (tmp_path / "lessons/exercises/e09_demo.py").write_text(files["lessons/exercises/solutions/e09_demo.py"])
    problems = planted_bug_problems("E09.1", lambda: run_exercise_tests("E09.1", "e09_demo", root=tmp_path))
    assert any("planted bug is gone" in p for p in problems), problems
