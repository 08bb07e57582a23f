"""The link checker (lessons/tools/course_check.py): each rule over the real course, and each rule shown to
fail on a small broken fixture course (conftest.py's `mini_course`). No network, no torch."""

from __future__ import annotations

import ast
import dataclasses

import course_check as cc
import pytest
from course_links import Course, replace_block

REAL = Course()


def _fmt(problems: list[str]) -> str:
    return "\n".join(problems)


# ---- the real course ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rule", cc.RULES, ids=lambda rule: rule.__name__)
def test_real_course(rule):
    problems = rule(REAL)
    assert not problems, f"{rule.__name__} found {len(problems)} problem(s):\n{_fmt(problems)}"


# ---- the fixture course is clean, so each failure below comes from the one thing we broke ------------

def test_fixture_course_is_clean(mini_course):
    assert cc.check_all(mini_course.course()) == []


def assert_fails(rule, course, *fragments: str) -> None:
    problems = rule(course)
    assert problems, f"{rule.__name__} should have failed"
    for fragment in fragments:
        assert any(fragment in p for p in problems), f"no problem mentions {fragment!r}:\n{_fmt(problems)}"


# ---- links and anchors -------------------------------------------------------------------------------

def test_missing_file_fails(mini_course):
    mini_course.append("lessons/01-alpha.md", "\nSee [this](../nowhere/gone.md).\n")
    assert_fails(cc.check_links, mini_course.course(), "no such file nowhere/gone.md")


def test_missing_anchor_fails(mini_course):
    mini_course.append("glossary.md", "\nMore in [alpha](lessons/01-alpha.md#no-such-section).\n")
    assert_fails(cc.check_links, mini_course.course(), 'has no anchor "no-such-section"')


def test_missing_anchor_in_notebook_fails(mini_course):
    mini_course.append("lessons/01-alpha.md", "\nRun it: [demo](../notebooks/01-alpha.ipynb#no-such-cell).\n")
    assert_fails(cc.check_links, mini_course.course(), 'has no anchor "no-such-cell"')


def test_link_to_unplanned_anchor_of_planned_lesson_fails(mini_course):
    mini_course.append("glossary.md", "\nLater: [beta](lessons/02-beta.md#not-planned).\n")
    assert_fails(cc.check_links, mini_course.course(), '"not-planned" is not one of its planned anchors')


def test_link_to_planned_anchor_of_planned_lesson_passes(mini_course):
    mini_course.append("glossary.md", "\nLater: [beta](lessons/02-beta.md#beta-intro).\n")
    assert cc.check_links(mini_course.course()) == []


def test_link_to_lesson_outside_the_plan_fails(mini_course):
    mini_course.append("lessons/01-alpha.md", "\nNext: [gamma](03-gamma.md#intro).\n")
    assert_fails(cc.check_links, mini_course.course(), "no such file lessons/03-gamma.md")


def test_planned_notebook_with_unplanned_anchor_fails(mini_course):
    mini_course.edit("lessons/interview-bank.md", "02-beta.ipynb#beta-demo", "02-beta.ipynb#elsewhere")
    assert_fails(cc.check_links, mini_course.course(), '"elsewhere" is not one of its planned anchors')


def test_missing_notebook_of_written_lesson_fails(mini_course):
    mini_course.path("notebooks/01-alpha.ipynb").unlink()
    assert_fails(cc.check_links, mini_course.course(), "notebook missing, and its lesson 01-alpha is written")


def test_absolute_link_fails(mini_course):
    mini_course.append("lessons/01-alpha.md", "\n[abs](/etc/passwd)\n")
    assert_fails(cc.check_links, mini_course.course(), "absolute link")


def test_line_anchor_into_code_fails(mini_course):
    mini_course.append("lessons/01-alpha.md", "\n[here](../pkg/mod.py#L3)\n")
    assert_fails(cc.check_links, mini_course.course(), "line anchors in code go stale")


def test_links_in_code_fences_and_external_links_are_ignored(mini_course):
    mini_course.append("lessons/01-alpha.md", "\n[vLLM](https://github.com/vllm-project/vllm)\n")
    assert cc.check_links(mini_course.course()) == []


# ---- duplicate ids ------------------------------------------------------------------------------------

def test_duplicate_anchor_fails(mini_course):
    mini_course.append("lessons/01-alpha.md", '\n<a id="intro"></a>\n## Intro again\n')
    assert_fails(cc.check_duplicate_ids, mini_course.course(), 'anchor "intro" is defined 2 times')


def test_duplicate_question_fails(mini_course):
    bank = mini_course.read("lessons/interview-bank.md")
    start = bank.index('<a id="q-batch-01">')
    end = bank.index('<a id="topic-kv">')
    mini_course.edit("lessons/interview-bank.md", '<a id="topic-kv">', bank[start:end] + '<a id="topic-kv">')
    assert_fails(cc.check_duplicate_ids, mini_course.course(), "Q-BATCH-01 appears 2 times")


def test_question_anchor_outside_the_bank_fails(mini_course):
    mini_course.append("lessons/01-alpha.md", '\n<a id="q-batch-07"></a>\n')
    assert_fails(cc.check_duplicate_ids, mini_course.course(), 'question anchor "q-batch-07" outside')


def test_exercise_anchor_in_the_wrong_lesson_fails(mini_course):
    mini_course.append("lessons/00-orientation.md", '\n<a id="e01-1"></a>\n')
    assert_fails(cc.check_duplicate_ids, mini_course.course(), 'exercise anchor "e01-1" belongs in lessons/01-alpha.md')


def test_unplanned_exercise_anchor_fails(mini_course):
    mini_course.append("lessons/01-alpha.md", '\n<a id="e01-2"></a>\n')
    assert_fails(cc.check_duplicate_ids, mini_course.course(), 'exercise anchor "e01-2" is not in course_plan.py')


# ---- code links ---------------------------------------------------------------------------------------

def test_unresolved_symbol_in_link_text_fails(mini_course):
    mini_course.append("lessons/01-alpha.md", "\nSee [`Thing.walk`](../pkg/mod.py).\n")
    assert_fails(cc.check_code_symbols, mini_course.course(), "`Thing.walk` is not defined in pkg/mod.py")


def test_unresolved_symbol_next_to_code_link_fails(mini_course):
    mini_course.append("lessons/01-alpha.md", "\nSee `make_widget` in [mod.py](../pkg/mod.py).\n")
    assert_fails(cc.check_code_symbols, mini_course.course(), "`make_widget` is not defined")


def test_link_text_naming_another_file_fails(mini_course):
    mini_course.append("lessons/01-alpha.md", "\nSee [`other.py`](../pkg/mod.py).\n")
    assert_fails(cc.check_code_symbols, mini_course.course(), "link text names `other.py`")


@pytest.mark.parametrize("symbol", ["Thing", "Thing.run", "Thing.size", "Thing.count", "make_thing()",
                                    "count", "mod.Thing.run"])
def test_symbols_that_resolve(mini_course, symbol):
    mini_course.append("lessons/01-alpha.md", f"\nSee [`{symbol}`](../pkg/mod.py).\n")
    assert cc.check_code_symbols(mini_course.course()) == []


def test_resolve_symbol_by_ast():
    tree = ast.parse("import os\nX: int = 1\nclass A:\n    class B:\n        def f(self): pass\n"
                     "    def g(self):\n        self.h = 1\n")
    assert all(cc.resolve_symbol(tree, s) for s in ["os", "X", "A", "A.B", "A.B.f", "A.g", "A.h", "f", "h"])
    assert not any(cc.resolve_symbol(tree, s) for s in ["Y", "A.f", "X.real", "A.B.g"])


# ---- the interview bank --------------------------------------------------------------------------------

def test_question_without_lesson_link_fails(mini_course):
    mini_course.edit("lessons/interview-bank.md", "lesson [section](01-alpha.md#intro) · ", "")
    assert_fails(cc.check_questions, mini_course.course(), "Q-BATCH-01: question without a lesson link")


def test_question_linking_a_lesson_without_section_fails(mini_course):
    mini_course.edit("lessons/interview-bank.md", "[section](01-alpha.md#intro)", "[section](01-alpha.md)")
    assert_fails(cc.check_questions, mini_course.course(), "question without a lesson link")


def test_question_missing_a_part_fails(mini_course):
    mini_course.edit("lessons/interview-bank.md", "**Common wrong answers.**", "Wrong answers:")
    assert_fails(cc.check_questions, mini_course.course(), "missing **Common wrong answers.**")


def test_question_with_bad_difficulty_fails(mini_course):
    mini_course.edit("lessons/interview-bank.md", "### Q-BATCH-01 [M]", "### Q-BATCH-01 [Hard]")
    assert_fails(cc.check_questions, mini_course.course(), "write [E], [M] or [H]")


def test_question_anchor_mismatch_fails(mini_course):
    mini_course.edit("lessons/interview-bank.md", '<a id="q-batch-01"></a>', '<a id="q-batch-1"></a>')
    assert_fails(cc.check_questions, mini_course.course(), 'put <a id="q-batch-01"></a> on the line above')


def test_question_in_the_wrong_topic_fails(mini_course):
    mini_course.edit("lessons/interview-bank.md", "### Q-KV-01", "### Q-BATCH-02")
    mini_course.edit("lessons/interview-bank.md", '<a id="q-kv-01">', '<a id="q-batch-02">')
    assert_fails(cc.check_questions, mini_course.course(), "sits in the KV topic section, not BATCH")


def test_unknown_topic_fails(mini_course):
    mini_course.edit("lessons/interview-bank.md", "### Q-KV-01", "### Q-GPU-01")
    assert_fails(cc.check_questions, mini_course.course(), "unknown topic GPU")


def test_malformed_question_heading_fails(mini_course):
    mini_course.edit("lessons/interview-bank.md", "### Q-KV-01 [M]", "### Q-KV-1 [M]")
    assert_fails(cc.check_questions, mini_course.course(), "not a question heading")


def test_see_it_run_without_notebook_fails(mini_course):
    mini_course.edit("lessons/interview-bank.md", "[the demo](../notebooks/01-alpha.ipynb#demo)", "the demo")
    assert_fails(cc.check_questions, mini_course.course(), "**See it run.** must link a notebook section")


# ---- the glossary -------------------------------------------------------------------------------------

def test_term_no_lesson_uses_fails(mini_course):
    mini_course.append("glossary.md", '\n<a id="orphan"></a>\n**orphan**: nobody links me.\n'
                                      "<!-- BEGIN AUTO:used-in:orphan -->\n<!-- END AUTO:used-in:orphan -->\n")
    assert_fails(cc.check_glossary, mini_course.course(), "orphan: no lesson uses this term")


def test_term_used_only_by_a_question_still_fails(mini_course):
    mini_course.append("glossary.md", '\n<a id="orphan"></a>\n**orphan**: only a question links me.\n'
                                      "<!-- BEGIN AUTO:used-in:orphan -->\n<!-- END AUTO:used-in:orphan -->\n")
    mini_course.edit("lessons/interview-bank.md", "../glossary.md#widget", "../glossary.md#orphan")
    assert_fails(cc.check_glossary, mini_course.course(), "orphan: no lesson uses this term")


def test_lesson_term_missing_from_glossary_fails(mini_course):
    mini_course.append("lessons/01-alpha.md", "\nA [sprocket](../glossary.md#sprocket).\n")
    course = mini_course.course()
    assert_fails(cc.check_glossary, course, "term 'sprocket' is missing from the glossary")
    assert cc.check_links(course) == [], "reported once, by check_glossary"


def test_planned_term_missing_from_glossary_fails(mini_course):
    glossary = mini_course.read("glossary.md")
    mini_course.write("glossary.md", glossary[: glossary.index('<a id="widget">')])
    assert_fails(cc.check_glossary, mini_course.course(), "plans term 'widget', missing from glossary.md")


def test_term_without_bold_name_fails(mini_course):
    mini_course.edit("glossary.md", "**gadget**: a small device.", "gadget: a small device.")
    assert_fails(cc.check_glossary, mini_course.course(), "must start with the term in bold")


def test_term_without_used_in_block_fails(mini_course):
    mini_course.edit("glossary.md", "<!-- BEGIN AUTO:used-in:gadget -->", "")
    assert_fails(cc.check_glossary, mini_course.course(), "gadget: no generated Used-in block")


# ---- lessons and notebooks ----------------------------------------------------------------------------

def test_lesson_outside_the_plan_fails(mini_course):
    mini_course.write("lessons/01-anatomy-of-a-step.md", "# Not planned\n")
    assert_fails(cc.check_lessons, mini_course.course(), "01-anatomy-of-a-step.md: not a lesson of the plan")


def test_written_lesson_missing_a_planned_anchor_fails(mini_course):
    mini_course.edit("lessons/01-alpha.md", '<a id="you-will-learn"></a>', "")
    assert_fails(cc.check_lessons, mini_course.course(), 'planned anchor "you-will-learn" is missing')


def test_written_lesson_missing_an_exercise_anchor_fails(mini_course):
    mini_course.edit("lessons/01-alpha.md", '<a id="e01-1"></a>', "")
    assert_fails(cc.check_lessons, mini_course.course(), 'planned anchor "e01-1" is missing')


def test_written_lesson_not_linking_a_planned_term_fails(mini_course):
    mini_course.edit("lessons/01-alpha.md", "[widget](../glossary.md#widget)", "widget")
    assert_fails(cc.check_lessons, mini_course.course(), "planned term 'widget' is never linked")


def test_lesson_without_its_notebook_fails(mini_course):
    mini_course.path("notebooks/01-alpha.ipynb").unlink()
    assert_fails(cc.check_lessons, mini_course.course(), "lesson without its notebook")


def test_notebook_without_its_lesson_fails(mini_course):
    mini_course.write("notebooks/02-beta.ipynb", "{}")
    assert_fails(cc.check_lessons, mini_course.course(), "notebook without its lesson lessons/02-beta.md")


def test_notebook_outside_the_plan_fails(mini_course):
    mini_course.write("notebooks/scratch.ipynb", "{}")
    assert_fails(cc.check_lessons, mini_course.course(), "notebook without a planned lesson")


def test_notebook_missing_a_planned_anchor_fails(mini_course):
    mini_course.write("notebooks/01-alpha.ipynb", mini_course.notebook("01-alpha", ("parameters",)))
    assert_fails(cc.check_lessons, mini_course.course(), 'planned anchor "demo" is missing')


def test_lesson_without_questions_block_fails(mini_course):
    mini_course.edit("lessons/01-alpha.md", "<!-- BEGIN AUTO:questions -->", "")
    assert_fails(cc.check_lessons, mini_course.course(), "no <!-- BEGIN AUTO:questions --> block")


def test_lesson_not_linking_its_notebook_fails(mini_course):
    mini_course.edit("lessons/01-alpha.md", "Notebook: [01-alpha.ipynb](../notebooks/01-alpha.ipynb)", "")
    assert_fails(cc.check_lessons, mini_course.course(), "never links its notebook")


def test_missing_course_map_block_fails(mini_course):
    mini_course.write("lessons/README.md", "# Map\n")
    assert_fails(cc.check_lessons, mini_course.course(), "no <!-- BEGIN AUTO:course-map --> block")


# ---- coverage: questions per lesson, exercises per notebook lesson --------------------------------------

def test_lesson_with_too_few_questions_fails(mini_course):
    course = mini_course.course()
    course.min_questions = 2
    assert_fails(cc.check_coverage, course, "lessons/01-alpha.md: 1 question(s) link this lesson, fewer than 2")


def test_question_linking_a_lesson_twice_counts_once(mini_course):
    mini_course.edit("lessons/interview-bank.md", "lesson [section](01-alpha.md#intro)",
                     "lesson [section](01-alpha.md#intro), [again](01-alpha.md#you-will-learn)")
    course = mini_course.course()
    course.min_questions = 2
    assert_fails(cc.check_coverage, course, "1 question(s) link this lesson")


def test_notebook_lesson_with_too_few_exercises_fails(mini_course):
    course = mini_course.course()
    course.min_exercises = 2
    assert_fails(cc.check_coverage, course, "lessons/01-alpha.md: 1 exercise(s), fewer than 2")


def test_coverage_skips_lessons_without_questions_notebook_or_file(mini_course):
    """00-orientation has no questions and no notebook; 02-beta is planned, not written: none is held to it."""
    course = mini_course.course()
    course.min_questions = course.min_exercises = 1
    assert cc.check_coverage(course) == []
    course.min_questions = course.min_exercises = 5
    assert all(p.startswith("lessons/01-alpha.md") for p in cc.check_coverage(course))


# ---- exercises ----------------------------------------------------------------------------------------

def test_exercise_without_stub_fails(mini_course):
    mini_course.path("lessons/exercises/e01_alpha.py").unlink()
    assert_fails(cc.check_exercises, mini_course.course(), "E01.1: no stub lessons/exercises/e01_alpha.py")


def test_stub_that_does_not_raise_its_id_fails(mini_course):
    mini_course.edit("lessons/exercises/e01_alpha.py", 'raise NotImplementedError("E01.1: do the thing")',
                     "return x")
    assert_fails(cc.check_exercises, mini_course.course(), 'never raises NotImplementedError("E01.1 ...")')


def test_exercise_without_test_fails(mini_course):
    mini_course.write("tests/exercises/test_e01_alpha.py", "def test_something_else():\n    pass\n")
    assert_fails(cc.check_exercises, mini_course.course(), "E01.1: no test function test_e01_1_*")


def test_exercise_without_solution_fails(mini_course):
    mini_course.path("lessons/exercises/solutions/e01_alpha.py").unlink()
    assert_fails(cc.check_exercises, mini_course.course(), "E01.1: no reference solution")


def test_stub_raising_an_unplanned_exercise_fails(mini_course):
    mini_course.append("lessons/exercises/e01_alpha.py",
                       '\n\ndef more():\n    raise NotImplementedError("E01.9: more")\n')
    assert_fails(cc.check_exercises, mini_course.course(), "raises E01.9, which course_plan.py does not list")


# ---- code -> lesson -----------------------------------------------------------------------------------

def test_lesson_line_naming_an_unplanned_lesson_fails(mini_course):
    mini_course.edit("pkg/mod.py", "lessons/01-alpha.md#intro", "lessons/01-anatomy-of-a-step.md")
    assert_fails(cc.check_lesson_lines, mini_course.course(), "01-anatomy-of-a-step.md, which is neither written nor planned")


def test_lesson_line_with_missing_anchor_of_written_lesson_fails(mini_course):
    mini_course.edit("pkg/mod.py", "lessons/01-alpha.md#intro", "lessons/01-alpha.md#outro")
    assert_fails(cc.check_lesson_lines, mini_course.course(), 'has no anchor "outro"')


def test_lesson_line_with_unplanned_anchor_of_planned_lesson_fails(mini_course):
    mini_course.edit("pkg/mod.py", "lessons/02-beta.md#beta-intro", "lessons/02-beta.md#beta-outro")
    assert_fails(cc.check_lesson_lines, mini_course.course(), '"beta-outro" is not one of its planned anchors')


def test_lesson_line_may_wrap_onto_the_next_line(mini_course):
    mini_course.edit("pkg/mod.py", "Lesson: lessons/01-alpha.md#intro; ", "Lesson: lessons/01-alpha.md#intro;\n")
    mini_course.edit("pkg/mod.py", "lessons/02-beta.md#beta-intro", "lessons/02-beta.md#nope")
    assert_fails(cc.check_lesson_lines, mini_course.course(), "lessons/02-beta.md#nope")


# ---- the generated blocks -----------------------------------------------------------------------------

def test_replace_block():
    text = "a\n<!-- BEGIN AUTO:x -->\nold\n<!-- END AUTO:x -->\nb\n"
    assert replace_block(text, "x", "new") == "a\n<!-- BEGIN AUTO:x -->\nnew\n<!-- END AUTO:x -->\nb\n"
    assert replace_block(text, "y", "new") is None


def test_question_linking_only_an_exercise_fails(mini_course):
    mini_course.edit("lessons/interview-bank.md", "[section](01-alpha.md#intro)", "[E01.1](01-alpha.md#e01-1)")
    assert_fails(cc.check_questions, mini_course.course(), "Q-BATCH-01: question without a lesson link")


def test_stub_naming_a_missing_question_fails(mini_course):
    mini_course.edit("lessons/exercises/e01_alpha.py", '"""Stub.', '"""Stub. Interview question: Q-BATCH-09.')
    assert_fails(cc.check_exercises, mini_course.course(), "mentions Q-BATCH-09, which is not in the interview bank")


def test_unknown_exercise_kind_fails(mini_course):
    from course_plan import PlannedExercise

    course = mini_course.course()
    alpha = course.lesson("01-alpha")
    broken = dataclasses.replace(alpha, exercises=(PlannedExercise("E01.1", "quiz", "Do the thing"),))
    course.plan = tuple(broken if lesson is alpha else lesson for lesson in course.plan)
    assert_fails(cc.check_exercises, course, "unknown exercise kind 'quiz'")


def test_code_link_to_missing_file_fails(mini_course):
    mini_course.append("lessons/01-alpha.md", "\nSee [`Thing`](../pkg/gone.py).\n")
    course = mini_course.course()
    assert_fails(cc.check_links, course, "no such file pkg/gone.py")
    assert cc.check_code_symbols(course) == [], "a missing file is reported once, by check_links"


def _as_debug(course):
    """The fixture course with its one exercise made a debug exercise."""
    from course_plan import PlannedExercise

    alpha = course.lesson("01-alpha")
    broken = dataclasses.replace(alpha, exercises=(PlannedExercise("E01.1", "debug", "Fix the thing"),))
    course.plan = tuple(broken if lesson is alpha else lesson for lesson in course.plan)
    return course


def test_debug_stub_stated_by_its_docstring_passes(mini_course):
    """A debug stub is buggy code that raises nothing; its docstring, starting with the id, states it."""
    mini_course.edit("lessons/exercises/e01_alpha.py", '    raise NotImplementedError("E01.1: do the thing")',
                     '    """E01.1 (debug): this returns the wrong thing; find out why."""\n    return x + 1')
    assert cc.check_exercises(_as_debug(mini_course.course())) == []


def test_debug_stub_without_its_statement_fails(mini_course):
    mini_course.edit("lessons/exercises/e01_alpha.py", '    raise NotImplementedError("E01.1: do the thing")',
                     "    return x + 1")
    assert_fails(cc.check_exercises, _as_debug(mini_course.course()), 'has no function or class whose docstring starts with "E01.1"')
