"""`serving-lab demo LESSON` (course/): every lesson's demo runs in its fast sizes on a tiny random
model, prints the measured and simulated numbers side by side with the error, and its beats, and writes its
plot. The simulator prices this machine with the `local-cpu` profile, so no calibration runs; nothing asserts a
time."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from course import DEMOS
from serving_lab import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model):
    # SmolLM2's vocabulary size: the serve demo sends token ids up to 40000, as lesson 6's traces do
    return make_tiny_hf_model("llama", name="demos", vocab_size=49152, max_position_embeddings=2048)


def table_column(out: str, name: str) -> list[str]:
    """The cells of column `name` of the first side-by-side table in `out` (cells are right-aligned under
    their header, two spaces apart)."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if "simulated_err_pct" in line.split())
    header = lines[at]
    end = re.search(rf"(?<!\S){name}(?!\S)", header).end()
    start = header.rfind("  ", 0, end - len(name)) + 2 if "  " in header[:end - len(name)] else 0
    rows = []
    for line in lines[at + 2:]:
        if not line.strip():
            break
        rows.append(line[start:end].strip())
    return rows


# the beats a demo must print besides its table (INSTRUCTOR.md): the occupancy of both schedulers, the other
# tenant's cold prompt, and two SLOs that pick two configurations
BEATS = {
    "batching": [r"occupancy at cap 12, 3 slots: static batching ran \d+ steps with \d+% of its slot-steps idle, "
                 r"continuous \d+ steps with \d+% idle"],
    "prefix": [r"side channel: .* A: TTFT \d+ ms measured, 64 tokens hit, B: TTFT \d+ ms measured, 0 tokens hit, "
               r"A, salted: TTFT \d+ ms measured, 0 tokens hit"],
    "tuning": [r"first_token \(TTFT 150 ms, TPOT 20 ms\): max_num_seqs=128 max_num_batched_tokens=1024",
               r"smooth \(TTFT 500 ms, TPOT 8.5 ms\): max_num_seqs=128 max_num_batched_tokens=256"],
}


@pytest.mark.parametrize("name", list(DEMOS))
def test_demo_prints_both_sides_and_writes_its_plot(name, tiny, tmp_path, capsys):
    cli.main(["demo", name, "--fast", "--model", str(tiny), "--hardware", "local-cpu", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    measured = [float(cell) for cell in table_column(out, "measured")]
    simulated = [float(cell) for cell in table_column(out, "simulated")]
    errors = table_column(out, "simulated_err_pct")
    assert measured and len(measured) == len(simulated) == len(errors)
    assert all(math.isfinite(x) and x >= 0 for x in measured + simulated)
    assert all(re.fullmatch(r"[+-]\d+\.\d%", e) for e in errors), errors
    assert "GPU what-if, Llama-3.1-8B on H100-SXM (simulated):" in out
    for beat in BEATS.get(name, []):
        assert re.search(beat, out), beat
    plot = tmp_path / f"{name}.png"
    assert f"plot: {plot}" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_list_names_each_demo_with_its_lesson(capsys):
    cli.main(["demo", "--list"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [[d.name, d.lesson] for d in DEMOS.values()]
    for demo in DEMOS.values():  # each names a lesson section that exists
        path, anchor = demo.lesson.split("#")
        assert f'<a id="{anchor}"></a>' in (ROOT / path).read_text()


def test_a_bad_name_lists_the_choices(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["demo", "batchin"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'batchin'" in err and all(name in err for name in DEMOS)


def test_the_overview_takes_no_lesson_flags(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["demo", "--fast"])
    assert exit_.value.code == 2
    assert "--fast and --hardware go with a lesson's demo" in capsys.readouterr().err
