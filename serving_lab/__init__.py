"""The layer that joins the real engine and the simulator: everything that runs both and compares them.

`ref_engine` (the real engine) and `sim` (the simulator) never import this package; it imports both, and never
the course (`course/`, the lessons' experiments and demos), which builds on it. Here live the `serving-lab`
command, calibration of the simulator against the engine, the engine-and-simulator pairing, the fidelity
method, the manifest, the sweep, the capstone report and the load generator. See ARCHITECTURE.md.
"""
