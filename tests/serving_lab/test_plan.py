"""`serving-lab plan`: the fewest replicas that meet the SLOs, the runners-up, and clear refusals.

Simulated on a datasheet profile, so every number is deterministic: the plan's fleet meets the SLO, the fleet
one replica smaller does not, and the same command gives the same table.
"""

from __future__ import annotations

import pytest

from serving_lab import cli
from serving_lab.manifest import EXAMPLE_MANIFEST
from serving_lab.plan import PlanTarget

BASE = ["plan", "--config", str(EXAMPLE_MANIFEST), "--model", "llama-3.1-8b", "--hardware", "h100-sxm",
        "--max-model-len", "4096", "--workload", "synthetic:200:512:64:120", "--usd-per-gpu-hour", "3"]


def run(capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    cli.main([*BASE, *extra])
    return capsys.readouterr().out


def test_the_plan_is_the_fewest_replicas_that_meet_the_slo(capsys):
    out = run(capsys, "--slo-ttft-ms", "200", "--slo-tpot-ms", "40", "--tensor-parallel-sizes", "1,2")
    lines = out.splitlines()
    assert lines[0].startswith("plan: ")
    rows = [line.split() for line in lines[3:]]
    best, smaller = rows[0], rows[-1]
    assert best[4] == "True" and smaller[4] == "False"  # meets_slo
    assert (best[0], best[1], smaller[1]) == ("1", "2", "1")  # one replica fewer, same degree
    assert rows[1][:2] == ["2", "2"]  # the runner-up: tensor parallel 2
    assert out == run(capsys, "--slo-ttft-ms", "200", "--slo-tpot-ms", "40", "--tensor-parallel-sizes", "1,2")


def test_an_unreachable_slo_says_no_plan(capsys):
    out = run(capsys, "--slo-ttft-ms", "1", "--slo-tpot-ms", "0.01", "--max-replicas", "2")
    assert out.startswith("no plan: no fleet of up to 2 replicas on H100-SXM keeps 90% of requests")


def test_bad_plan_arguments_are_named(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*BASE, "--slo-ttft-ms", "200", "--slo-tpot-ms", "40", "--tensor-parallel-sizes", "one"])
    assert exit_info.value.code == 2
    assert "--tensor-parallel-sizes 'one': give integers" in capsys.readouterr().err
    with pytest.raises(ValueError, match="attainment must be in"):
        PlanTarget(300, 40, 3, attainment=1.5)
    with pytest.raises(ValueError, match="price per GPU-hour"):
        PlanTarget(300, 40, 0)
