"""The torch-free policy core shared by the real engine and the simulator (see ARCHITECTURE.md)."""

from core.config import EngineConfig, ParallelConfig
from core.fair import FairRequestQueue, FairScheduler
from core.interfaces import ScheduledRequest, SchedulerInterface, SchedulerOutput, SchedulerStats, StepResult
from core.metrics import RunMetrics, StepRecord, relative_error
from core.priority import PriorityRequestQueue, PriorityScheduler
from core.request import Request, RequestStatus
from core.request_queue import FCFSRequestQueue, KeyedRequestQueue, RequestQueue
from core.scheduler import Scheduler, StaticScheduler, StepPlan, make_scheduler
from core.scheduler_registry import SCHEDULERS, SCHEDULING_POLICIES, register_scheduler
from core.workload import Exponential, Workload, WorkloadRequest

__all__ = [
    "SCHEDULERS", "SCHEDULING_POLICIES", "EngineConfig", "Exponential", "FCFSRequestQueue", "FairRequestQueue", "FairScheduler",
    "KeyedRequestQueue", "ParallelConfig", "PriorityRequestQueue", "PriorityScheduler", "Request", "RequestQueue",
    "RequestStatus", "RunMetrics", "ScheduledRequest", "Scheduler", "SchedulerInterface", "SchedulerOutput",
    "SchedulerStats", "StaticScheduler", "StepPlan", "StepRecord", "StepResult", "Workload", "WorkloadRequest",
    "make_scheduler", "register_scheduler",
    "relative_error",
]
