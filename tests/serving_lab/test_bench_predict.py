"""`serving-lab bench serve --dry-run`: the simulator's prediction of a `bench serve` run, no server needed
(the prediction next to a live measurement, `--simulate`, is in test_server.py)."""

from __future__ import annotations

import json

import pytest

from serving_lab import cli

BENCH = ["bench", "serve", "--dry-run", "--hardware", "local-cpu", "--num-prompts", "12", "--random-input-len", "32",
         "--random-output-len", "8", "--request-rate", "20"]


def dry_run(tmp_path, *flags: str) -> dict:
    result_file = tmp_path / "predicted.json"
    cli.main([*BENCH, *flags, "--result-file", str(result_file)])
    return json.loads(result_file.read_text())


def test_dry_run_predicts_the_same_requests_and_the_cap_slows_them(tmp_path, capsys):
    free = dry_run(tmp_path)
    capped = dry_run(tmp_path, "--max-concurrency", "1", "--frontend-latency-ms", "5")
    for result in (free, capped):
        simulated = result["simulated"]
        assert simulated["completed"] == 12 and simulated["total_output_tokens"] == 12 * 8
        assert simulated["total_input_tokens"] == 12 * 32 and simulated["hardware"] == "local-cpu"
    assert capped["max_concurrency"] == 1 and capped["simulated"]["frontend_latency_ms"] == 5
    assert capped["simulated"]["duration"] > free["simulated"]["duration"]
    assert capped["simulated"]["mean_ttft_ms"] >= 5
    assert "output_throughput" in capsys.readouterr().out


def test_text_prompts_cannot_be_simulated(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "hello", "output_len": 4}) + "\n")
    with pytest.raises(SystemExit) as exit_:
        cli.main([*BENCH, "--dataset-path", str(prompts)])
    assert exit_.value.code == 2 and "token-id prompts" in capsys.readouterr().err
