"""The course site (lessons/tools/course_site.py): it builds from the checkout, every page opens clean in a real
browser with no broken link or anchor, notebook figures reach the lessons, a failed build leaves nothing, and
each lesson's playground runs the simulator offline in the browser with the decisions Python makes."""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
import zipfile
from pathlib import Path

import course_site
import nbformat
import pytest
from conftest import ROOT
from course_reader import Course

sys.path.insert(0, str(ROOT / "tests"))
from browser import broken_links, launch, offline, open_pages, require_browser, run_playground, served  # noqa: E402

from course.playground import PLAYGROUNDS, dashboard_frames, run  # noqa: E402


def pyodide_installed() -> bool:
    try:
        course_site.pinned_pyodide()
    except course_site.SiteError:
        return False
    return True


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, course_site.Site, bool]:
    """The site, built once for this module's browser tests (`--no-execute`), with the playgrounds where the
    pinned Pyodide is installed; (folder, what it holds, whether it has the playgrounds)."""
    out = tmp_path_factory.mktemp("built") / "site"
    playground = pyodide_installed()
    return out, course_site.build(out, execute=False, playground=playground, progress=lambda _: None), playground


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


def test_the_site_builds_and_every_page_reads_clean_in_a_browser(built) -> None:
    chromium = require_browser()
    out, site, _ = built
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


def test_the_build_refuses_a_missing_or_other_pyodide_before_writing(tmp_path: Path, monkeypatch) -> None:
    npm = tmp_path / "npm"
    npm.mkdir()
    shutil.copyfile(course_site.PLAYGROUND_NPM / "package.json", npm / "package.json")
    monkeypatch.setattr(course_site, "PLAYGROUND_NPM", npm)
    monkeypatch.setattr(course_site.pinned_pyodide, "__defaults__", (npm,))
    out = tmp_path / "site"
    with pytest.raises(course_site.SiteError, match=r"need Pyodide 314\.0\.8, which is not installed: run `npm ci"):
        course_site.build(out, execute=False, progress=lambda _: None)
    assert not out.exists()
    (npm / "node_modules" / "pyodide").mkdir(parents=True)
    (npm / "node_modules" / "pyodide" / "package.json").write_text(json.dumps({"version": "0.26.0"}))
    with pytest.raises(course_site.SiteError, match=r"found Pyodide 0\.26\.0 without pyodide\.js, .*--no-playground"):
        course_site.pinned_pyodide(npm)
    assert course_site.main(["--out", str(out), "--no-execute"]) == 1 and not out.exists()


def test_the_simulator_archive_holds_the_simulator_and_simpy_and_is_reproducible() -> None:
    archive = course_site.simulator_archive()
    assert archive == course_site.simulator_archive()
    names = set(zipfile.ZipFile(io.BytesIO(archive)).namelist())
    assert {"course/playground.py", "core/scheduler.py", "sim/simulator.py", "sim/data/gpu_fit.json",
            "simpy/__init__.py", "simpy/LICENSE"} <= names
    assert not any(n.startswith(("ref_engine/", "serving_lab/")) or "__pycache__" in n for n in names)
    # the small samples `Workload.from_trace` draws from go; the full traces (core/trace.py, 250 KB) stay out
    assert {"core/trace.py", "core/data/azure-llm-2023-conv.csv", "core/data/azure-llm-2023-code.csv"} <= names
    assert not any(n.endswith(".gz") for n in names)


def test_the_playgrounds_and_the_dashboard_run_offline_in_the_browser_as_in_python(built) -> None:
    """Served over HTTP with every request off the site refused: each lesson's playground starts Pyodide,
    runs, draws, and its scheduling decisions (the digest) and answer are Python's to the last digit; the
    simulated dashboard replays to the end on the numbers of Python's replay."""
    chromium = require_browser()
    out, _, has_playgrounds = built
    if not has_playgrounds:
        pytest.skip("the pinned Pyodide is not installed: npm ci --prefix lessons/tools/playground")
    from playwright.sync_api import sync_playwright

    with served(out) as origin, sync_playwright() as pw:
        browser = launch(pw, chromium)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            refused = offline(page, origin)
            for playground in PLAYGROUNDS:
                shown = run_playground(page, f"{origin}/lessons/{playground.lesson}.html", guess="2")
                expected = run(playground.lesson)
                assert shown["state"] == "done", (playground.lesson, page.inner_text("section.playground .pg-status"))
                assert (shown["digest"], float(shown["answer"])) == (expected["digest"], expected["answer"])
                assert page.locator("section.playground .uplot canvas").count() == 1
                assert page.locator("section.playground .pg-result li").count() == len(expected["lines"])
            # a knob moved on the last page (lesson 7): the request rate's slider to its first value, run again
            page.evaluate("document.querySelector('section.playground').dataset.state = 'again'")
            page.fill("section.playground input[name=request_rate]", "0")
            page.click("section.playground .pg-run")
            page.wait_for_selector("section.playground[data-state=done]", timeout=60_000)
            shown = page.eval_on_selector("section.playground", "s => ({...s.dataset})")
            assert shown["digest"] == run(PLAYGROUNDS[-1].lesson, request_rate=4.0)["digest"] != expected["digest"]

            page.goto(f"{origin}/dashboard/index.html?speed=8", wait_until="load")
            page.wait_for_function("window.dashboard.done", timeout=180_000)
            seen = page.evaluate("""() => {
              const m = name => document.querySelector(`[data-metric="${name}"]`).dataset;
              return {steps: window.dashboard.numSteps, status: document.getElementById("status").textContent,
                      tokens: +m("output_tokens_per_second").total, ttft: +m("time_to_first_token").count,
                      preemptions: +m("preempted_sequences").value, blocks: window.dashboard.maxInUseBlocks};
            }""")
        finally:
            browser.close()
    last = dashboard_frames(speed=8.0)[-1]
    metrics = last["metrics"]
    assert seen["status"] == "replay finished" and seen["blocks"] > 0
    assert (seen["steps"], seen["tokens"], seen["ttft"], seen["preemptions"]) == (
        last["num_steps"], metrics["output_tokens_per_second"]["total"], metrics["time_to_first_token"]["count"],
        metrics["preempted_sequences"]["value"])
    assert errors == [] and refused == []
