"""`serving-lab report`: the worked example's pinned simulated numbers, every file written and valid, a
self-contained HTML page that a real browser renders, and clear errors with nothing half-written."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import pytest
from browser import open_page, require_browser

from serving_lab import cli, report
from serving_lab.manifest import EXAMPLE_MANIFEST, ManifestError

MANIFESTS = EXAMPLE_MANIFEST.parent
BEFORE, AFTER = MANIFESTS / "capstone-before.yaml", MANIFESTS / "capstone-after.yaml"
WORKLOAD = "synthetic:16:64:16"  # the worked example of lessons/capstone.md

# The worked example in the simulator on the built-in CPU profile: deterministic, so pinned. A change here
# means the simulator or the shared core changed its decisions or prices; say why in the commit.
GOLDEN = {
    "before": {"output_throughput": 277.6256, "mean_ttft_ms": 373.4997, "mean_itl_ms": 13.52108, "num_steps": 64},
    "after": {"output_throughput": 753.6676, "mean_ttft_ms": 71.00986, "mean_itl_ms": 16.51789, "num_steps": 19},
}
GOLDEN_SPEEDUP = 2.714691


@pytest.fixture(scope="module")
def simulated() -> report.Report:
    return report.run_report(BEFORE, AFTER, WORKLOAD, hardware="local-cpu", measure=False)


def test_worked_example_simulated_numbers_are_pinned(simulated):
    for side, numbers in GOLDEN.items():
        run = simulated.results["runs"][side]["simulated"]
        for key, value in numbers.items():
            assert run[key] == pytest.approx(value, rel=1e-6), (side, key)
    assert simulated.results["speedup"]["simulated"] == pytest.approx(GOLDEN_SPEEDUP, rel=1e-6)
    assert simulated.results["speedup"]["measured"] is None


@pytest.fixture(scope="module")
def written(simulated, tmp_path_factory) -> Path:
    return report.write_report(simulated, tmp_path_factory.mktemp("reports") / "example")


def test_every_file_is_written_and_results_validate(written):
    assert sorted(p.name for p in written.iterdir()) == sorted(
        ["results.json", "report.md", "report.html", *report.PLOTS])
    results = json.loads((written / "results.json").read_text())
    report.validate(results)
    assert results["schema"] == report.SCHEMA_ID and results["hardware_profile"]["name"] == "local-cpu"
    markdown = (written / "report.md").read_text()
    assert "2.71x simulated" in markdown and "--simulate-only --hardware local-cpu" in markdown


def test_the_schema_catches_a_broken_document(simulated):
    broken = json.loads(json.dumps(simulated.results))
    del broken["runs"]["after"]["simulated"]["output_throughput"]
    with pytest.raises(ValueError, match="results.json: runs/after/simulated: 'output_throughput' is a required"):
        report.validate(broken)


def test_html_is_self_contained_and_its_images_decode(written):
    from PIL import Image

    html = (written / "report.html").read_text()
    sources = re.findall(r'<img [^>]*src="([^"]+)"', html)
    assert len(sources) == len(report.PLOTS)
    assert not re.search(r'(src|href)="(?!data:)', html)  # no file, no URL: nothing the page needs beside it
    assert "<script" not in html and "url(" not in html
    for source in sources:
        assert source.startswith("data:image/png;base64,")
        image = Image.open(io.BytesIO(base64.b64decode(source.split(",", 1)[1])))
        image.verify()
        assert image.size[0] > 100 and image.size[1] > 100


def test_html_renders_in_a_headless_browser(written):
    executable = require_browser()
    check = open_page(written / "report.html", executable)
    assert check.problems() == []
    assert len(check.images) == len(report.PLOTS) and all(w > 0 and h > 0 for _, w, h in check.images)


def test_existing_folder_needs_force_and_a_failed_write_leaves_nothing(simulated, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="exists; choose another --out or give --force"):
        report.write_report(simulated, out)
    assert [p.name for p in out.iterdir()] == ["mine.txt"]

    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(report, "render_html", fail)
    with pytest.raises(RuntimeError):
        report.write_report(simulated, out, force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and [p.name for p in out.iterdir()] == ["mine.txt"]
    monkeypatch.undo()
    report.write_report(simulated, out, force=True)
    assert not (out / "mine.txt").exists() and (out / "report.html").exists()


def test_before_and_after_must_share_the_numerics(tmp_path):
    (tmp_path / "bf16.yaml").write_text(AFTER.read_text().replace("  served_model_name: smollm2",
                                                                  "  served_model_name: smollm2\n  dtype: bfloat16"))
    with pytest.raises(ValueError, match="before and after serve different models or numerics"):
        report.run_report(BEFORE, tmp_path / "bf16.yaml", WORKLOAD, hardware="local-cpu")


def test_a_manifest_the_engine_cannot_run_is_named(tmp_path):
    text = AFTER.read_text().replace("tensor_parallel_size: 1", "tensor_parallel_size: 3")
    (tmp_path / "tp3.yaml").write_text(text)
    with pytest.raises(ManifestError, match="engine.tensor_parallel_size: measured runs run the engine in one process"):
        report.run_report(BEFORE, tmp_path / "tp3.yaml", WORKLOAD, hardware="local-cpu")
    assert report.run_report(BEFORE, tmp_path / "tp3.yaml", WORKLOAD, hardware="local-cpu", measure=False)


@pytest.mark.slow
def test_measured_on_a_tiny_model(make_tiny_hf_model, tmp_path):
    """Both sides on the engine (a tiny random model, so quick), with the speed-up's spread over repeats."""
    folder = make_tiny_hf_model("llama", name="report-tiny")
    manifests = []
    for path in (BEFORE, AFTER):
        manifests.append(tmp_path / path.name)
        manifests[-1].write_text(path.read_text().replace("HuggingFaceTB/SmolLM2-135M-Instruct", str(folder))
                                 .replace("max_model_len: 2048", "max_model_len: 256"))
    done = report.run_report(*manifests, "synthetic:12:40:8", hardware="local-cpu", repeats=2)
    results = done.results
    measured = results["speedup"]["measured"]
    assert len(measured["per_repeat"]) == 2 and measured["min"] <= measured["median"] <= measured["max"]
    for side in report.SIDES:
        run = results["runs"][side]
        assert len(run["measured"]) == 2 and run["measured_best"]["completed"] == 12
        assert run["slowdown"] > 0 and set(run["error_pct"]) == set(report.REPORTED)
    out = report.write_report(done, tmp_path / "report")
    report.validate(json.loads((out / "results.json").read_text()))
    assert "x measured** (median of 2 paired repeats, range" in (out / "report.md").read_text()


def test_cli_names_bad_input(tmp_path, capsys):
    args = ["report", "--before", str(BEFORE), "--after", str(AFTER), "--workload", WORKLOAD, "--out", str(tmp_path / "r")]
    with pytest.raises(SystemExit):
        cli.main([*args, "--simulate-only"])
    assert "--simulate-only needs --hardware NAME" in capsys.readouterr().err
    cli.main([*args, "--simulate-only", "--hardware", "local-cpu"])
    assert "2.71x simulated" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main([*args, "--simulate-only", "--hardware", "local-cpu"])
    assert "exists; choose another --out or give --force" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main([*args[:-1], str(tmp_path / "r2"), "--workload", "synthetic:0:1:1", "--simulate-only",
                  "--hardware", "local-cpu"])
    assert "NUM_REQUESTS must be a positive integer" in capsys.readouterr().err
    assert not (tmp_path / "r2").exists()
