"""The course plan: every lesson of Serving Lab, written or not, as data.

This list is the one place that says which lessons exist or will exist. The generator
(`course_links.py`) builds the course map from it, and the link checker (`course_check.py`) uses it to
decide what a link may point at:

- a lesson whose file `lessons/<stem>.md` exists is **written**: every anchor, term and exercise listed
  for it below must really be in the file, and its notebook must exist (when `notebook` is true);
- a lesson whose file does not exist yet is **planned**: links to it (and to its notebook) are accepted,
  but only to the anchors listed here, so that questions, the glossary and code docstrings can point at
  a lesson before it is written, and the lesson writer knows exactly which anchors to create.

Stems never change once other files link to them. Ids (questions, terms, exercises) never encode lesson
numbers except exercises, whose `ENN.k` names their lesson.

To add a lesson: append a `PlannedLesson`; write `lessons/<stem>.md` (and `notebooks/<stem>.ipynb`);
run `python lessons/tools/course_links.py --write`; run `pytest tests/course`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlannedExercise:
    """One exercise `ENN.k`: its stub lives in `lessons/exercises/eNN_<slug>.py`, its tests in
    `tests/exercises/test_eNN_<slug>.py` (functions named `test_eNN_k_*`), its reference solution in
    `lessons/exercises/solutions/eNN_<slug>.py`, and its statement under the anchor `#eNN-k` of the lesson."""

    id: str  # "E01.1"
    kind: str  # implement | estimate | predict-then-run | debug | design
    title: str

    @property
    def anchor(self) -> str:
        """"E01.1" -> "e01-1"."""
        return self.id.lower().replace(".", "-")

    @property
    def lesson_number(self) -> str:
        return self.id[1:3]


@dataclass(frozen=True)
class PlannedLesson:
    stem: str  # file name without ".md"; notebooks/<stem>.ipynb has the same stem
    title: str
    minutes: int  # reading + running the notebook + exercises, for a learner doing all of it
    notebook: bool = True  # does the lesson come with notebooks/<stem>.ipynb?
    has_questions: bool = True  # must the lesson carry the generated AUTO:questions block?
    anchors: tuple[str, ...] = ()  # section anchors the lesson must define (`<a id="..."></a>`)
    notebook_anchors: tuple[str, ...] = ()  # anchors its notebook's Markdown cells must define
    terms: tuple[str, ...] = ()  # glossary terms the lesson must link (`../glossary.md#term`) at first use
    exercises: tuple[PlannedExercise, ...] = ()

    @property
    def number(self) -> str:
        """"01" for "01-continuous-batching", "C" for the capstone."""
        head = self.stem.split("-", 1)[0]
        return head if head.isdigit() else "C"

    @property
    def slug(self) -> str:
        """The exercise module slug: "01-continuous-batching" -> "continuous_batching"."""
        rest = self.stem.split("-", 1)[1] if self.number != "C" else self.stem
        return rest.replace("-", "_")

    @property
    def exercise_module(self) -> str:
        """Stem of the stub, solution and test modules: "e01_continuous_batching"."""
        return f"e{self.number}_{self.slug}"

    @property
    def required_anchors(self) -> tuple[str, ...]:
        return self.anchors + tuple(e.anchor for e in self.exercises)


LESSONS: tuple[PlannedLesson, ...] = (
    # Lesson 0: the-big-picture (LLM serving on one page: request to streamed tokens, the two phases, the KV
    # cache, the step loop, where each lesson fits, the metrics, what the course leaves out), then the manual.
    PlannedLesson(
        "00-orientation", "Orientation: how to run the course", minutes=20, notebook=False,
        anchors=("the-big-picture", "quick-start", "modes", "checking-exercises", "links-and-ids",
                 "generated-blocks", "questions"),
        terms=("prefill", "decode", "kv-cache", "continuous-batching", "paged-attention", "ttft", "tpot",
               "goodput", "flash-attention", "flash-decoding", "mla", "sliding-window-attention",
               "multi-lora", "structured-output", "expert-parallelism"),
    ),
    # Lesson 1 sections: cost-of-a-step (prefill vs decode, memory- vs compute-bound, the step-time knee;
    # the experiment that calibrates the simulator), request-lifecycle (waiting -> running -> finished, num_computed_tokens),
    # static-batching, continuous-batching (iteration-level scheduling, the engine loop), token-budget
    # (max_num_batched_tokens, max_num_seqs, chunked prefill, head-of-line blocking), measuring-a-server
    # (TTFT, TPOT, ITL, E2EL, throughput, goodput), load-and-capacity (Poisson arrivals, the hockey stick),
    # experiment-protocol (same workload and seed through simulator and engine, the error column).
    PlannedLesson(
        "01-continuous-batching", "From static to continuous batching", minutes=120,
        anchors=("you-will-learn", "cost-of-a-step", "request-lifecycle", "static-batching",
                 "continuous-batching", "token-budget", "measuring-a-server", "load-and-capacity",
                 "experiment-protocol", "exercises", "questions", "summary"),
        notebook_anchors=("cost-of-a-step", "static-vs-continuous", "load-and-capacity", "exercises"),
        terms=("prefill", "decode", "kv-cache", "step-time", "memory-bound", "compute-bound",
               "arithmetic-intensity", "roofline", "static-batching", "continuous-batching",
               "iteration-level-scheduling", "token-budget", "max-num-seqs", "chunked-prefill",
               "head-of-line-blocking", "ttft", "tpot", "itl", "e2e-latency", "throughput", "goodput",
               "cost-model", "calibration"),
        exercises=(
            PlannedExercise("E01.1", "implement", "One continuous-batching step"),
            PlannedExercise("E01.2", "predict-then-run", "Static vs continuous: count the steps"),
            PlannedExercise("E01.3", "design", "Size a deployment for a latency target"),
        ),
    ),
    # Lesson 2 sections: kv-cache-size (bytes per token, GQA), reservation-waste (contiguous reservation,
    # internal/external fragmentation), blocks-and-block-tables (block table, slot mapping), block-pool
    # (ref counts, free queue), attention-over-blocks (the paged attention kernel), block-size (the
    # U-shape), preemption (recompute vs swap), memory-bound-throughput (more sequences, more throughput).
    PlannedLesson(
        "02-paged-attention", "PagedAttention: the KV cache as virtual memory", minutes=120,
        anchors=("you-will-learn", "kv-cache-size", "reservation-waste", "blocks-and-block-tables",
                 "block-pool", "attention-over-blocks", "block-size", "preemption",
                 "memory-bound-throughput", "exercises", "questions", "summary"),
        notebook_anchors=("kv-cache-size", "allocation-modes", "block-size", "preemption", "exercises"),
        terms=("kv-cache", "gqa", "kv-cache-usage", "internal-fragmentation", "external-fragmentation",
               "paged-attention", "block", "block-size", "block-table", "slot-mapping", "block-pool",
               "preemption", "recompute", "swap"),
        exercises=(
            PlannedExercise("E02.1", "estimate", "How many sequences fit in the KV cache?"),
            PlannedExercise("E02.2", "implement", "A block allocator with reference counts"),
            PlannedExercise("E02.3", "debug", "A forked sequence overwrites its parent's KV"),
        ),
    ),
    # Lesson 3 sections: the-stall (a long prefill stalls running decodes; Sarathi-Serve Fig 1a),
    # token-budget-dial (TTFT vs ITL over the budget; capacity under an ITL SLO), budget-knobs (vLLM's
    # long_prefill_token_threshold, max_num_partial_prefills; the manifest's prefill_budget_tokens,
    # decode_batch_max_tokens), priority (priority scheduling, preemption, priority inversion), fairness (VTC,
    # Jain's index, no banked credit), goodput, disaggregation (xP+yD, KV connectors, kv_role),
    # kv-transfer (bytes x prompt / bandwidth), when-disaggregation-pays.
    PlannedLesson(
        "03-chunked-prefill-and-disaggregation",
        "The scheduler: chunked prefill, priorities, fairness and prefill/decode disaggregation", minutes=120,
        anchors=("you-will-learn", "the-stall", "token-budget-dial", "budget-knobs", "priority", "fairness",
                 "goodput", "disaggregation", "kv-transfer", "when-disaggregation-pays", "exercises",
                 "questions", "summary"),
        notebook_anchors=("the-stall", "token-budget-dial", "capacity", "fairness", "disaggregation", "exercises"),
        terms=("chunked-prefill", "token-budget", "prefill-stall", "itl", "ttft", "tpot", "head-of-line-blocking",
               "priority-scheduling", "priority-inversion", "preemption", "virtual-token-counter",
               "jains-fairness-index", "goodput", "throughput", "disaggregated-prefill", "kv-connector", "kv-role"),
        exercises=(
            PlannedExercise("E03.1", "implement", "Virtual token counters: who is admitted next?"),
            PlannedExercise("E03.2", "estimate", "How long does a prompt's KV cache take to cross the link?"),
        ),
    ),
    # Lesson 4 sections: repeated-prefixes (system prompts, few-shot, chat history), hash-chain (block hashes,
    # extra keys, token comparison, evictable blocks), last-token-rule (at most n - 1 tokens, copy-on-write vs
    # vLLM V1's recompute), ttft-and-throughput (vLLM Fig 16 and SGLang's numbers), hit-rate (whole blocks),
    # eviction (LRU via the free queue, the cliff), tenant-isolation (timing side channel, cache_salt),
    # radix-tree (SGLang vs hash chain), miss-explanations, what-the-simulator-models.
    PlannedLesson(
        "04-prefix-caching", "Prefix caching", minutes=90,
        anchors=("you-will-learn", "repeated-prefixes", "hash-chain", "last-token-rule", "ttft-and-throughput",
                 "hit-rate", "eviction", "tenant-isolation", "radix-tree", "miss-explanations",
                 "what-the-simulator-models", "exercises", "questions", "summary"),
        notebook_anchors=("hash-chain", "shared-prefix-ttft", "hit-rate", "eviction", "tenant-isolation",
                          "chat-replay", "miss-explanations", "exercises"),
        terms=("prefix-caching", "prefill", "kv-cache", "prefix-cache-hit-rate", "block", "block-hash",
               "cache-salt", "evictable-block", "copy-on-write", "ttft", "throughput", "lru-eviction",
               "timing-side-channel", "tenant-isolation", "radix-tree", "hash-chain"),
        exercises=(
            PlannedExercise("E04.1", "implement", "The hash chain and the lookup"),
            PlannedExercise("E04.2", "estimate", "Hit rate and prefill saved for a shared prefix"),
            PlannedExercise("E04.3", "debug", "A prompt comes back and misses, though its blocks are cached"),
        ),
    ),
    # Lesson 5 sections: nearly-free (memory-bound decode verifies k + 1 tokens for the price of one),
    # verification (greedy prefix match, rejection sampling, why it is exact), proposers (n-gram prompt
    # lookup, draft model, self:L), learned-proposers (EAGLE, Medusa heads, multi-token prediction in the same
    # frame), acceptance-and-speedup (Leviathan's formula, the draft's cost, break-even acceptance),
    # acceptance-by-temperature (measured), grounded-vs-chat (where n-gram shines), measured-vs-simulated (the
    # engine against the profile, and why they differ), batch-size (where speculation turns into a slow-down),
    # draft-model-pays (70B + 8B simulated, the self-draft measured), simulating-speculation (acceptance rates,
    # replay, the draft's cost from its dims).
    PlannedLesson(
        "05-speculative-decoding", "Speculative decoding", minutes=90,
        anchors=("you-will-learn", "nearly-free", "verification", "proposers", "learned-proposers",
                 "acceptance-and-speedup", "acceptance-by-temperature", "grounded-vs-chat", "measured-vs-simulated",
                 "batch-size", "draft-model-pays", "simulating-speculation", "exercises", "questions", "summary"),
        notebook_anchors=("formula", "measured", "batch-size", "acceptance", "draft-model", "exercises"),
        terms=("speculative-decoding", "draft-model", "prompt-lookup-decoding", "acceptance-rate",
               "rejection-sampling", "bonus-token", "memory-bound", "compute-bound", "decode", "eagle",
               "medusa-heads", "multi-token-prediction"),
        exercises=(
            PlannedExercise("E05.1", "implement", "Prompt lookup: draft tokens from the context"),
            PlannedExercise("E05.2", "estimate", "Tokens per step and the speed-up of speculation"),
        ),
    ),
    # Lesson 6 sections: the-boxes (two processes, the diagram, what each box owns), one-request-traced (real
    # timestamps through every box: where TTFT and each inter-token gap go), request-sequence (the sequence
    # diagram replayed against the trace), queueing-and-admission (a burst under max_num_seqs; 429s),
    # symptoms (symptom -> box -> /metrics series), manifest-map (manifest sections -> boxes), six-metrics
    # (the manifest's metrics -> vllm: series), what-the-simulator-models.
    PlannedLesson(
        "06-architecture-map", "The architecture map", minutes=60,
        anchors=("you-will-learn", "the-boxes", "one-request-traced", "request-sequence", "queueing-and-admission",
                 "symptoms", "manifest-map", "six-metrics", "what-the-simulator-models", "exercises", "questions",
                 "summary"),
        notebook_anchors=("the-boxes", "one-request-traced", "queueing-and-admission", "metrics", "exercises"),
        terms=("api-server", "engine-core", "server-sent-events", "backpressure", "admission-control",
               "request-tracing", "ttft", "itl", "prefill", "decode", "max-num-seqs", "kv-cache-usage",
               "preemption", "prefix-cache-hit-rate", "detokenization"),
        exercises=(
            PlannedExercise("E06.1", "implement", "Where did the time to first token go?"),
            PlannedExercise("E06.2", "estimate", "When does the k-th request of a burst start?"),
        ),
    ),
    # Lesson 7 sections: no-best-config (the answer depends on workload and SLO; Vidur), the-knobs (each knob's
    # mechanism, linked to the lesson that taught it), sweep (a dense grid in the simulator), pareto-and-slo
    # (the front; goodput picks a point per SLO), trusting-the-sweep (engine points, rank agreement),
    # numerics (quantization and KV dtype: throughput against quality), parallelism (TP vs replicas, pipeline
    # stages), roofline-floor (where tuning stops paying), capstone (the before -> after report).
    PlannedLesson(
        "07-tuning-knobs", "Tuning knobs: sweeping the throughput/latency curve", minutes=90,
        anchors=("you-will-learn", "no-best-config", "the-knobs", "sweep", "pareto-and-slo", "trusting-the-sweep",
                 "numerics", "parallelism", "roofline-floor", "capstone", "exercises", "questions", "summary"),
        notebook_anchors=("gpu-sweep", "slo-picks", "cpu-sweep", "numerics", "roofline-floor", "worked-example",
                          "exercises"),
        terms=("configuration-sweep", "pareto-front", "goodput", "rank-agreement", "max-num-seqs", "token-budget",
               "block-size", "quantization", "kv-cache-dtype", "tensor-parallelism", "cuda-graphs", "roofline",
               "throughput", "itl", "ttft"),
        exercises=(
            PlannedExercise("E07.1", "implement", "The Pareto front of a sweep"),
            PlannedExercise("E07.2", "design", "Capacity planning: replicas and cost per million tokens"),
        ),
    ),
    # The capstone: the-assignment (baseline manifest, workload, SLO; tune, justify, report), the-rubric,
    # worked-example (the report CI regenerates, its numbers), how-the-report-is-made (serving-lab report),
    # capacity-planning (from the tuned configuration's goodput to replicas, GPUs, cost per million tokens,
    # headroom, routing and autoscaling).
    PlannedLesson("capstone", "Capstone: a before -> after throughput report", minutes=180, notebook=False,
                  anchors=("the-assignment", "the-rubric", "worked-example", "how-the-report-is-made",
                           "capacity-planning", "questions"),
                  terms=("goodput", "cost-per-million-tokens", "data-parallelism", "tensor-parallelism",
                         "pipeline-parallelism", "cache-aware-routing", "autoscaling", "cold-start")),
)

# Interview-bank topics (lessons/CONTRIBUTING.md, "Ids, anchors and links"), in the order the bank lists them.
TOPICS: dict[str, str] = {
    "BATCH": "Batching",
    "SCHED": "Scheduling",
    "METRIC": "Metrics and SLOs",
    "SYS": "Systems fundamentals",
    "KV": "The KV cache",
    "PAGE": "Paging and blocks",
    "KERN": "Attention kernels",
    "PREEMPT": "Preemption",
    "PREFIX": "Prefix caching",
    "SPEC": "Speculative decoding",
    "PD": "Prefill/decode disaggregation",
    "FAIR": "Fairness and isolation",
    "FEAT": "Serving features: adapters and structured output",
    "PAR": "Parallelism",
    "TUNE": "Tuning",
    "CAP": "Capacity planning",
    "SIM": "Simulation and cost models",
}

# Coverage (course_check.check_coverage): every written lesson that has questions is linked by at least this
# many questions of the bank, and every written lesson with a notebook has at least this many exercises.
MIN_QUESTIONS_PER_LESSON = 6
MIN_EXERCISES_PER_NOTEBOOK_LESSON = 2

EXERCISE_KINDS = ("implement", "estimate", "predict-then-run", "debug", "design")
