"""The course read from its files: lessons, notebooks, interview bank and glossary, as the tools see them.

The generator (`course_links.py`), the link checker (`course_check.py`) and the site (`course_site.py`) all read
the course through `Course`, so they agree on what a link, an anchor, a lesson, an exercise, a question and a
glossary term are. The files are the only source: a lesson is a file `lessons/NN-topic.md` (or
`lessons/capstone.md`), its title is its first heading, its minutes are on its header line, and its exercises
are its `### ENN.k Title (kind)` headings. Standard library only, no network.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ANCHOR_RE = re.compile(r'<a\s+id="([^"]*)"\s*>\s*</a>')
# [text](target) where text may hold `code` spans and one level of [brackets]; an optional "title".
LINK_RE = re.compile(
    r'\[((?:[^\[\]`]|`[^`]*`|\[[^\[\]]*\])*)\]\(\s*<?([^()\s<>]+)>?(?:\s+"[^"]*")?\s*\)')
FENCE_RE = re.compile(r"^\s*(```|~~~)")
QUESTION_RE = re.compile(r"^###\s+(Q-([A-Z]+)-(\d{2}))\s+((?:\[[A-Za-z-]+\]\s*)+)(.*)$")
TOPIC_RE = re.compile(r"^##\s+([A-Z]+)\b")
EXERCISE_HEADING_RE = re.compile(r"^###\s+(E\d\d\.\d+)\s+(.*?)\s*(?:\(([\w-]+)\))?\s*$")
EXERCISE_ANCHOR_RE = re.compile(r"^e(\d\d)-(\d+)$")
LESSON_STEM_RE = re.compile(r"^(\d\d)-[a-z0-9-]+$|^capstone$")
MINUTES_RE = re.compile(r"\b(\d+) min")
# the course map, the bank, the format, the vLLM release the course cites, the instructor's guide
NOT_LESSONS = ("README.md", "interview-bank.md", "CONTRIBUTING.md", "vllm-baseline.md", "INSTRUCTOR.md")


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


@dataclass(frozen=True)
class Link:
    """One relative or external link found in a course file."""

    source: Path  # the file the link is in
    where: str  # "lessons/x.md:12" or "notebooks/x.ipynb cell 3 line 2", for messages
    line: int  # the line number `where` ends with
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


def links_in(text: str, source: Path, where_prefix: str, first_line: int = 1) -> list[Link]:
    """Every link of `text`, numbered from `first_line` (a slice of a file starts past line 1)."""
    links = []
    for number, line in enumerate(strip_fences(text).split("\n"), start=first_line):
        for m in LINK_RE.finditer(line):
            links.append(Link(source, f"{where_prefix}{number}", number, m.group(1), m.group(2), line[: m.start()]))
    return links


def markdown_units(path: Path, text: str) -> list[tuple[str, str]]:
    """(where-prefix, Markdown text) pieces of a file: the whole file, or each Markdown cell of a notebook."""
    if path.suffix != ".ipynb":
        return [(":", text)]
    try:
        cells = json.loads(text).get("cells", [])
    except json.JSONDecodeError:
        return []
    return [(f" cell {i} line ", "".join(cell.get("source", "")))
            for i, cell in enumerate(cells, start=1) if cell.get("cell_type") == "markdown"]


@dataclass(frozen=True)
class Exercise:
    """One exercise `ENN.k`, stated under the heading `### ENN.k Title (kind)` of lesson NN."""

    id: str  # "E01.1"
    title: str
    kind: str  # implement | estimate | predict-then-run | debug | design ("" if the heading names none)
    line: int  # of the heading

    @property
    def anchor(self) -> str:
        """"E01.1" -> "e01-1"."""
        return self.id.lower().replace(".", "-")


@dataclass(frozen=True)
class Lesson:
    """One lesson file. The orientation (00) and the capstone have no notebook; every other lesson has
    `notebooks/<stem>.ipynb`."""

    stem: str  # "01-continuous-batching"; the notebook and the exercise modules follow it
    title: str  # the first `# ` heading ("" if none)
    minutes: int  # from the header line ("90 min"); 0 if it names none
    exercises: tuple[Exercise, ...]

    @property
    def number(self) -> str:
        """"01" for "01-continuous-batching", "C" for the capstone."""
        head = self.stem.split("-", 1)[0]
        return head if head.isdigit() else "C"

    @property
    def has_notebook(self) -> bool:
        return self.number not in ("00", "C")

    @property
    def exercise_module(self) -> str:
        """Stem of the stub, solution and test modules: "e01_continuous_batching"."""
        return f"e{self.number}_{self.stem.split('-', 1)[-1].replace('-', '_')}"


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
    body: str = ""  # from the heading to the next question or section
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


class Course:
    """The course files under `root`, each read once."""

    def __init__(self, root: Path = ROOT,
                 code_dirs: tuple[str, ...] = ("core", "ref_engine", "sim", "serving_lab", "course",
                                               "lessons/exercises", "benchmarks")) -> None:
        self.root = Path(root).resolve()
        self.code_dirs = code_dirs  # where module docstrings may carry a `Lesson:` line
        self.lessons_dir = self.root / "lessons"
        self.notebooks_dir = self.root / "notebooks"
        self.exercises_dir = self.lessons_dir / "exercises"
        self.glossary_path = self.root / "glossary.md"
        self.bank_path = self.lessons_dir / "interview-bank.md"
        self.map_path = self.lessons_dir / "README.md"
        self._texts: dict[Path, str] = {}
        self._anchors: dict[Path, list[str]] = {}

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

    def lesson_path(self, stem: str) -> Path:
        return self.lessons_dir / f"{stem}.md"

    def notebook_path(self, stem: str) -> Path:
        return self.notebooks_dir / f"{stem}.ipynb"

    def markdown_pages(self) -> list[Path]:
        return sorted(self.lessons_dir.glob("*.md")) if self.lessons_dir.is_dir() else []

    def notebooks(self) -> list[Path]:
        return sorted(self.notebooks_dir.glob("*.ipynb")) if self.notebooks_dir.is_dir() else []

    @cached_property
    def lessons(self) -> list[Lesson]:
        """Every lesson file, in course order (the numbered lessons, then the capstone)."""
        stems = [p.stem for p in self.markdown_pages() if LESSON_STEM_RE.match(p.stem)]
        return [self._read_lesson(stem) for stem in sorted(stems, key=lambda s: (s == "capstone", s))]

    def _read_lesson(self, stem: str) -> Lesson:
        lines = strip_fences(self.read(self.lesson_path(stem))).split("\n")
        title = next((line[2:].strip() for line in lines if line.startswith("# ")), "")
        minutes = MINUTES_RE.search("\n".join(lines[:8]))
        exercises = tuple(Exercise(m.group(1), m.group(2), m.group(3) or "", n)
                          for n, m in enumerate(map(EXERCISE_HEADING_RE.match, lines), start=1) if m)
        return Lesson(stem, title, int(minutes.group(1)) if minutes else 0, exercises)

    def lesson(self, stem: str) -> Lesson | None:
        return next((lesson for lesson in self.lessons if lesson.stem == stem), None)

    def lesson_stem_of(self, path: Path) -> str | None:
        """The stem if `path` is a lesson file."""
        path = Path(os.path.normpath(path))
        if path.parent == self.lessons_dir and path.suffix == ".md" and self.lesson(path.stem):
            return path.stem
        return None

    def course_files(self) -> list[Path]:
        """The files whose links the checker follows: lessons, glossary, notebooks (Markdown cells)."""
        files = self.markdown_pages() + ([self.glossary_path] if self.glossary_path.is_file() else [])
        if self.notebooks_dir.is_dir():
            files += sorted(self.notebooks_dir.glob("*.md")) + self.notebooks()
        return files

    def anchors(self, path: Path) -> list[str]:
        """Explicit `<a id>` anchors of a Markdown file or a notebook's Markdown cells, duplicates kept."""
        path = Path(path).resolve()
        if path not in self._anchors:
            self._anchors[path] = [anchor for _, text in markdown_units(path, self.read(path))
                                   for anchor in ANCHOR_RE.findall(strip_fences(text))]
        return self._anchors[path]

    def links(self, path: Path) -> list[Link]:
        return [link for prefix, text in markdown_units(path, self.read(path))
                for link in links_in(text, path, self.name(path) + prefix)]

    # ---- the interview bank ----

    @cached_property
    def questions(self) -> list[Question]:
        """The bank's questions in its order; each ends where the next question or `## ` section starts."""
        lines = self.read(self.bank_path).split("\n")
        plain = strip_fences("\n".join(lines)).split("\n")
        bank = self.name(self.bank_path)
        questions: list[Question] = []
        starts: list[int] = []  # where each question's text starts (its heading), 0-based
        ends: list[int] = []
        section = None
        for i, line in enumerate(plain):
            question = QUESTION_RE.match(line)
            if question or line.startswith("## "):
                above = ANCHOR_RE.fullmatch(plain[i - 1].strip()) if i else None
                if len(ends) < len(starts):
                    ends.append(i - 1 if above else i)
            if line.startswith("## "):
                topic = TOPIC_RE.match(line)
                section = topic.group(1) if topic else None
            if question:
                tags = tuple(re.findall(r"\[([A-Za-z-]+)\]", question.group(4)))
                questions.append(Question(question.group(1), question.group(2), tags, question.group(5).strip(),
                                          i + 1, above.group(1) if above else None, section))
                starts.append(i)
        ends += [len(lines)] * (len(starts) - len(ends))
        for q, start, end in zip(questions, starts, ends):
            q.body = "\n".join(lines[start:end])
            q.links = links_in(q.body, self.bank_path, f"{bank}:", first_line=start + 1)
            # the **Links.** paragraph: from its line to the next blank line
            in_links, links_lines = False, set()
            for n in range(start, end):
                in_links = "**Links.**" in plain[n] or (in_links and plain[n].strip() != "")
                if in_links:
                    links_lines.add(n + 1)
            q.links_line = [link for link in q.links if link.line in links_lines]
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

    @cached_property
    def terms(self) -> list[Term]:
        """Glossary entries: an anchor line, then (before the next anchor or heading) the bold term."""
        plain = strip_fences(self.read(self.glossary_path)).split("\n")
        starts = [i for i, line in enumerate(plain) if ANCHOR_RE.fullmatch(line.strip())]
        terms = []
        for n, i in enumerate(starts):
            end = starts[n + 1] if n + 1 < len(starts) else len(plain)
            end = next((j for j in range(i + 1, end) if plain[j].startswith("#")), end)
            first = next((plain[j] for j in range(i + 1, end) if plain[j].strip()), "")
            name = re.match(r"^\*\*([^*]+)\*\*", first)
            terms.append(Term(ANCHOR_RE.fullmatch(plain[i].strip()).group(1), name.group(1) if name else None, i + 1))
        return terms

    def term_links(self, path: Path) -> list[tuple[str, Link]]:
        """(term id, link) for every link from `path` into glossary.md with an anchor."""
        return [(link.anchor, link) for link in self.links(path)
                if not link.is_external and link.anchor and link.resolved == self.glossary_path]

    def first_use_section(self, stem: str, term: str) -> str | None:
        """The anchor of the lesson section where the lesson first links `term` ("" before any anchor; None if
        the lesson never links it)."""
        first = next((link for t, link in self.term_links(self.lesson_path(stem)) if t == term), None)
        if first is None:
            return None
        upto = strip_fences(self.read(self.lesson_path(stem))).split("\n")[: first.line]
        anchors = [a for line in upto for a in ANCHOR_RE.findall(line)]
        return anchors[-1] if anchors else ""
