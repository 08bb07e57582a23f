"""The README's two commands are the project's promise; CI must run exactly the second one."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_ci_runs_the_readme_test_command():
    setup_and_demo, setup_and_test = readme_commands()[:2]
    assert "serving-lab demo" in setup_and_demo
    assert setup_and_test in (ROOT / ".ci" / "run").read_text()
    assert "notebooks" in setup_and_test and "--nbval-lax" in setup_and_test
