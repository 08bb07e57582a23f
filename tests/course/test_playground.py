"""The lessons' playgrounds (course/playground.py): each runs, the same twice, says what its lesson says, and
sits on its lesson's page. The browser half is in test_site.py; that the module imports nothing Pyodide lacks
is import-linter's "browser" contract (tests/test_architecture.py)."""

from __future__ import annotations

import math
import re

import pytest
from conftest import ROOT

from course.playground import BY_LESSON, PLAYGROUNDS, run

MARKER = "<!-- playground -->"


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    return {p.lesson: run(p.lesson) for p in PLAYGROUNDS}


def test_each_playground_runs_the_same_twice_and_draws_a_chart(results) -> None:
    for lesson, result in results.items():
        assert run(lesson) == result, lesson  # seeded: the page and this process must agree
        assert math.isfinite(result["answer"]) and result["lines"] and re.fullmatch(r"[0-9a-f]{16}", result["digest"])
        chart = result["chart"]
        assert chart["x"] == sorted(set(chart["x"])), lesson
        assert all(len(s["values"]) == len(chart["x"]) for s in chart["series"]), lesson


def test_a_knob_changes_the_decisions_and_a_bad_one_names_the_choices(results) -> None:
    other = run("01-continuous-batching", max_num_seqs=8)
    assert other["digest"] != results["01-continuous-batching"]["digest"]
    with pytest.raises(ValueError, match=r"max_num_seqs=7 is not offered; choose one of \[8, 16, 32, 64\]"):
        run("01-continuous-batching", max_num_seqs=7)
    with pytest.raises(ValueError, match="has no knob 'block_size'"):
        run("01-continuous-batching", block_size=16)
    with pytest.raises(ValueError, match="no playground for lesson '06-architecture-map'"):
        run("06-architecture-map")


def test_the_playgrounds_say_what_their_lessons_say(results) -> None:
    """The core decides these: they hold exactly, for every GPU."""
    assert results["01-continuous-batching"]["answer"] > 1.2  # continuous beats static on a spread of lengths
    assert results["02-paged-attention"]["answer"] > 1.2  # paging fits more sequences in the same pool
    worst_itl = results["03-chunked-prefill-and-disaggregation"]["chart"]["series"][0]["values"]
    assert worst_itl == sorted(worst_itl) and worst_itl[-1] > 10 * worst_itl[0]  # a bigger budget, a longer stall
    hit = results["04-prefix-caching"]
    whole_blocks_share = float(re.search(r", ([\d.]+)%\)", hit["lines"][0]).group(1))
    assert abs(hit["answer"] - whole_blocks_share) < 0.5  # only the prefix's whole blocks hit
    speedups = results["05-speculative-decoding"]["chart"]["series"][0]["values"]
    assert speedups[0] > 2 and speedups[-1] < speedups[0]  # speculation pays least at the largest batch
    ttft = results["07-tuning-knobs"]["chart"]["series"][1]["values"]
    assert ttft[0] > 10 * min(ttft) and results["07-tuning-knobs"]["answer"] in (16, 32, 64)  # too few seats queue


def test_each_playground_has_its_place_in_its_lesson() -> None:
    placed = {p.stem for p in (ROOT / "lessons").glob("*.md") if MARKER in p.read_text(encoding="utf-8")}
    assert placed == set(BY_LESSON)
    for lesson in BY_LESSON:
        assert (ROOT / "lessons" / f"{lesson}.md").read_text(encoding="utf-8").count(MARKER) == 1
