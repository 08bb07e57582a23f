"""The live dashboard (`serving-lab serve --dashboard`, and a simulated run's replay): one static page fed
by one event stream. `core/dashboard_frames.py` is the stream's format, `live.py` a running server's frames, `routes.py`
the page's routes on a FastAPI app, `static/` the page (plain JavaScript, uPlot vendored for the charts).
Nothing here imports torch, so the simulator's replay serves the same page.

Lesson: lessons/06-architecture-map.md (what an operator sees of the loop).
"""
