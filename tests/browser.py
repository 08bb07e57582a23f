"""Open a local HTML page in a real headless Chromium and report what a reader's browser would show wrong.

Why this exists: a page can be well-formed HTML and still be broken for a reader — an embedded image whose
data: URI does not decode, a link to a file that isn't there, a script that throws. Only a real browser sees
these, so the tests of the self-contained report and of the course site open their pages here.

The driver is Playwright (the pip package, in the `test` extra) driving Debian's Chromium (`apt-get install
chromium`, which .ci/run does) through `executable_path`: Playwright's own browser download (`playwright
install`) is never used. Tests call `require_browser()` first, which skips them where either is missing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ENV_VAR = "SERVING_LAB_CHROMIUM"  # a Chromium executable (path or name on PATH) to use instead of the default
NAMES = ("chromium", "chromium-browser", "google-chrome")
INSTALL_HINT = "install Debian's chromium (apt-get install chromium) or set SERVING_LAB_CHROMIUM"

# --no-sandbox: Chromium's sandbox refuses to start as root (CI runs as root); --disable-dev-shm-usage: a
# container's /dev/shm may be 64 MB; the rest keep Chromium off the network on its own account (this
# machine's network is closed, and every refused background connection is noise and a delay).
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SRC_CHARS = 80  # image sources and request URLs are cut to this many characters (data: URIs are long)
TIMEOUT_MS = 30_000  # for loading one page, and for its images to finish loading after that
# Chromium's start: on a loaded 2-core CI machine one start once took over 30 s, so a start gets longer and,
# if it still hangs, one more try with a fresh process (a hung start is the machine, not the page).
LAUNCH_TIMEOUT_MS = 90_000
LAUNCH_TRIES = 2

# Waits for every <img> to finish (loaded or failed), lazy ones included as a reader scrolling would, then
# reads their natural sizes: 0 x 0 is an image that did not load or did not decode.
_IMAGES_JS = """async (timeoutMs) => {
  const imgs = Array.from(document.images);
  for (const img of imgs) if (img.loading === "lazy") img.loading = "eager";
  const done = img => img.complete ? null : new Promise(r => {
    img.addEventListener("load", r); img.addEventListener("error", r); });
  await Promise.race([Promise.all(imgs.map(done)), new Promise(r => setTimeout(r, timeoutMs))]);
  return imgs.map(img => [img.currentSrc || img.src, img.naturalWidth, img.naturalHeight]);
}"""

# The page's links as the browser resolved them, and the anchors it offers to links from elsewhere.
_LINKS_JS = """() => [Array.from(document.querySelectorAll("a[href]"), a => a.href),
  Array.from(document.querySelectorAll("[id]"), e => e.id).concat(
    Array.from(document.querySelectorAll("a[name]"), a => a.name))]"""


@dataclass(frozen=True)
class PageCheck:
    """What the browser saw on one page."""

    console_errors: list[str]  # console.error messages (Chromium's own "Failed to load resource" too) and uncaught errors
    failed_requests: list[str]  # "url (reason)" for each request that failed or got an HTTP status >= 400
    images: list[tuple[str, int, int]]  # (src cut to SRC_CHARS, natural width, natural height) per <img>
    links: list[str] = field(default_factory=list)  # every <a href> as the browser resolved it (absolute URL)
    ids: list[str] = field(default_factory=list)  # every element id and <a name>: the anchors a link may target

    def problems(self) -> list[str]:
        """Every error, failed request and image of size 0, one line each (empty for a clean page)."""
        broken = [f"image did not load or decode: {src}" for src, w, h in self.images if w == 0 or h == 0]
        return ([f"console: {e}" for e in self.console_errors]
                + [f"request failed: {r}" for r in self.failed_requests] + broken)


def find_chromium() -> str | None:
    """The Chromium executable: $SERVING_LAB_CHROMIUM if set, else the first of NAMES on PATH; None if none."""
    wanted = os.environ.get(ENV_VAR)
    if wanted:
        return shutil.which(wanted)
    return next((found for name in NAMES if (found := shutil.which(name))), None)


def require_browser() -> str:
    """The Chromium executable, or skip the calling test (with how to get one) where it or Playwright is missing."""
    executable = find_chromium()
    if executable is None:
        where = f"${ENV_VAR}={os.environ[ENV_VAR]!r} is not an executable" if os.environ.get(ENV_VAR) else (
            f"none of {', '.join(NAMES)} on PATH")
        pytest.skip(f"no headless Chromium ({where}): {INSTALL_HINT}")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("Playwright is not installed (it drives Chromium): pip install -e '.[test]'")
    return executable


def _short(url: str) -> str:
    """`url` cut to SRC_CHARS: a data: URI keeps its head (the media type), any other URL its tail (the file name)."""
    if len(url) <= SRC_CHARS:
        return url
    return url[: SRC_CHARS - 3] + "..." if url.startswith("data:") else "..." + url[3 - SRC_CHARS:]


def launch(pw, executable: str):
    """A headless Chromium started through Playwright `pw` (a `sync_playwright()`), retried once if its start
    times out."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(1, LAUNCH_TRIES + 1):
        try:
            return pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, timeout=LAUNCH_TIMEOUT_MS)
        except PlaywrightTimeout:
            if attempt == LAUNCH_TRIES:
                raise


def open_pages(paths: Iterable[Path], executable: str | None = None) -> dict[Path, PageCheck]:
    """Open each local HTML file in one headless Chromium (started once) and check it; keyed by the given path."""
    from playwright.sync_api import sync_playwright

    executable = executable or find_chromium()
    if executable is None:
        raise RuntimeError(f"no headless Chromium: {INSTALL_HINT}")
    paths = list(paths)
    for path in paths:
        if not Path(path).is_file():
            raise FileNotFoundError(path)
    checks: dict[Path, PageCheck] = {}
    with sync_playwright() as pw:
        browser = launch(pw, executable)
        try:
            # One tab visits every page (a new tab per page costs ~4x as much); the handlers write into the
            # lists of the page being visited.
            seen: dict[str, list[str]] = {"errors": [], "failed": []}
            page = browser.new_page()
            page.on("console", lambda msg: seen["errors"].append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc: seen["errors"].append(f"uncaught {exc.name}: {exc.message}"))
            page.on("requestfailed", lambda req: seen["failed"].append(f"{_short(req.url)} ({req.failure or 'failed'})"))
            page.on("response", lambda resp: seen["failed"].append(
                f"{_short(resp.url)} (HTTP {resp.status})") if resp.status >= 400 else None)
            for path in paths:
                seen = {"errors": [], "failed": []}
                errors, failed = seen["errors"], seen["failed"]
                page.goto(Path(path).resolve().as_uri(), wait_until="load", timeout=TIMEOUT_MS)
                images = [(_short(src), int(w), int(h)) for src, w, h in page.evaluate(_IMAGES_JS, TIMEOUT_MS)]
                links, ids = page.evaluate(_LINKS_JS)
                checks[path] = PageCheck(console_errors=errors, failed_requests=failed, images=images,
                                         links=links, ids=ids)
        finally:
            browser.close()
    return checks


def broken_links(checks: dict[Path, PageCheck], site: Path) -> list[str]:
    """Links between local pages that lead nowhere: "page -> link (why)" for a link into `site` whose file is
    missing or whose #anchor is not an id of the target page. Every target must be among the opened pages
    (open them all) so that its anchors are known; links outside `site` (the web, data:) are not followed."""
    from urllib.parse import unquote, urlsplit

    site = Path(site).resolve()
    anchors = {Path(p).resolve(): set(check.ids) for p, check in checks.items()}
    problems = []
    for page, check in checks.items():
        for link in check.links:
            parts = urlsplit(link)
            if parts.scheme != "file":
                continue
            target = Path(unquote(parts.path)).resolve()
            if not target.is_relative_to(site):
                problems.append(f"{page} -> {link} (outside the site)")
            elif target.is_dir() or not target.is_file():
                problems.append(f"{page} -> {link} (no such file)")
            elif parts.fragment and target.suffix == ".html":
                if target not in anchors:
                    problems.append(f"{page} -> {link} (target page not opened, anchors unknown)")
                elif not {parts.fragment, unquote(parts.fragment)} & anchors[target]:
                    problems.append(f"{page} -> {link} (no anchor #{parts.fragment})")
    return problems


def open_page(path: Path, executable: str | None = None) -> PageCheck:
    """Open one local HTML file in headless Chromium and report its errors, failed requests and image sizes."""
    return open_pages([path], executable)[path]


@contextmanager
def served(folder: Path) -> Iterator[str]:
    """`folder` served over HTTP on a free loopback port for the block's duration; yields the origin URL. Pages
    that start WebAssembly (the lessons' playgrounds) need this: a file:// page cannot fetch their files."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def offline(page, origin: str) -> list[str]:
    """Refuse every request of `page` that leaves `origin`; returns the (growing) list of refused URLs."""
    refused: list[str] = []

    def route(route) -> None:
        if route.request.url.startswith(origin + "/"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    page.route("**/*", route)
    return refused


def run_playground(page, url: str, guess: str = "1", timeout_ms: int = 180_000) -> dict[str, str]:
    """Open a lesson page's playground at `url`, enter a prediction, run it with the default knobs and wait for
    it to finish; returns the playground's data attributes (state, digest, answer, loadMs, runMs)."""
    page.goto(url, wait_until="load", timeout=TIMEOUT_MS)
    page.fill("section.playground .pg-guess", guess)
    page.click("section.playground .pg-run")
    page.wait_for_selector("section.playground[data-state=done], section.playground[data-state=failed]",
                           timeout=timeout_ms)
    return page.eval_on_selector("section.playground", "s => ({...s.dataset})")
