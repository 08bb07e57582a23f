"""Notebook rules (lessons/tools/notebook_rules.py, lessons/CONTRIBUTING.md, "A notebook") over notebooks/*.ipynb, and each
rule shown to fail on a bad fixture notebook. With no notebook written yet, the real-folder test passes
vacuously; the fixture tests always run."""

from __future__ import annotations

from pathlib import Path

import nbformat
import notebook_rules as nr
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_real_notebooks_follow_the_rules():
    problems = []
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        problems += [p for rule in nr.RULES for p in rule(nb, path)]
    assert not problems, "\n".join(problems)


# ---- fixtures -----------------------------------------------------------------------------------------

PARAMETERS = '''\
import os
import random

PRESETS = {
    "fast": {"num_requests": 16, "device": "cpu"},
    "full": {"num_requests": 1024, "device": "auto"},
}
MODE = os.environ.get("SERVING_LAB_MODE", "fast")
P = PRESETS[MODE]
random.seed(0)
print(MODE, P)
'''


def good_notebook() -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        new_markdown_cell("# Demo\n\nLesson: [01](../lessons/01-demo.md). Runs in ~10 s (fast).\n"
                          "Background: [vLLM](https://github.com/vllm-project/vllm)."),
        new_code_cell(PARAMETERS, metadata={"tags": ["parameters"]}),
        new_code_cell('from pathlib import Path\ndata = Path("../benchmarks") / "x.json"\nprint(P["num_requests"] / 2)'),
        new_markdown_cell("## Takeaways"),
    ]
    return stored(nb)


def stored(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """`nb` as notebook_outputs.py leaves it: its code cells' digest in its metadata."""
    nb.metadata[nr.METADATA_KEY] = {"code_digest": nr.code_digest(nb.cells)}
    return nb


def problems_of(nb: nbformat.NotebookNode, tmp_path: Path, rule=None) -> list[str]:
    path = tmp_path / "01-demo.ipynb"
    nbformat.write(nb, path)
    if rule is None:
        return nr.check_notebook(path)
    return rule(nbformat.read(path, as_version=4), path)


def test_good_fixture_notebook_passes(tmp_path):
    assert problems_of(good_notebook(), tmp_path) == []


def with_code(source: str) -> nbformat.NotebookNode:
    nb = good_notebook()
    nb.cells.insert(3, new_code_cell(source))
    return stored(nb)


def never_run() -> nbformat.NotebookNode:
    nb = good_notebook()
    del nb.metadata[nr.METADATA_KEY]
    return nb


def code_changed_after_its_run() -> nbformat.NotebookNode:
    nb = good_notebook()
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", text="8.0\n")]
    nb.cells[2].source = nb.cells[2].source.replace("/ 2", "/ 4")
    return nb


def test_markdown_edits_keep_stored_outputs_current(tmp_path):
    nb = good_notebook()
    nb.cells[3].source = "## Takeaways, reworded"
    assert problems_of(nb, tmp_path, nr.rule_outputs_current) == []


def other_kernel() -> nbformat.NotebookNode:
    nb = good_notebook()
    nb.metadata["kernelspec"]["name"] = "conda-env-serving"
    return nb


def code_first() -> nbformat.NotebookNode:
    nb = good_notebook()
    nb.cells = nb.cells[1:]
    return nb


def no_lesson_link() -> nbformat.NotebookNode:
    nb = good_notebook()
    nb.cells[0].source = "# Demo\n\nNo link here."
    return nb


def untagged_parameters() -> nbformat.NotebookNode:
    nb = good_notebook()
    nb.cells[1].metadata = {}
    return nb


def no_mode() -> nbformat.NotebookNode:
    nb = good_notebook()
    nb.cells[1].source = PARAMETERS.replace('os.environ.get("SERVING_LAB_MODE", "fast")', '"fast"')
    return nb


def no_presets() -> nbformat.NotebookNode:
    nb = good_notebook()
    nb.cells[1].source = 'import os\nMODE = os.environ.get("SERVING_LAB_MODE", "fast")\nN = 16 if MODE == "fast" else 1024\n'
    return nb


BAD = [
    (never_run, nr.rule_outputs_current, "no stored run"),
    (code_changed_after_its_run, nr.rule_outputs_current, "its code changed since its outputs were stored"),
    (other_kernel, nr.rule_kernel, "must be 'python3'"),
    (code_first, nr.rule_first_cell_links_lesson, "first cell must be Markdown"),
    (no_lesson_link, nr.rule_first_cell_links_lesson, "must link its lesson ../lessons/01-demo.md"),
    (untagged_parameters, nr.rule_parameters_cell, "tagged `parameters`"),
    (no_mode, nr.rule_parameters_cell, "must read SERVING_LAB_MODE"),
    (no_presets, nr.rule_parameters_cell, "no presets table"),
    (lambda: with_code('import os\nn = int(os.environ["N"])'), nr.rule_environment_only_in_parameters,
     "only the `parameters` cell may"),
    (lambda: with_code('from os import getenv\nn = getenv("N")'), nr.rule_environment_only_in_parameters,
     "only the `parameters` cell may"),
    (lambda: with_code("!pip install simpy"), nr.rule_forbidden_code, "installs packages"),
    (lambda: with_code("%pip install simpy"), nr.rule_forbidden_code, "installs packages"),
    (lambda: with_code('import urllib.request\nurllib.request.urlopen("https://example.com")'), nr.rule_forbidden_code,
     "a URL in a code cell"),
    (lambda: with_code('open("/home/me/data.json")'), nr.rule_no_absolute_paths, "absolute path '/home/me/data.json'"),
    (lambda: with_code('%matplotlib inline\nopen("C:\\\\data\\\\x.json")'), nr.rule_no_absolute_paths, "absolute path"),
    (lambda: with_code('p = "~/models/x.gguf"'), nr.rule_no_absolute_paths, "absolute path"),
    (lambda: with_code("x = x.cuda()"), nr.rule_forbidden_code, "`.cuda(`"),
    (lambda: with_code("%timeit sum(range(10))"), nr.rule_forbidden_code, "timeit"),
    (lambda: with_code("%%timeit\nsum(range(10))"), nr.rule_forbidden_code, "timeit"),
]


@pytest.mark.parametrize("make, rule, fragment", BAD, ids=[f"{r.__name__}-{i}" for i, (_, r, _) in enumerate(BAD)])
def test_bad_fixture_notebook_fails(tmp_path, make, rule, fragment):
    problems = problems_of(make(), tmp_path, rule)
    assert any(fragment in p for p in problems), f"{rule.__name__} did not complain about {fragment!r}: {problems}"
    assert problems_of(make(), tmp_path), "check_notebook must report it too"


def test_division_and_relative_paths_are_not_absolute(tmp_path):
    nb = with_code('rate = f"{n}/s"\nunits = "tokens/s"\np = "../results/a.json"\nprint(8 / 2)')
    assert problems_of(nb, tmp_path, nr.rule_no_absolute_paths) == []
