"""Time to first result in the lessons' playgrounds: the course site served on loopback, each lesson page opened
in a fresh headless Chromium context (an empty cache, as a first visit), a prediction typed, Run clicked.

    python benchmarks/playground_start.py [--rounds 3]

Reported per lesson (medians over rounds): the wall time from opening the page to the chart (goal: under 10 s),
Pyodide's start as the page measures it (the runtime, the standard library and the simulator's archive:
`loadMs`), the simulation in the browser (`runMs`), and the same simulation in this CPython, so their ratio is
WebAssembly's cost. Needs the test extra, Debian's Chromium and `npm ci --prefix lessons/tools/playground`.
Prints markdown for benchmarks/RESULTS.md ("The playground in the browser"). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "lessons" / "tools")]

import course_site  # noqa: E402
from browser import find_chromium, launch, offline, run_playground, served  # noqa: E402

from course.playground import PLAYGROUNDS, run  # noqa: E402


def cpython_seconds(lesson: str) -> float:
    started = time.perf_counter()
    run(lesson)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    chromium = find_chromium()
    if chromium is None:
        print("no headless Chromium: apt-get install chromium", file=sys.stderr)
        return 2
    rows: dict[str, dict[str, list[float]]] = {p.lesson: {"wall": [], "load": [], "run": [], "cpython": []}
                                               for p in PLAYGROUNDS}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "site"
        course_site.build(out, execute=False, progress=lambda _: None)
        with served(out) as origin, sync_playwright() as pw:
            browser = launch(pw, chromium)
            version = browser.version
            for _ in range(args.rounds):
                for playground in PLAYGROUNDS:
                    context = browser.new_context()
                    page = context.new_page()
                    refused = offline(page, origin)
                    started = time.perf_counter()
                    shown = run_playground(page, f"{origin}/lessons/{playground.lesson}.html")
                    wall = time.perf_counter() - started
                    context.close()
                    if shown["state"] != "done" or refused:
                        raise RuntimeError(f"{playground.lesson}: {shown}, refused {refused}")
                    row = rows[playground.lesson]
                    row["wall"].append(wall)
                    row["load"].append(int(shown["loadMs"]) / 1000)
                    row["run"].append(int(shown["runMs"]) / 1000)
                    row["cpython"].append(cpython_seconds(playground.lesson))
            browser.close()
    print(f"Machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}, "
          f"Chromium {version}; `python benchmarks/playground_start.py --rounds {args.rounds}`; medians of "
          f"{args.rounds} rounds, each page in a fresh browser context.\n")
    print("| lesson | page to chart (s) | Pyodide start (s) | simulation in the browser (s) | same in CPython (s) | browser / CPython |")
    print("| --- | --- | --- | --- | --- | --- |")
    for lesson, row in rows.items():
        m = {k: statistics.median(v) for k, v in row.items()}
        print(f"| {lesson} | {m['wall']:.1f} | {m['load']:.1f} | {m['run']:.2f} | {m['cpython']:.2f} | "
              f"{m['run'] / m['cpython']:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
