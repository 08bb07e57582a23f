"""Shared pieces of the course tests: import paths, and a small fixture course to break on purpose.

The reader, generator, checker and notebook rules live in lessons/tools/ (a folder of scripts, not a package),
so that folder and the repository root go on `sys.path` here.

`mini_course` builds, in tmp_path, the smallest course that passes every rule (with the coverage minimums at 1):
an orientation, a lesson 01 with its notebook and one exercise (stub, test and solution), a lesson 02, a
glossary of two terms, a bank of two questions, and a code file whose docstring links back. Each rule's test
then breaks one thing and checks that the rule, and only a rule about that thing, complains.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "lessons" / "tools"
for path in (ROOT, TOOLS):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from course_links import updates  # noqa: E402
from course_reader import Course  # noqa: E402

QUESTIONS_BLOCK = "<a id=\"questions\"></a>\n## Questions\n<!-- BEGIN AUTO:questions -->\n<!-- END AUTO:questions -->\n"


def _question(qid: str, lesson_link: str, notebook_link: str, term: str) -> str:
    return textwrap.dedent(f"""\
        <a id="{qid.lower()}"></a>
        ### {qid} [M] Why?

        **Short answer.** Because.

        <details><summary>Deep answer</summary>

        2 x 2 bytes = 4 bytes.

        </details>

        **Common wrong answers.**
        - "Never": it happens.

        **Follow-ups.** none.

        **See it run.** [the demo]({notebook_link})

        **Links.** lesson [section]({lesson_link}) · term [{term}](../glossary.md#{term})
        """)


MINI_FILES = {
    "lessons/README.md": "# Map\n\n<!-- BEGIN AUTO:course-map -->\n<!-- END AUTO:course-map -->\n",
    "lessons/00-orientation.md": "# Orientation\n\n5 min\n\nRun it.\n\n" + QUESTIONS_BLOCK,
    "lessons/01-alpha.md": textwrap.dedent("""\
        # Alpha

        Notebook: [01-alpha.ipynb](../notebooks/01-alpha.ipynb) · 30 min

        <a id="you-will-learn"></a>
        ## You will learn

        <a id="intro"></a>
        ## Intro
        A [widget](../glossary.md#widget) is made by [`Thing.run`](../pkg/mod.py), and
        `make_thing` in [mod.py](../pkg/mod.py) too.

        ```python
        [not a link](nowhere.md)
        ```

        <a id="exercises"></a>
        ## Exercises
        <a id="e01-1"></a>
        ### E01.1 Do the thing (implement)

        """) + QUESTIONS_BLOCK,
    "lessons/02-beta.md": textwrap.dedent("""\
        # Beta

        Notebook: [02-beta.ipynb](../notebooks/02-beta.ipynb) · 20 min

        <a id="beta-intro"></a>
        ## Intro
        A [gadget](../glossary.md#gadget).

        """) + QUESTIONS_BLOCK,
    "lessons/interview-bank.md": (
        "# Bank\n\n<!-- BEGIN AUTO:bank-index -->\n<!-- END AUTO:bank-index -->\n\n"
        '<a id="topic-batch"></a>\n## BATCH: Batching\n\n'
        + _question("Q-BATCH-01", "01-alpha.md#intro", "../notebooks/01-alpha.ipynb#demo", "widget")
        + '\n<a id="topic-kv"></a>\n## KV: The KV cache\n\n'
        + _question("Q-KV-01", "02-beta.md#beta-intro", "../notebooks/02-beta.ipynb#beta-demo", "gadget")),
    "glossary.md": textwrap.dedent("""\
        # Glossary

        <a id="gadget"></a>
        **gadget**: a small device. See also [widget](#widget).
        <!-- BEGIN AUTO:used-in:gadget -->
        <!-- END AUTO:used-in:gadget -->

        <a id="widget"></a>
        **widget**: a thing. Used in [the intro](lessons/01-alpha.md#intro).
        <!-- BEGIN AUTO:used-in:widget -->
        <!-- END AUTO:used-in:widget -->
        """),
    "pkg/mod.py": textwrap.dedent('''\
        """A module.

        Lesson: lessons/01-alpha.md#intro; lessons/02-beta.md#beta-intro.
        """


        class Thing:
            size = 3

            def __init__(self):
                self.count = 0

            def run(self):
                return self.size


        def make_thing():
            return Thing()
        '''),
    "lessons/exercises/e01_alpha.py": textwrap.dedent('''\
        """Stub. Lesson: lessons/01-alpha.md#e01-1"""


        def do(x: int) -> int:
            raise NotImplementedError("E01.1: do the thing")
        '''),
    "lessons/exercises/solutions/e01_alpha.py": "def do(x: int) -> int:\n    return x\n",
    "tests/exercises/test_e01_alpha.py": "def test_e01_1_does(impl):\n    assert impl.do(1) == 1\n",
}


def mini_notebook(lesson: str, anchors: tuple[str, ...]) -> str:
    first = f"# A notebook\n\nLesson: [{lesson}](../lessons/{lesson}.md)\n" + "".join(
        f'\n<a id="{a}"></a>\n## {a}\n' for a in anchors)
    return json.dumps({"cells": [{"cell_type": "markdown", "metadata": {}, "source": first}],
                       "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                   "language": "python"}},
                       "nbformat": 4, "nbformat_minor": 5})


class MiniCourse:
    """A fixture course in `root`; `course()` reads it afresh (a `Course` caches what it read)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for name, text in MINI_FILES.items():
            self.write(name, text)
        self.write("notebooks/01-alpha.ipynb", mini_notebook("01-alpha", ("parameters", "demo")))
        self.write("notebooks/02-beta.ipynb", mini_notebook("02-beta", ("beta-demo",)))
        texts, _, missing = updates(self.course())
        assert not missing, missing
        for path, text in texts.items():
            path.write_text(text, encoding="utf-8")

    notebook = staticmethod(mini_notebook)

    def course(self) -> Course:
        return Course(self.root, code_dirs=("pkg", "lessons/exercises"))

    def path(self, name: str) -> Path:
        return self.root / name

    def read(self, name: str) -> str:
        return self.path(name).read_text(encoding="utf-8")

    def write(self, name: str, text: str) -> None:
        path = self.path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")

    def edit(self, name: str, old: str, new: str) -> None:
        text = self.read(name)
        assert old in text, f"{old!r} not in {name}"
        self.write(name, text.replace(old, new, 1))

    def append(self, name: str, text: str) -> None:
        self.write(name, self.read(name) + text)


@pytest.fixture
def mini_course(tmp_path: Path) -> MiniCourse:
    return MiniCourse(tmp_path)
