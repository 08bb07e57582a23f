"""The torch-free policy core shared by the real engine and the simulator (see ARCHITECTURE.md)."""

from ref_engine.core.config import EngineConfig
from ref_engine.core.fair import FairRequestQueue, FairScheduler
from ref_engine.core.interfaces import ScheduledRequest, SchedulerOutput, StepResult
from ref_engine.core.metrics import RunMetrics, StepRecord, relative_error
from ref_engine.core.priority import PriorityRequestQueue, PriorityScheduler
from ref_engine.core.request import Request, RequestStatus
from ref_engine.core.request_queue import FCFSRequestQueue, KeyedRequestQueue, RequestQueue
from ref_engine.core.scheduler import Scheduler, StaticScheduler, StepPlan, make_scheduler
from ref_engine.core.scheduler_registry import SCHEDULERS, SCHEDULING_POLICIES, register_scheduler
from ref_engine.core.workload import Exponential, Workload, WorkloadRequest

__all__ = [
    "SCHEDULERS", "SCHEDULING_POLICIES", "EngineConfig", "Exponential", "FCFSRequestQueue", "FairRequestQueue", "FairScheduler",
    "KeyedRequestQueue", "PriorityRequestQueue", "PriorityScheduler", "Request", "RequestQueue", "RequestStatus",
    "RunMetrics", "ScheduledRequest", "Scheduler", "SchedulerOutput", "StaticScheduler", "StepPlan",
    "StepRecord", "StepResult", "Workload", "WorkloadRequest", "make_scheduler", "register_scheduler",
    "relative_error",
]
