"""The layering rules of ARCHITECTURE.md, as import contracts (`[tool.importlinter]` in pyproject.toml).

`lint-imports` (the import-linter package, in the `test` extra) reads the source statically, without importing
it, and checks four contracts: ref_engine imports neither sim nor serving_lab; sim imports only ref_engine.core
and ref_engine.model.arch_config, and never torch; those torch-free parts never import torch; serving_lab sits
above sim, sim above ref_engine. Indirect imports count too. tests/core/test_no_torch.py checks the torch-free
rule once more at run time.

The contracts must also be able to fail: each one is run on a copy of the packages with one bad import added.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ref_engine", "sim", "serving_lab")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

# The ref_engine modules sim may import (as module names, before the forbidden list is checked against them).
SIM_MAY_IMPORT = ("ref_engine.core", "ref_engine.model.arch_config")


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the venv's `lint-imports` in `cwd` (which holds pyproject.toml and the three packages)."""
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} not found: install the test extra (pip install -e '.[test]')")
    env = {**os.environ, "COLUMNS": "200"}  # keep each contract's name and verdict on one line
    env.pop("PYTHONPATH", None)  # lint-imports puts cwd first on sys.path; nothing else may shadow it
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def contracts() -> dict[str, dict]:
    from importlinter.api import read_configuration

    options = read_configuration(str(ROOT / "pyproject.toml"))["contracts_options"]
    return {contract["id"]: contract for contract in options}


def verdicts(output: str) -> dict[str, str]:
    """{contract name: "KEPT" | "BROKEN"} from lint-imports' summary lines."""
    flat = " ".join(output.split())
    return {contract["name"]: ("BROKEN" if f"{contract['name']} BROKEN" in flat else
                               "KEPT" if f"{contract['name']} KEPT" in flat else "missing")
            for contract in contracts().values()}


def test_import_contracts_hold():
    result = lint_imports(ROOT)
    assert result.returncode == 0, f"an import contract is broken:\n{result.stdout}\n{result.stderr}"
    assert set(verdicts(result.stdout).values()) == {"KEPT"}, result.stdout


def module_names(package: str) -> set[str]:
    names = set()
    for path in (ROOT / package).rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_sim_contract_lists_every_engine_module():
    """The sim contract names the forbidden ref_engine modules one by one; a new engine module must join it."""
    forbidden = set(contracts()["sim-torch-free"]["forbidden_modules"])
    allowed = {name for name in module_names("ref_engine")
               if any(name == ok or name.startswith(ok + ".") for ok in SIM_MAY_IMPORT)}
    engine_forbidden = {name for name in forbidden if name.split(".")[0] == "ref_engine"}
    assert module_names("ref_engine") - allowed == engine_forbidden, (
        "pyproject.toml, contract sim-torch-free: forbidden_modules must list every ref_engine module "
        f"except {', '.join(SIM_MAY_IMPORT)}")


@pytest.fixture(scope="module")
def project_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The three packages' .py files and pyproject.toml, copied to a temporary folder."""
    folder = tmp_path_factory.mktemp("layers")
    shutil.copy(ROOT / "pyproject.toml", folder / "pyproject.toml")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, folder / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return folder


# (file that gains the import, the import, the contract that must break)
VIOLATIONS = [
    ("ref_engine/engine.py", "import sim.simulator", "engine-below"),
    ("ref_engine/core/config.py", "from serving_lab import calibrate", "engine-below"),
    ("sim/hardware.py", "from ref_engine import LLM", "sim-torch-free"),
    ("sim/cost_model.py", "from ref_engine.model.llama import TransposedLinear", "sim-torch-free"),
    ("sim/executor.py", "import torch", "sim-torch-free"),
    ("ref_engine/core/request.py", "import torch.nn", "core-torch-free"),
    ("sim/simulator.py", "import serving_lab.fidelity", "layers"),
]


@pytest.mark.parametrize(("path", "statement", "contract_id"), VIOLATIONS,
                         ids=[f"{contract}:{path}" for path, _, contract in VIOLATIONS])
def test_a_bad_import_breaks_its_contract(project_copy: Path, path: str, statement: str, contract_id: str):
    target = project_copy / path
    original = target.read_text()
    target.write_text(original + f"\n{statement}  # added by tests/test_architecture.py\n")
    try:
        result = lint_imports(project_copy)
    finally:
        target.write_text(original)
    name = contracts()[contract_id]["name"]
    assert result.returncode != 0, f"`{statement}` in {path} broke no contract:\n{result.stdout}"
    assert verdicts(result.stdout)[name] == "BROKEN", f"expected {contract_id!r} to break:\n{result.stdout}"


def test_the_copy_is_clean(project_copy: Path):
    """The copy itself passes, so each failure above comes from the one import added."""
    result = lint_imports(project_copy)
    assert result.returncode == 0, result.stdout + result.stderr
