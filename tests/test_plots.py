"""Every plot of docs/benchmarks.md renders from the committed results with nothing cut off.

``benchmarks/plot_results.py`` draws docs/img/bench_*.png from docs/img/bench_*.json. A newcomer
found a y label running off the canvas and into the date stamp; this draws every plot from the
committed JSONs into a temporary folder (docs/img is never written) and holds each figure's
text to the canvas: matplotlib's tight bounding box inside the figure, and the stamp clear of
every other label.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest
from matplotlib.text import Text

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
#: Tolerance in pixels: anti-aliasing may put a glyph's edge half a pixel out.
SLACK = 1.0
#: The plots docs/benchmarks.md shows; a plot that stops being drawn fails here.
NAMES = [
    "bench_overhead.png",
    "bench_memory.png",
    "bench_launch.png",
    "bench_memory_sweep.png",
    "bench_estimate_vs_measured.png",
]


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Draw every plot once into a temporary folder; the figures stay open for inspection."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import plot_results
    finally:
        sys.path.remove(str(BENCHMARKS))
    out = tmp_path_factory.mktemp("img")
    drawn = plot_results.draw(out, close=False)
    yield {"out": out, "figures": drawn, "expected": list(plot_results.PLOTS), "dpi": plot_results.DPI}
    import matplotlib.pyplot as plt

    for fig in drawn.values():
        plt.close(fig)


def _renderer(fig: Any) -> Any:
    """Lay ``fig`` out at its own dpi (savefig drew it at another) and return the renderer that did."""
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _drawn_tick_labels(fig: Any) -> set[int]:
    """ids of the tick labels inside their axis's view interval: only those are drawn."""
    drawn = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if low <= tick.get_loc() <= high:
                    drawn.update({id(tick.label1), id(tick.label2)})
    return drawn


def _texts(fig: Any, renderer: Any) -> list[tuple[Text, Any]]:
    """Every text ``fig`` draws (visible, non-empty, tick labels in view) with its extent in pixels."""
    ticks = {
        id(label)
        for ax in fig.axes
        for axis in (ax.xaxis, ax.yaxis)
        for tick in axis.get_major_ticks() + axis.get_minor_ticks()
        for label in (tick.label1, tick.label2)
    }
    drawn = _drawn_tick_labels(fig)
    found = []
    for text in fig.findobj(Text):
        if not text.get_visible() or not text.get_text().strip() or (id(text) in ticks and id(text) not in drawn):
            continue
        found.append((text, text.get_window_extent(renderer)))
    return found


def test_every_plot_is_drawn_from_the_committed_results(figures: dict[str, Any]) -> None:
    """Each plot exists, at the figure's size (nothing cropped), without touching docs/img."""
    assert sorted(figures["expected"]) == sorted(NAMES), "plot_results.PLOTS changed: update NAMES here"
    assert sorted(figures["figures"]) == sorted(NAMES), "a committed bench_*.json is missing or unreadable"
    for name, fig in figures["figures"].items():
        png = figures["out"] / name
        assert png.stat().st_size > 10_000, f"{name} is nearly empty"
        width, height = matplotlib.image.imread(png).shape[1::-1]
        assert (width, height) == tuple(round(v) for v in fig.get_size_inches() * figures["dpi"]), name


@pytest.mark.parametrize("name", NAMES)
def test_labels_fit_inside_the_figure(figures: dict[str, Any], name: str) -> None:
    """The tight bounding box of everything drawn lies inside the canvas; every text does too."""
    fig = figures["figures"][name]
    renderer = _renderer(fig)
    canvas = fig.bbox
    tight = fig.get_tightbbox(renderer).transformed(fig.dpi_scale_trans)  # inches -> pixels
    assert tight.x0 >= canvas.x0 - SLACK and tight.y0 >= canvas.y0 - SLACK, f"{name}: cut off left/bottom: {tight}"
    assert tight.x1 <= canvas.x1 + SLACK and tight.y1 <= canvas.y1 + SLACK, f"{name}: cut off right/top: {tight}"
    for text, box in _texts(fig, renderer):
        inside = box.x0 >= -SLACK and box.y0 >= -SLACK and box.x1 <= canvas.x1 + SLACK and box.y1 <= canvas.y1 + SLACK
        assert inside, f"{name}: {text.get_text()!r} runs off the canvas ({box} vs {canvas})"


@pytest.mark.parametrize("name", NAMES)
def test_the_stamp_and_the_axis_labels_overlap_nothing(figures: dict[str, Any], name: str) -> None:
    """The date/machine stamp, axis labels and titles overlap no other text (the launch plot's y label did)."""
    fig = figures["figures"][name]
    renderer = _renderer(fig)
    texts = _texts(fig, renderer)
    stamps = [box for text, box in texts if text.get_gid() == "stamp"]
    assert len(stamps) == 1, f"{name}: expected one date/machine stamp, found {len(stamps)}"
    guarded = [(t, b) for t, b in texts if t.get_gid() == "stamp"]
    for ax in fig.axes:
        guarded += [(t, t.get_window_extent(renderer)) for t in (ax.xaxis.label, ax.yaxis.label, ax.title)]
    for text, box in guarded:
        if not text.get_text():
            continue
        for other, other_box in texts:
            if other is not text and box.overlaps(other_box):
                raise AssertionError(f"{name}: {text.get_text()!r} overlaps {other.get_text()!r}")
