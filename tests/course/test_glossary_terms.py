"""Every term a lesson puts in a heading or in bold has a glossary entry (lessons/CONTRIBUTING.md, "What the
checkers enforce"). No network, no torch.

What counts as a term, and when it has an entry:

- **Where.** The `##`-`####` headings and the `**bold**` spans of every lesson file (the numbered lessons and
  the capstone), outside fenced code and HTML comments. Not checked: the title (`# `, it names the lesson), the
  sections every lesson has by the format (anchors `you-will-learn`, `exercises`, `questions`, `summary`),
  exercise headings (`### ENN.k ...`, they state a task), a heading that starts with a question word (`When
  it backfires: ...` asks, it does not name) or with an -ing verb (`Measuring a server` names an activity).
- **What.** A heading's term is its text before the first colon (`Goodput: throughput that meets the SLO` ->
  `Goodput`). A bold span is a term unless it is a run-in lead (it ends with `.` or `:` inside the bold), the
  lead of a numbered step (`1. **Sweep** the knobs`), or has no letter (`**35%**`). Emphasis is written in
  italics, so it is never mistaken for a term.
- **Short only.** After dropping a leading article or pronoun ("the", "a", "one", "what", ...), a candidate of
  more than three words is a phrase, not a term, and is not checked.
- **Matching.** Case-insensitive and plural-insensitive (each word singularised: "caches" -> "cache",
  "queries" -> "query"), hyphens and underscores read as spaces, link syntax reduced to its text. The glossary's
  vocabulary is every entry's bold term (and what its parentheses hold: "Grouped-query attention (GQA)" gives
  both) plus every name on its `Synonyms:` line, up to four words each. A candidate has an entry when a
  vocabulary phrase occurs in it as whole words ("Priorities and preemption" contains "preemption") or it
  occurs so in a vocabulary phrase ("The stall" is the head of "prefill stall").
- **Allowed.** `ALLOWED` lists, with a reason each, the few candidates that are not serving terms: the course's
  own furniture and lesson 6's figure labels. A release name in bold (`**vLLM v0.33.0**`, which
  tests/course/test_vllm_baseline.py requires) is allowed by its pattern.

A term that fails either gets a glossary entry (and a lesson link to it) or, if it really is no term, an
italic or a line in `ALLOWED` with its reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from course_reader import ANCHOR_RE, Course, strip_fences

# Candidates (normalised, see `normalise`) that are not serving terms, each with its reason.
ALLOWED: dict[str, str] = {
    "quick start": "the orientation's setup section",
    "anchor": "the course's link format (orientation, 'How the links and ids work')",
    "question": "the course's id format (orientation, 'How the links and ids work')",
    "appendix": "lesson 1's appendix heading",
    "tolerance": "lesson 1's appendix: the notebooks' pass/fail tolerances, not a serving term",
    "experiment protocol": "lesson 1's rules for comparing engine and simulator",
    "capstone": "the course's final assignment",
    "assignment": "the capstone's sections",
    "rubric": "the capstone's sections",
    "worked example": "the capstone's sections",
    "best configuration": "lesson 7's 'No best configuration': a claim, not a term",
    "box": "lesson 6's figure: a box is a component drawn in it",
    "request traced": "lesson 6's section on one traced request (the term is request tracing)",
    "request sequence replayed": "lesson 6's sequence diagram",
    "few shot example": "a kind of prompt in lesson 4's list of shared prefixes",
    "chat history": "a kind of prompt in lesson 4's list of shared prefixes",
    "agent and tool": "a kind of prompt in lesson 4's list of shared prefixes",
}
ALLOWED_PATTERNS = (re.compile(r"^vllm v\d+(\.\d+)*$"),)  # the baseline release, in bold on purpose

FORMAT_SECTIONS = {"you-will-learn", "exercises", "questions", "summary"}
LEADING = {"a", "an", "the", "one", "its", "our", "their", "your", "no", "more", "it", "we", "you", "they"}
QUESTION_WORDS = {"what", "why", "how", "when", "which", "where", "who", "is", "are", "does", "do", "can"}

MAX_WORDS = 3  # a longer candidate is a phrase, not a term
MAX_VOCABULARY_WORDS = 4  # a longer synonym is an explanation, not a name
HEADING_RE = re.compile(r"^(#{2,4})\s+(.*?)\s*$")
BOLD_RE = re.compile(r"\*\*(.+?)\*\*")
LINK_TEXT_RE = re.compile(r"\[([^\]]*)\]\([^)]*\)")
EXERCISE_RE = re.compile(r"^E\d\d\.\d+\b")
NUMBERED_LEAD_RE = re.compile(r"^\s*\d+\.\s+\*\*")


def singular(word: str) -> str:
    """A plural English noun's singular, by the common rules (good enough for matching, not for grammar)."""
    if len(word) > 3 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and re.search(r"(ch|sh|x|ss|z)es$", word):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not re.search(r"(ss|us|is|ics)$", word):
        return word[:-1]
    return word


def stem(word: str) -> str:
    """`singular`, then a final "e" dropped, so that both spellings of a plural meet: "caches" and "cache" ->
    "cach", "batches" and "batch" -> "batch"."""
    word = singular(word)
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


def words(text: str) -> list[str]:
    """Lower-case, stemmed words of `text`: link syntax reduced to its text, code and emphasis marks dropped,
    hyphens, underscores, slashes and other punctuation read as spaces ("v0.33.0" keeps its dots)."""
    text = LINK_TEXT_RE.sub(r"\1", text).lower()
    text = re.sub(r"[`*]", "", text)
    text = re.sub(r"(?<!\d)\.|\.(?!\d)", " ", text)
    return [stem(w) for w in re.sub(r"[^a-z0-9.]+", " ", text).split()]


LEADING_STEMS = {stem(w) for w in LEADING}
QUESTION_STEMS = {stem(w) for w in QUESTION_WORDS}


def normalise(text: str) -> str:
    """A candidate term as the check compares it: `words`, without a leading article or pronoun."""
    ws = words(text)
    while ws and ws[0] in LEADING_STEMS:
        ws = ws[1:]
    return " ".join(ws)


def vocabulary(course: Course) -> set[str]:
    """The glossary's names: every entry's bold term (split at its parentheses) and its `Synonyms:` names."""
    names = []
    for term in course.terms:
        names += re.split(r"[()]", term.name or "")
    blocks: list[str | None] = []  # each entry's Synonyms line with its indented continuation lines
    for line in strip_fences(course.read(course.glossary_path)).split("\n"):
        if line.startswith("- Synonyms:"):
            blocks.append(line.removeprefix("- Synonyms:"))
        elif blocks and blocks[-1] is not None and line.startswith("  ") and line.strip():
            blocks[-1] += " " + line.strip()
        elif blocks and blocks[-1] is not None:
            blocks.append(None)  # the block ended
    for block in filter(None, blocks):
        names += re.split(r"[,;]", re.sub(r"\([^)]*\)", "", block))
    found = {normalise(name) for name in names}
    return {name for name in found if name and len(name.split()) <= MAX_VOCABULARY_WORDS}


def _contains(phrase: str, part: str) -> bool:
    return re.search(rf"(?:^| ){re.escape(part)}(?: |$)", phrase) is not None


def has_entry(candidate: str, names: set[str]) -> bool:
    return any(_contains(candidate, name) or _contains(name, candidate) for name in names)


def allowed(candidate: str, allow: dict[str, str]) -> bool:
    return candidate in {normalise(term) for term in allow} or any(p.match(candidate) for p in ALLOWED_PATTERNS)


@dataclass(frozen=True)
class Candidate:
    where: str  # "lessons/01-x.md:12"
    kind: str  # "heading" | "bold"
    text: str  # as written
    term: str  # normalised


def candidates(course: Course) -> list[Candidate]:
    """Every heading and bold span of the lessons that names a term, by the rules in the module docstring."""
    found = []
    for lesson in course.lessons:
        path = course.lesson_path(lesson.stem)
        lines = strip_fences(course.read(path)).split("\n")
        for number, line in enumerate(lines, start=1):
            where = f"{course.name(path)}:{number}"
            heading = HEADING_RE.match(line)
            if heading:
                above = ANCHOR_RE.search(lines[number - 2]) if number > 1 else None
                text = heading.group(2)
                first = (words(text) or [""])[0]
                if not ((above and above.group(1) in FORMAT_SECTIONS) or EXERCISE_RE.match(text)
                        or first in QUESTION_STEMS or (first.endswith("ing") and len(first) > 5)):
                    found.append(Candidate(where, "heading", text, normalise(text.split(":", 1)[0])))
                continue
            for bold in BOLD_RE.finditer(line):
                text = bold.group(1).strip()
                numbered_lead = bold.start() == line.index("**") and NUMBERED_LEAD_RE.match(line)
                if text.endswith((".", ":")) or numbered_lead or not re.search(r"[A-Za-z]", text):
                    continue
                found.append(Candidate(where, "bold", text, normalise(text)))
    return [c for c in found if c.term and len(c.term.split()) <= MAX_WORDS]


def missing_terms(course: Course, allow: dict[str, str] = ALLOWED) -> list[str]:
    """One message per heading or bold term that has no glossary entry and is not allowed."""
    names = vocabulary(course)
    return [f"{c.where}: the {c.kind} term {c.text!r} ({c.term!r}) has no glossary entry: add one to glossary.md "
            f"(linked from a lesson), or italicise it or add it to ALLOWED in {__name__} with a reason if it is no term"
            for c in candidates(course) if not has_entry(c.term, names) and not allowed(c.term, allow)]


# ---- the real course ----------------------------------------------------------------------------------

def test_every_heading_and_bold_term_has_a_glossary_entry():
    problems = missing_terms(Course())
    assert not problems, f"{len(problems)} term(s) without a glossary entry:\n" + "\n".join(problems)


def test_every_allowed_candidate_still_occurs():
    """An allowlist line for a word no lesson uses any more is dead weight: remove it."""
    terms = {c.term for c in candidates(Course())}
    assert sorted(term for term in ALLOWED if normalise(term) not in terms) == []


# ---- the rules, on the fixture course (conftest.py's `mini_course`) -------------------------------------

MINI_ALLOWED = {"intro": "the fixture lessons' section name"}
LESSON = "lessons/01-alpha.md"


def test_fixture_course_is_clean(mini_course):
    assert missing_terms(mini_course.course(), MINI_ALLOWED) == []


@pytest.mark.parametrize("added, fragment", [
    ("\nThe **sprocket** turns.\n", "'sprocket'"),
    ("\n<a id=\"cogs\"></a>\n## Cogs: how they mesh\n", "the heading term 'Cogs: how they mesh'"),
    ("\nTwo **flywheel rims** spin.\n", "('flywheel rim')"),
    ("\n1. Then the **sprocket** turns.\n", "'sprocket'"),  # bold inside a numbered item, not its lead
])
def test_a_term_without_entry_fails(mini_course, added, fragment):
    mini_course.append(LESSON, added)
    problems = missing_terms(mini_course.course(), MINI_ALLOWED)
    assert any(fragment in p for p in problems), problems


@pytest.mark.parametrize("added", [
    "\nMany **Widgets** here.\n",  # case and plural
    "\nA **[gadget](../glossary.md#gadget)** there.\n",  # a link inside the bold
    "\n## The widgets and the sprockets\n",  # contains a term
    "\n**Sprockets.** A run-in lead ends with a period.\n",
    "\n1. **Sprocket** the widget: a numbered step's lead.\n",
    "\nIt turns *every* time: emphasis is italic.\n",
    "\nIt takes **35%**.\n",
    "\nA **long phrase that is bold for emphasis**.\n",
    "\n## When it backfires: a question\n",
    "\n## Measuring a sprocket\n",
    "\n## Intro\n",  # allowed
])
def test_what_is_not_a_missing_term(mini_course, added):
    mini_course.append(LESSON, added)
    assert missing_terms(mini_course.course(), MINI_ALLOWED) == []


def test_a_synonym_is_an_entry(mini_course):
    mini_course.append(LESSON, "\nThe **cog** turns.\n")
    assert missing_terms(mini_course.course(), MINI_ALLOWED)
    mini_course.edit("glossary.md", "**widget**: a thing.", "**widget**: a thing.\n\n- Synonyms: cog, `thing_maker`.")
    assert missing_terms(mini_course.course(), MINI_ALLOWED) == []


@pytest.mark.parametrize("word, plural", [("cache", "caches"), ("query", "queries"), ("batch", "batches"),
                                          ("box", "boxes"), ("bus", "bus"), ("metrics", "metrics"),
                                          ("queue", "queues"), ("sequence", "sequences"), ("process", "processes")])
def test_plural_and_singular_meet(word, plural):
    assert stem(plural) == stem(word)
