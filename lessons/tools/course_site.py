#!/usr/bin/env python3
"""Build the course as a static website: lessons, glossary, interview bank, a mock interview, the notebooks
with their outputs and plots, and every source file the course links, in one folder a browser opens.

    python lessons/tools/course_site.py                    # site/: notebooks executed in fast mode (~10 min)
    python lessons/tools/course_site.py --no-execute       # notebooks shown with their stored run (seconds)
    python lessons/tools/course_site.py --update-figures   # also refresh lessons/img/ from the executed notebooks
    python lessons/tools/course_site.py --figures 05-speculative-decoding   # only that notebook's figures, no site
    python lessons/tools/course_site.py --no-playground     # without the lessons' in-browser simulator
    python -m http.server -d site                          # then open http://localhost:8000 (or open site/index.html)

The lessons' playgrounds run the course's simulator in the page with Pyodide, pinned in
lessons/tools/playground/package.json: `npm ci --prefix lessons/tools/playground` installs it (once), and the
build copies it into site/playground/ with everything else the page loads, so the site works offline. A page
opened from disk cannot start WebAssembly: serve the folder (the http.server line above) to use them.

Why no site generator: the course is GitHub-flavoured Markdown that must read well on GitHub as it is (raw
`<a id>` anchors, relative `.md` and `.ipynb` links), so the site renders the same files with markdown-it-py (as the
capstone report does), nbconvert and nbclient (Jupyter, already installed for nbval) and one Jinja template;
Jupyter Book 2 needs Node.js and would rewrite the anchor conventions the checker relies on. The folder mirrors
the repository (`lessons/01-x.md` -> `lessons/01-x.html`, `sim/simulator.py` -> `sim/simulator.py.html`), so
every relative link keeps working once its suffix is mapped (`site_url`).

Figures: a notebook cell tagged `figure:<name>` makes the image `lessons/img/<stem>-<name>.png` that the lesson
embeds. `--update-figures` writes those files from a fresh execution; the committed images are what GitHub and
a `--no-execute` build show.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

sys.path.insert(0, str(Path(__file__).resolve().parent))

from course_reader import ROOT, Course  # noqa: E402

from serving_lab.folders import replaced_whole  # noqa: E402

TEMPLATES = Path(__file__).resolve().parent / "site"
FIGURE_TAG = "figure:"
IMAGE_SUFFIXES = {".png", ".svg", ".jpg", ".jpeg", ".gif"}
HREF_RE = re.compile(r'(\b(?:href|src)=")([^"]*)(")')
EXTERNAL_RE = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*:|//|#)")
ENTRY_PAGES = ("lessons/README.md", "glossary.md", "lessons/interview-bank.md", "notebooks/README.md")
PROJECT_PAGES = (("README.md", "Project README"), ("ARCHITECTURE.md", "Architecture"),
                 ("benchmarks/RESULTS.md", "Measured results"))
LEVELS = {"E": "easy", "M": "medium", "H": "hard"}
# The playgrounds (course/playground.py run by Pyodide in the page): where a lesson's Markdown says
# PLAYGROUND_MARKER, its page gets the playground. Pyodide comes from the npm registry, pinned in
# lessons/tools/playground/package.json and installed beside it by `npm ci`; uPlot is the dashboard's copy.
PLAYGROUND_MARKER = "<!-- playground -->"
PLAYGROUND_NPM = Path(__file__).resolve().parent / "playground"
PYODIDE_FILES = ("pyodide.js", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json")
UPLOT = ROOT / "ref_engine" / "entrypoints" / "dashboard" / "static" / "vendor" / "uplot"
SIMULATOR_ARCHIVE = "serving_lab_sim.zip"
DASHBOARD = ROOT / "ref_engine" / "entrypoints" / "dashboard" / "static"  # the server's page, fed here by the simulator
DASHBOARD_PAGE = "dashboard"  # the navigation's name for it


class SiteError(Exception):
    """A site that cannot be built as asked (a notebook that fails, a missing tool); the message says which."""


@dataclass
class Site:
    """What the site holds, as repository paths (relative, POSIX): found by following the course's links."""

    markdown: list[str] = field(default_factory=list)
    notebooks: list[str] = field(default_factory=list)
    code: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)


def site_url(repo_path: str, root: Path = ROOT) -> str:
    """Where a repository file lives in the site: Markdown and notebooks become `.html`, a folder its
    `index.html`, an image stays itself, any other file becomes a highlighted `<name>.html` page."""
    path = Path(repo_path)
    if (root / path).is_dir():
        return (path / "index.html").as_posix()
    if path.suffix in (".md", ".ipynb"):
        return path.with_suffix(".html").as_posix()
    if path.suffix.lower() in IMAGE_SUFFIXES:
        return path.as_posix()
    return f"{path.as_posix()}.html"


def rewrite_links(html: str, page: str, root: Path = ROOT) -> str:
    """Map every relative href/src of a page rendered from the repository file `page` to the site's files."""
    page_dir = Path(page).parent

    def one(match: re.Match) -> str:
        target = match.group(2)
        if not target or EXTERNAL_RE.match(target):
            return match.group(0)
        path, _, anchor = target.partition("#")
        repo_target = Path(os.path.normpath(page_dir / unquote(path))).as_posix()
        if repo_target.startswith("..") or not (root / repo_target).exists():
            return match.group(0)  # left as written: the browser check reports it as broken
        url = relative(site_url(repo_target, root), page_dir.as_posix() or ".")
        return f"{match.group(1)}{url}{'#' + anchor if anchor else ''}{match.group(3)}"

    return HREF_RE.sub(one, html)


def collect(course: Course) -> Site:
    """Every page the site needs: the course's entry pages, each lesson and notebook in course order, and what
    they link to, transitively through Markdown (files outside the repository are never followed)."""
    root = course.root
    start = list(ENTRY_PAGES) + [p for p, _ in PROJECT_PAGES]
    for lesson in course.lessons:
        start.append(f"lessons/{lesson.stem}.md")
        if lesson.has_notebook:
            start.append(f"notebooks/{lesson.stem}.ipynb")
    site, seen, todo = Site(), set(), [s for s in start if (root / s).exists()]
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        path = root / name
        if path.is_dir():
            site.folders.append(name)  # its listing links every file in it: each gets a page too
            todo += [p.relative_to(root).as_posix() for p in sorted(path.iterdir()) if not _hidden(p)]
            continue
        suffix = path.suffix.lower()
        if suffix in IMAGE_SUFFIXES:
            site.images.append(name)
            continue
        if suffix not in (".md", ".ipynb"):
            site.code.append(name)
            continue
        (site.markdown if suffix == ".md" else site.notebooks).append(name)
        for link in course.links(path):
            if link.is_external or not link.path_part:
                continue
            target = link.resolved
            if target.exists() and target.resolve().is_relative_to(root):
                todo.append(target.resolve().relative_to(root).as_posix())
    return site


def _hidden(path: Path) -> bool:
    return path.name.startswith((".", "__pycache__", "node_modules")) or path.suffix in (".pyc",)


# ---- rendering ----------------------------------------------------------------------------------------------

def heading_id(text: str) -> str:
    """The id GitHub gives a Markdown heading (lower case, punctuation dropped, spaces to hyphens), so that links
    written for GitHub (`README.md#the-deployment-manifest`) work on the site too."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _markdown_to_html(text: str) -> str:
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
    tokens = md.parse(text)
    used: dict[str, int] = {}
    for heading, inline in zip(tokens, tokens[1:]):
        if heading.type == "heading_open":
            plain = "".join(c.content for c in inline.children or () if c.type in ("text", "code_inline"))
            slug = heading_id(plain)
            heading.attrSet("id", slug if slug not in used else f"{slug}-{used[slug]}")
            used[slug] = used.get(slug, 0) + 1
    return md.renderer.render(tokens, md.options, {})


def _title(text: str, fallback: str) -> str:
    match = re.search(r"^#\s+(.+)$", text, re.MULTILINE)
    return re.sub(r"[`*_]", "", match.group(1)).strip() if match else fallback


@dataclass(frozen=True)
class NavItem:
    title: str
    repo_path: str
    children: tuple[NavItem, ...] = ()


def navigation(course: Course, dashboard: bool = False) -> list[NavItem]:
    """The sidebar, in course order: each lesson with its notebook, then the bank, mock interview, glossary (and
    with `dashboard`, the simulated dashboard's page)."""
    items = [NavItem("Course map", "lessons/README.md")]
    for lesson in course.lessons:
        label = lesson.number if lesson.number != "C" else "Capstone"
        title = lesson.title if lesson.number != "C" else lesson.title.split(":", 1)[-1].strip()
        children = ((NavItem("Notebook", f"notebooks/{lesson.stem}.ipynb"),) if lesson.has_notebook else ())
        items.append(NavItem(f"{label} · {title}" if lesson.number != "C" else f"{label}: {title}",
                             f"lessons/{lesson.stem}.md", children))
    items += [NavItem("Interview bank", "lessons/interview-bank.md"), NavItem("Mock interview", "mock-interview"),
              NavItem("Glossary", "glossary.md")]
    if dashboard:
        items.append(NavItem("Dashboard, simulated", DASHBOARD_PAGE))
    items += [NavItem(title, path) for path, title in PROJECT_PAGES]
    return items


class Renderer:
    """Writes pages into `out` through the one template; every link is made relative to the page's place."""

    def __init__(self, course: Course, out: Path, playgrounds: bool = False) -> None:
        import jinja2
        from pygments.formatters import HtmlFormatter

        self.course, self.out, self.playgrounds = course, out, playgrounds
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True)
        self.template = env.get_template("page.html.j2")
        self.nav = navigation(course, dashboard=playgrounds)
        self.pygments_css = HtmlFormatter().get_style_defs(".highlight")

    def _site_path(self, repo_path: str) -> str:
        special = {"mock-interview": "mock-interview.html", DASHBOARD_PAGE: "dashboard/index.html"}
        return special.get(repo_path) or site_url(repo_path, self.course.root)

    def write(self, repo_path: str, title: str, body: str) -> Path:
        """One page: `body` is HTML whose links are written relative to `repo_path`'s folder in the repository."""
        from markupsafe import Markup

        target = self._site_path(repo_path)
        here = Path(target).parent.as_posix() or "."

        def url(path: str) -> str:
            return relative(self._site_path(path), here)

        html = self.template.render(
            title=title, body=Markup(rewrite_links(body, repo_path, self.course.root)), nav=self.nav,
            current=repo_path, url=url, home=relative("index.html", here), css=relative("style.css", here))
        path = self.out / target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(html, encoding="utf-8")
        return path

    def markdown_page(self, repo_path: str) -> Path:
        text = (self.course.root / repo_path).read_text(encoding="utf-8")
        html = _markdown_to_html(text)
        if self.playgrounds and PLAYGROUND_MARKER in html:
            here = Path(self._site_path(repo_path)).parent.as_posix()
            html = html.replace(PLAYGROUND_MARKER, playground_html(Path(repo_path).stem, here))
        return self.write(repo_path, _title(text, repo_path), html)

    def notebook_page(self, repo_path: str, notebook) -> Path:
        from nbconvert import HTMLExporter

        body, _ = HTMLExporter(template_name="basic").from_notebook_node(notebook)
        title = _title("".join(c.source for c in notebook.cells[:1] if c.cell_type == "markdown"), repo_path)
        return self.write(repo_path, f"Notebook: {title}", body)

    def code_page(self, repo_path: str) -> Path:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import TextLexer, get_lexer_for_filename
        from pygments.util import ClassNotFound

        text = (self.course.root / repo_path).read_text(encoding="utf-8", errors="replace")
        try:
            lexer = get_lexer_for_filename(repo_path, text)
        except ClassNotFound:
            lexer = TextLexer()
        code = highlight(text, lexer, HtmlFormatter(linenos="inline", linespans="L"))
        header = f"<h1><code>{repo_path}</code></h1>"
        return self.write(repo_path, repo_path, header + code)

    def folder_page(self, repo_path: str) -> Path:
        folder = self.course.root / repo_path
        rows = [f'<li><a href="{p.name}{"/" if p.is_dir() else ""}">{p.name}</a></li>'
                for p in sorted(folder.iterdir()) if not _hidden(p)]
        # Links to a folder's files point at their pages: site_url maps them as it maps any link.
        return self.write(f"{repo_path}/index", repo_path, f"<h1><code>{repo_path}/</code></h1><ul>{''.join(rows)}</ul>")

    def css(self) -> None:
        css = (TEMPLATES / "style.css").read_text(encoding="utf-8") + "\n" + self.pygments_css
        (self.out / "style.css").write_text(css, encoding="utf-8")


def relative(site_path: str, here: str) -> str:
    """A link from the site folder `here` to the site file `site_path`."""
    return Path(os.path.relpath(site_path, here)).as_posix()


def mock_interview_body(course: Course) -> str:
    """The mock-interview page: every question as data, and a small script that draws a set by level."""
    questions = [{"id": q.id, "title": q.title, "level": q.tags[0], "design": "design" in q.tags,
                  "url": f"lessons/interview-bank.html#{q.anchor}"} for q in course.questions]
    counts = {level: sum(q["level"] == level for q in questions) for level in LEVELS}
    options = "".join(f'<label><input type="checkbox" name="level" value="{k}" checked> {v} ({counts[k]})</label> '
                      for k, v in LEVELS.items())
    return (TEMPLATES / "mock-interview.html").read_text(encoding="utf-8").replace(
        "{{OPTIONS}}", options).replace("{{TOTAL}}", str(len(questions))).replace(
        "{{QUESTIONS}}", json.dumps(questions).replace("</", "<\\/"))


def home_body(course: Course, dashboard: bool = False) -> str:
    rows = []
    for lesson in course.lessons:
        notebook = (f' · <a href="notebooks/{lesson.stem}.html">notebook</a>' if lesson.has_notebook else "")
        questions = len(course.questions_of(lesson.stem))
        extra = f" · {questions} interview questions" if questions else ""
        rows.append(f'<li><a href="lessons/{lesson.stem}.html">{lesson.title}</a>{notebook}{extra} '
                    f'<span class="muted">({lesson.minutes} min)</span></li>')
    extra = ('<p>Lessons 1-5 and 7 end with a <strong>playground</strong>: the lesson\'s experiment, run by the '
             "course's simulator in your browser. The <a href=\"dashboard/index.html\">dashboard</a> replays a "
             "simulated server's run live: the batch step by step, the KV pool's blocks, queues, tenants and the six "
             "metrics (the same page <code>serving-lab serve --dashboard</code> shows of a running server).</p>\n"
             if dashboard else "")
    return (TEMPLATES / "home.html").read_text(encoding="utf-8").replace("{{LESSONS}}", "".join(rows)).replace(
        "{{QUESTIONS}}", str(len(course.questions))).replace("{{DASHBOARD}}", extra)


# ---- the playgrounds ---------------------------------------------------------------------------------------

def pinned_pyodide(npm: Path = PLAYGROUND_NPM) -> tuple[Path, str]:
    """The installed Pyodide package's folder and version, the one package.json pins. A SiteError naming the fix
    otherwise: a page whose playground cannot load is worse than a build that says why."""
    wanted = json.loads((npm / "package.json").read_text(encoding="utf-8"))["dependencies"]["pyodide"]
    folder = npm / "node_modules" / "pyodide"
    fix = (f"run `npm ci --prefix {os.path.relpath(npm)}` (it needs Node.js and npm), "
           "or build without the playgrounds (--no-playground)")
    if not (folder / "package.json").is_file():
        raise SiteError(f"the lessons' playgrounds need Pyodide {wanted}, which is not installed: {fix}")
    version = json.loads((folder / "package.json").read_text(encoding="utf-8"))["version"]
    missing = [name for name in PYODIDE_FILES if not (folder / name).is_file()]
    if version != wanted or missing:
        found = f"Pyodide {version}" + (f" without {', '.join(missing)}" if missing else "")
        raise SiteError(f"the lessons' playgrounds need Pyodide {wanted}, found {found}: {fix}")
    return folder, version


def simulator_archive(root: Path = ROOT) -> bytes:
    """One zip the page unpacks into Pyodide: `core`, `sim`, `course/playground.py` and SimPy with its licence
    (all pure Python). Byte-for-byte the same for the same sources (fixed dates, sorted names)."""
    import importlib.metadata
    import io

    import simpy

    files: dict[str, Path] = {}
    for package in ("core", "sim"):
        for path in sorted((root / package).rglob("*")):
            if path.suffix in (".py", ".json", ".csv") and "__pycache__" not in path.parts:
                files[path.relative_to(root).as_posix()] = path
    for name in ("course/__init__.py", "course/playground.py"):
        files[name] = root / name
    simpy_dir = Path(simpy.__file__).parent
    for path in sorted(simpy_dir.rglob("*.py")):
        files[f"simpy/{path.relative_to(simpy_dir).as_posix()}"] = path
    licence = [f for f in importlib.metadata.distribution("simpy").files or () if f.name.startswith("LICENSE")]
    if licence:
        files["simpy/LICENSE"] = Path(licence[0].locate())
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, files[name].read_bytes())
    return buffer.getvalue()


def write_playground_files(out: Path, pyodide: tuple[Path, str], root: Path = ROOT) -> None:
    """The site's playground/ folder (Pyodide's runtime from `pinned_pyodide`, the simulator's archive, uPlot,
    the page scripts) and its dashboard/ page."""
    pyodide, version = pyodide
    folder = out / "playground"
    (folder / "pyodide").mkdir(parents=True)
    for name in PYODIDE_FILES:
        shutil.copyfile(pyodide / name, folder / "pyodide" / name)
    (folder / "pyodide" / "VENDORED.txt").write_text(
        f"Pyodide {version} (https://pyodide.org), Mozilla Public License 2.0: the runtime files of the npm "
        f"registry's `pyodide@{version}`, unchanged.\n", encoding="utf-8")
    shutil.copytree(UPLOT, folder / "vendor" / "uplot")
    for name in ("python.js", "playground.js"):
        shutil.copyfile(TEMPLATES / name, folder / name)
    (folder / SIMULATOR_ARCHIVE).write_bytes(simulator_archive(root))
    dashboard = out / "dashboard"
    dashboard.mkdir()
    for name in ("dashboard.js", "dashboard.css"):
        shutil.copyfile(DASHBOARD / name, dashboard / name)
    shutil.copyfile(TEMPLATES / "dashboard-feed.js", dashboard / "dashboard-feed.js")
    (dashboard / "index.html").write_text(dashboard_page(), encoding="utf-8")


def dashboard_page() -> str:
    """The server's dashboard page, fed by the simulator in the browser (dashboard-feed.js) instead of a
    server's event stream, with a form to choose the GPU and the replay's speed."""
    from html import escape

    from course.playground import DASHBOARD_SPEEDS, GPUS

    def options(values) -> str:
        labels = (escape(f"{v:g}" if isinstance(v, float) else v) for v in values)
        return "".join(f'<option value="{label}">{label}</option>' for label in labels)

    form = ('<form id="replay-form" method="get"><a href="../index.html">the course</a> · GPU <select name="hardware">'
            f'{options(GPUS)}</select> speed <select name="speed">{options(DASHBOARD_SPEEDS)}</select>x '
            '<button>Replay</button></form>\n')
    html = (DASHBOARD / "index.html").read_text(encoding="utf-8")
    for old, new in (('"dashboard/static/vendor/uplot/', '"../playground/vendor/uplot/'),
                     ('"dashboard/static/dashboard', '"dashboard'),
                     ("</header>", form + "</header>"),
                     ('<script src="../playground/vendor/uplot/uPlot.iife.min.js"></script>',
                      '<script src="../playground/pyodide/pyodide.js"></script>\n<script src="../playground/python.js">'
                      '</script>\n<script src="dashboard-feed.js"></script>\n'
                      '<script src="../playground/vendor/uplot/uPlot.iife.min.js"></script>')):
        if old not in html:
            raise SiteError(f"{DASHBOARD / 'index.html'} has no {old!r}: update course_site.dashboard_page to it")
        html = html.replace(old, new)
    return html


def playground_html(stem: str, here: str) -> str:
    """The playground block of lesson `stem`'s page (in the site folder `here`); '' if the lesson has none."""
    from html import escape

    from course.playground import BY_LESSON, catalog

    if stem not in BY_LESSON:
        return ""
    spec = next(entry for entry in catalog() if entry["lesson"] == stem)
    root = relative("playground", here) + "/"
    data = json.dumps(spec).replace("</", "<\\/")  # safe inside <script>
    return (f'<section class="playground" id="playground" data-root="{escape(root)}">\n'
            f"<h2>Try it: {escape(spec['title'])}</h2>\n"
            '<p class="muted">The course\'s simulator (<code>course/playground.py</code> with <code>core/</code> and '
            "<code>sim/</code>) running in your browser on Pyodide, serving Llama-3.1-8B on the GPU you choose. "
            "Predict first, then run.</p>\n"
            f'<script type="application/json">{data}</script>\n'
            '<form class="pg-form"></form>\n<p class="pg-status"></p>\n<div class="pg-result"></div>\n'
            f'<link rel="stylesheet" href="{root}vendor/uplot/uPlot.min.css">\n'
            f'<script src="{root}vendor/uplot/uPlot.iife.min.js"></script>\n'
            f'<script src="{root}pyodide/pyodide.js"></script>\n'
            f'<script src="{root}python.js"></script>\n'
            f'<script src="{root}playground.js"></script>\n</section>\n')


# ---- notebooks and their figures ----------------------------------------------------------------------------

def read_notebook(path: Path, execute: bool, timeout_s: int = 1800):
    """The notebook, executed in its own folder with a fresh kernel (fast mode unless SERVING_LAB_MODE says)
    when `execute`; a failing cell stops the build and names the notebook and the cell."""
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    if execute:
        from nbclient import NotebookClient
        from nbclient.exceptions import CellExecutionError

        client = NotebookClient(notebook, timeout=timeout_s, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        try:
            client.execute()
        except CellExecutionError as exc:
            raise SiteError(f"{path.name}: a cell failed while executing:\n{exc}") from None
    return notebook


def figures_of(notebook, stem: str) -> dict[str, bytes]:
    """`{"lessons/img/<stem>-<name>.png": png}` for each executed cell tagged `figure:<name>`."""
    import base64

    found = {}
    for cell in notebook.cells:
        names = [t[len(FIGURE_TAG):] for t in cell.get("metadata", {}).get("tags", []) if t.startswith(FIGURE_TAG)]
        pngs = [o["data"]["image/png"] for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
        for name in names:
            if not pngs:
                raise SiteError(f"{stem}.ipynb: the cell tagged {FIGURE_TAG}{name} made no image")
            found[f"lessons/img/{stem}-{name}.png"] = base64.b64decode(pngs[0])
    return found


def figure_tags(path: Path) -> list[str]:
    """The figure names a notebook promises (without executing it)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [t[len(FIGURE_TAG):] for c in cells for t in c.get("metadata", {}).get("tags", []) if t.startswith(FIGURE_TAG)]


# ---- the build ----------------------------------------------------------------------------------------------

def build(out: Path, *, execute: bool = True, update_figures: bool = False, playground: bool = True,
          root: Path = ROOT, progress=print) -> Site:
    """Build the site into `out` (replaced whole, never left half-written: built beside it, then renamed).
    `playground`: the lessons' in-browser simulator too (it needs the pinned Pyodide: `pinned_pyodide`)."""
    if update_figures and not execute:
        raise SiteError("--update-figures needs the notebooks executed (drop --no-execute)")
    pyodide = pinned_pyodide() if playground else None  # before anything is executed or written
    course = Course(root)
    site = collect(course)
    with replaced_whole(Path(out).resolve()) as tmp:
        renderer = Renderer(course, tmp, playgrounds=playground)
        renderer.css()
        if pyodide is not None:
            write_playground_files(tmp, pyodide, root)
        figures: dict[str, bytes] = {}
        for name in site.notebooks:
            started = time.perf_counter()
            notebook = read_notebook(root / name, execute)
            if execute:
                figures.update(figures_of(notebook, Path(name).stem))
                progress(f"executed {name} in {time.perf_counter() - started:.0f} s")
            renderer.notebook_page(name, notebook)
        if update_figures:
            for name, png in figures.items():
                (root / name).write_bytes(png)
                progress(f"wrote {name}")
        for name in site.markdown:
            renderer.markdown_page(name)
        for name in site.code:
            renderer.code_page(name)
        for name in site.folders:
            renderer.folder_page(name)
        for name in site.images + sorted(f"lessons/img/{p.name}" for p in (root / "lessons/img").glob("*.png")):
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / name, tmp / name)
        for name, png in figures.items():  # this run's figures, whether or not the repository's were updated
            (tmp / name).write_bytes(png)
        renderer.write("mock-interview", "Mock interview", mock_interview_body(course))
        renderer.write("index.md", "Serving Lab: the course", home_body(course, dashboard=playground))
    return site


def update_figures(stems: list[str], root: Path = ROOT, progress=print) -> None:
    """Execute the named notebooks and rewrite their figures in lessons/img/ (no site is built)."""
    for stem in stems:
        path = root / "notebooks" / f"{stem}.ipynb"
        if not path.is_file():
            raise SiteError(f"no notebook {path.relative_to(root)}")
        started = time.perf_counter()
        figures = figures_of(read_notebook(path, execute=True), stem)
        for name, png in figures.items():
            (root / name).write_bytes(png)
        progress(f"{stem}: {len(figures)} figures in {time.perf_counter() - started:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "site", help="the site folder (replaced whole)")
    parser.add_argument("--no-execute", dest="execute", action="store_false",
                        help="render the notebooks as committed (their stored fast-mode run) instead of executing them")
    parser.add_argument("--update-figures", action="store_true",
                        help="write the figures of cells tagged figure:<name> into lessons/img/")
    parser.add_argument("--no-playground", dest="playground", action="store_false",
                        help="leave out the lessons' in-browser simulator (it needs `npm ci` in lessons/tools/playground)")
    parser.add_argument("--figures", nargs="+", metavar="STEM",
                        help="only execute these notebooks and rewrite their figures (no site)")
    args = parser.parse_args(argv)
    try:
        import nbclient  # noqa: F401
        import nbconvert  # noqa: F401
    except ImportError:
        print("the site needs nbconvert and nbclient: pip install -e '.[test]' (Jupyter brings both)",
              file=sys.stderr)
        return 2
    started = time.perf_counter()
    try:
        if args.figures:
            update_figures(args.figures)
            return 0
        site = build(args.out, execute=args.execute, update_figures=args.update_figures, playground=args.playground)
    except SiteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    pages = len(site.markdown) + len(site.notebooks) + len(site.code) + len(site.folders) + 2
    print(f"built {pages} pages into {args.out} in {time.perf_counter() - started:.0f} s: "
          f"open {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
