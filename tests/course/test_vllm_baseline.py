"""The vLLM baseline (lessons/vllm-baseline.md) lists every flag `serving-lab manifest --to-vllm` can print, and the
orientation and the glossary name the same release as the page does.

The flags come from two places: the command printed for the client's manifest (tests/serving_lab/data/), and every
`--flag` literal in serving_lab/vllm_command.py, so that a flag printed only for other manifests is covered too.
No torch, no network: the manifest and the command builder are plain Python.
"""

from __future__ import annotations

import re
from pathlib import Path

from serving_lab.manifest import load_manifest
from serving_lab.vllm_command import vllm_serve_command

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "lessons" / "vllm-baseline.md"
CLIENT = ROOT / "tests" / "serving_lab" / "data" / "client_deploy.yaml"
FLAG_RE = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
RELEASE_RE = re.compile(r"\*\*vLLM (v\d+\.\d+\.\d+)\*\*")


def printed_flags(command: str) -> set[str]:
    """The flags of a `vllm serve` command as `vllm_serve_command` prints it (the `#` note lines left out)."""
    lines = [line for line in command.splitlines() if not line.startswith("#")]
    return set(FLAG_RE.findall("\n".join(lines)))


def source_flags() -> set[str]:
    """Every flag literal the command builder can emit ("--name" in a string)."""
    source = (ROOT / "serving_lab" / "vllm_command.py").read_text(encoding="utf-8")
    return set(re.findall(r"[\"'](--[a-z][a-z0-9-]*)[\"']", source))


def listed_flags(baseline_text: str) -> set[str]:
    """The flags the baseline page names in code font (`--a`, or `--a`, `--b` in one cell)."""
    return {flag for span in re.findall(r"`([^`]+)`", baseline_text) for flag in FLAG_RE.findall(span)
            if span.strip().startswith("--")}


def missing_flags(flags: set[str], baseline_text: str) -> set[str]:
    return flags - listed_flags(baseline_text)


def test_client_command_prints_flags():
    flags = printed_flags(vllm_serve_command(load_manifest(CLIENT)))
    assert {"--tensor-parallel-size", "--max-num-batched-tokens", "--speculative-config"} <= flags


def test_every_flag_to_vllm_prints_is_in_the_baseline():
    flags = printed_flags(vllm_serve_command(load_manifest(CLIENT))) | source_flags()
    missing = missing_flags(flags, BASELINE.read_text(encoding="utf-8"))
    assert not missing, f"add these flags to lessons/vllm-baseline.md (with default and source file): {sorted(missing)}"


def test_a_flag_left_out_of_the_baseline_is_named():
    text = BASELINE.read_text(encoding="utf-8").replace("`--long-prefill-token-threshold`", "the threshold")
    assert missing_flags({"--long-prefill-token-threshold", "--block-size"}, text) == {"--long-prefill-token-threshold"}


def test_orientation_and_glossary_name_the_baseline_release():
    release = RELEASE_RE.search(BASELINE.read_text(encoding="utf-8"))
    assert release, "lessons/vllm-baseline.md names no release in bold (**vLLM vX.Y.Z**)"
    for path in (ROOT / "lessons" / "00-orientation.md", ROOT / "glossary.md"):
        found = RELEASE_RE.findall(path.read_text(encoding="utf-8"))
        assert found == [release.group(1)], f"{path.name} names {found}, the baseline page {release.group(1)}"
