"""What the lessons' diagrams share: a blank canvas, rounded text boxes, labelled arrows between them, and rows of
cells (blocks, tokens), in one palette. Each lesson's diagram is a function in its lesson's module
(`continuous_batching.step_loop`, `paged_attention.block_table`, ...).

Why drawn in code: the notebooks draw them (a cell tagged `figure:<name>` becomes the image its lesson embeds,
lessons/tools/course_site.py), so a diagram changes in a reviewed diff beside the code it describes, and it
names the same functions and knobs. Each diagram returns its figure; nothing here runs a model.
"""

from __future__ import annotations

from collections.abc import Sequence

BOX = dict(boxstyle="round,pad=0.3", fc="white", ec="black", lw=1)
COLORS = ("#cfe2f3", "#f9cb9c", "#d9ead3", "#fff2cc", "#ead1dc", "#d0e0e3")
ARROW = "#444"


def canvas(width: float, height: float, xlim: tuple[float, float], ylim: tuple[float, float]):
    """A blank figure of `width` x `height` inches, axes hidden, drawn in data units over `xlim` x `ylim`."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.axis("off")
    return fig, ax


def box(ax, x: float, y: float, text: str, color: str = "white", fontsize: float = 9, **style):
    """A rounded text box centred at (x, y); its size follows the text."""
    return ax.text(x, y, text, ha="center", va="center", fontsize=fontsize,
                   bbox={**BOX, "fc": color, **style})


def arrow(ax, start, end, label: str = "", rad: float = 0.0, color: str = ARROW, fontsize: float = 8,
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


def cell_row(ax, x: float, y: float, labels: Sequence[str], colors: Sequence[str], width: float = 0.6,
           height: float = 0.5, fontsize: float = 8) -> list[tuple[float, float]]:
    """A row of square cells (blocks, tokens) from (x, y), left to right; returns each cell's centre."""
    from matplotlib.patches import Rectangle

    centres = []
    for i, (label, color) in enumerate(zip(labels, colors)):
        ax.add_patch(Rectangle((x + i * width, y), width, height, fc=color, ec="black", lw=0.8))
        ax.text(x + (i + 0.5) * width, y + height / 2, label, ha="center", va="center", fontsize=fontsize)
        centres.append((x + (i + 0.5) * width, y + height / 2))
    return centres
