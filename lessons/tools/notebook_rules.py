#!/usr/bin/env python3
"""The rules every notebook in notebooks/ follows (lessons/CONTRIBUTING.md, "A notebook"), as checks on the JSON.

    python lessons/tools/notebook_rules.py            # check notebooks/*.ipynb, exit 1 on a problem
    pytest tests/course/test_notebook_rules.py        # the same, one test per rule

A notebook runs anywhere, and is committed with the outputs of one fast-mode run (for readers on GitHub):
- its stored outputs belong to its code: the digest of its code cells that `notebook_outputs.py` recorded
  when it stored them still matches (CI runs it again under nbval, without comparing outputs);
- kernel `python3`;
- the first cell is Markdown and links its lesson (`../lessons/<same stem>.md`);
- the first code cell is tagged `parameters` and is the only cell that reads the environment
  (`os.environ`, `getenv`): it reads SERVING_LAB_MODE and picks sizes from a presets table, a dict with
  "fast" and "full" keys;
- no `!pip` / `%pip` installs, no network (no http:// or https:// in code cells; links belong in
  Markdown), no absolute paths, no `.cuda(` (the engine picks the device), no `%timeit` (timings come
  from the engine's own metrics, and the notebook must stay deterministic).

Each `rule_*` takes the parsed notebook (a dict, as `json.load` or `nbformat.read` gives it) and its path,
and returns a list of problems. Standard library only.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ENV_RE = re.compile(r"\bos\.environ\b|\bgetenv\s*\(|\benviron\s*\[|\benviron\.get\s*\(")
ABSOLUTE_RE = re.compile(r"^(?:/[A-Za-z0-9_.~-]|~/|[A-Za-z]:[\\/])")
# What no code cell may hold, and why.
FORBIDDEN = (
    (re.compile(r"^\s*[!%]\s*pip\b|\bpip\s+install\b", re.MULTILINE),
     "installs packages (the README's setup installs everything)"),
    (re.compile(r"https?://"), "a URL in a code cell (no network; put links in Markdown cells)"),
    (re.compile(r"\.cuda\("), "`.cuda(` (the engine picks the device; pass device=... if you must)"),
    (re.compile(r"%%?timeit\b|\bimport\s+timeit\b|\btimeit\."), "timeit (time steps through the engine's metrics instead)"),
)


def source(cell: dict) -> str:
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else text


def code_cells(nb: dict) -> list[tuple[int, dict]]:
    """(1-based cell number, cell) of every code cell."""
    return [(i, c) for i, c in enumerate(nb.get("cells", []), start=1) if c.get("cell_type") == "code"]


def python_only(code: str) -> str:
    """The cell without IPython magics and shell lines, so `ast` can read the rest."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in code.split("\n"))


def string_constants(code: str) -> list[str] | None:
    """Every string literal of a code cell (None if the cell does not parse as Python)."""
    try:
        tree = ast.parse(python_only(code))
    except SyntaxError:
        return None
    # in an f-string only the leading text can start a path: f"{n}/s" is not an absolute path
    inner = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values[1:]}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in inner]


# ---- the rules ----------------------------------------------------------------------------------------

REGENERATE = "python lessons/tools/notebook_outputs.py"
METADATA_KEY = "serving_lab"  # the notebook metadata notebook_outputs.py writes: {"code_digest": ...}


def code_digest(cells: list[dict]) -> str:
    """SHA-256 of the code cells' sources, in order: what stored outputs were computed from."""
    digest = hashlib.sha256()
    for cell in cells:
        if cell.get("cell_type") == "code":
            digest.update(source(cell).encode("utf-8") + b"\0")
    return digest.hexdigest()


def stale_reason(nb: dict) -> str | None:
    """Why `nb`'s stored outputs do not belong to its code (None when they do)."""
    stored = nb.get("metadata", {}).get(METADATA_KEY, {}).get("code_digest")
    if stored is None:
        return f"no stored run (run `{REGENERATE}`)"
    if stored != code_digest(nb.get("cells", [])):
        return f"its code changed since its outputs were stored (run `{REGENERATE} <stem>`)"
    return None


def rule_outputs_current(nb: dict, path: Path) -> list[str]:
    reason = stale_reason(nb)
    return [f"{path.name}: stale outputs: {reason}"] if reason else []


def rule_kernel(nb: dict, path: Path) -> list[str]:
    name = nb.get("metadata", {}).get("kernelspec", {}).get("name")
    return [] if name == "python3" else [f"{path.name}: kernel is {name!r}, must be 'python3'"]


def rule_first_cell_links_lesson(nb: dict, path: Path) -> list[str]:
    cells = nb.get("cells", [])
    if not cells or cells[0].get("cell_type") != "markdown":
        return [f"{path.name}: the first cell must be Markdown (title, lesson link, what you will see, runtime)"]
    if f"../lessons/{path.stem}.md" not in source(cells[0]):
        return [f"{path.name}: the first cell must link its lesson ../lessons/{path.stem}.md"]
    return []


def rule_parameters_cell(nb: dict, path: Path) -> list[str]:
    if not code_cells(nb):
        return [f"{path.name}: no code cell, so no `parameters` cell"]
    i, cell = code_cells(nb)[0]
    problems = []
    if "parameters" not in cell.get("metadata", {}).get("tags", []):
        problems.append(f"{path.name} cell {i}: the first code cell must be tagged `parameters`")
    code = source(cell)
    if "SERVING_LAB_MODE" not in code or not ENV_RE.search(code):
        problems.append(f"{path.name} cell {i}: the parameters cell must read SERVING_LAB_MODE from the environment")
    try:
        tree = ast.parse(python_only(code))
    except SyntaxError:
        return problems + [f"{path.name} cell {i}: the parameters cell is not plain Python"]
    has_presets = any(
        isinstance(node, ast.Dict)
        and {"fast", "full"} <= {k.value for k in node.keys if isinstance(k, ast.Constant)}
        for node in ast.walk(tree))
    if not has_presets:
        problems.append(f'{path.name} cell {i}: no presets table (a dict with "fast" and "full" keys)')
    return problems


def rule_environment_only_in_parameters(nb: dict, path: Path) -> list[str]:
    return [f"{path.name} cell {i}: reads the environment; only the `parameters` cell may"
            for i, cell in code_cells(nb)[1:] if ENV_RE.search(source(cell))]


def rule_forbidden_code(nb: dict, path: Path) -> list[str]:
    return [f"{path.name} cell {i}: {why}"
            for i, cell in code_cells(nb) for pattern, why in FORBIDDEN if pattern.search(source(cell))]


def rule_no_absolute_paths(nb: dict, path: Path) -> list[str]:
    problems = []
    for i, cell in code_cells(nb):
        strings = string_constants(source(cell))
        if strings is None:  # not plain Python: fall back to quoted strings
            strings = re.findall(r"""["']([^"'\n]*)["']""", source(cell))
        for s in strings:
            if ABSOLUTE_RE.match(s):
                problems.append(f"{path.name} cell {i}: absolute path {s!r} (use paths relative to the notebook)")
    return problems


RULES = (rule_outputs_current, rule_kernel, rule_first_cell_links_lesson, rule_parameters_cell,
         rule_environment_only_in_parameters, rule_forbidden_code, rule_no_absolute_paths)


def check_notebook(path: Path) -> list[str]:
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    return [problem for rule in RULES for problem in rule(nb, Path(path))]


def main() -> int:
    problems = [p for nb in sorted((ROOT / "notebooks").glob("*.ipynb")) for p in check_notebook(nb)]
    for problem in problems:
        print(problem)
    print(f"{len(problems)} problem(s)" if problems else "the notebooks follow the rules")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
