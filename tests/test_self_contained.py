"""The project documents itself: no file cites a document that is not in the repository.

The design, the course format and the machine's measured facts live in ARCHITECTURE.md, lessons/CONTRIBUTING.md
and benchmarks/RESULTS.md. This test scans every file git knows (tracked, or new and not ignored), skipping
binary files, for citations of notes kept outside the repository: the folder `OUTSIDE_FOLDER` matches and
the file names in `OUTSIDE_NAMES` (a name is fine when a file of that name is in the repository), and "the
curriculum" (the course is its lesson files). It also checks that the paths ARCHITECTURE.md names exist.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

OUTSIDE_FOLDER = re.compile(r"(?<![\w.-])(?:\.\./)*shared/")
# The notes kept outside the repository, each with the project's own document that carries what a reader
# needs of it: the one to cite instead. (The scan has to name what it looks for; this is the only place.)
OUTSIDE_NOTES = {
    "DESIGN.md": "ARCHITECTURE.md",
    "COURSE.md": "lessons/CONTRIBUTING.md",
    "CURRICULUM.md": "the lesson itself (lessons/README.md lists them)",
    "PERF-NOTES.md": "benchmarks/RESULTS.md",
}
OUTSIDE_NAMES = tuple(OUTSIDE_NOTES)
# The same documents by their bare names ("CURRICULUM row 4", "PERF-NOTES", "the curriculum's experiment").
OUTSIDE_BARE = re.compile(r"\b(?:CURRICULUM|PERF-NOTES)\b|(?i:\bthe curriculum\b|\bcurriculum's\b)")


def project_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no file list")
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return [name for name in listed if (ROOT / name).is_file()]


def text_of(name: str) -> str | None:
    data = (ROOT / name).read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def outside_citations(text: str, present: set[str]) -> list[tuple[int, str]]:
    """(line number, line) of every line that cites a document outside the repository."""
    missing = [name for name in OUTSIDE_NAMES if name not in present]
    names = re.compile(r"(?<![\w-])(?:" + "|".join(map(re.escape, missing)) + r")\b") if missing else None
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        if OUTSIDE_FOLDER.search(line) or OUTSIDE_BARE.search(line) or (names and names.search(line)):
            found.append((number, line.strip()))
    return found


def test_no_file_cites_a_document_outside_the_repository():
    files = project_files()
    present = {Path(name).name for name in files}
    problems = []
    for name in files:
        if name == THIS:
            continue
        text = text_of(name)
        if text is None:
            continue
        problems += [f"{name}:{number}: {line}" for number, line in outside_citations(text, present)]
    instead = "; ".join(f"{name}: {own}" for name, own in OUTSIDE_NOTES.items())
    assert not problems, (
        f"these lines cite documents that are not in the repository; cite the project's own instead ({instead}):\n"
        + "\n".join(problems))


@pytest.mark.parametrize(("line", "cited"), [
    *((f"The design is in {name} of the notes.", True) for name in OUTSIDE_NAMES),
    *((f"measured at ~27 GB/s (shared/{name})", True) for name in OUTSIDE_NAMES),
    *((f"see ../shared/{name}", True) for name in OUTSIDE_NAMES),
    *((f"see {own}", False) for own in OUTSIDE_NOTES.values()),
    ("the cost of one step (CURRICULUM row 0)", True),
    ("quoted from PERF-NOTES, 2026", True),
    ("the notebook runs the curriculum's experiment", True),
    ("(the curriculum's rule is at or below about 85%)", True),
    ("see ARCHITECTURE.md and lessons/CONTRIBUTING.md", False),
    ("requests that share a prefix; the shared core decides", False),
    ("shared_prefix_ttft(prefix_lens)", False),
    ("notebooks/shared_data.json", False),
    ("a curriculum of seven lessons", False),
])
def test_the_scan_finds_outside_citations(line, cited):
    assert bool(outside_citations(line, present=set())) is cited


def test_a_name_present_in_the_repository_is_fine():
    here, elsewhere = OUTSIDE_NAMES[:2]
    assert outside_citations(f"the rules of {here}", present={here}) == []
    assert outside_citations(f"see {elsewhere}", present={here}) != []


def test_paths_named_in_architecture_exist():
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    folders = ("ref_engine/", "core/", "sim/", "serving_lab/", "course/", "tests/", "lessons/", "benchmarks/")
    named = {span for span in re.findall(r"`([\w./*-]+)`", text) if "/" in span or span.endswith((".py", ".md", ".toml"))}
    missing = []
    for span in sorted(named):
        candidates = [span] + [folder + span for folder in folders]
        if "*" in span:
            found = any(any(ROOT.glob(candidate)) for candidate in candidates)
        else:
            found = any((ROOT / candidate).exists() for candidate in candidates)
        if not found:
            missing.append(span)
    assert not missing, f"ARCHITECTURE.md names paths that do not exist: {missing}"
