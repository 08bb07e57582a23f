"""The short soak (benchmarks/soak.py, 40 seconds, the crash 10 s in): the server on the
default model under mixed traffic with bad inputs, disconnects, bursts past a tenant's cap, resets under load
and one engine-core crash, then the audit: nothing running or waiting, no KV block in use, every request
accounted for, no cross-tenant prefix hit, and a server that exited non-zero when its engine core died.
Memory growth is judged by the ten-minute benchmark only: 40 seconds are too short for a steady baseline.
"""

from __future__ import annotations

import asyncio

import pytest
from live_server import free_port

from benchmarks.soak import run_soak


@pytest.mark.slow
def test_a_short_soak_with_a_crash_ends_clean(smollm2_path, tmp_path):
    report = asyncio.run(run_soak(40.0, clients=6, port=free_port(), warmup_s=5.0, log_dir=tmp_path))
    assert report.problems(check_rss=False) == [], (tmp_path / "server.log").read_text()[-4000:]
    assert report.restarts == 1 and all(code != 0 for code in report.exit_codes)
    outcomes = report.ledger.outcomes
    for kind in ("stream", "plain", "shared_prefix"):
        assert outcomes[f"{kind}:completed"] > 0, outcomes
    for kind, status in (("malformed", 400), ("oversized", 413), ("too_long", 400)):
        assert outcomes[f"{kind}:completed"] == 0 and outcomes[f"{kind}:refused:{status}"] > 0, outcomes
    assert report.ledger.probes > 0 and report.ledger.cross_tenant_hits == 0
