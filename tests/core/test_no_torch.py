"""The core and the simulator must import without torch (ARCHITECTURE.md: the core is torch-free)."""

import subprocess
import sys


def test_core_and_sim_import_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError
        "import core, core.scheduler, core.arch_config\n"
        "import sim.cost_model, sim.hardware\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
