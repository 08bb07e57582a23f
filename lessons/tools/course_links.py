#!/usr/bin/env python3
"""Fill the course's generated blocks, and read the course the way the link checker reads it.

    python lessons/tools/course_links.py --write   # rewrite every stale block in place
    python lessons/tools/course_links.py --check   # dry run: exit 1 and name the stale blocks
    python lessons/tools/course_links.py --skeleton 01-continuous-batching   # a planned lesson's skeleton

Generated blocks sit between `<!-- BEGIN AUTO:kind -->` and `<!-- END AUTO:kind -->` lines; everything
else is written by hand. The kinds (lessons/CONTRIBUTING.md, "Generated blocks"):
- `course-map` in lessons/README.md: one row per lesson of the plan (course_plan.py), written or planned;
- `questions` in every written lesson: the interview questions whose **Links.** line points at it;
- `used-in:<term>` in glossary.md, one per term: the lessons and questions that link the term;
- `bank-index` in lessons/interview-bank.md: every question, topic by topic.

The second half of this module is the small Markdown reader that `course_check.py` (the link checker)
also uses, so the generator and the checker agree on what a link, an anchor, a question and a glossary
term are. Standard library only, no network.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import course_plan  # noqa: E402  (a sibling file; this folder is not a package)
from course_plan import PlannedLesson  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WRITE_COMMAND = "python lessons/tools/course_links.py --write"

# ---------------------------------------------------------------------------------------------------
# Reading Markdown
# ---------------------------------------------------------------------------------------------------

ANCHOR_RE = re.compile(r'<a\s+id="([^"]*)"\s*>\s*</a>')
# [text](target) where text may hold `code` spans and one level of [brackets]; an optional "title".
LINK_RE = re.compile(
    r'\[((?:[^\[\]`]|`[^`]*`|\[[^\[\]]*\])*)\]\(\s*<?([^()\s<>]+)>?(?:\s+"[^"]*")?\s*\)')
FENCE_RE = re.compile(r"^\s*(```|~~~)")
QUESTION_RE = re.compile(r"^###\s+(Q-([A-Z]+)-(\d{2}))\s+((?:\[[A-Za-z-]+\]\s*)+)(.*)$")
TOPIC_RE = re.compile(r"^##\s+([A-Z]+)\b")
GLOSSARY_LINK_RE = re.compile(r"(?:^|/)glossary\.md$")
EXERCISE_ANCHOR_RE = re.compile(r"^e(\d\d)-(\d+)$")


def strip_fences(text: str) -> str:
    """Blank out fenced code blocks and HTML comments (keeping the line count), so links and anchors in
    code or in comments don't count."""
    text = re.sub(r"<!--.*?-->", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.DOTALL)
    out, inside = [], False
    for line in text.split("\n"):
        if FENCE_RE.match(line):
            inside = not inside
            out.append("")
        else:
            out.append("" if inside else line)
    return "\n".join(out)


def rel(path: Path, start: Path) -> str:
    """A relative link from the folder `start` to `path`, with forward slashes."""
    return Path(os.path.relpath(path, start)).as_posix()


@dataclass(frozen=True)
class Link:
    """One relative or external link found in a course file."""

    source: Path  # the file the link is in
    where: str  # "lessons/x.md:12" or "notebooks/x.ipynb cell 3 line 2", for messages
    text: str  # the link text, as written
    target: str  # the target, as written
    before: str  # the text of the line just before the link

    @property
    def is_external(self) -> bool:
        return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", self.target) is not None

    @property
    def path_part(self) -> str:
        return self.target.split("#", 1)[0]

    @property
    def anchor(self) -> str | None:
        return self.target.split("#", 1)[1] if "#" in self.target else None

    @property
    def resolved(self) -> Path:
        """The target file (the source itself for `#anchor` links)."""
        if not self.path_part:
            return self.source
        return Path(os.path.normpath(self.source.parent / self.path_part))


def links_in(text: str, source: Path, where_prefix: str) -> list[Link]:
    links = []
    for number, line in enumerate(strip_fences(text).split("\n"), start=1):
        for m in LINK_RE.finditer(line):
            links.append(Link(source=source, where=f"{where_prefix}{number}", text=m.group(1),
                              target=m.group(2), before=line[: m.start()]))
    return links


def markdown_units(path: Path, text: str) -> list[tuple[str, str]]:
    """(where-prefix, Markdown text) pieces of a file: the whole file, or each Markdown cell of a notebook."""
    if path.suffix == ".ipynb":
        try:
            cells = json.loads(text).get("cells", [])
        except json.JSONDecodeError:
            return []
        units = []
        for i, cell in enumerate(cells, start=1):
            if cell.get("cell_type") == "markdown":
                source = cell.get("source", "")
                units.append((f" cell {i} line ", "".join(source) if isinstance(source, list) else source))
        return units
    return [(":", text)]


@dataclass
class Question:
    """One interview question of lessons/interview-bank.md."""

    id: str  # "Q-KV-03"
    topic: str  # "KV"
    tags: tuple[str, ...]  # ("M",) or ("H", "design")
    title: str
    line: int  # of the heading
    anchor_above: str | None  # the `<a id>` on the line above the heading
    section_topic: str | None  # the topic of the `## TOPIC ...` section it sits in
    body: str  # from the heading to the next question or section
    links: list[Link] = field(default_factory=list)  # every link in the body
    links_line: list[Link] = field(default_factory=list)  # links on the **Links.** line

    @property
    def anchor(self) -> str:
        return self.id.lower()


@dataclass
class Term:
    """One glossary entry: an `<a id>` line, then a line starting with the bold term."""

    id: str
    name: str | None  # the bold term, None if the entry lacks it
    line: int
    body: str


class Course:
    """The course files under `root`, read once, with the plan that says which lessons exist or will."""

    def __init__(self, root: Path = ROOT, lessons: tuple[PlannedLesson, ...] = course_plan.LESSONS,
                 topics: dict[str, str] | None = None,
                 code_dirs: tuple[str, ...] = ("ref_engine", "sim", "serving_lab", "course", "lessons/exercises", "benchmarks"),
                 min_questions: int = course_plan.MIN_QUESTIONS_PER_LESSON,
                 min_exercises: int = course_plan.MIN_EXERCISES_PER_NOTEBOOK_LESSON) -> None:
        self.root = Path(root).resolve()
        self.plan = lessons
        self.topics = course_plan.TOPICS if topics is None else topics
        self.min_questions = min_questions  # questions linking each written lesson that has questions
        self.min_exercises = min_exercises  # exercises of each written lesson that has a notebook
        self.code_dirs = code_dirs
        self.lessons_dir = self.root / "lessons"
        self.notebooks_dir = self.root / "notebooks"
        self.exercises_dir = self.lessons_dir / "exercises"
        self.solutions_dir = self.exercises_dir / "solutions"
        self.exercise_tests_dir = self.root / "tests" / "exercises"
        self.glossary_path = self.root / "glossary.md"
        self.bank_path = self.lessons_dir / "interview-bank.md"
        self.map_path = self.lessons_dir / "README.md"
        self._texts: dict[Path, str] = {}
        self._anchors: dict[Path, list[str]] = {}
        self._questions: list[Question] | None = None
        self._terms: list[Term] | None = None

    # ---- files ----

    def name(self, path: Path) -> str:
        """`path` relative to the course root, for messages."""
        try:
            return path.resolve().relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    def read(self, path: Path) -> str:
        path = Path(path).resolve()
        if path not in self._texts:
            self._texts[path] = path.read_text(encoding="utf-8") if path.is_file() else ""
        return self._texts[path]

    def lesson(self, stem: str) -> PlannedLesson | None:
        return next((lesson for lesson in self.plan if lesson.stem == stem), None)

    def lesson_path(self, stem: str) -> Path:
        return self.lessons_dir / f"{stem}.md"

    def notebook_path(self, stem: str) -> Path:
        return self.notebooks_dir / f"{stem}.ipynb"

    def is_written(self, lesson: PlannedLesson) -> bool:
        return self.lesson_path(lesson.stem).is_file()

    @property
    def written_lessons(self) -> list[PlannedLesson]:
        return [lesson for lesson in self.plan if self.is_written(lesson)]

    def lesson_stem_of(self, path: Path) -> str | None:
        """The plan's stem if `path` is (or would be) a planned lesson file."""
        path = Path(os.path.normpath(path))
        if path.parent == self.lessons_dir and path.suffix == ".md" and self.lesson(path.stem):
            return path.stem
        return None

    def notebook_stem_of(self, path: Path) -> str | None:
        path = Path(os.path.normpath(path))
        lesson = self.lesson(path.stem)
        if path.parent == self.notebooks_dir and path.suffix == ".ipynb" and lesson and lesson.notebook:
            return path.stem
        return None

    def course_files(self) -> list[Path]:
        """The files whose links the checker follows: lessons, glossary, notebooks (Markdown cells)."""
        files = sorted(self.lessons_dir.glob("*.md")) if self.lessons_dir.is_dir() else []
        if self.glossary_path.is_file():
            files.append(self.glossary_path)
        if self.notebooks_dir.is_dir():
            files += sorted(self.notebooks_dir.glob("*.md")) + sorted(self.notebooks_dir.glob("*.ipynb"))
        return files

    def anchors(self, path: Path) -> list[str]:
        """Explicit `<a id>` anchors of a Markdown file or a notebook's Markdown cells, duplicates kept."""
        path = Path(path).resolve()
        if path not in self._anchors:
            found = []
            for _, text in markdown_units(path, self.read(path)):
                found += ANCHOR_RE.findall(strip_fences(text))
            self._anchors[path] = found
        return self._anchors[path]

    def links(self, path: Path) -> list[Link]:
        out = []
        for prefix, text in markdown_units(path, self.read(path)):
            out += links_in(text, path, self.name(path) + prefix)
        return out

    # ---- the interview bank ----

    @property
    def questions(self) -> list[Question]:
        if self._questions is None:
            self._questions = self._parse_bank()
        return self._questions

    def _parse_bank(self) -> list[Question]:
        text = self.read(self.bank_path)
        lines = text.split("\n")
        plain = strip_fences(text).split("\n")
        questions: list[Question] = []
        section = None
        current: Question | None = None
        start = 0

        def close(end: int) -> None:
            """Finish the current question at line `end` (0-based, exclusive)."""
            if current is None:
                return
            current.body = "\n".join(lines[start:end])
            current.links = [_shift(link, start) for link in
                             links_in(current.body, self.bank_path, f"{self.name(self.bank_path)}:")]
            # the **Links.** paragraph: from its line to the next blank line
            in_links, links_lines = False, set()
            for n in range(start, end):
                in_links = ("**Links.**" in plain[n]) or (in_links and plain[n].strip() != "")
                if in_links:
                    links_lines.add(n + 1)
            current.links_line = [link for link in current.links if _line_of(link) in links_lines]

        for i, line in enumerate(plain):
            topic = TOPIC_RE.match(line)
            question = QUESTION_RE.match(line)
            if question or line.startswith("## "):
                has_anchor_above = i > 0 and ANCHOR_RE.fullmatch(plain[i - 1].strip()) is not None
                close(i - 1 if has_anchor_above else i)
                current = None
            if line.startswith("## "):
                section = topic.group(1) if topic else None
            if question:
                above = ANCHOR_RE.fullmatch(plain[i - 1].strip()) if i else None
                tags = tuple(re.findall(r"\[([A-Za-z-]+)\]", question.group(4)))
                current = Question(id=question.group(1), topic=question.group(2), tags=tags,
                                   title=question.group(5).strip(), line=i + 1,
                                   anchor_above=above.group(1) if above else None,
                                   section_topic=section, body="")
                start = i
                questions.append(current)
        close(len(lines))
        return questions

    def question_lessons(self, question: Question) -> list[tuple[str, str | None]]:
        """(lesson stem, section anchor) pairs the question's **Links.** line points at; links to an
        exercise (`#e01-1`) are not lesson sections and are left out."""
        out = []
        for link in question.links_line:
            stem = None if link.is_external else self.lesson_stem_of(link.resolved)
            if stem and not (link.anchor and EXERCISE_ANCHOR_RE.match(link.anchor)):
                out.append((stem, link.anchor))
        return out

    def questions_of(self, stem: str) -> list[Question]:
        return [q for q in self.questions if any(s == stem for s, _ in self.question_lessons(q))]

    # ---- the glossary ----

    @property
    def terms(self) -> list[Term]:
        if self._terms is None:
            self._terms = self._parse_glossary()
        return self._terms

    def _parse_glossary(self) -> list[Term]:
        text = self.read(self.glossary_path)
        lines = text.split("\n")
        plain = strip_fences(text).split("\n")
        starts = [i for i, line in enumerate(plain) if ANCHOR_RE.fullmatch(line.strip())]
        terms = []
        for n, i in enumerate(starts):
            end = starts[n + 1] if n + 1 < len(starts) else len(lines)
            for j in range(i + 1, end):
                if plain[j].startswith("#"):
                    end = j
                    break
            first = next((plain[j] for j in range(i + 1, end) if plain[j].strip()), "")
            name = re.match(r"^\*\*([^*]+)\*\*", first)
            terms.append(Term(id=ANCHOR_RE.fullmatch(plain[i].strip()).group(1),
                              name=name.group(1) if name else None, line=i + 1,
                              body="\n".join(lines[i:end])))
        return terms

    def term_links(self, path: Path) -> list[tuple[str, Link]]:
        """(term id, link) for every link from `path` into glossary.md with an anchor."""
        out = []
        for link in self.links(path):
            if not link.is_external and link.anchor and link.resolved == self.glossary_path:
                out.append((link.anchor, link))
        return out

    def first_use_section(self, stem: str, term: str) -> str | None:
        """The anchor of the lesson section where the lesson first links `term` (None if it doesn't)."""
        path = self.lesson_path(stem)
        text = strip_fences(self.read(path)).split("\n")
        section = None
        for line in text:
            for anchor in ANCHOR_RE.findall(line):
                section = anchor
            for m in LINK_RE.finditer(line):
                target = m.group(2)
                if "#" in target and GLOSSARY_LINK_RE.search(target.split("#")[0]) \
                        and target.split("#", 1)[1] == term:
                    return section or ""
        return None


def _line_of(link: Link) -> int:
    return int(link.where.rsplit(":", 1)[1])


def _shift(link: Link, offset: int) -> Link:
    """Re-number a link found in a slice of the bank that starts at line `offset` (0-based)."""
    prefix, number = link.where.rsplit(":", 1)
    return Link(link.source, f"{prefix}:{int(number) + offset}", link.text, link.target, link.before)


# ---------------------------------------------------------------------------------------------------
# Generated blocks
# ---------------------------------------------------------------------------------------------------

def begin_marker(kind: str) -> str:
    return f"<!-- BEGIN AUTO:{kind} -->"


def end_marker(kind: str) -> str:
    return f"<!-- END AUTO:{kind} -->"


def replace_block(text: str, kind: str, body: str) -> str | None:
    """`text` with the block's content replaced by `body`; None if the markers are missing."""
    begin, end = begin_marker(kind), end_marker(kind)
    i = text.find(begin)
    j = text.find(end, i + 1) if i >= 0 else -1
    if i < 0 or j < 0:
        return None
    return text[: i + len(begin)] + "\n" + body.rstrip("\n") + "\n" + text[j:]


def _question_line(q: Question, link_base: str) -> str:
    tags = " ".join(f"[{t}]" for t in q.tags)
    return f"[{q.id}]({link_base}#{q.anchor}) {tags} {q.title}".rstrip()


def render_questions(course: Course, lesson: PlannedLesson) -> str:
    """A written lesson's list of the questions that link it."""
    base = rel(course.bank_path, course.lessons_dir)
    questions = course.questions_of(lesson.stem)
    if not questions:
        return "_No interview question links this lesson yet._"
    return "\n".join(f"- {_question_line(q, base)}" for q in questions)


def render_used_in(course: Course, term: str) -> str:
    """A glossary term's "Used in" line: lessons that link it (or plan to), then questions that link it."""
    parts = []
    for lesson in course.plan:
        if course.is_written(lesson):
            section = course.first_use_section(lesson.stem, term)
            if section is not None:
                target = rel(course.lesson_path(lesson.stem), course.root) + (f"#{section}" if section else "")
                parts.append(f"[{lesson.number} {lesson.title}]({target})")
        elif term in lesson.terms:
            parts.append(f"{lesson.number} {lesson.title} _(planned)_")
    bank = rel(course.bank_path, course.root)
    used_by_questions = [q for q in course.questions
                         if any(link.anchor == term and link.resolved == course.glossary_path
                                for link in q.links)]
    line = "- Used in: " + (" · ".join(parts) if parts else "_no lesson yet_")
    if used_by_questions:
        line += "; questions " + ", ".join(f"[{q.id}]({bank}#{q.anchor})" for q in used_by_questions)
    return line


def _minutes(total: int) -> str:
    hours, minutes = divmod(total, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"


def render_course_map(course: Course) -> str:
    here = course.lessons_dir
    bank = rel(course.bank_path, here)
    rows = ["| # | Lesson | Notebook | Exercises | Questions | Minutes |",
            "|---|---|---|---|---|---:|"]
    n_exercises = n_questions = 0
    for lesson in course.plan:
        written = course.is_written(lesson)
        title = f"[{lesson.title}]({rel(course.lesson_path(lesson.stem), here)})" if written \
            else f"{lesson.title} _(planned)_"
        if not lesson.notebook:
            notebook = "—"
        elif course.notebook_path(lesson.stem).is_file():
            notebook = f"[{lesson.stem}.ipynb]({rel(course.notebook_path(lesson.stem), here)})"
        else:
            notebook = "_planned_"
        exercises = []
        for ex in lesson.exercises:
            target = (f"{rel(course.lesson_path(lesson.stem), here)}#{ex.anchor}" if written
                      else rel(course.exercises_dir / f"{lesson.exercise_module}.py", here))
            exercises.append(f"[{ex.id}]({target}) {ex.kind}")
        questions = [f"[{q.id}]({bank}#{q.anchor})" for q in course.questions_of(lesson.stem)]
        n_exercises += len(exercises)
        n_questions += len(questions)
        rows.append(f"| {lesson.number} | {title} | {notebook} | {'<br>'.join(exercises) or '—'} | "
                    f"{', '.join(questions) or '—'} | {lesson.minutes} |")
    total = sum(lesson.minutes for lesson in course.plan)
    written = len(course.written_lessons)
    rows.append(f"| | **{written} of {len(course.plan)} written** | | **{n_exercises} exercises** | "
                f"**{n_questions} question links** | **{_minutes(total)}** |")
    return "\n".join(rows)


def render_bank_index(course: Course) -> str:
    rows = ["| Question | Level | Lessons |", "|---|---|---|"]
    order = {topic: i for i, topic in enumerate(course.topics)}
    for q in sorted(course.questions, key=lambda q: (order.get(q.topic, len(order)), q.id)):
        lessons = []
        for stem, anchor in course.question_lessons(q):
            lesson = course.lesson(stem)
            label = f"{lesson.number}" + (f" §{anchor}" if anchor else "")
            lessons.append(f"[{label}]({stem}.md" + (f"#{anchor})" if anchor else ")"))
        rows.append(f"| [{q.id}](#{q.anchor}) {q.title} | {' '.join(q.tags)} | {', '.join(lessons) or '—'} |")
    return "\n".join(rows)


def expected_blocks(course: Course) -> list[tuple[Path, str, str]]:
    """Every generated block as (file, kind, content), in a fixed order."""
    blocks = [(course.map_path, "course-map", render_course_map(course))]
    for lesson in course.written_lessons:
        if lesson.has_questions:
            blocks.append((course.lesson_path(lesson.stem), "questions", render_questions(course, lesson)))
    for term in course.terms:
        blocks.append((course.glossary_path, f"used-in:{term.id}", render_used_in(course, term.id)))
    blocks.append((course.bank_path, "bank-index", render_bank_index(course)))
    return blocks


def updates(course: Course) -> tuple[dict[Path, str], list[str], list[str]]:
    """(new text per changed file, stale blocks, missing blocks), without writing anything."""
    texts: dict[Path, str] = {}
    stale, missing = [], []
    for path, kind, body in expected_blocks(course):
        text = texts.get(path, course.read(path))
        new = replace_block(text, kind, body)
        if new is None:
            missing.append(f"{course.name(path)}: no {begin_marker(kind)} ... {end_marker(kind)} block")
        elif new != text:
            texts[path] = new
            stale.append(f"{course.name(path)} (AUTO:{kind})")
    return texts, stale, missing


# ---------------------------------------------------------------------------------------------------
# A skeleton for the writer of a planned lesson
# ---------------------------------------------------------------------------------------------------

def exercise_statements(course: Course, lesson: PlannedLesson) -> dict[str, list[tuple[str, str]]]:
    """Per exercise id, (name, docstring) of the stub functions and classes that raise it (or, for a debug
    exercise, whose docstring starts with "ENN.k (debug)"), read with `ast`."""
    import ast

    path = course.exercises_dir / f"{lesson.exercise_module}.py"
    try:
        tree = ast.parse(course.read(path))
    except SyntaxError:
        return {}
    out: dict[str, list[tuple[str, str]]] = {}
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            continue
        stated = re.match(r"^(E\d\d\.\d+) \(debug\)", ast.get_docstring(node) or "")
        if stated:  # a debug exercise: buggy code that raises nothing, stated by its docstring
            out.setdefault(stated.group(1), []).append((node.name, ast.get_docstring(node) or ""))
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Raise) and isinstance(sub.exc, ast.Call) and sub.exc.args \
                    and isinstance(sub.exc.args[0], ast.Constant) and isinstance(sub.exc.args[0].value, str):
                m = re.match(r"^(E\d\d\.\d+)\b", sub.exc.args[0].value)
                if m:
                    out.setdefault(m.group(1), []).append((node.name, ast.get_docstring(node) or ""))
                    break
    return out


def render_skeleton(course: Course, lesson: PlannedLesson) -> str:
    """A Markdown skeleton of a planned lesson with every planned anchor, term and exercise (the layout of
    lessons/CONTRIBUTING.md, "A lesson"). The writer replaces the TODOs; the checker then accepts the anchors and terms."""
    nb = f"../notebooks/{lesson.stem}.ipynb"
    stub = f"exercises/{lesson.exercise_module}.py"
    special = {"you-will-learn", "exercises", "questions", "summary"}
    lines = [f"# {lesson.title}", ""]
    header = f"{lesson.minutes} min · prerequisites: TODO · code: TODO ([`Symbol`](../path/to/file.py))"
    lines += [(f"Notebook: [{lesson.stem}.ipynb]({nb}) · " if lesson.notebook else "") + header, ""]
    for anchor in lesson.anchors:
        if anchor == "exercises" or anchor in special - {"you-will-learn"}:
            continue
        title = "You will learn" if anchor == "you-will-learn" else anchor.replace("-", " ").capitalize()
        lines += [f'<a id="{anchor}"></a>', f"## {title}", ""]
        if anchor == "you-will-learn":
            lines += ["- TODO (3-5 testable bullets)", ""]
        else:
            run_it = f' ([notebook, "TODO"]({nb}#TODO))' if lesson.notebook else ""
            lines += ["TODO", "", f"Run it: TODO{run_it}", ""]
    if lesson.exercises or "exercises" in lesson.anchors:
        statements = exercise_statements(course, lesson)
        lines += ['<a id="exercises"></a>', "## Exercises", ""]
        for ex in lesson.exercises:
            lines += [f'<a id="{ex.anchor}"></a>', f"### {ex.id} {ex.title} ({ex.kind})", ""]
            for name, doc in statements.get(ex.id, []):
                lines += [f"Stub: [`{name}`]({stub})", "", doc, ""]
            asked = [q for q in course.questions if any(
                link.anchor == ex.anchor and course.lesson_stem_of(link.resolved) == lesson.stem
                for link in q.links if not link.is_external)]
            if asked:
                lines += ["Interview questions: " + ", ".join(f"[{q.id}](interview-bank.md#{q.anchor})"
                                                             for q in asked), ""]
            lines += [f"Check: `pytest tests/exercises --impl=learner -k {ex.anchor.replace('-', '_')}`", "",
                      "<details><summary>Hints</summary>", "", "TODO", "", "</details>", ""]
    if lesson.has_questions:
        lines += ['<a id="questions"></a>', "## Interview questions", "", begin_marker("questions"),
                  end_marker("questions"), ""]
    if "summary" in lesson.anchors:
        lines += ['<a id="summary"></a>', "## Summary", "", "TODO", ""]
    if lesson.terms:
        lines += ["<!-- Link each term at its first use, then delete this list:",
                  *[f"[{t}](../glossary.md#{t})" for t in lesson.terms], "-->", ""]
    if lesson.notebook_anchors:
        lines += [f"<!-- The notebook {lesson.stem}.ipynb must define these anchors in Markdown cells: "
                  + ", ".join(lesson.notebook_anchors) + " -->", ""]
    return "\n".join(lines)


def run(course: Course, write: bool) -> int:
    """Write the stale blocks (`write`), or only report them; returns the exit status."""
    texts, stale, missing = updates(course)
    for problem in missing:
        print(f"missing block: {problem}", file=sys.stderr)
    if not write:
        if stale:
            print("stale generated blocks:\n  " + "\n  ".join(stale), file=sys.stderr)
            print(f"run: {WRITE_COMMAND}", file=sys.stderr)
            return 1
        print(f"all generated blocks are fresh ({len(expected_blocks(course)) - len(missing)} blocks)")
        return 0
    for path, text in texts.items():
        path.write_text(text, encoding="utf-8")
    print(f"rewrote {len(stale)} block(s)" + (":\n  " + "\n  ".join(stale) if stale else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite stale generated blocks")
    mode.add_argument("--check", action="store_true", help="dry run: exit 1 if a block is stale")
    mode.add_argument("--skeleton", metavar="STEM",
                      help="print a skeleton of a planned lesson: its anchors, terms and exercise statements")
    args = parser.parse_args(argv)
    course = Course(ROOT)
    if args.skeleton:
        lesson = course.lesson(args.skeleton)
        if lesson is None:
            parser.error(f"no lesson {args.skeleton!r} in course_plan.py")
        print(render_skeleton(course, lesson))
        return 0
    return run(course, write=args.write)


if __name__ == "__main__":
    sys.exit(main())
