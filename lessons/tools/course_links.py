#!/usr/bin/env python3
"""Fill the course's generated blocks: the links that run backwards (lesson -> its questions, term -> where it
is used) and the tables (course map, bank index), so that nobody keeps them by hand.

    python lessons/tools/course_links.py --write   # rewrite every stale block in place
    python lessons/tools/course_links.py --check   # dry run: exit 1 and name the stale or missing blocks

Generated blocks sit between `<!-- BEGIN AUTO:kind -->` and `<!-- END AUTO:kind -->` lines; everything
else is written by hand. The kinds (lessons/CONTRIBUTING.md, "Generated blocks"):
- `course-map` in lessons/README.md: one row per lesson;
- `questions` in every lesson: the interview questions whose **Links.** line points at it;
- `used-in:<term>` in glossary.md, one per term: the lessons and questions that link the term;
- `bank-index` in lessons/interview-bank.md: every question, topic by topic.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from course_reader import Course, Lesson  # noqa: E402  (a sibling file; this folder is not a package)

WRITE_COMMAND = "python lessons/tools/course_links.py --write"


def rel(path: Path, start: Path) -> str:
    """A relative link from the folder `start` to `path`, with forward slashes."""
    return Path(os.path.relpath(path, start)).as_posix()


def replace_block(text: str, kind: str, body: str) -> str | None:
    """`text` with the block's content replaced by `body`; None if the markers are missing."""
    begin, end = f"<!-- BEGIN AUTO:{kind} -->", f"<!-- END AUTO:{kind} -->"
    i = text.find(begin)
    j = text.find(end, i + 1) if i >= 0 else -1
    if i < 0 or j < 0:
        return None
    return text[: i + len(begin)] + "\n" + body.rstrip("\n") + "\n" + text[j:]


def render_questions(course: Course, lesson: Lesson) -> str:
    """A lesson's list of the questions that link it."""
    base = rel(course.bank_path, course.lessons_dir)
    lines = [f"- [{q.id}]({base}#{q.anchor}) {' '.join(f'[{t}]' for t in q.tags)} {q.title}".rstrip()
             for q in course.questions_of(lesson.stem)]
    return "\n".join(lines) or "_No interview question links this lesson yet._"


def render_used_in(course: Course, term: str) -> str:
    """A glossary term's "Used in" line: lessons that link it (at their first use), then questions that link it."""
    parts = []
    for lesson in course.lessons:
        section = course.first_use_section(lesson.stem, term)
        if section is not None:
            target = rel(course.lesson_path(lesson.stem), course.root) + (f"#{section}" if section else "")
            parts.append(f"[{lesson.number} {lesson.title}]({target})")
    bank = rel(course.bank_path, course.root)
    questions = [q for q in course.questions
                 if any(link.anchor == term and link.resolved == course.glossary_path for link in q.links)]
    line = "- Used in: " + (" · ".join(parts) if parts else "_no lesson yet_")
    if questions:
        line += "; questions " + ", ".join(f"[{q.id}]({bank}#{q.anchor})" for q in questions)
    return line


def render_course_map(course: Course) -> str:
    here = course.lessons_dir
    bank = rel(course.bank_path, here)
    rows = ["| # | Lesson | Notebook | Exercises | Questions | Minutes |", "|---|---|---|---|---|---:|"]
    n_exercises = n_questions = 0
    for lesson in course.lessons:
        page = rel(course.lesson_path(lesson.stem), here)
        notebook = (f"[{lesson.stem}.ipynb]({rel(course.notebook_path(lesson.stem), here)})"
                    if lesson.has_notebook else "—")
        exercises = [f"[{ex.id}]({page}#{ex.anchor}) {ex.kind}" for ex in lesson.exercises]
        questions = [f"[{q.id}]({bank}#{q.anchor})" for q in course.questions_of(lesson.stem)]
        n_exercises += len(exercises)
        n_questions += len(questions)
        rows.append(f"| {lesson.number} | [{lesson.title}]({page}) | {notebook} | {'<br>'.join(exercises) or '—'} | "
                    f"{', '.join(questions) or '—'} | {lesson.minutes} |")
    hours, minutes = divmod(sum(lesson.minutes for lesson in course.lessons), 60)
    rows.append(f"| | **{len(course.lessons)} lessons** | | **{n_exercises} exercises** | "
                f"**{n_questions} question links** | **{hours} h {minutes:02d} min** |")
    return "\n".join(rows)


def render_bank_index(course: Course) -> str:
    """One row per question, topic by topic in the bank's order of topics."""
    order = {topic: i for i, topic in enumerate(dict.fromkeys(q.topic for q in course.questions))}
    rows = ["| Question | Level | Lessons |", "|---|---|---|"]
    for q in sorted(course.questions, key=lambda q: (order[q.topic], q.id)):
        lessons = [f"[{course.lesson(stem).number}{f' §{anchor}' if anchor else ''}]"
                   f"({stem}.md{f'#{anchor}' if anchor else ''})" for stem, anchor in course.question_lessons(q)]
        rows.append(f"| [{q.id}](#{q.anchor}) {q.title} | {' '.join(q.tags)} | {', '.join(lessons) or '—'} |")
    return "\n".join(rows)


def expected_blocks(course: Course) -> list[tuple[Path, str, str]]:
    """Every generated block as (file, kind, content), in a fixed order."""
    blocks = [(course.map_path, "course-map", render_course_map(course))]
    blocks += [(course.lesson_path(lesson.stem), "questions", render_questions(course, lesson))
               for lesson in course.lessons]
    blocks += [(course.glossary_path, f"used-in:{term.id}", render_used_in(course, term.id)) for term in course.terms]
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
            missing.append(f"{course.name(path)}: no <!-- BEGIN AUTO:{kind} --> ... <!-- END AUTO:{kind} --> block")
        elif new != text:
            texts[path] = new
            stale.append(f"{course.name(path)} (AUTO:{kind})")
    return texts, stale, missing


def run(course: Course, write: bool) -> int:
    """Write the stale blocks (`write`), or only report them; 1 if a block is missing, or stale and not written."""
    texts, stale, missing = updates(course)
    for problem in missing:
        print(f"missing block: {problem}", file=sys.stderr)
    if write:
        for path, text in texts.items():
            path.write_text(text, encoding="utf-8")
        print(f"rewrote {len(stale)} block(s)" + "".join(f"\n  {s}" for s in stale))
    elif stale:
        print("stale generated blocks:" + "".join(f"\n  {s}" for s in stale), file=sys.stderr)
        print(f"run: {WRITE_COMMAND}", file=sys.stderr)
    else:
        print(f"all generated blocks are fresh ({len(expected_blocks(course)) - len(missing)} blocks)")
    return 1 if missing or (stale and not write) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite stale generated blocks")
    mode.add_argument("--check", action="store_true", help="dry run: exit 1 if a block is stale or missing")
    return run(Course(), write=parser.parse_args(argv).write)


if __name__ == "__main__":
    sys.exit(main())
