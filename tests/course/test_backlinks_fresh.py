"""The generated blocks (course map, lesson question lists, glossary "Used in" lines, bank index) are fresh:
re-running the generator in dry-run mode changes nothing. If this fails, run the command it names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import course_links

ROOT = Path(__file__).resolve().parents[2]


def test_generated_blocks_are_fresh():
    result = subprocess.run([sys.executable, "lessons/tools/course_links.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, (
        f"generated blocks are stale; run `{course_links.WRITE_COMMAND}` and commit the result\n{result.stderr}")
    assert "missing block" not in result.stderr, result.stderr


def test_stale_block_fails_and_names_the_command(mini_course, capsys):
    assert course_links.run(mini_course.course(), write=False) == 0
    mini_course.append("lessons/01-alpha.md", "\nA [gadget](../glossary.md#gadget) too.\n")  # Used in changes
    assert course_links.run(mini_course.course(), write=False) == 1
    err = capsys.readouterr().err
    assert "glossary.md (AUTO:used-in:gadget)" in err
    assert course_links.WRITE_COMMAND in err
    assert course_links.run(mini_course.course(), write=True) == 0
    assert course_links.run(mini_course.course(), write=False) == 0
    assert "lessons/01-alpha.md#intro" not in mini_course.read("glossary.md").split("used-in:gadget")[1]


def test_new_question_makes_the_lesson_list_and_index_stale(mini_course):
    bank = mini_course.read("lessons/interview-bank.md")
    second = bank[bank.index('<a id="q-batch-01">'):bank.index('<a id="topic-kv">')]
    mini_course.edit("lessons/interview-bank.md", '<a id="topic-kv">',
                     second.replace("q-batch-01", "q-batch-02").replace("Q-BATCH-01", "Q-BATCH-02") + '<a id="topic-kv">')
    _, stale, missing = course_links.updates(mini_course.course())
    assert not missing
    assert set(stale) == {"lessons/README.md (AUTO:course-map)", "lessons/01-alpha.md (AUTO:questions)",
                          "glossary.md (AUTO:used-in:widget)", "lessons/interview-bank.md (AUTO:bank-index)"}


def test_missing_block_is_reported(mini_course, capsys):
    mini_course.write("lessons/README.md", "# Map without its block\n")
    course_links.run(mini_course.course(), write=False)
    assert "missing block: lessons/README.md" in capsys.readouterr().err


def test_skeleton_of_a_planned_lesson_keeps_the_plan(mini_course):
    """The writer's starting point defines every planned anchor, links its notebook and has the questions
    block; what is left to do shows up as TODO links the checker rejects."""
    import course_check as cc

    course = mini_course.course()
    skeleton = course_links.render_skeleton(course, course.lesson("02-beta"))
    assert "<!-- Link each term at its first use" in skeleton
    mini_course.write("lessons/02-beta.md", skeleton.replace("<!-- Link each term at its first use, then delete this list:\n", "").replace("\n-->\n", "\n", 1))
    mini_course.write("notebooks/02-beta.ipynb", mini_course.notebook("02-beta", ("beta-demo",)))
    course = mini_course.course()
    assert cc.check_lessons(course) == []
    assert all("TODO" in p or "path/to/file.py" in p for p in cc.check_links(course)), cc.check_links(course)


def test_skeleton_shows_the_exercise_statement(mini_course):
    mini_course.edit("lessons/exercises/e01_alpha.py", "def do(x: int) -> int:\n",
                     'def do(x: int) -> int:\n    """E01.1: return x unchanged."""\n')
    course = mini_course.course()
    skeleton = course_links.render_skeleton(course, course.lesson("01-alpha"))
    assert '<a id="e01-1"></a>' in skeleton and "E01.1: return x unchanged." in skeleton
