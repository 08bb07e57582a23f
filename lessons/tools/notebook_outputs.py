#!/usr/bin/env python3
"""Store one fast-mode run's outputs in the notebooks, so a reader on GitHub sees what a run prints and draws.

    python lessons/tools/notebook_outputs.py                           # every notebook (~10 min on 2 cores)
    python lessons/tools/notebook_outputs.py 04-prefix-caching         # only these
    python lessons/tools/notebook_outputs.py --check                   # which stored outputs are stale

Most readers open a course notebook on GitHub, which shows the outputs stored in the file and never runs it.
So each notebook is committed with the outputs of one fast-mode run on a quiet machine, made by this command:
it executes the notebook in its folder with a fresh kernel (as the site builder does), prepends to the first
code cell's outputs one line saying on which machine and when the run was made, and records a digest of the
code cells in the notebook's metadata (`serving_lab.code_digest`). A notebook whose code has changed since then
has stale outputs: the notebook rules (notebook_rules.py, `rule_outputs_current`) fail on it until this command
is run again. (The figures the lessons embed are refreshed separately, by `course_site.py --update-figures`.) Markdown edits do not make outputs stale. CI still executes every notebook under nbval; with
`--nbval-lax` the stored outputs are shown, not compared, so a slower or busier machine never fails on them.

A notebook is written only once its run has finished (to a temporary file, then renamed over the old one): a
run that fails leaves the committed notebook as it was.

Lesson: lessons/CONTRIBUTING.md (a notebook).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from course_site import ROOT, SiteError, read_notebook  # noqa: E402
from notebook_rules import METADATA_KEY, REGENERATE, code_digest, stale_reason  # noqa: E402


def run_banner() -> str:
    """The line a stored run starts with: the machine and the time, so a reader can weigh the numbers."""
    import torch

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = platform.processor() or platform.machine()
    return (f"[stored run: fast mode, {when}, {cpu}, {os.cpu_count()} cores, torch {torch.__version__} "
            f"with {torch.get_num_threads()} threads; your numbers will differ; `{REGENERATE}` remakes them]\n")


def store_outputs(path: Path) -> float:
    """Execute `path` in fast mode and store its outputs; returns the seconds it took."""
    import nbformat

    started = time.perf_counter()
    os.environ["SERVING_LAB_MODE"] = "fast"
    notebook = read_notebook(path, execute=True)
    first_code = next(cell for cell in notebook.cells if cell.cell_type == "code")
    first_code.outputs.insert(0, nbformat.v4.new_output("stream", name="stdout", text=run_banner()))
    notebook.metadata[METADATA_KEY] = {"code_digest": code_digest(notebook.cells)}
    partial = path.with_suffix(".ipynb.partial")
    nbformat.write(notebook, partial)
    partial.replace(path)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stems", nargs="*", metavar="STEM", help="notebooks to run (default: all)")
    parser.add_argument("--check", action="store_true", help="list the notebooks whose stored outputs are stale")
    args = parser.parse_args(argv)
    paths = ([ROOT / "notebooks" / f"{stem}.ipynb" for stem in args.stems] if args.stems
             else sorted((ROOT / "notebooks").glob("*.ipynb")))
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        print(f"error: no notebook {', '.join(missing)} in notebooks/", file=sys.stderr)
        return 2
    if args.check:
        stale = [(p.name, stale_reason(json.loads(p.read_text(encoding="utf-8")))) for p in paths]
        for name, reason in stale:
            if reason:
                print(f"{name}: {reason}")
        return 1 if any(reason for _, reason in stale) else 0
    for path in paths:
        try:
            seconds = store_outputs(path)
        except SiteError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"{path.name}: outputs stored in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
