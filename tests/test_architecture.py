"""The layering rules of ARCHITECTURE.md, as import contracts (`[tool.importlinter]` in pyproject.toml), and
the layout ARCHITECTURE.md and the README describe, against the tree.

`lint-imports` (the import-linter package, in the `test` extra) reads the source statically, without importing
it, and checks four contracts: layers (the course above the product, the product above the engine and the
simulator, two independent siblings, both above the torch-free core they share); torch-free (the simulator and
the core never import torch); browser (the lessons' playgrounds, course/playground.py, with the simulator and
the core, import nothing the browser's Pyodide lacks: no torch, numpy, PyYAML, engine or product code);
acyclic (no import circles between the modules or subpackages of any package). Indirect imports count too. tests/core/test_no_torch.py checks the torch-free
rule once more at run time.

The contracts must also be able to fail: each one is run on a copy of the packages with one bad import added.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "ref_engine", "sim", "serving_lab", "course")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

def lint_imports(cwd: Path) -> str:
    """Run the venv's `lint-imports` in `cwd` (which holds pyproject.toml and the packages); its report."""
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} not found: install the test extra (pip install -e '.[test]')")
    env = {**os.environ, "COLUMNS": "200"}  # keep each contract's name and verdict on one line
    env.pop("PYTHONPATH", None)  # lint-imports puts cwd first on sys.path; nothing else may shadow it
    result = subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=120)
    assert "not configured correctly" not in result.stdout + result.stderr, result.stdout + result.stderr
    return result.stdout + result.stderr


def contracts() -> dict[str, str]:
    """{contract id: its name}, as pyproject.toml declares them."""
    from importlinter.api import read_configuration

    options = read_configuration(str(ROOT / "pyproject.toml"))["contracts_options"]
    return {contract["id"]: contract["name"] for contract in options}


def verdicts(report: str) -> dict[str, str]:
    """{contract id: "KEPT" | "BROKEN" | "missing"} from lint-imports' summary lines."""
    flat = " ".join(report.split())
    return {cid: ("BROKEN" if f"{name} BROKEN" in flat else "KEPT" if f"{name} KEPT" in flat else "missing")
            for cid, name in contracts().items()}


@pytest.fixture(scope="module")
def tree_report() -> str:
    return lint_imports(ROOT)


@pytest.mark.parametrize("contract_id", [
    "layers",
    "torch-free",
    "browser",
    "acyclic",
])
def test_contract_holds(tree_report: str, contract_id: str):
    assert verdicts(tree_report)[contract_id] == "KEPT", tree_report


def test_every_contract_is_tested():
    assert set(contracts()) == {"layers", "torch-free", "browser", "acyclic"}


@pytest.fixture(scope="module")
def project_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages and pyproject.toml, copied to a temporary folder."""
    folder = tmp_path_factory.mktemp("layers")
    shutil.copy(ROOT / "pyproject.toml", folder / "pyproject.toml")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, folder / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return folder


# (file that gains the import, the import, the contract that must break, what its report then names)
VIOLATIONS = [
    ("serving_lab/sweep.py", "import course.tuning_knobs", "layers", "serving_lab.sweep -> course.tuning_knobs"),
    ("serving_lab/cli.py", "import course.claims", "layers", "serving_lab.cli -> course.claims"),
    ("ref_engine/engine.py", "import sim.simulator", "layers", "ref_engine.engine -> sim.simulator"),
    ("core/config.py", "from serving_lab import calibrate", "layers", "core.config -> serving_lab.calibrate"),
    ("core/scheduler.py", "import ref_engine.engine", "layers", "core.scheduler -> ref_engine.engine"),
    ("core/block_pool.py", "import sim.simulator", "layers", "core.block_pool -> sim.simulator"),
    ("ref_engine/runner.py", "import course.demo", "layers", "ref_engine.runner -> course.demo"),
    ("sim/hardware.py", "from ref_engine import LLM", "layers", "sim.hardware -> ref_engine (l."),
    ("sim/cost_model.py", "from ref_engine.model.linear import TransposedLinear", "layers",
     "sim.cost_model -> ref_engine.model.linear"),
    ("sim/simulator.py", "import serving_lab.fidelity", "layers", "sim.simulator -> serving_lab.fidelity"),
    ("sim/executor.py", "import torch", "torch-free", "sim.executor -> torch"),
    ("core/request.py", "import torch.nn", "torch-free", "core.request -> torch"),
    ("course/playground.py", "from serving_lab.pairing import Sides", "browser",
     "course.playground -> serving_lab.pairing"),
    ("course/drawing.py", "import course.continuous_batching", "acyclic", "No cycles are allowed in course."),
    ("ref_engine/kv_transfer/config.py", "import ref_engine.kv_transfer.connector", "acyclic",
     "No cycles are allowed in ref_engine.kv_transfer."),
]


@pytest.mark.parametrize(("path", "statement", "contract_id", "evidence"), VIOLATIONS,
                         ids=[f"{contract}:{path}" for path, _, contract, _ in VIOLATIONS])
def test_a_bad_import_breaks_its_contract(project_copy: Path, path: str, statement: str, contract_id: str,
                                          evidence: str):
    target = project_copy / path
    original = target.read_text()
    target.write_text(original + f"\n{statement}  # added by tests/test_architecture.py\n")
    try:
        report = lint_imports(project_copy)
    finally:
        target.write_text(original)
    assert verdicts(report)[contract_id] == "BROKEN", f"`{statement}` in {path} broke no {contract_id!r}:\n{report}"
    assert evidence in report, f"the {contract_id!r} report does not name `{statement}`:\n{report}"


def test_the_copy_lints_as_the_tree(project_copy: Path, tree_report: str):
    """The copy itself lints as the tree does and names none of the bad imports, so each failure above comes
    from the one import added."""
    report = lint_imports(project_copy)
    assert verdicts(report) == verdicts(tree_report), report
    assert not [evidence for *_, evidence in VIOLATIONS if evidence in report], report


# ---- the layout the docs describe ----

def packages_in_tree() -> dict[str, set[str]]:
    """{top-level package: its subpackages' paths relative to it}, from the folders with an __init__.py."""
    found = {}
    for init in sorted(ROOT.glob("*/__init__.py")):
        package = init.parent
        found[package.name] = {p.parent.relative_to(package).as_posix() for p in package.rglob("*/__init__.py")
                               if "__pycache__" not in p.parts}
    return found


def architecture_sections() -> dict[str, list[str]]:
    """ARCHITECTURE.md's "Packages": {"pkg/" or "pkg/sub/" heading a table: the names in its first column}."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    packages = text.split("\n## Packages\n", 1)[1].split("\n## ", 1)[0]
    sections: dict[str, list[str]] = {}
    current = None
    for line in packages.splitlines():
        if m := re.match(r"`([\w/]+/)`: ", line):
            current = sections.setdefault(m.group(1), [])
        elif current is not None and line.startswith("| `"):
            current += re.findall(r"`([^`]+)`", line.split(" | ")[0])
    return sections


def test_architecture_describes_every_package_and_only_those():
    tree = packages_in_tree()
    sections = architecture_sections()
    top_level = {name.split("/")[0] for name in sections}
    assert top_level == set(tree), f"ARCHITECTURE.md's packages {sorted(top_level)} != the tree's {sorted(tree)}"
    problems = []
    for heading, names in sections.items():
        folder = ROOT / heading
        problems += [f"{heading}{name} does not exist" for name in names
                     if not any(folder.glob(name.rstrip("/")))]
    for package, subpackages in tree.items():
        named = [heading.removeprefix(f"{package}/") + name for heading, names in sections.items()
                 if heading.startswith(f"{package}/") for name in ["", *names]]
        problems += [f"{package}/{sub}/ is in no table" for sub in sorted(subpackages)
                     if not any(n.startswith(f"{sub}/") for n in named)]
    assert not problems, "ARCHITECTURE.md's Packages section and the tree disagree:\n" + "\n".join(problems)


def test_readme_layout_names_every_top_level_folder_and_only_those():
    try:
        tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: which folders belong to the tree is unknown")
    folders = {path.split("/")[0] for path in tracked.splitlines() if "/" in path and not path.startswith(".")}
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    named = {name for line in table.splitlines() if line.startswith("| `")
             for name in re.findall(r"`([^`]+)`", line.split(" | ")[0])}
    missing = sorted(name for name in named if not (ROOT / name).exists())
    assert not missing, f"README.md's layout names paths that do not exist: {missing}"
    named_folders = {name.split("/")[0] for name in named if "/" in name}
    assert named_folders == folders, f"README.md's layout names {sorted(named_folders)}, the tree has {sorted(folders)}"
