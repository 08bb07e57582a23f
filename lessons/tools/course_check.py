#!/usr/bin/env python3
"""The course's link checker: every rule of lessons/CONTRIBUTING.md ("What the checkers enforce") as a function.

    python lessons/tools/course_check.py        # print every problem, exit 1 if there is one
    pytest tests/course                         # the same rules, one test each

Each `check_*` function takes a `Course` (course_reader.py) and returns a list of problems, each a string
that starts with the file (and line) to fix. No network, no torch: code is read with `ast`, never imported.

What counts as what:
- an **anchor** is an explicit `<a id="..."></a>` (in a Markdown file, or a notebook's Markdown cell);
  heading slugs are not anchors, because GitHub, VS Code and Jupyter disagree on them;
- a lesson **uses** a glossary term when it links `../glossary.md#term`;
- a **code link** is a link to a `.py` file; every backticked name in its text, or right before it
  (`` `Scheduler.schedule` in [scheduler.py](../core/scheduler.py) ``), must be a class,
  function, method, attribute or module-level name of that file;
- a module docstring's `Lesson:` paragraph may name `lessons/<stem>.md[#anchor]`: the lesson and the anchor
  must exist.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from course_reader import EXERCISE_ANCHOR_RE, NOT_LESSONS, Course, Link, strip_fences  # noqa: E402

EXTERNAL_SCHEMES = ("http", "https", "mailto")
SYMBOL_RE = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(.*\))?$")
BEFORE_SYMBOL_RE = re.compile(r"`([^`]+)`\s*(?:in\s+|\(\s*)?$")
TERM_ID_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
LESSON_REF_RE = re.compile(r"lessons/([A-Za-z0-9_.-]+?)\.md(?:#([A-Za-z0-9_-]+))?")
QUESTION_PARTS = ("**Short answer.**", "<details>", "</details>", "**Common wrong answers.**",
                  "**Follow-ups.**", "**See it run.**", "**Links.**")
DIFFICULTIES = ("E", "M", "H")
EXERCISE_KINDS = ("implement", "estimate", "predict-then-run", "debug", "design")
MIN_QUESTIONS = 8  # questions linking each lesson
MIN_EXERCISES = 2  # exercises of each lesson with a notebook


# ---- links and anchors -------------------------------------------------------------------------------

def check_links(course: Course) -> list[str]:
    """Every relative link points at an existing file, and at an anchor that file defines."""
    problems = []
    for path in course.course_files():
        for link in course.links(path):
            where = f"{link.where}: link {link.target!r}"
            target, anchor = link.resolved, link.anchor
            if link.is_external:
                if link.target.split(":", 1)[0].lower() not in EXTERNAL_SCHEMES:
                    problems.append(f"{where}: only http(s) and mailto links may leave the repository")
            elif link.path_part.startswith("/"):
                problems.append(f"{where}: absolute link; use a path relative to the file")
            elif anchor is not None and target == course.glossary_path:
                continue  # check_glossary says which term is missing
            elif not target.exists():
                problems.append(f"{where}: no such file {course.name(target)}")
            elif anchor is None:
                continue
            elif target.suffix == ".py":
                problems.append(f"{where}: line anchors in code go stale; link the file and name the symbol in backticks")
            elif target.suffix not in (".md", ".ipynb"):
                problems.append(f"{where}: {course.name(target)} cannot hold anchors")
            elif anchor not in course.anchors(target):
                problems.append(f'{where}: {course.name(target)} has no anchor "{anchor}" (add <a id="{anchor}"></a>)')
    return problems


def check_duplicate_ids(course: Course) -> list[str]:
    """No anchor twice in a file; question anchors only in the bank; exercise anchors only in their lesson."""
    problems = []
    owners = {ex.anchor: lesson.stem for lesson in course.lessons for ex in lesson.exercises}
    for path in course.course_files():
        anchors = course.anchors(path)
        for anchor, count in Counter(anchors).items():
            if count > 1:
                problems.append(f'{course.name(path)}: anchor "{anchor}" is defined {count} times')
        for anchor in set(anchors):
            if anchor.startswith("q-") and path != course.bank_path:
                problems.append(f'{course.name(path)}: question anchor "{anchor}" outside the interview bank')
            if EXERCISE_ANCHOR_RE.match(anchor) and path.suffix == ".md":
                owner = owners.get(anchor)
                if owner is None:
                    problems.append(f'{course.name(path)}: exercise anchor "{anchor}" has no `### ENN.k` heading')
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


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None


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
                trees[target] = _parse(target)
            for span in map(str.strip, code_link_symbols(link)):
                if span.endswith(".py") or "/" in span:
                    if not target.as_posix().endswith(span.lstrip("./")):
                        problems.append(f"{link.where}: link text names `{span}` but links {course.name(target)}")
                    continue
                m = SYMBOL_RE.match(span)
                if not m:
                    continue  # not a name (`max_num_seqs=64`, `pytest -q`): nothing to resolve
                if trees[target] is None:
                    problems.append(f"{link.where}: {course.name(target)} does not parse, so `{span}` cannot resolve")
                elif not resolve_symbol(trees[target], m.group(1), target.stem):
                    problems.append(f"{link.where}: `{span}` is not defined in {course.name(target)}")
    return problems


# ---- the interview bank ------------------------------------------------------------------------------

def check_questions(course: Course) -> list[str]:
    """Question format (lessons/CONTRIBUTING.md, "An interview question"); every question links a lesson section."""
    problems = []
    bank = course.name(course.bank_path)
    for n, line in enumerate(strip_fences(course.read(course.bank_path)).split("\n"), start=1):
        if line.startswith("### ") and not re.match(r"^###\s+Q-[A-Z]+-\d{2}\s+\[", line):
            problems.append(f"{bank}:{n}: not a question heading (write `### Q-TOPIC-nn [E|M|H] Title`)")
    for q in course.questions:
        where = f"{bank}:{q.line}: {q.id}"
        if q.anchor_above != q.anchor:
            problems.append(f'{where}: put <a id="{q.anchor}"></a> on the line above the heading')
        if q.section_topic != q.topic:
            problems.append(f"{where}: sits in the {q.section_topic or 'no'} topic section, not {q.topic}")
        if not q.tags or q.tags[0] not in DIFFICULTIES or any(t != "design" for t in q.tags[1:]):
            problems.append(f"{where}: tags {list(q.tags)}: write [E], [M] or [H], optionally then [design]")
        if not q.title:
            problems.append(f"{where}: the heading has no question")
        problems += [f"{where}: missing {part}" for part in QUESTION_PARTS if part not in q.body]
        if not any(anchor for _, anchor in course.question_lessons(q)):
            problems.append(f"{where}: question without a lesson link (its **Links.** line must link a "
                            "lesson section, e.g. 01-continuous-batching.md#static-batching)")
        see_it_run = [link for link in q.links if "**See it run.**" in link.before]
        if "**See it run.**" in q.body and not any(link.path_part.endswith(".ipynb") for link in see_it_run):
            problems.append(f"{where}: **See it run.** must link a notebook section (../notebooks/NN-topic.ipynb#anchor)")
    return problems


# ---- the glossary -------------------------------------------------------------------------------------

def check_glossary(course: Course) -> list[str]:
    """Entry format; every term used by a lesson; every term a course file links is in the glossary."""
    if not course.glossary_path.is_file():
        return ["glossary.md is missing"]
    problems = []
    used = {t for lesson in course.lessons for t, _ in course.term_links(course.lesson_path(lesson.stem))}
    for term in course.terms:
        where = f"glossary.md:{term.line}: {term.id}"
        if not TERM_ID_RE.match(term.id):
            problems.append(f"{where}: term ids are kebab case (kv-cache)")
        if term.name is None:
            problems.append(f"{where}: the line after the anchor must start with the term in bold")
        if term.id not in used:
            problems.append(f"{where}: no lesson uses this term (link it from a lesson as ../glossary.md#{term.id})")
    ids = {t.id for t in course.terms}
    for path in course.course_files():
        problems += [f"{link.where}: term {term!r} is missing from the glossary"
                     for term, link in course.term_links(path) if term not in ids]
    return problems


# ---- lessons and notebooks ----------------------------------------------------------------------------

def check_lessons(course: Course) -> list[str]:
    """Lesson files are named as lessons and have a title and minutes; lessons and notebooks pair up."""
    problems = []
    stems = {lesson.stem for lesson in course.lessons}
    for path in course.markdown_pages():
        if path.name not in NOT_LESSONS and path.stem not in stems:
            problems.append(f"{course.name(path)}: not a lesson (name it NN-topic.md)")
    for lesson in course.lessons:
        path = course.lesson_path(lesson.stem)
        name = course.name(path)
        if not lesson.title or not lesson.minutes:
            problems.append(f"{name}: a lesson starts with its `# Title`, then a header line naming its minutes (90 min)")
        notebook = course.notebook_path(lesson.stem)
        if lesson.has_notebook and not notebook.is_file():
            problems.append(f"{name}: lesson without its notebook {course.name(notebook)}")
        elif lesson.has_notebook and not any(link.resolved == notebook for link in course.links(path)):
            problems.append(f"{name}: the lesson never links its notebook {course.name(notebook)}")
    with_notebook = {lesson.stem for lesson in course.lessons if lesson.has_notebook}
    problems += [f"{course.name(nb)}: notebook without a lesson lessons/{nb.stem}.md that has one"
                 for nb in course.notebooks() if nb.stem not in with_notebook]
    return problems


def check_coverage(course: Course) -> list[str]:
    """Every lesson is linked by at least MIN_QUESTIONS questions (on their **Links.** line, as its generated
    `questions` block counts them), and every lesson with a notebook has at least MIN_EXERCISES exercises."""
    problems = []
    for lesson in course.lessons:
        name = course.name(course.lesson_path(lesson.stem))
        n = len(course.questions_of(lesson.stem))
        if n < MIN_QUESTIONS:
            problems.append(f"{name}: {n} question(s) link this lesson, fewer than {MIN_QUESTIONS} (add questions "
                            "to lessons/interview-bank.md whose **Links.** line links one of its sections)")
        if lesson.has_notebook and len(lesson.exercises) < MIN_EXERCISES:
            problems.append(f"{name}: {len(lesson.exercises)} exercise(s), fewer than {MIN_EXERCISES} for a "
                            "lesson with a notebook")
    return problems


# ---- exercises ----------------------------------------------------------------------------------------

def check_exercises(course: Course) -> list[str]:
    """Each exercise heading names its lesson's number and a known kind, sits under its anchor, and has a stub,
    a test `test_eNN_k_*` and a solution module; a stub names only questions that exist. (That each stub still
    raises its id, or states its debug exercise, is checked on the imported stubs: test_exercises_meta.py.)"""
    problems = []
    for lesson in course.lessons:
        module = lesson.exercise_module
        stub = course.exercises_dir / f"{module}.py"
        test = course.root / "tests" / "exercises" / f"test_{module}.py"
        test_tree = _parse(test)
        tests = {n.name for n in ast.walk(test_tree) if isinstance(n, ast.FunctionDef)} if test_tree else set()
        anchors = course.anchors(course.lesson_path(lesson.stem))
        for ex in lesson.exercises:
            where = f"{course.name(course.lesson_path(lesson.stem))}:{ex.line}: {ex.id}"
            if ex.id[1:3] != lesson.number:
                problems.append(f"{where}: lesson {lesson.number}'s exercises are E{lesson.number}.k")
            if ex.kind not in EXERCISE_KINDS:
                problems.append(f"{where}: end the heading with its kind, one of ({', '.join(EXERCISE_KINDS)})")
            if ex.anchor not in anchors:
                problems.append(f'{where}: put <a id="{ex.anchor}"></a> above the heading')
            if _parse(stub) is None:
                problems.append(f"{where}: no stub {course.name(stub)} (or it does not parse)")
            prefix = f"test_{ex.anchor.replace('-', '_')}"
            if not any(name == prefix or name.startswith(prefix + "_") for name in tests):
                problems.append(f"{where}: no test function {prefix}_* in {course.name(test)}")
            if not (course.exercises_dir / "solutions" / f"{module}.py").is_file():
                problems.append(f"{where}: no reference solution {course.name(course.exercises_dir / 'solutions')}/{module}.py")
    modules = {lesson.exercise_module for lesson in course.lessons if lesson.exercises}
    questions = {q.id for q in course.questions}
    for stub in sorted(course.exercises_dir.glob("e*.py")) if course.exercises_dir.is_dir() else []:
        if stub.stem not in modules:
            problems.append(f"{course.name(stub)}: no lesson has exercises in this module")
        for qid in sorted(set(re.findall(r"\bQ-[A-Z]+-\d\d\b", course.read(stub))) - questions):
            problems.append(f"{course.name(stub)}: mentions {qid}, which is not in the interview bank")
    return problems


# ---- code -> lesson ------------------------------------------------------------------------------------

def check_lesson_lines(course: Course) -> list[str]:
    """A module docstring's `Lesson:` paragraph (from "Lesson:" to the next blank line) names lessons and
    anchors that exist."""
    problems = []
    for folder in course.code_dirs:
        for path in sorted((course.root / folder).rglob("*.py")):
            tree = None if "__pycache__" in path.parts else _parse(path)
            doc = (ast.get_docstring(tree, clean=False) if tree else None) or ""
            for paragraph in re.findall(r"Lesson:(.*?)(?:\n\n|$)", doc, flags=re.DOTALL):
                for m in LESSON_REF_RE.finditer(paragraph):
                    stem, anchor = m.group(1), m.group(2)
                    where = f"{course.name(path)}: Lesson: line names {m.group(0)}"
                    if course.lesson(stem) is None:
                        problems.append(f"{where}, which is not a lesson")
                    elif anchor and anchor not in course.anchors(course.lesson_path(stem)):
                        problems.append(f'{where}, but lessons/{stem}.md has no anchor "{anchor}"')
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
