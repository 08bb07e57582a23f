"""The link checker (lessons/tools/course_check.py): each rule over the real course, and each rule shown to
fail on a small broken fixture course (conftest.py's `mini_course`). No network, no torch."""

from __future__ import annotations

import ast

import course_check as cc
import pytest
from course_reader import Course

REAL = Course()
LESSON, BANK, GLOSSARY, STUB = "lessons/01-alpha.md", "lessons/interview-bank.md", "glossary.md", "lessons/exercises/e01_alpha.py"
ORPHAN = '\n<a id="orphan"></a>\n**orphan**: nobody links me.\n'


def _fmt(problems: list[str]) -> str:
    return "\n".join(problems)


@pytest.mark.parametrize("rule", cc.RULES, ids=lambda rule: rule.__name__)
def test_real_course(rule):
    problems = rule(REAL)
    assert not problems, f"{rule.__name__} found {len(problems)} problem(s):\n{_fmt(problems)}"


@pytest.fixture
def coverage(monkeypatch):
    """Sets the coverage minimums (the fixture course is far below the real ones)."""
    def at(questions: int, exercises: int) -> None:
        monkeypatch.setattr(cc, "MIN_QUESTIONS", questions)
        monkeypatch.setattr(cc, "MIN_EXERCISES", exercises)
    at(0, 0)
    return at


def test_fixture_course_is_clean(mini_course, coverage):
    """So each failure below comes from the one thing a test broke."""
    assert cc.check_all(mini_course.course()) == []


def assert_fails(rule, course, *fragments: str) -> None:
    problems = rule(course)
    assert problems, f"{rule.__name__} should have failed"
    for fragment in fragments:
        assert any(fragment in p for p in problems), f"no problem mentions {fragment!r}:\n{_fmt(problems)}"


# (file, text to replace or None to append, new text, the rule that must fail, a fragment of its message)
BREAKS = [
    # links and anchors
    (LESSON, None, "\nSee [this](../nowhere/gone.md).\n", cc.check_links, "no such file nowhere/gone.md"),
    (GLOSSARY, None, "\n[alpha](lessons/01-alpha.md#no-such-section)\n", cc.check_links, 'has no anchor "no-such-section"'),
    (LESSON, None, "\n[demo](../notebooks/01-alpha.ipynb#no-such-cell)\n", cc.check_links, 'has no anchor "no-such-cell"'),
    (LESSON, None, "\n[abs](/etc/passwd)\n", cc.check_links, "absolute link"),
    (LESSON, None, "\n[ftp](ftp://example.com/x)\n", cc.check_links, "only http(s) and mailto"),
    (LESSON, None, "\n[here](../pkg/mod.py#L3)\n", cc.check_links, "line anchors in code go stale"),
    # ids
    (LESSON, None, '\n<a id="intro"></a>\n## Intro again\n', cc.check_duplicate_ids, 'anchor "intro" is defined 2 times'),
    (LESSON, None, '\n<a id="q-batch-07"></a>\n', cc.check_duplicate_ids, 'question anchor "q-batch-07" outside'),
    ("lessons/00-orientation.md", None, '\n<a id="e01-1"></a>\n', cc.check_duplicate_ids,
     'exercise anchor "e01-1" belongs in lessons/01-alpha.md'),
    (LESSON, None, '\n<a id="e01-2"></a>\n', cc.check_duplicate_ids, 'exercise anchor "e01-2" has no `### ENN.k` heading'),
    # code links
    (LESSON, None, "\nSee [`Thing.walk`](../pkg/mod.py).\n", cc.check_code_symbols, "`Thing.walk` is not defined in pkg/mod.py"),
    (LESSON, None, "\nSee `make_widget` in [mod.py](../pkg/mod.py).\n", cc.check_code_symbols, "`make_widget` is not defined"),
    (LESSON, None, "\nSee [`other.py`](../pkg/mod.py).\n", cc.check_code_symbols, "link text names `other.py`"),
    # the interview bank
    (BANK, "lesson [section](01-alpha.md#intro) · ", "", cc.check_questions, "Q-BATCH-01: question without a lesson link"),
    (BANK, "[section](01-alpha.md#intro)", "[section](01-alpha.md)", cc.check_questions, "question without a lesson link"),
    (BANK, "[section](01-alpha.md#intro)", "[E01.1](01-alpha.md#e01-1)", cc.check_questions, "question without a lesson link"),
    (BANK, "**Common wrong answers.**", "Wrong answers:", cc.check_questions, "missing **Common wrong answers.**"),
    (BANK, "### Q-BATCH-01 [M]", "### Q-BATCH-01 [Hard]", cc.check_questions, "write [E], [M] or [H]"),
    (BANK, '<a id="q-batch-01"></a>', '<a id="q-batch-1"></a>', cc.check_questions, 'put <a id="q-batch-01"></a> on the line'),
    (BANK, "### Q-KV-01", "### Q-BATCH-02", cc.check_questions, "sits in the KV topic section, not BATCH"),
    (BANK, "### Q-KV-01 [M]", "### Q-KV-1 [M]", cc.check_questions, "not a question heading"),
    (BANK, "[the demo](../notebooks/01-alpha.ipynb#demo)", "the demo", cc.check_questions, "**See it run.** must link a notebook"),
    # the glossary
    (GLOSSARY, None, ORPHAN, cc.check_glossary, "orphan: no lesson uses this term"),
    (LESSON, None, "\nA [sprocket](../glossary.md#sprocket).\n", cc.check_glossary, "'sprocket' is missing from the glossary"),
    (GLOSSARY, "**gadget**: a small device.", "gadget: a small device.", cc.check_glossary, "must start with the term in bold"),
    (GLOSSARY, '<a id="gadget"></a>', '<a id="Gadget"></a>', cc.check_glossary, "term ids are kebab case"),
    # lessons and notebooks
    ("lessons/02-beta.md", " · 20 min", "", cc.check_lessons, "lessons/02-beta.md: a lesson starts with its `# Title`"),
    (LESSON, "Notebook: [01-alpha.ipynb](../notebooks/01-alpha.ipynb)", "", cc.check_lessons, "never links its notebook"),
    # exercises
    (LESSON, "### E01.1 Do the thing (implement)", "### E01.1 Do the thing (quiz)", cc.check_exercises,
     "end the heading with its kind"),
    (LESSON, "### E01.1 Do the thing (implement)", "### E01.1 Do the thing", cc.check_exercises, "end the heading with its kind"),
    (LESSON, '<a id="e01-1"></a>', "", cc.check_exercises, 'put <a id="e01-1"></a> above the heading'),
    (LESSON, '<a id="e01-1"></a>\n### E01.1', '<a id="e02-1"></a>\n### E02.1', cc.check_exercises, "lesson 01's exercises are E01.k"),
    ("tests/exercises/test_e01_alpha.py", "def test_e01_1_does", "def test_other", cc.check_exercises,
     "E01.1: no test function test_e01_1_*"),
    (STUB, '"""Stub.', '"""Stub. Interview question: Q-BATCH-09.', cc.check_exercises,
     "mentions Q-BATCH-09, which is not in the interview bank"),
    # code -> lesson
    ("pkg/mod.py", "lessons/01-alpha.md#intro", "lessons/01-anatomy.md", cc.check_lesson_lines, "01-anatomy.md, which is not a lesson"),
    ("pkg/mod.py", "lessons/01-alpha.md#intro", "lessons/01-alpha.md#outro", cc.check_lesson_lines, 'has no anchor "outro"'),
]


@pytest.mark.parametrize("name, old, new, rule, fragment", BREAKS, ids=[f"{b[3].__name__}-{i}" for i, b in enumerate(BREAKS)])
def test_a_broken_course_fails(mini_course, name, old, new, rule, fragment):
    if old is None:
        mini_course.append(name, new)
    else:
        mini_course.edit(name, old, new)
    assert_fails(rule, mini_course.course(), fragment)


@pytest.mark.parametrize("name, fragment", [
    ("lessons/exercises/e01_alpha.py", "E01.1: no stub lessons/exercises/e01_alpha.py"),
    ("lessons/exercises/solutions/e01_alpha.py", "E01.1: no reference solution"),
])
def test_a_missing_exercise_file_fails(mini_course, name, fragment):
    mini_course.path(name).unlink()
    assert_fails(cc.check_exercises, mini_course.course(), fragment)


def test_external_links_are_not_followed(mini_course):
    mini_course.append(LESSON, "\n[vLLM](https://github.com/vllm-project/vllm)\n")
    assert cc.check_links(mini_course.course()) == []


def test_code_link_to_missing_file_is_reported_once(mini_course):
    mini_course.append(LESSON, "\nSee [`Thing`](../pkg/gone.py).\n")
    course = mini_course.course()
    assert_fails(cc.check_links, course, "no such file pkg/gone.py")
    assert cc.check_code_symbols(course) == []


def test_missing_term_is_reported_once(mini_course):
    mini_course.append(LESSON, "\nA [sprocket](../glossary.md#sprocket).\n")
    assert cc.check_links(mini_course.course()) == [], "check_glossary reports it"


def test_duplicate_question_fails(mini_course):
    bank = mini_course.read(BANK)
    question = bank[bank.index('<a id="q-batch-01">'):bank.index('<a id="topic-kv">')]
    mini_course.edit(BANK, '<a id="topic-kv">', question + '<a id="topic-kv">')
    assert_fails(cc.check_duplicate_ids, mini_course.course(), "Q-BATCH-01 appears 2 times")


@pytest.mark.parametrize("symbol", ["Thing", "Thing.run", "Thing.size", "Thing.count", "make_thing()",
                                    "count", "mod.Thing.run"])
def test_symbols_that_resolve(mini_course, symbol):
    mini_course.append(LESSON, f"\nSee [`{symbol}`](../pkg/mod.py).\n")
    assert cc.check_code_symbols(mini_course.course()) == []


def test_resolve_symbol_by_ast():
    tree = ast.parse("import os\nX: int = 1\nclass A:\n    class B:\n        def f(self): pass\n"
                     "    def g(self):\n        self.h = 1\n")
    assert all(cc.resolve_symbol(tree, s) for s in ["os", "X", "A", "A.B", "A.B.f", "A.g", "A.h", "f", "h"])
    assert not any(cc.resolve_symbol(tree, s) for s in ["Y", "A.f", "X.real", "A.B.g"])


def test_term_used_only_by_a_question_still_fails(mini_course):
    mini_course.append(GLOSSARY, ORPHAN)
    mini_course.edit(BANK, "../glossary.md#widget", "../glossary.md#orphan")
    assert_fails(cc.check_glossary, mini_course.course(), "orphan: no lesson uses this term")


def test_misnamed_lesson_fails(mini_course):
    mini_course.write("lessons/03_gamma.md", "# Gamma\n")
    assert_fails(cc.check_lessons, mini_course.course(), "lessons/03_gamma.md: not a lesson (name it NN-topic.md)")


def test_lesson_without_its_notebook_fails(mini_course):
    mini_course.path("notebooks/01-alpha.ipynb").unlink()
    course = mini_course.course()
    assert_fails(cc.check_lessons, course, "lesson without its notebook")
    assert_fails(cc.check_links, course, "no such file notebooks/01-alpha.ipynb")


@pytest.mark.parametrize("stem", ["03-gamma", "00-orientation", "scratch"])
def test_notebook_without_its_lesson_fails(mini_course, stem):
    mini_course.write(f"notebooks/{stem}.ipynb", "{}")
    assert_fails(cc.check_lessons, mini_course.course(), f"notebook without a lesson lessons/{stem}.md that has one")


def test_lesson_with_too_few_questions_fails(mini_course, coverage):
    coverage(2, 0)
    assert_fails(cc.check_coverage, mini_course.course(), "lessons/01-alpha.md: 1 question(s) link this lesson, fewer than 2")


def test_question_linking_a_lesson_twice_counts_once(mini_course, coverage):
    mini_course.edit(BANK, "lesson [section](01-alpha.md#intro)",
                     "lesson [section](01-alpha.md#intro), [again](01-alpha.md#you-will-learn)")
    coverage(2, 0)
    assert_fails(cc.check_coverage, mini_course.course(), "lessons/01-alpha.md: 1 question(s) link this lesson")


def test_notebook_lesson_with_too_few_exercises_fails(mini_course, coverage):
    coverage(0, 2)
    problems = cc.check_coverage(mini_course.course())
    assert [p.split(":")[0] for p in problems] == ["lessons/01-alpha.md", "lessons/02-beta.md"], problems
    assert "1 exercise(s), fewer than 2" in problems[0]


def test_lesson_line_may_wrap_onto_the_next_line(mini_course):
    mini_course.edit("pkg/mod.py", "Lesson: lessons/01-alpha.md#intro; ", "Lesson: lessons/01-alpha.md#intro;\n")
    mini_course.edit("pkg/mod.py", "lessons/02-beta.md#beta-intro", "lessons/02-beta.md#nope")
    assert_fails(cc.check_lesson_lines, mini_course.course(), "lessons/02-beta.md#nope")
