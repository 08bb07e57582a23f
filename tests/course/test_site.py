"""The course site (lessons/tools/course_site.py): it builds from the checkout, every page opens clean in a real
browser with no broken link or anchor, notebook figures reach the lessons, and a failed build leaves nothing."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import course_site
import nbformat
import pytest
from conftest import ROOT
from course_reader import Course

sys.path.insert(0, str(ROOT / "tests"))
from browser import broken_links, open_pages, require_browser  # noqa: E402


def test_site_url_maps_each_kind_of_file() -> None:
    assert course_site.site_url("lessons/01-continuous-batching.md") == "lessons/01-continuous-batching.html"
    assert course_site.site_url("notebooks/02-paged-attention.ipynb") == "notebooks/02-paged-attention.html"
    assert course_site.site_url("sim/simulator.py") == "sim/simulator.py.html"
    assert course_site.site_url("lessons/exercises") == "lessons/exercises/index.html"
    assert course_site.site_url("lessons/img/06-architecture-map-boxes.png") == "lessons/img/06-architecture-map-boxes.png"


def test_links_are_rewritten_relative_to_the_page() -> None:
    html = ('<a href="02-paged-attention.md#block-size">x</a> <a href="../sim/simulator.py">y</a> '
            '<a href="#here">z</a> <a href="https://arxiv.org/abs/2309.06180">w</a> <img src="img/06-architecture-map-boxes.png">'
            '<a href="../no/such/file.md">v</a>')
    out = course_site.rewrite_links(html, "lessons/01-continuous-batching.md")
    assert 'href="02-paged-attention.html#block-size"' in out
    assert 'href="../sim/simulator.py.html"' in out
    assert 'href="#here"' in out and 'href="https://arxiv.org/abs/2309.06180"' in out
    assert 'src="img/06-architecture-map-boxes.png"' in out
    assert 'href="../no/such/file.md"' in out  # left as written, for the browser check to report


def test_headings_get_githubs_ids() -> None:
    assert course_site.heading_id("The deployment manifest") == "the-deployment-manifest"
    assert course_site.heading_id("Step 3: `serving-lab serve`!") == "step-3-serving-lab-serve"
    html = course_site._markdown_to_html("# A b\n\n## A b\n\n<a id=\"x\"></a>\ntext")
    assert '<h1 id="a-b">' in html and '<h2 id="a-b-1">' in html and '<a id="x"></a>' in html


def test_navigation_follows_the_course_order() -> None:
    course = Course()
    lessons = [item.repo_path for item in course_site.navigation(course) if item.repo_path.startswith("lessons/0")
               or item.repo_path == "lessons/capstone.md"]
    assert lessons == [f"lessons/{lesson.stem}.md" for lesson in course.lessons]


def test_a_tagged_cell_becomes_the_lessons_figure(tmp_path: Path) -> None:
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
                                  "%matplotlib inline\nplt.plot([0, 1], [1, 0]); plt.show()",
                                  metadata={"tags": ["figure:line"]}),
        nbformat.v4.new_code_cell("print('no figure here')")])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "09-demo.ipynb"
    nbformat.write(notebook, path)
    executed = course_site.read_notebook(path, execute=True, timeout_s=120)
    figures = course_site.figures_of(executed, "09-demo")
    assert list(figures) == ["lessons/img/09-demo-line.png"]
    assert figures["lessons/img/09-demo-line.png"].startswith(b"\x89PNG")
    assert course_site.figure_tags(path) == ["line"]


def test_every_figure_a_lesson_embeds_is_made_by_its_notebook() -> None:
    """A lesson's `img/<stem>-<name>.png` is committed and its notebook tags a cell `figure:<name>` (so that
    `--update-figures` remakes it); every tagged cell's image is embedded by its lesson."""
    embedded, promised = set(), set()
    for lesson in Course().lessons:
        text = (ROOT / "lessons" / f"{lesson.stem}.md").read_text(encoding="utf-8")
        for name in re.findall(rf"\]\(img/{re.escape(lesson.stem)}-([a-z0-9-]+)\.png\)", text):
            embedded.add((lesson.stem, name))
            assert (ROOT / "lessons" / "img" / f"{lesson.stem}-{name}.png").is_file(), (lesson.stem, name)
        if lesson.has_notebook:
            promised |= {(lesson.stem, name) for name in course_site.figure_tags(ROOT / "notebooks" / f"{lesson.stem}.ipynb")}
    assert promised <= embedded, f"tagged but not shown: {sorted(promised - embedded)}"
    assert embedded <= promised, f"shown but made by no notebook: {sorted(embedded - promised)}"


def test_a_failed_build_leaves_the_old_site_and_no_temp_folder(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "site"
    out.mkdir()
    (out / "old.html").write_text("old")

    def fail(path: Path, execute: bool, timeout_s: int = 0):
        raise course_site.SiteError(f"{path.name}: boom")

    monkeypatch.setattr(course_site, "read_notebook", fail)
    with pytest.raises(course_site.SiteError, match="boom"):
        course_site.build(out, execute=True, progress=lambda _: None)
    assert [p.name for p in tmp_path.iterdir()] == ["site"] and (out / "old.html").read_text() == "old"


def test_the_site_builds_and_every_page_reads_clean_in_a_browser(tmp_path: Path) -> None:
    chromium = require_browser()
    out = tmp_path / "site"
    site = course_site.build(out, execute=False, progress=lambda _: None)
    course = Course()
    for lesson in course.lessons:
        assert f"lessons/{lesson.stem}.md" in site.markdown
        assert not lesson.has_notebook or f"notebooks/{lesson.stem}.ipynb" in site.notebooks
    pages = sorted(out.rglob("*.html"))
    checks = open_pages(pages, chromium)
    problems = [f"{page.relative_to(out)}: {p}" for page, check in checks.items() for p in check.problems()]
    problems += broken_links(checks, out)
    assert problems == []
    mock = checks[out / "mock-interview.html"]
    assert sum("interview-bank.html#q-" in link for link in mock.links) == 5  # the first draw, on opening
    assert len(course.questions) >= 60
