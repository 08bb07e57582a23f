"""The generated blocks (course map, lesson question lists, glossary "Used in" lines, bank index) are fresh:
re-running the generator in dry-run mode changes nothing. If this fails, run the command it names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import course_links
import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_generated_blocks_are_fresh():
    result = subprocess.run([sys.executable, "lessons/tools/course_links.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, (
        f"generated blocks are stale or missing; run `{course_links.WRITE_COMMAND}` and commit the result\n{result.stderr}")


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


@pytest.mark.parametrize("name, marker", [
    ("lessons/README.md", "<!-- BEGIN AUTO:course-map -->"),
    ("lessons/01-alpha.md", "<!-- BEGIN AUTO:questions -->"),
    ("glossary.md", "<!-- BEGIN AUTO:used-in:gadget -->"),
    ("lessons/interview-bank.md", "<!-- BEGIN AUTO:bank-index -->"),
])
def test_missing_block_fails(mini_course, capsys, name, marker):
    mini_course.edit(name, marker, "")
    assert course_links.run(mini_course.course(), write=False) == 1
    assert course_links.run(mini_course.course(), write=True) == 1
    assert f"missing block: {name}: no {marker}" in capsys.readouterr().err


def test_replace_block():
    text = "a\n<!-- BEGIN AUTO:x -->\nold\n<!-- END AUTO:x -->\nb\n"
    assert course_links.replace_block(text, "x", "new") == "a\n<!-- BEGIN AUTO:x -->\nnew\n<!-- END AUTO:x -->\nb\n"
    assert course_links.replace_block(text, "y", "new") is None
