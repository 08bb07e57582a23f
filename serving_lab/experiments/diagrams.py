"""The lessons' diagrams, drawn with matplotlib: the step loop, a block table, the hash chain, propose-and-verify,
the request sequence, prefill/decode disaggregation and the sweep loop.

Why drawn in code: the notebooks draw them (a cell tagged `figure:<name>` becomes the image its lesson embeds,
lessons/tools/course_site.py), so a diagram changes in a reviewed diff beside the code it describes, and it
names the same functions and knobs. Each function returns the figure; nothing here runs a model.
"""

from __future__ import annotations

from collections.abc import Sequence

BOX = dict(boxstyle="round,pad=0.3", fc="white", ec="black", lw=1)
COLORS = ("#cfe2f3", "#f9cb9c", "#d9ead3", "#fff2cc", "#ead1dc", "#d0e0e3")
ARROW = "#444"


def _figure(width: float, height: float, xlim: tuple[float, float], ylim: tuple[float, float]):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.axis("off")
    return fig, ax


def _box(ax, x: float, y: float, text: str, color: str = "white", fontsize: float = 9, **style):
    """A rounded text box centred at (x, y); its size follows the text."""
    return ax.text(x, y, text, ha="center", va="center", fontsize=fontsize,
                   bbox={**BOX, "fc": color, **style})


def _arrow(ax, start, end, label: str = "", rad: float = 0.0, color: str = ARROW, fontsize: float = 8,
           offset: tuple[float, float] = (0.0, 0.12), **style) -> None:
    """An arrow between two points or two boxes (clipped at their edges), with a label at its middle."""
    tail = start.get_position() if hasattr(start, "get_position") else start
    head = end.get_position() if hasattr(end, "get_position") else end
    props = dict(arrowstyle="-|>", color=color, lw=1.2, connectionstyle=f"arc3,rad={rad}", **style)
    if hasattr(start, "get_bbox_patch"):
        props["patchA"] = start.get_bbox_patch()
    if hasattr(end, "get_bbox_patch"):
        props["patchB"] = end.get_bbox_patch()
    ax.annotate("", head, tail, arrowprops=props)
    if label:
        ax.text((tail[0] + head[0]) / 2 + offset[0], (tail[1] + head[1]) / 2 + offset[1], label, ha="center",
                va="bottom", fontsize=fontsize, color="#a33")


def _cells(ax, x: float, y: float, labels: Sequence[str], colors: Sequence[str], width: float = 0.6,
           height: float = 0.5, fontsize: float = 8) -> list[tuple[float, float]]:
    """A row of square cells (blocks, tokens) from (x, y), left to right; returns each cell's centre."""
    from matplotlib.patches import Rectangle

    centres = []
    for i, (label, color) in enumerate(zip(labels, colors)):
        ax.add_patch(Rectangle((x + i * width, y), width, height, fc=color, ec="black", lw=0.8))
        ax.text(x + (i + 0.5) * width, y + height / 2, label, ha="center", va="center", fontsize=fontsize)
        centres.append((x + (i + 0.5) * width, y + height / 2))
    return centres


def step_loop():
    """Lesson 1: the engine loop. Every step the scheduler re-forms the batch (iteration-level scheduling)."""
    fig, ax = _figure(9, 5, (0, 10), (0, 6))
    waiting = _box(ax, 1.4, 3, "waiting queue\n(new requests arrive)", COLORS[3])
    schedule = _box(ax, 5, 5.1, "Scheduler.schedule()\nrunning first, then waiting,\nwithin max_num_batched_tokens,\n"
                    "max_num_seqs and free KV blocks", COLORS[0])
    forward = _box(ax, 8.4, 3, "ModelRunner.execute_model()\none forward pass over\nevery scheduled token", COLORS[1])
    sample = _box(ax, 5, 0.9, "Sampler: one token per\nrequest that finished its prompt", COLORS[2])
    update = _box(ax, 5, 3, "update_from_output()\nappend tokens; finished\nrequests free their blocks", "white")
    _arrow(ax, waiting, schedule, "admit", rad=-0.2)
    _arrow(ax, schedule, forward, "SchedulerOutput", rad=-0.2)
    _arrow(ax, forward, sample, "logits", rad=-0.2)
    _arrow(ax, sample, update, "", rad=0)
    _arrow(ax, update, schedule, "next step", rad=0, offset=(0.55, -0.1))
    _arrow(ax, update, waiting, "preempted\n(recompute)", rad=0.0, offset=(0, -0.55))
    ax.text(8.4, 1.0, "finished -> client\n(TTFT, ITL measured here)", ha="center", fontsize=8, color="#555")
    ax.set_title("One engine step: schedule, forward, sample, update; repeat", fontsize=11)
    fig.tight_layout()
    return fig


def block_table():
    """Lesson 2: two requests' logical blocks, their block tables, and the physical blocks of the pool."""
    fig, ax = _figure(11, 4.6, (0, 13), (0, 6))
    ax.text(0.1, 5.5, "logical blocks (block_size 4)", fontsize=9, weight="bold")
    ax.text(5.0, 5.5, "block tables", fontsize=9, weight="bold")
    ax.text(8.2, 5.5, "block pool (physical KV blocks)", fontsize=9, weight="bold")
    tables = {"A": (["The cat sat on", "the mat and", "purred"], [7, 1, 4], COLORS[0], 4.2),
              "B": (["Once upon a time", "there was"], [2, 9], COLORS[1], 1.8)}
    owner = {}
    for name, (chunks, table, color, y) in tables.items():
        ax.text(0.1, y + 0.7, f"request {name}", fontsize=9)
        _cells(ax, 0.1, y, chunks, [color] * len(chunks), width=1.5, fontsize=7)
        cells = _cells(ax, 5.0, y, [str(b) for b in table], [color] * len(table))
        for (cx, cy), block in zip(cells, table):
            owner[block] = (color, (cx, cy))
    pool = _cells(ax, 8.2, 2.6, [str(b) for b in range(6)], [owner.get(b, ("white",))[0] for b in range(6)])
    pool += _cells(ax, 8.2, 1.9, [str(b) for b in range(6, 12)], [owner.get(b, ("white",))[0] for b in range(6, 12)])
    for block, (_, (cx, cy)) in owner.items():
        px, py = pool[block]
        _arrow(ax, (cx, cy - 0.25 if cy > py else cy + 0.25), (px, py + 0.25 if cy > py else py - 0.25),
               color="#888", rad=0.15)
    ax.text(8.2, 1.2, "white: free (in the free queue); a block holds 4 tokens' K and V in every layer\n"
            "slot of token t = table[t // 4] * 4 + t % 4", fontsize=7.5, color="#555")
    ax.set_title("PagedAttention: a block table maps each request's logical blocks to any free physical block",
                 fontsize=11)
    fig.tight_layout()
    return fig


def hash_chain():
    """Lesson 4: each full block's hash chains its parent's, so a hit on block i means blocks 0..i all match."""
    fig, ax = _figure(11, 4.2, (0, 12), (0, 5))
    y = {"first request": 3.6, "second request": 1.5}
    for label, row in y.items():
        ax.text(0.1, row + 0.75, label, fontsize=9, weight="bold")
    first = [_box(ax, 1.6 + 2.6 * i, y["first request"], text, COLORS[0] if i < 2 else "white", fontsize=7.5)
             for i, text in enumerate(["system prompt\ntokens 0-15\nh0 = H(None, t0..15)",
                                       "system prompt\ntokens 16-31\nh1 = H(h0, t16..31)",
                                       "question A\ntokens 32-47\nh2 = H(h1, t32..47)",
                                       "tokens 48-50\n(partial block:\nnot hashed)"])]
    second = [_box(ax, 1.6 + 2.6 * i, y["second request"], text, COLORS[2] if i < 2 else "white", fontsize=7.5)
              for i, text in enumerate(["same 16 tokens\nh0: hit", "same 16 tokens\nh1: hit",
                                        "question B\nh2' != h2: miss", "..."])]
    for row in (first, second):
        for a, b in zip(row, row[1:]):
            _arrow(ax, a, b, "parent", fontsize=7)
    for a, b in zip(first[:2], second[:2]):
        _arrow(ax, a, b, "", color="#2a7", linestyle="dashed")
    ax.text(6.0, 0.3, "cached blocks are found by hash; the second request's prefill starts at token 32 "
            "(extra keys such as cache_salt enter h0)", ha="center", fontsize=8, color="#555")
    ax.set_title("Prefix caching: a hash chain over full blocks", fontsize=11)
    fig.tight_layout()
    return fig


def propose_verify(k: int = 4, accepted: int = 2):
    """Lesson 5: a proposer drafts k tokens, one target pass scores k + 1 positions, the longest agreeing prefix
    is kept plus one token from the target, so every step emits between 1 and k + 1 tokens."""
    fig, ax = _figure(11, 3.8, (0, 12), (0, 4.6))
    ax.text(0.1, 3.9, f"1. propose (n-gram lookup, a draft model, EAGLE/Medusa heads): {k} draft tokens",
            fontsize=9)
    _cells(ax, 0.4, 3.1, ["context", *[f"d{i + 1}" for i in range(k)]], ["#eee", *[COLORS[3]] * k], width=1.1)
    ax.text(0.1, 2.4, f"2. verify: one target forward over the last token + {k} drafts scores {k + 1} positions",
            fontsize=9)
    marks = ["ok"] * accepted + ["reject"] + ["-"] * (k - accepted - 1)
    colors = [COLORS[2]] * accepted + ["#f4cccc"] + ["#eee"] * (k - accepted - 1)
    _cells(ax, 1.5, 1.6, marks, colors, width=1.1)
    ax.text(0.1, 0.9, f"3. emit d1..d{accepted} and the target's own token at position {accepted + 1} "
            f"({accepted + 1} tokens this step); the rejected drafts' KV slots are given back", fontsize=9)
    _cells(ax, 1.5, 0.1, [*[f"d{i + 1}" for i in range(accepted)], "t*"], [COLORS[2]] * accepted + [COLORS[0]],
           width=1.1)
    ax.set_title("Speculative decoding: propose k, verify in one pass, keep the agreeing prefix + 1", fontsize=11)
    fig.tight_layout()
    return fig


def request_sequence():
    """Lesson 6: the sequence diagram of one streamed request, numbered as the lesson's table and trace are."""
    lanes = ["client", "API server", "engine core", "scheduler +\nKV cache", "model runner\n+ sampler"]
    messages = [(0, 1, "1 POST /v1/completions"), (1, 1, "2 tokenize, check length"),
                (1, 2, "3 EngineCoreRequest (ZeroMQ)"), (2, 3, "4-6 schedule: admit, allocate slots"),
                (2, 4, "7-9 forward + sample"), (4, 2, "token"), (2, 2, "10 detokenize"),
                (2, 1, "11 outputs (ZeroMQ)"), (1, 0, "12 SSE chunk"), (2, 3, "next step: 4-12 again ...")]
    fig, ax = _figure(11, 5.6, (-0.5, len(lanes) * 2.4 - 1.5), (0, len(messages) + 1.8))
    top = len(messages) + 1
    for i, lane in enumerate(lanes):
        x = i * 2.4
        _box(ax, x, top + 0.3, lane, COLORS[i % len(COLORS)], fontsize=8.5)
        ax.plot([x, x], [0.2, top - 0.2], color="#999", lw=1, ls="--")
    for row, (src, dst, label) in enumerate(messages):
        y = top - 1 - row
        if src == dst:  # work inside one box: a short loop
            ax.annotate("", (src * 2.4 + 0.05, y - 0.35), (src * 2.4 + 0.05, y),
                        arrowprops=dict(arrowstyle="-|>", color=ARROW, connectionstyle="arc3,rad=-1.2"))
            ax.text(src * 2.4 + 0.35, y - 0.2, label, fontsize=7.5, color="#a33", va="center")
        else:
            _arrow(ax, (src * 2.4, y), (dst * 2.4, y), label, fontsize=7.5, offset=(0, 0.04))
    ax.set_title("One streamed request, box by box (the numbers are lesson 6's table and trace events)", fontsize=11)
    fig.tight_layout()
    return fig


def pd_layout():
    """Lesson 3: colocated instances with chunked prefill against xP+yD disaggregation and its KV transfer."""
    fig, ax = _figure(11, 4.8, (0, 12), (0, 6))
    ax.text(0.1, 5.5, "colocated (chunked prefill)", fontsize=9, weight="bold")
    router = _box(ax, 1.3, 4.5, "router", COLORS[3])
    for i, y in enumerate((5.0, 4.0)):
        inst = _box(ax, 5.2, y, f"instance {i}: each step mixes decodes and\nprefill chunks within the token budget",
                    COLORS[0], fontsize=8)
        _arrow(ax, router, inst)
    ax.text(8.3, 4.5, "one knob trades TTFT for ITL:\nthe token budget", fontsize=8, color="#555", va="center")
    ax.plot([0.1, 11.9], [3.25, 3.25], color="#ccc", lw=1)
    ax.text(0.1, 2.8, "disaggregated (xP + yD)", fontsize=9, weight="bold")
    router2 = _box(ax, 1.3, 1.6, "router /\nproxy", COLORS[3])
    prefill = _box(ax, 4.4, 1.6, "prefill instances (x)\nkv_role: producer\ncompute-bound", COLORS[1])
    decode = _box(ax, 9.0, 1.6, "decode instances (y)\nkv_role: consumer\nmemory-bound", COLORS[2])
    _arrow(ax, router2, prefill, "prompt")
    _arrow(ax, prefill, decode, "KV cache over the link\n2 x layers x kv_heads x head_dim\nx bytes x prompt tokens",
           fontsize=7.5, offset=(0, 0.25))
    _arrow(ax, decode, router2, "output tokens", rad=-0.3, offset=(0, -1.45))
    ax.set_title("Prefill/decode disaggregation: two pools sized separately, at the price of a KV transfer",
                 fontsize=11)
    fig.tight_layout()
    return fig


def sweep_loop():
    """Lesson 7: the simulator sweeps the grid, the SLO picks from the front, the engine checks a few points."""
    fig, ax = _figure(11, 3.2, (0, 12), (1, 4.2))
    steps = [("grid.yaml\nknob -> values\n(hundreds of points)", COLORS[3]),
             ("simulator\nevery point, seconds each\n(calibrated or GPU profile)", COLORS[0]),
             ("Pareto front\nthroughput vs latency;\ngoodput under the SLO", COLORS[2]),
             ("engine\nmeasures a few points\n(--measure-front)", COLORS[1]),
             ("trust the pick?\nSpearman rho of\nsimulated vs measured", COLORS[4])]
    boxes = [_box(ax, 1.2 + 2.4 * i, 2.2, text, color, fontsize=8) for i, (text, color) in enumerate(steps)]
    for a, b in zip(boxes, boxes[1:]):
        _arrow(ax, a, b)
    _arrow(ax, boxes[-1], boxes[0], "rho low: fix the profile, not the pick", rad=0.25, offset=(0, 1.2))
    ax.set_title("serving-lab sweep: simulate everything, measure what you will deploy", fontsize=11)
    fig.tight_layout()
    return fig
