"""The discrete-event simulator: the shared core scheduler on a SimPy clock, priced by a cost model.

Torch-free by design (ARCHITECTURE.md): any model on any hardware, at any scale, in seconds on a laptop.
"""

from sim.autoscaler import Autoscaler, ColdStart
from sim.cluster import Cluster
from sim.cost_model import CostModel
from sim.hardware import HardwareProfile
from sim.simulator import Simulator

__all__ = ["Autoscaler", "ColdStart", "Cluster", "CostModel", "HardwareProfile", "Simulator"]
