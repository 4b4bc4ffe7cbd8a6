"""Draw docs/img/bench_*.png from the docs/img/bench_*.json results the benchmark scripts wrote.

    python benchmarks/plot_results.py [--out DIR]

Kept apart from the measuring scripts so a plot can be redrawn without re-measuring, and so the
scripts do not need matplotlib (``nox -s bench`` installs it). A result file that is missing is
skipped with a note: the plots show what was measured, nothing else. ``--out`` writes the PNGs
elsewhere (tests/test_plots.py draws into a temporary folder and never touches docs/img).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _bench import RESULTS

__all__ = ["DPI", "PLOTS", "draw", "main"]

#: Resolution of the PNGs (the docs page shows them at their pixel size).
DPI = 110

#: Room kept under every figure for the date/machine stamp, in inches (a fraction would shrink
#: with the figure and let the stamp run into the lowest axis label on short figures).
_STAMP_INCHES = 0.22
#: One colour per strategy (sweep plots) and per loop (plain, phalanx, Lightning).
_COLORS = {
    "ddp": "#555",
    "fsdp": "#2a7",
    "deepspeed_stage_2": "#c83",
    "deepspeed_stage_3": "#c33",
    "model_parallel": "#36c",
}
_LOOP_COLORS = ["#888", "#2a7", "#c55"]
#: Sweep models from this size up are what the planner's accuracy rows judge; below it fixed
#: costs (library buffers, one-layer terms) dominate the ratio, so those points are drawn faded.
_JUDGED_PARAMS = 10_000_000


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"bench_{name}.json"
    if not path.exists():
        print(f"skipped: {path.name} not found (run the benchmark that writes it)")
        return None
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _save(fig: Any, result: dict[str, Any], out: Path, name: str) -> Any:
    """Stamp ``fig`` with the run's date and machine, lay it out above the stamp, write out/<name>."""
    m = result["machine"]
    stamp = f"{m['date']}, {m['cpu']}, {m['cores']} cores, load {m['load_avg_1_5_15']}"
    fig.text(0.01, 0.04 / fig.get_figheight(), stamp, fontsize=7, gid="stamp")
    fig.tight_layout(rect=(0, _STAMP_INCHES / fig.get_figheight(), 1, 1))
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / name, dpi=DPI)
    print(f"wrote {out / name}")
    return fig


def _spread(values: Sequence[float]) -> tuple[float, float, float]:
    """Median, min and max: every bar in these plots is a median with its full range as error bar."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2], ordered[0], ordered[-1]


def _bars_with_range(ax: Any, names: list[str], spreads: list[tuple[float, float, float]], colors: list[str]) -> Any:
    medians = [s[0] for s in spreads]
    errors = [[s[0] - s[1] for s in spreads], [s[2] - s[0] for s in spreads]]
    return ax.bar(names, medians, yerr=errors, capsize=4, color=colors[: len(names)])


def plot_overhead(plt: Any, out: Path) -> Any:
    """Per-step time of the tiny model and the MLP step-time ratio: plain vs phalanx vs Lightning.

    One panel for the tiny model: CPU and wall time are the same on one thread, so the CPU panel
    the plot used to have repeated the wall one. Both panels start at 0 and show min..max.
    """
    result = _load("trainer_overhead")
    if result is None:
        return None
    runs, calls = result["data"]["runs"], result["data"]["calls_per_step_tiny"]
    names = list(runs["tiny"])
    fig, (ax, rax) = plt.subplots(1, 2, figsize=(10, 4))
    tiny = [_spread([r[0] * 1e6 for r in runs["tiny"][n]]) for n in names]
    cpu = [_spread([r[1] * 1e6 for r in runs["tiny"][n]])[0] for n in names]
    cpu_gap = max(abs(c - w[0]) / w[0] for c, w in zip(cpu, tiny)) * 100
    bars = _bars_with_range(ax, names, tiny, _LOOP_COLORS)
    for bar, name, (median, _, high) in zip(bars, names, tiny):
        ax.annotate(
            f"{median:.0f} µs, {calls[name]:.0f} calls",
            (bar.get_x() + bar.get_width() / 2, high),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 4),
            textcoords="offset points",
        )
    ax.set_ylim(0, max(s[2] for s in tiny) * 1.15)
    ax.set_ylabel("µs per step (wall clock)")
    ax.set_title("tiny model (32-32-4, batch 8), per step")
    ax.text(
        0.02,
        0.97,
        f"CPU time = wall time within {cpu_gap:.2f} % (one thread)",
        transform=ax.transAxes,
        fontsize=8,
        va="top",
    )
    plain = runs["mlp"]["plain"]
    ratios = [_spread([o[0] / p[0] for o, p in zip(runs["mlp"][n], plain)]) for n in names]
    bars = _bars_with_range(rax, names, ratios, _LOOP_COLORS)
    for bar, (median, low, high) in zip(bars, ratios):
        rax.annotate(
            f"{median:.3f}\n[{low:.3f}..{high:.3f}]",
            (bar.get_x() + bar.get_width() / 2, high),
            ha="center",
            va="bottom",
            fontsize=7.5,
            xytext=(0, 4),
            textcoords="offset points",
        )
    rax.axhline(1.02, ls="--", color="k", lw=0.8, label="target 1.02")
    rax.set_ylim(0, max(1.3, max(r[2] for r in ratios) * 1.25))
    rax.set_ylabel("step time / plain loop's (wall)")
    rax.set_title("MLP 256-1024-1024-10, ratio to plain")
    rax.legend(fontsize=8, loc="lower right")
    return _save(fig, result, out, "bench_overhead.png")


def plot_memory(plt: Any, out: Path) -> Any:
    """Per-rank model-state memory of each strategy next to its analytic bytes-per-parameter expectation.

    Each benchmark measures its own ddp baseline, in its own way, in the same run: the bars are
    grouped by benchmark so the two ddp bars read as two baselines, not as two ddp variants.
    """
    groups: list[tuple[str, list[tuple[str, float, float]]]] = []  # caption, [(label, measured, expected)]
    stamp = None
    fsdp = _load("fsdp_memory")
    if fsdp is not None:
        d, stamp = fsdp["data"], fsdp
        bars = [
            (label, d["peak_growth_bytes"][v] / 2**20, d["bytes_per_param_expected"][v] * d["params"] / 2**20)
            for v, label in (("ddp", "ddp\n(baseline)"), ("fsdp_raw", "fsdp2 raw"), ("phalanx", "phalanx fsdp"))
        ]
        groups.append(("bench_fsdp_memory.py, float32:\npeak RSS growth", bars))
    for precision in ("32_true", "bf16_mixed"):
        ds = _load(f"deepspeed_memory_{precision}")
        if ds is not None:
            d, stamp = ds["data"], stamp or ds
            expected = d["bytes_per_param_expected"]
            bars = [
                ("ddp\n(baseline)", d["ddp_mib"], expected["ddp"] * d["params"] / 2**20),
                ("phalanx ZeRO-3", d["zero3_mib"], expected["zero3"] * d["params"] / 2**20),
            ]
            groups.append((f"bench_deepspeed_memory.py, {d['precision']}:\npeak live tensors", bars))
    if not groups or stamp is None:
        return None
    fig, ax = plt.subplots(figsize=(10, 4.6))
    flat = [bar for _, bars in groups for bar in bars]
    xs = range(len(flat))
    ax.bar([x - 0.2 for x in xs], [b[1] for b in flat], width=0.4, label="measured peak per rank", color="#2a7")
    ax.bar(
        [x + 0.2 for x in xs],
        [b[2] for b in flat],
        width=0.4,
        label="analytic: bytes/param x params / ranks",
        color="#bbb",
    )
    ax.set_xticks(list(xs), [b[0] for b in flat], fontsize=8)
    first = 0
    for caption, bars in groups:
        last = first + len(bars) - 1
        if first:
            ax.axvline(first - 0.5, color="k", lw=0.8, ls=":")
        ax.annotate(
            caption,
            ((first + last) / 2, 0),
            xycoords=("data", "axes fraction"),
            xytext=(0, -30),
            textcoords="offset points",
            ha="center",
            va="top",
            fontsize=8,
        )
        first = last + 1
    ax.set_ylim(0, max(max(b[1], b[2]) for b in flat) * 1.2)
    ax.set_ylabel("MiB per rank (params + grads + Adam)")
    ax.set_title("per-rank model-state memory, 2 ranks, ~50M parameters; each benchmark has its own ddp baseline")
    ax.legend(fontsize=8, loc="upper right")
    return _save(fig, stamp, out, "bench_memory.png")


def plot_launch(plt: Any, out: Path) -> Any:
    """Launch-to-first-step per start method, torchrun as the reference."""
    result = _load("ddp")
    if result is None or "launch_seconds" not in result["data"]:
        return None
    launches = result["data"]["launch_seconds"]
    names = list(launches)
    fig, ax = plt.subplots(figsize=(6.4, 4))
    _bars_with_range(ax, names, [_spread(v) for v in launches.values()], ["#888"] + ["#2a7"] * (len(names) - 1))
    ax.set_ylabel("seconds")
    ax.set_title(
        f"launch to first step, {result['data']['devices']} ranks\n(command start -> slowest rank's first step)"
    )
    return _save(fig, result, out, "bench_launch.png")


def plot_memory_sweep(plt: Any, out: Path) -> Any:
    """Per-rank bytes vs parameter count per strategy, measured (markers) and planned (dashed), per rank count."""
    result = _load("memory_sweep")
    if result is None:
        return None
    data = result["data"]
    rank_counts = sorted({r["ranks"] for r in data["results"]})
    fig, axes = plt.subplots(1, len(rank_counts), figsize=(5.6 * len(rank_counts), 4.6), sharey=True, squeeze=False)
    for ax, ranks in zip(axes[0], rank_counts):
        for name in data["strategies"]:
            rows = sorted(
                (r for r in data["results"] if r["ranks"] == ranks and r["strategy"] == name), key=lambda r: r["params"]
            )
            if not rows:
                continue
            xs = [r["params"] for r in rows]
            color = _COLORS.get(name)
            ax.plot(xs, [r["measured_live"] / 2**20 for r in rows], "o", color=color, label=name)
            ax.plot(xs, [r["peak_rss_growth"] / 2**20 for r in rows], "o", mfc="none", ms=9, color=color, alpha=0.6)
            ax.plot(xs, [r["estimate"]["total"] / 2**20 for r in rows], "--", color=color, lw=1.2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(True, which="both", lw=0.3, alpha=0.5)
        ax.set_xlabel("parameters")
        ax.set_title(f"{ranks} CPU ranks (gloo), AdamW, float32")
        skipped = [x for x in data.get("left_out", []) if f" x{ranks} " in x]
        if skipped:
            ax.text(0.02, 0.98, "not run: " + "\n".join(skipped), transform=ax.transAxes, fontsize=6.5, va="top")
    axes[0][0].set_ylabel("MiB per rank")
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles += [
        plt.Line2D([], [], color="k", marker="o", ls=""),
        plt.Line2D([], [], color="k", marker="o", mfc="none", ls=""),
        plt.Line2D([], [], color="k", ls="--"),
    ]
    labels += ["measured: live tensors", "measured: peak RSS growth", "planner estimate (phalanx plan)"]
    axes[0][-1].legend(handles, labels, fontsize=7, loc="lower right")
    return _save(fig, result, out, "bench_memory_sweep.png")


def _pct_range(ratios: list[float]) -> str:
    """``+20..+23 %``: how far the estimate is off, in the plainest unit."""
    low, high = (round((r - 1) * 100) for r in (min(ratios), max(ratios)))
    return f"{low:+d} %" if low == high else f"{low:+d}..{high:+d} %"


def plot_estimate_vs_measured(plt: Any, out: Path) -> Any:
    """The planner's per-rank estimate against the measured bytes, with a +-10 % band.

    Left: every point, coloured by strategy. Right: estimate / measured per strategy, live tensors
    and peak RSS side by side, each column labelled with its range at >= 10M parameters, so which
    strategy is off, by how much and in which direction reads without a legend.
    """
    result = _load("memory_sweep")
    if result is None:
        return None
    rows, strategies = result["data"]["results"], result["data"]["strategies"]
    if not rows:
        return None
    fig, (ax, rax) = plt.subplots(1, 2, figsize=(12, 5.2), gridspec_kw={"width_ratios": [1, 1.25]})
    measures = (("measured_live", "live", {}), ("peak_rss_growth", "RSS", {"mfc": "none"}))
    markers = {2: "o", 4: "s"}
    measured = [r[k] / 2**20 for r in rows for k, _, _ in measures]
    low, high = min(measured) / 1.5, max(measured) * 1.5
    line = [low, high]
    ax.fill_between(line, [v * 0.9 for v in line], [v * 1.1 for v in line], color="#ddd")
    ax.plot(line, line, "k-", lw=0.8)
    for slot, name in enumerate(strategies):
        mine = [r for r in rows if r["strategy"] == name]
        for side, (key, short, extra) in zip((-0.2, 0.2), measures):
            judged = []
            for r in mine:
                big = r["params"] >= _JUDGED_PARAMS
                style = {"marker": markers.get(r["ranks"], "^"), "ls": "", "color": _COLORS.get(name), **extra}
                x, y = r[key] / 2**20, r["estimate"]["total"] / 2**20
                ax.plot([x], [y], ms=6, alpha=0.85 if big else 0.35, **style)
                offset = 0.06 * (1 if r["ranks"] > 2 else -1)
                rax.plot([slot + side + offset], [y / x], ms=6 if big else 4, alpha=0.9 if big else 0.3, **style)
                if big:
                    judged.append(y / x)
            if judged:  # live tensors: label above the column; peak RSS: below it
                above = key == "measured_live"
                rax.annotate(
                    _pct_range(judged),
                    (slot + side, max(judged) if above else min(judged)),
                    xytext=(0, 7 if above else -7),
                    textcoords="offset points",
                    ha="center",
                    va="bottom" if above else "top",
                    fontsize=7,
                    color=_COLORS.get(name),
                )
            rax.annotate(
                short,
                (slot + side, 0),
                xycoords=("data", "axes fraction"),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=7,
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.set_xlabel("measured MiB per rank (filled: live tensors; hollow: peak RSS growth)")
    ax.set_ylabel("planner estimate MiB per rank (phalanx plan total)")
    ax.set_title("estimate vs measured, memory sweep")
    legend = [plt.Line2D([], [], color=_COLORS.get(n), marker="o", ls="", label=n) for n in strategies]
    legend += [
        plt.Line2D([], [], color="k", marker=m, ls="", mfc="none", label=f"{k} ranks") for k, m in markers.items()
    ]
    legend += [plt.Rectangle((0, 0), 1, 1, color="#ddd", label="+-10 % of measured")]
    ax.legend(handles=legend, fontsize=7, loc="upper left")
    rax.axhspan(0.9, 1.1, color="#ddd")
    rax.axhline(1.0, color="k", lw=0.8)
    rax.set_xlim(-0.6, len(strategies) - 0.4)
    ratios = [r["estimate"]["total"] / r[k] for r in rows for k, _, _ in measures]
    rax.set_ylim(min(0.5, min(ratios) - 0.08), max(ratios) + 0.12)
    rax.set_xticks(range(len(strategies)), [n.replace("_", "\n", 1) for n in strategies], fontsize=8)
    rax.grid(True, axis="y", lw=0.3, alpha=0.5)
    rax.set_ylabel("estimate / measured (> 1: over-estimate)")
    rax.set_title(
        f"per strategy; labels: range at >= {_JUDGED_PARAMS // 10**6}M params (faded: smaller models)", fontsize=9
    )
    return _save(fig, result, out, "bench_estimate_vs_measured.png")


#: Every plot, by the file it writes.
PLOTS: dict[str, Callable[[Any, Path], Any]] = {
    "bench_overhead.png": plot_overhead,
    "bench_memory.png": plot_memory,
    "bench_launch.png": plot_launch,
    "bench_memory_sweep.png": plot_memory_sweep,
    "bench_estimate_vs_measured.png": plot_estimate_vs_measured,
}


def draw(out: Path = RESULTS, *, close: bool = True) -> dict[str, Any]:
    """Draw every plot whose results exist into ``out``; return the figures by file name.

    ``close=False`` keeps the figures open for whoever inspects them (the layout test).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = {}
    for name, plot in PLOTS.items():
        fig = plot(plt, out)
        if fig is not None:
            figures[name] = fig
            if close:
                plt.close(fig)
    return figures


def main(argv: list[str] | None = None) -> int:
    """Draw every plot whose results exist."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the PNGs (default: docs/img)")
    draw(parser.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
