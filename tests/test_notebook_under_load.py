"""Notebook 05 passes when its calibration runs while another program keeps half the cores busy.

Issue #18: with `python3 -c "while True: pass"` on one of the two cores, notebook 05 failed. Its calibration
ran under that load, the fit priced a batch-1 verify step above the 1.97 decode steps it replaces, and the
claim "speculation speeds up batch 1 on this CPU" (simulated with that fit) broke. Now a calibration records
how steady the machine was, and every claim that rests on a timing or on the fit is skipped, loudly, when
the machine or the fit was unsteady, while the exact claims still run. This test keeps that from coming back.

What it runs, and why only this: the CI run (tests + every notebook) takes ~18-22 of its 30 minutes, and this
test may add ~4. Load does its damage through the calibration, so the test gives notebook 05 a cache folder
of its own (no profile: it must calibrate, and the machine's own profile is left alone), keeps one of every
two cores busy until that calibration is saved (bounded, and killed in any case), and then lets the
notebook finish (~1 min). Load during the rest of the notebook would only slow it down: once the fit is
flagged, every timing claim in it is skipped whatever the machine does next. Notebook 05 is the one whose
claims rest most on the fit (its CPU speed-up sweep is all simulated); the other notebooks make their timing
claims through the same helper (`serving_lab.experiments.claims`, tested in tests/serving_lab/test_claims.py).
About 2-3 min calibrating under load plus ~1 min of notebook on a quiet 2-core machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "05-speculative-decoding.ipynb"
BUSY_LIMIT_S = 600  # a busy process exits by itself after this, should the test die before killing it
NOTEBOOK_LIMIT_S = 1200
BUSY_LOOP = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass"


@pytest.mark.slow
def test_notebook_05_passes_when_its_calibration_ran_on_a_busy_machine(tmp_path):
    from ref_engine.model import store
    from sim.hardware import HardwareProfile

    cache = tmp_path / "cache"
    cache.mkdir()
    model = store.default_model_path()  # pulled into the ordinary cache folder once, if it is not there yet
    (cache / model.name).symlink_to(model)
    profiles = cache / "profiles"
    # PASSIVE: torch's two threads sleep instead of spinning while they wait for the busy core, as the
    # benchmarks run them; the wait still shows in the calibration's steadiness (the test checks it), and
    # the run takes minutes less than with threads spinning against the busy loop
    env = {**os.environ, "SERVING_LAB_CACHE": str(cache), "SERVING_LAB_MODE": "fast", "PYTHONPATH": str(ROOT),
           "OMP_WAIT_POLICY": "PASSIVE"}
    log = tmp_path / "nbval.log"
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(BUSY_LIMIT_S)])
            for _ in range(max(1, (os.cpu_count() or 2) // 2))]
    notebook = None
    try:
        with log.open("w") as out:
            notebook = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                         "--nbval-lax", "--nbval-current-env", str(NOTEBOOK)],
                                        cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            while notebook.poll() is None and not any(profiles.glob("*.json")):
                time.sleep(1)
            for process in busy:
                process.kill()
            notebook.wait(timeout=NOTEBOOK_LIMIT_S)
    finally:
        for process in [*busy, *([notebook] if notebook else [])]:
            process.kill()
            process.wait()
    output = log.read_text()
    assert notebook.returncode == 0, output[-5000:]
    saved = [HardwareProfile.from_json(path) for path in profiles.glob("*.json")]
    assert saved and saved[0].provenance["steady"] is False, (
        "the calibration ran with half the cores busy but its profile says the machine was steady: "
        f"{saved[0].provenance if saved else 'no profile saved'}")
