#!/usr/bin/env python3
"""The course's link checker: every rule of lessons/CONTRIBUTING.md ("What the checkers enforce") as a function.

    python lessons/tools/course_check.py        # print every problem, exit 1 if there is one
    pytest tests/course                         # the same rules, one test each

Each `check_*` function takes a `Course` (course_links.py) and returns a list of problems, each a string
that starts with the file (and line) to fix. No network, no torch: code is read with `ast`, never imported.

What counts as what:
- an **anchor** is an explicit `<a id="..."></a>` (in a Markdown file, or a notebook's Markdown cell);
  heading slugs are not anchors, because GitHub, VS Code and Jupyter disagree on them;
- a lesson **uses** a glossary term when it links `../glossary.md#term`;
- a link to a **planned** lesson (in course_plan.py, file not written yet) or to its notebook is accepted,
  but only with one of the anchors the plan lists for it; once the file exists, the file decides;
- a **code link** is a link to a `.py` file; every backticked name in its text, or right before it
  (`` `Scheduler.schedule` in [scheduler.py](../ref_engine/core/scheduler.py) ``), must be a class,
  function, method, attribute or module-level name of that file;
- a module docstring's `Lesson:` paragraph may name `lessons/<stem>.md[#anchor]`: the stem must be in the
  plan and the anchor must exist (or be planned).
"""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from course_links import EXERCISE_ANCHOR_RE, Course, Link, begin_marker, strip_fences  # noqa: E402
from course_plan import EXERCISE_KINDS  # noqa: E402

EXTERNAL_SCHEMES = ("http", "https", "mailto")
SYMBOL_RE = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(.*\))?$")
BEFORE_SYMBOL_RE = re.compile(r"`([^`]+)`\s*(?:in\s+|\(\s*)?$")
TERM_ID_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
LESSON_REF_RE = re.compile(r"lessons/([A-Za-z0-9_.-]+?)\.md(?:#([A-Za-z0-9_-]+))?")
QUESTION_PARTS = ("**Short answer.**", "<details>", "</details>", "**Common wrong answers.**",
                  "**Follow-ups.**", "**See it run.**", "**Links.**")
DIFFICULTIES = ("E", "M", "H")


def _is_glossary_anchor(course: Course, link: Link) -> bool:
    return not link.is_external and link.anchor is not None and link.resolved == course.glossary_path


# ---- links and anchors -------------------------------------------------------------------------------

def check_links(course: Course) -> list[str]:
    """Every relative link points at an existing file and anchor, or at a planned lesson's planned anchor."""
    problems = []
    for path in course.course_files():
        for link in course.links(path):
            if link.is_external:
                scheme = link.target.split(":", 1)[0].lower()
                if scheme not in EXTERNAL_SCHEMES:
                    problems.append(f"{link.where}: link {link.target!r}: only http(s) and mailto links may "
                                    "leave the repository")
                continue
            if link.path_part.startswith("/"):
                problems.append(f"{link.where}: absolute link {link.target!r}: use a path relative to the file")
                continue
            if _is_glossary_anchor(course, link):
                continue  # check_glossary says which term is missing
            problems += _check_target(course, link)
    return problems


def _check_target(course: Course, link: Link) -> list[str]:
    target, anchor = link.resolved, link.anchor
    where = f"{link.where}: link {link.target!r}"
    if target.is_file():
        if anchor is None:
            return []
        if target.suffix in (".md", ".ipynb"):
            if anchor in course.anchors(target):
                return []
            return [f'{where}: {course.name(target)} has no anchor "{anchor}" (add <a id="{anchor}"></a>)']
        if target.suffix == ".py":
            return [f"{where}: line anchors in code go stale; link the file and name the symbol in backticks"]
        return [f"{where}: {course.name(target)} cannot hold anchors"]
    if target.is_dir():
        return [] if anchor is None else [f"{where}: a folder has no anchors"]
    stem = course.lesson_stem_of(target)
    if stem:  # a planned lesson, not written yet
        lesson = course.lesson(stem)
        if anchor is None or anchor in lesson.required_anchors:
            return []
        return [f'{where}: lesson {stem} is not written yet and "{anchor}" is not one of its planned anchors '
                f"(course_plan.py lists {list(lesson.required_anchors)})"]
    stem = course.notebook_stem_of(target)
    if stem:
        lesson = course.lesson(stem)
        if course.is_written(lesson):
            return [f"{where}: notebook missing, and its lesson {stem} is written"]
        if anchor is None or anchor in lesson.notebook_anchors:
            return []
        return [f'{where}: notebook {stem} is not written yet and "{anchor}" is not one of its planned '
                f"anchors (course_plan.py lists {list(lesson.notebook_anchors)})"]
    return [f"{where}: no such file {course.name(target)}"]


def check_duplicate_ids(course: Course) -> list[str]:
    """No anchor twice in a file; question anchors only in the bank; exercise anchors only in their lesson."""
    problems = []
    planned_exercises = {ex.anchor: lesson.stem for lesson in course.plan for ex in lesson.exercises}
    for path in course.course_files():
        anchors = course.anchors(path)
        for anchor, count in Counter(anchors).items():
            if count > 1:
                problems.append(f'{course.name(path)}: anchor "{anchor}" is defined {count} times')
        for anchor in set(anchors):
            if anchor.startswith("q-") and path != course.bank_path:
                problems.append(f'{course.name(path)}: question anchor "{anchor}" outside the interview bank')
            if EXERCISE_ANCHOR_RE.match(anchor) and path.suffix == ".md":
                owner = planned_exercises.get(anchor)
                if owner is None:
                    problems.append(f'{course.name(path)}: exercise anchor "{anchor}" is not in course_plan.py')
                elif path != course.lesson_path(owner):
                    problems.append(f'{course.name(path)}: exercise anchor "{anchor}" belongs in lessons/{owner}.md')
    ids = Counter(q.id for q in course.questions)
    problems += [f"{course.name(course.bank_path)}: question {qid} appears {n} times" for qid, n in ids.items() if n > 1]
    terms = Counter(t.id for t in course.terms)
    problems += [f"glossary.md: term {tid} appears {n} times" for tid, n in terms.items() if n > 1]
    return problems


# ---- code links --------------------------------------------------------------------------------------

def _members(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a module or class body defines (functions, classes, assignments, imports)."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try)):
            names.update(_members(node.body + getattr(node, "orelse", [])))
    return names


def _class_members(cls: ast.ClassDef) -> dict[str, ast.AST]:
    """A class's own names plus the `self.x` attributes its methods assign."""
    names = _members(cls.body)
    for method in cls.body:
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(method):
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
                for t in targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        names.setdefault(t.attr, node)
    return names


def resolve_symbol(tree: ast.Module, dotted: str, module_stem: str = "") -> bool:
    """Does `dotted` ("Scheduler.schedule", "cdiv", "EngineConfig.block_size") name something in `tree`?

    A bare name also matches a member of any class in the file (`max_num_seqs` -> EngineConfig's field).
    A leading module name equal to the file's stem is ignored (`scheduler.Scheduler`).
    """
    parts = dotted.split(".")
    if module_stem in parts[:-1]:
        parts = parts[parts.index(module_stem) + 1:]
    scope = _members(tree.body)
    if len(parts) == 1 and parts[0] not in scope:
        return any(parts[0] in _class_members(node) for node in ast.walk(tree) if isinstance(node, ast.ClassDef))
    for i, part in enumerate(parts):
        node = scope.get(part)
        if node is None:
            return False
        if i < len(parts) - 1:
            if not isinstance(node, ast.ClassDef):
                return False
            scope = _class_members(node)
    return True


def code_link_symbols(link: Link) -> list[str]:
    """The backticked spans a code link vouches for: in its text, and the one right before it."""
    spans = re.findall(r"`([^`]+)`", link.text)
    before = BEFORE_SYMBOL_RE.search(link.before)
    if before:
        spans.append(before.group(1))
    return spans


def check_code_symbols(course: Course) -> list[str]:
    """A backticked symbol in or next to a code link resolves, by AST, in the linked file."""
    problems = []
    trees: dict[Path, ast.Module | None] = {}
    for path in course.course_files():
        for link in course.links(path):
            target = link.resolved
            if link.is_external or target.suffix != ".py" or not target.is_file():
                continue
            if target not in trees:
                try:
                    trees[target] = ast.parse(target.read_text(encoding="utf-8"))
                except SyntaxError:
                    trees[target] = None
            tree = trees[target]
            for span in code_link_symbols(link):
                span = span.strip()
                if span.endswith(".py") or "/" in span:
                    if not target.as_posix().endswith(span.lstrip("./")):
                        problems.append(f"{link.where}: link text names `{span}` but links {course.name(target)}")
                    continue
                m = SYMBOL_RE.match(span)
                if not m:
                    continue  # not a name (`max_num_seqs=64`, `pytest -q`): nothing to resolve
                if tree is None:
                    problems.append(f"{link.where}: {course.name(target)} does not parse, so `{span}` cannot resolve")
                elif not resolve_symbol(tree, m.group(1), target.stem):
                    problems.append(f"{link.where}: `{span}` is not defined in {course.name(target)}")
    return problems


# ---- the interview bank ------------------------------------------------------------------------------

def check_questions(course: Course) -> list[str]:
    """Question format (lessons/CONTRIBUTING.md, "An interview question"); every question links a lesson section."""
    problems = []
    bank = course.name(course.bank_path)
    plain = strip_fences(course.read(course.bank_path)).split("\n")
    for n, line in enumerate(plain, start=1):
        if line.startswith("### ") and not re.match(r"^###\s+Q-[A-Z]+-\d{2}\s+\[", line):
            problems.append(f"{bank}:{n}: not a question heading (write `### Q-TOPIC-nn [E|M|H] Title`)")
    for q in course.questions:
        where = f"{bank}:{q.line}: {q.id}"
        if q.topic not in course.topics:
            problems.append(f"{where}: unknown topic {q.topic} (known: {', '.join(course.topics)})")
        if q.anchor_above != q.anchor:
            problems.append(f'{where}: put <a id="{q.anchor}"></a> on the line above the heading')
        if q.section_topic != q.topic:
            problems.append(f"{where}: sits in the {q.section_topic or 'no'} topic section, not {q.topic}")
        if not q.tags or q.tags[0] not in DIFFICULTIES or any(t != "design" for t in q.tags[1:]):
            problems.append(f"{where}: tags {list(q.tags)}: write [E], [M] or [H], optionally then [design]")
        if not q.title:
            problems.append(f"{where}: the heading has no question")
        for part in QUESTION_PARTS:
            if part not in q.body:
                problems.append(f"{where}: missing {part}")
        if not any(anchor for _, anchor in course.question_lessons(q)):
            problems.append(f"{where}: question without a lesson link (its **Links.** line must link a "
                            "lesson section, e.g. 01-continuous-batching.md#static-batching)")
        see_it_run = [link for link in q.links if "**See it run.**" in link.before]
        if "**See it run.**" in q.body and not any(link.path_part.endswith(".ipynb") for link in see_it_run):
            problems.append(f"{where}: **See it run.** must link a notebook section (../notebooks/NN-topic.ipynb#anchor)")
    return problems


# ---- the glossary -------------------------------------------------------------------------------------

def check_glossary(course: Course) -> list[str]:
    """Entry format; every term used by a lesson; every term a lesson links or plans is in the glossary."""
    problems = []
    if not course.glossary_path.is_file():
        return ["glossary.md is missing"]
    ids = {t.id for t in course.terms}
    for term in course.terms:
        where = f"glossary.md:{term.line}: {term.id}"
        if not TERM_ID_RE.match(term.id):
            problems.append(f"{where}: term ids are kebab case (kv-cache)")
        if term.name is None:
            problems.append(f"{where}: the line after the anchor must start with the term in bold")
        if begin_marker(f"used-in:{term.id}") not in term.body:
            problems.append(f"{where}: no generated Used-in block; add the lines "
                            f"{begin_marker(f'used-in:{term.id}')} / <!-- END AUTO:used-in:{term.id} --> "
                            "and run python lessons/tools/course_links.py --write")
        used = any(term.id in lesson.terms for lesson in course.plan if not course.is_written(lesson)) or \
            any(t == term.id for lesson in course.written_lessons
                for t, _ in course.term_links(course.lesson_path(lesson.stem)))
        if not used:
            problems.append(f"{where}: no lesson uses this term (link it from a lesson as ../glossary.md#"
                            f"{term.id}, or list it in a planned lesson's terms in course_plan.py)")
    for lesson in course.plan:
        for term in lesson.terms:
            if term not in ids:
                problems.append(f"course_plan.py: lesson {lesson.stem} plans term {term!r}, missing from glossary.md")
    for path in course.course_files():
        for term, link in course.term_links(path):
            if term not in ids:
                problems.append(f"{link.where}: term {term!r} is missing from the glossary")
    return problems


# ---- lessons and notebooks ----------------------------------------------------------------------------

def check_lessons(course: Course) -> list[str]:
    """Lesson files are planned; written lessons keep the plan's promises; lessons and notebooks pair up."""
    problems = []
    for required in (course.map_path, course.bank_path, course.glossary_path):
        if not required.is_file():
            problems.append(f"{course.name(required)} is missing")
    if course.map_path.is_file() and begin_marker("course-map") not in course.read(course.map_path):
        problems.append(f"{course.name(course.map_path)}: no {begin_marker('course-map')} block")
    if course.bank_path.is_file() and begin_marker("bank-index") not in course.read(course.bank_path):
        problems.append(f"{course.name(course.bank_path)}: no {begin_marker('bank-index')} block")
    others = {course.map_path.name, course.bank_path.name, "CONTRIBUTING.md"}  # the course map, bank, format
    for path in sorted(course.lessons_dir.glob("*.md")) if course.lessons_dir.is_dir() else []:
        if path.name not in others and course.lesson(path.stem) is None:
            problems.append(f"{course.name(path)}: not a lesson of the plan (add it to lessons/tools/course_plan.py)")
    for lesson in course.written_lessons:
        path = course.lesson_path(lesson.stem)
        name = course.name(path)
        anchors = set(course.anchors(path))
        for anchor in lesson.required_anchors:
            if anchor not in anchors:
                problems.append(f'{name}: planned anchor "{anchor}" is missing (add <a id="{anchor}"></a>)')
        linked = {t for t, _ in course.term_links(path)}
        for term in lesson.terms:
            if term not in linked:
                problems.append(f"{name}: planned term {term!r} is never linked (../glossary.md#{term})")
        if lesson.has_questions and begin_marker("questions") not in course.read(path):
            problems.append(f"{name}: no {begin_marker('questions')} block")
        if lesson.notebook:
            notebook = course.notebook_path(lesson.stem)
            if not notebook.is_file():
                problems.append(f"{name}: lesson without its notebook {course.name(notebook)}")
            elif not any(not link.is_external and link.resolved == notebook for link in course.links(path)):
                problems.append(f"{name}: the lesson never links its notebook {course.name(notebook)}")
    for notebook in sorted(course.notebooks_dir.glob("*.ipynb")) if course.notebooks_dir.is_dir() else []:
        lesson = course.lesson(notebook.stem)
        if lesson is None or not lesson.notebook:
            problems.append(f"{course.name(notebook)}: notebook without a planned lesson of the same stem")
            continue
        if not course.is_written(lesson):
            problems.append(f"{course.name(notebook)}: notebook without its lesson lessons/{lesson.stem}.md")
        anchors = set(course.anchors(notebook))
        for anchor in lesson.notebook_anchors:
            if anchor not in anchors:
                problems.append(f'{course.name(notebook)}: planned anchor "{anchor}" is missing '
                                f'(add <a id="{anchor}"></a> to a Markdown cell)')
    return problems


def check_coverage(course: Course) -> list[str]:
    """Every written lesson that has questions is linked by at least `course.min_questions` questions (on their
    **Links.** line, as its generated `questions` block counts them), and every written lesson with a notebook
    plans at least `course.min_exercises` exercises. A planned lesson is held to neither until it is written."""
    problems = []
    for lesson in course.written_lessons:
        name = course.name(course.lesson_path(lesson.stem))
        if lesson.has_questions:
            n = len(course.questions_of(lesson.stem))
            if n < course.min_questions:
                problems.append(f"{name}: {n} question(s) link this lesson, fewer than {course.min_questions} (add "
                                f"questions to lessons/interview-bank.md whose **Links.** line links one of its "
                                "sections)")
        if lesson.notebook and len(lesson.exercises) < course.min_exercises:
            problems.append(f"{name}: {len(lesson.exercises)} exercise(s), fewer than {course.min_exercises} for a "
                            "lesson with a notebook (add them to course_plan.py, with stub, test and solution)")
    return problems


# ---- exercises ----------------------------------------------------------------------------------------

def raised_exercise_ids(tree: ast.Module) -> set[str]:
    """Ids "E01.1" of every `raise NotImplementedError("E01.1 ...")` in a stub."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) \
                and isinstance(node.exc.func, ast.Name) and node.exc.func.id == "NotImplementedError" \
                and node.exc.args and isinstance(node.exc.args[0], ast.Constant) \
                and isinstance(node.exc.args[0].value, str):
            m = re.match(r"^(E\d\d\.\d+)\b", node.exc.args[0].value)
            if m:
                ids.add(m.group(1))
    return ids


def stated_exercise_ids(tree: ast.Module) -> set[str]:
    """Ids "E02.3" that open the docstring of a top-level function or class of a stub. A *debug* exercise
    states itself this way: its stub holds working but buggy code, which raises nothing."""
    ids = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            m = re.match(r"^(E\d\d\.\d+)\b", ast.get_docstring(node) or "")
            if m:
                ids.add(m.group(1))
    return ids


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None


def check_exercises(course: Course) -> list[str]:
    """Every planned exercise has a stub that raises its id (a debug exercise: a stub function or class whose
    docstring starts with its id, since its buggy code raises nothing), a test `test_eNN_k_*`, and a solution
    module; the interview questions a stub names exist."""
    problems = []
    planned = {ex.id for lesson in course.plan for ex in lesson.exercises}
    modules = {lesson.exercise_module for lesson in course.plan if lesson.exercises}
    for lesson in course.plan:
        if not lesson.exercises:
            continue
        stub = course.exercises_dir / f"{lesson.exercise_module}.py"
        test = course.exercise_tests_dir / f"test_{lesson.exercise_module}.py"
        solution = course.solutions_dir / f"{lesson.exercise_module}.py"
        stub_tree, test_tree = _parse(stub), _parse(test)
        raised = raised_exercise_ids(stub_tree) if stub_tree else set()
        stated = stated_exercise_ids(stub_tree) if stub_tree else set()
        tests = {n.name for n in ast.walk(test_tree) if isinstance(n, ast.FunctionDef)} if test_tree else set()
        for ex in lesson.exercises:
            if stub_tree is None:
                problems.append(f"{ex.id}: no stub {course.name(stub)} (or it does not parse)")
            elif ex.kind == "debug":
                if ex.id not in stated:
                    problems.append(f'{ex.id}: the debug stub {course.name(stub)} has no function or class whose '
                                    f'docstring starts with "{ex.id}"')
            elif ex.id not in raised:
                problems.append(f'{ex.id}: the stub {course.name(stub)} never raises NotImplementedError("{ex.id} ...")')
            prefix = f"test_{ex.anchor.replace('-', '_')}"
            if not any(name == prefix or name.startswith(prefix + "_") for name in tests):
                problems.append(f"{ex.id}: no test function {prefix}_* in {course.name(test)}")
            if not solution.is_file():
                problems.append(f"{ex.id}: no reference solution {course.name(solution)}")
            if ex.kind not in EXERCISE_KINDS:
                problems.append(f"{ex.id}: unknown exercise kind {ex.kind!r}")
    questions = {q.id for q in course.questions}
    for stub in sorted(course.exercises_dir.glob("e*.py")) if course.exercises_dir.is_dir() else []:
        tree = _parse(stub)
        for qid in sorted(set(re.findall(r"\bQ-[A-Z]+-\d\d\b", course.read(stub))) - questions):
            problems.append(f"{course.name(stub)}: mentions {qid}, which is not in the interview bank")
        if stub.stem not in modules:
            problems.append(f"{course.name(stub)}: no lesson of the plan has exercises in this module")
        for ex_id in sorted(raised_exercise_ids(tree) if tree else set()):
            if ex_id not in planned:
                problems.append(f"{course.name(stub)}: raises {ex_id}, which course_plan.py does not list")
    return problems


# ---- code -> lesson ------------------------------------------------------------------------------------

def lesson_paragraphs(docstring: str) -> list[str]:
    """The `Lesson:` paragraphs of a module docstring (from "Lesson:" to the next blank line)."""
    out = []
    for m in re.finditer(r"Lesson:", docstring):
        rest = docstring[m.end():]
        out.append(rest.split("\n\n", 1)[0])
    return out


def check_lesson_lines(course: Course) -> list[str]:
    """A module docstring's `Lesson:` paragraph names planned lessons, and anchors that exist or are planned."""
    problems = []
    for folder in course.code_dirs:
        for path in sorted((course.root / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            tree = _parse(path)
            doc = ast.get_docstring(tree, clean=False) if tree else None
            if not doc:
                continue
            for paragraph in lesson_paragraphs(doc):
                for m in LESSON_REF_RE.finditer(paragraph):
                    stem, anchor = m.group(1), m.group(2)
                    where = f"{course.name(path)}: Lesson: line names {m.group(0)}"
                    lesson = course.lesson(stem)
                    if lesson is None:
                        problems.append(f"{where}, which is neither written nor planned "
                                        "(fix the name, or add the lesson to course_plan.py)")
                    elif anchor is None:
                        continue
                    elif course.is_written(lesson):
                        if anchor not in course.anchors(course.lesson_path(stem)):
                            problems.append(f'{where}, but lessons/{stem}.md has no anchor "{anchor}"')
                    elif anchor not in lesson.required_anchors:
                        problems.append(f'{where}: lesson {stem} is planned and "{anchor}" is not one of '
                                        "its planned anchors")
    return problems


RULES = (check_links, check_duplicate_ids, check_code_symbols, check_questions, check_glossary, check_lessons,
         check_coverage, check_exercises, check_lesson_lines)


def check_all(course: Course) -> list[str]:
    return [problem for rule in RULES for problem in rule(course)]


def main() -> int:
    problems = check_all(Course())
    for problem in problems:
        print(problem)
    print(f"{len(problems)} problem(s)" if problems else "the course links are sound")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
