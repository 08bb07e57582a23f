"""The layer that joins the real engine and the simulator: everything that runs both and compares them.

`ref_engine` (the real engine) and `sim` (the simulator) never import this package; it imports both. Here
live the `serving-lab` command, calibration of the simulator against the engine, the fidelity method, the
per-lesson experiments (one module each under `experiments/`) and the demo. See ARCHITECTURE.md.
"""
