"""benchmarks/gpu_check.py without a GPU: it says so and exits 0; its report (JSON keys, the Markdown table) from
made-up results; and a check that raises or overruns its budget is a failed row while the others still run.
No model runs here: the checks themselves need a GPU (issue #29)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.gpu_check import CHECKS, Check, CheckResult, main, report_markdown, run_checks, write_report

ROOT = Path(__file__).resolve().parents[1]
MACHINE = {"device": "NVIDIA H200", "torch": "2.13.0+cu128", "date": "2026-12-04T06:00+00:00"}


def test_without_a_gpu_it_says_so_exits_0_and_writes_nothing(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={"CUDA_VISIBLE_DEVICES": "",
                                                                            "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert "gpu_check: no CUDA device here" in done.stdout and "nothing to check" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_the_report_is_a_json_of_every_row_and_a_markdown_table(tmp_path):
    results = [CheckResult("parity", "passed", {"float32 = transformers": "5/5"}, "every comparison token for token",
                           12.5),
               CheckResult("calibration", "failed", {"copy GB/s": 4123.456}, "fit 40% | off", 30.0),
               CheckResult("disaggregated_pair", "skipped", detail="needs per-role knobs")]
    json_path, md_path = write_report(results, MACHINE, tmp_path / "out")
    report = json.loads(json_path.read_text())
    assert set(report) == {"machine", "results", "summary"} and report["machine"] == MACHINE
    assert report["summary"] == {"passed": 1, "failed": 1, "skipped": 1}
    assert [set(row) for row in report["results"]] == [{"name", "status", "numbers", "detail", "seconds"}] * 3
    assert report["results"][1] == {"name": "calibration", "status": "failed", "numbers": {"copy GB/s": 4123.456},
                                    "detail": "fit 40% | off", "seconds": 30.0}
    lines = md_path.read_text().splitlines()
    assert lines[0].startswith("## ") and "NVIDIA H200" in lines[2] and "1 passed, 1 failed, 1 skipped" in lines[2]
    table = lines[lines.index("| check | status | seconds | numbers | detail |"):]
    assert table[1] == "| --- | --- | --- | --- | --- |"
    assert table[2] == "| parity | passed | 12.5 | float32 = transformers 5/5 | every comparison token for token |"
    assert table[3] == r"| calibration | failed | 30 | copy GB/s 4123 | fit 40% \| off |"  # a bare | splits a row
    assert len(table) == 2 + len(results) and md_path.read_text() == report_markdown(results, MACHINE)


def test_a_check_that_raises_or_overruns_fails_alone_and_the_others_run():
    ran = []

    def passes(ctx):
        ran.append("passes")
        return CheckResult("passes", "passed")

    def raises(ctx):
        ran.append("raises")
        raise RuntimeError("CUDA error: an illegal memory access")

    def overruns(ctx):
        ran.append("overruns")
        while True:
            time.sleep(0.01)

    results = run_checks([Check("raises", raises, 5), Check("overruns", overruns, 0.3), Check("passes", passes, 5)],
                         context=None)
    assert ran == ["raises", "overruns", "passes"]
    assert [(r.name, r.status) for r in results] == [("raises", "failed"), ("overruns", "failed"), ("passes", "passed")]
    assert results[0].detail == "RuntimeError: CUDA error: an illegal memory access"
    assert results[1].detail == "CheckTimeout: ran past its budget of 0.3 s" and 0.3 <= results[1].seconds < 2


def test_a_row_with_another_status_is_refused_by_name():
    with pytest.raises(ValueError, match="check 'x': status must be one of .* got 'ok'"):
        CheckResult("x", "ok")


def test_the_checks_fit_the_issues_eight_minutes():
    assert sum(c.budget_s for c in CHECKS) < 8 * 60
    assert len({c.name for c in CHECKS}) == len(CHECKS)


@pytest.mark.parametrize("budget, message", [("notebooks=abc", "SECONDS must be a number"),
                                             ("notebook=60", "NAME must be one of"), ("parity=0", "above 0")])
def test_a_bad_budget_is_refused_naming_it(budget, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--budget", budget, "--list"])
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_list_names_each_check_with_its_budget(capsys):
    assert main(["--list", "--budget", "notebooks=590"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{c.name} ({590 if c.name == 'notebooks' else c.budget_s:g} s)"
                                                    for c in CHECKS]
