"""A production trace as data, and replayed: Azure's CSV format read with every mistake named by file and line,
the two 2023 traces shipped in full, and `Workload.replay` playing a trace's arrivals scaled in time and looped
past its end, with its lengths."""

from __future__ import annotations

import gzip
import math
import re
from pathlib import Path

import pytest

from core.trace import TRACE_FILES, Trace, load_trace, read_trace
from core.workload import TRACES, Workload, trace_lengths

DATA = Path(__file__).resolve().parents[2] / "core" / "data"
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
# The first rows of data/AzureLLMInferenceTrace_{conv,code}.csv, github.com/Azure/AzurePublicDataset at
# commit b469a113cedca53ddc3bdea71a143dc4b7d8700c, as written there
FIRST_ROWS = {
    "azure-conv-2023": ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:50.9951690,396,109"],
    "azure-code-2023": ["2023-11-16 18:17:03.9799600,4808,10", "2023-11-16 18:17:04.0319600,3180,8"],
}
LAST_ROWS = {
    "azure-conv-2023": "2023-11-16 19:14:08.4025270,197,183",
    "azure-code-2023": "2023-11-16 19:14:19.9280160,549,173",
}


def arrivals(workload: Workload) -> list[float]:
    return [r.arrival_time for r in workload.requests]


def lengths(workload: Workload) -> list[tuple[int, int]]:
    return [(r.prompt_len, r.output_len) for r in workload.requests]


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    return path


def test_a_file_of_azure_s_format_reads_as_offsets_and_counts(tmp_path):
    text = (f"# a note on where it comes from\n{HEADER}\n2023-11-16 18:15:46.6805900,374,44\n"
            "2023-11-16 18:15:50.9951690,396,109\n2023-11-16 18:15:50.9951690,1,1\n2023-11-16 18:16:46,20,3\n")
    trace = read_trace(write(tmp_path, text))
    assert trace == Trace(name="trace", source="a note on where it comes from",
                          arrival_times=(0.0, 4.314579, 4.314579, 59.31941), prompt_lens=(374, 396, 1, 20),
                          output_lens=(44, 109, 1, 3))
    assert read_trace(write(tmp_path, text, "trace.csv.gz")) == trace  # gzipped, the same
    bare = read_trace(write(tmp_path, text.split("\n", 1)[1], "bare.csv"), name="mine")
    assert (bare.name, bare.source, len(bare)) == ("mine", str(tmp_path / "bare.csv"), 4)
    assert trace.duration == 59.31941 and trace.mean_interarrival == pytest.approx(59.31941 / 3)


@pytest.mark.parametrize("text, line, error", [
    ("", 1, "empty file; expected the header TIMESTAMP,ContextTokens,GeneratedTokens"),
    ("# only a note\n", 2, "the file ends before the header"),
    ("timestamp,prompt,output\n2023-11-16 18:15:46,3,4\n", 1,
     f"expected the header {HEADER}, got 'timestamp,prompt,output'"),
    (f"{HEADER}\n", 2, "no requests after the header"),
    (f"{HEADER}\n2023-11-16 18:15:46,3,4\n2023-11-16 18:15:47,3\n", 3, f"expected 3 fields, {HEADER}, got 2"),
    (f"{HEADER}\n2023-11-16 18:15:46,3,4,5\n", 2, "got 4: '2023-11-16 18:15:46,3,4,5'"),
    (f"{HEADER}\n2023-11-16 18:15:46,3,4\n\n", 3, "got 1: ''"),
    (f"{HEADER}\n2023-11-16 18:15:46,3.5,4\n", 2, "ContextTokens must be an integer >= 1, got '3.5'"),
    (f"{HEADER}\n2023-11-16 18:15:46,3,0\n", 2, "GeneratedTokens must be an integer >= 1, got '0'"),
    (f"{HEADER}\n2023-11-16 18:15:46,-3,4\n", 2, "ContextTokens must be an integer >= 1, got '-3'"),
    (f"{HEADER}\nyesterday,3,4\n", 2, "TIMESTAMP must be a date and time like 2023-11-16 18:15:46.68, "
                                      "got 'yesterday'"),
    (f"{HEADER}\n2023-13-16 18:15:46,3,4\n", 2, "TIMESTAMP must be a date and time"),  # month 13
    (f"{HEADER}\n2023-11-16 18:15:46.5x,3,4\n", 2, "TIMESTAMP must be a date and time"),
    (f"# note\n# more\n{HEADER}\n2023-11-16 18:15:46.5,3,4\n2023-11-16 18:15:46.4,3,4\n", 5,
     "TIMESTAMP 2023-11-16 18:15:46.400000 is earlier than the previous request's, 2023-11-16 18:15:46.500000"),
])
def test_each_mistake_in_a_trace_file_names_its_file_and_line(tmp_path, text, line, error):
    path = write(tmp_path, text)
    with pytest.raises(ValueError) as raised:
        read_trace(path)
    assert str(raised.value).startswith(f"{path}:{line}: ") and error in str(raised.value)


@pytest.mark.parametrize("fields, error", [
    (dict(arrival_times=(), prompt_lens=(), output_lens=()), "need one entry per request, at least one"),
    (dict(arrival_times=(0.0, 1.0), prompt_lens=(3,), output_lens=(4,)), "got [1, 2]"),
    (dict(arrival_times=(1.0,), prompt_lens=(3,), output_lens=(4,)), "must start at 0 and never decrease"),
    (dict(arrival_times=(0.0, 2.0, 1.0), prompt_lens=(3,) * 3, output_lens=(4,) * 3), "never decrease"),
    (dict(arrival_times=(0.0,), prompt_lens=(0,), output_lens=(4,)), "at least one token"),
])
def test_a_trace_built_in_code_keeps_the_invariants(fields, error):
    with pytest.raises(ValueError, match=f"trace 'made': .*{re.escape(error)}"):
        Trace(name="made", source="a test", **fields)


@pytest.mark.parametrize("name, num_requests", [("azure-conv-2023", 19_366), ("azure-code-2023", 8_819)])
def test_the_shipped_traces_are_azure_s_in_full(name, num_requests):
    trace = load_trace(name)
    assert trace.name == name and len(trace) == num_requests
    assert "CC BY 4.0" in trace.source and "Splitwise" in trace.source and "AzurePublicDataset" in trace.source
    lines = gzip.decompress((DATA / TRACE_FILES[name]).read_bytes()).decode().splitlines()
    rows = lines[lines.index(HEADER) + 1:]
    assert rows[:2] == FIRST_ROWS[name] and rows[-1] == LAST_ROWS[name]  # Azure's rows, as written there
    first, second = (row.split(",") for row in FIRST_ROWS[name])
    assert (trace.prompt_lens[:2], trace.output_lens[:2]) == ((int(first[1]), int(second[1])),
                                                              (int(first[2]), int(second[2])))
    assert 3400 < trace.duration < 3600  # an hour
    # `from_trace` draws from a systematic sample of the same trace: its every 19th (chat) or 9th (code) request
    step = {"azure-conv-2023": 19, "azure-code-2023": 9}[name]
    assert list(trace_lengths(name)) == list(zip(trace.prompt_lens, trace.output_lens))[::step]


def test_the_shipped_traces_are_small_and_named_as_from_trace_names_them():
    assert set(TRACE_FILES) == set(TRACES)
    assert sum((DATA / file).stat().st_size for file in TRACE_FILES.values()) < 400_000
    assert all(file.endswith(".gz") for file in TRACE_FILES.values())  # so the browser's archive leaves them out
    with pytest.raises(ValueError, match="unknown trace 'sharegpt': neither a file nor one of azure-conv-2023"):
        load_trace("sharegpt")


SMALL = Trace(name="small", source="a test", arrival_times=(0.0, 1.0, 3.0), prompt_lens=(10, 20, 30),
              output_lens=(1, 2, 3))


def test_a_replay_plays_the_trace_s_arrivals_and_lengths():
    workload = Workload.replay("azure-code-2023")
    trace = load_trace("azure-code-2023")
    assert arrivals(workload) == list(trace.arrival_times)
    assert lengths(workload) == list(zip(trace.prompt_lens, trace.output_lens))
    assert workload.name == "replay-azure-code-2023"
    assert Workload.replay(SMALL, num_requests=2).requests == Workload.replay(SMALL).requests[:2]  # the first ones


@pytest.mark.parametrize("time_scale", [10, 0.25, 3.0])
def test_time_scaling_divides_every_arrival_and_keeps_the_requests(time_scale):
    plain = Workload.replay("azure-conv-2023", num_requests=3000)
    scaled = Workload.replay("azure-conv-2023", time_scale=time_scale, num_requests=3000)
    assert len(scaled) == len(plain) == 3000 and lengths(scaled) == lengths(plain)
    assert arrivals(scaled) == [t / time_scale for t in arrivals(plain)]


def test_more_requests_than_the_trace_loop_it_end_to_end():
    """Each pass starts one mean inter-arrival gap (3 s / 2) after the previous pass's last arrival."""
    looped = Workload.replay(SMALL, num_requests=8)
    assert arrivals(looped) == [0.0, 1.0, 3.0, 4.5, 5.5, 7.5, 9.0, 10.0]
    assert lengths(looped) == [(10, 1), (20, 2), (30, 3)] * 2 + [(10, 1), (20, 2)]
    assert arrivals(Workload.replay(SMALL, 2.0, 8)) == [0.0, 0.5, 1.5, 2.25, 2.75, 3.75, 4.5, 5.0]
    long = Workload.replay("azure-code-2023", num_requests=20_000)
    assert len(long) == 20_000 and arrivals(long) == sorted(arrivals(long))
    assert lengths(long)[8_819:17_638] == lengths(long)[:8_819] == lengths(Workload.replay("azure-code-2023"))
    single = Trace(name="one", source="a test", arrival_times=(0.0,), prompt_lens=(5,), output_lens=(2,))
    assert arrivals(Workload.replay(single, num_requests=3)) == [0.0] * 3


def test_the_same_seed_gives_the_same_requests(tmp_path):
    path = write(tmp_path, f"{HEADER}\n2023-11-16 18:15:46,30,4\n2023-11-16 18:15:47.5,50,2\n")
    same = [Workload.replay(path, seed=7).make_requests(vocab_size=1000) for _ in range(2)]
    other = Workload.replay(path, seed=8).make_requests(vocab_size=1000)
    assert [r.prompt_token_ids for r in same[0]] == [r.prompt_token_ids for r in same[1]]
    assert [r.prompt_token_ids for r in same[0]] != [r.prompt_token_ids for r in other]
    assert [(len(r.prompt_token_ids), r.max_tokens, r.arrival_time) for r in other] == [(30, 4, 0.0), (50, 2, 1.5)]


@pytest.mark.parametrize("time_scale", [0, -1.0, math.nan, math.inf, "10", True])
def test_time_scale_must_be_a_positive_number(time_scale):
    with pytest.raises(ValueError, match="time_scale must be a positive number"):
        Workload.replay(SMALL, time_scale=time_scale)


@pytest.mark.parametrize("num_requests", [0, -2, 1.5, True])
def test_num_requests_must_be_a_positive_integer(num_requests):
    with pytest.raises(ValueError, match="num_requests must be an integer >= 1"):
        Workload.replay(SMALL, num_requests=num_requests)
