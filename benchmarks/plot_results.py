"""Draw docs/img/bench_*.png from the docs/img/bench_*.json results the benchmark scripts wrote.

    python benchmarks/plot_results.py

Kept apart from the measuring scripts so a plot can be redrawn without re-measuring, and so the
scripts do not need matplotlib (``nox -s bench`` installs it). A result file that is missing is
skipped with a note: the plots show what was measured, nothing else.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from _bench import RESULTS

__all__ = ["main"]


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"bench_{name}.json"
    if not path.exists():
        print(f"skipped: {path.name} not found (run the benchmark that writes it)")
        return None
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _save(fig: Any, result: dict[str, Any], name: str, bottom: float = 0.04) -> None:
    """Lay out ``fig``, stamp it with the run's date and machine, write docs/img/<name>."""
    fig.tight_layout(rect=(0, bottom, 1, 1))
    m = result["machine"]
    fig.text(0.01, 0.01, f"{m['date']}, {m['cpu']}, {m['cores']} cores, load {m['load_avg_1_5_15']}", fontsize=7)
    fig.savefig(RESULTS / name, dpi=110)
    print(f"wrote {name}")


def plot_overhead(plt: Any) -> None:
    """Per-step time of the tiny model and the MLP ratio: plain vs phalanx vs Lightning."""
    result = _load("trainer_overhead")
    if result is None:
        return
    runs, calls = result["data"]["runs"], result["data"]["calls_per_step_tiny"]
    names = list(runs["tiny"])
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    for ax, clock, label in ((axes[0], 1, "CPU"), (axes[1], 0, "wall")):
        values = [sorted(r[clock] * 1e6 for r in runs["tiny"][n]) for n in names]
        medians = [v[len(v) // 2] for v in values]
        errors = [[m - v[0] for m, v in zip(medians, values)], [v[-1] - m for m, v in zip(medians, values)]]
        bars = ax.bar(names, medians, yerr=errors, capsize=4, color=["#888", "#2a7", "#c55"][: len(names)])
        for bar, name in zip(bars, names):
            ax.annotate(
                f"{calls[name]:.0f} calls",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 6),
                textcoords="offset points",
            )
        ax.set_ylabel(f"us per step ({label} time)")
        ax.set_title(f"tiny model (32-32-4, batch 8), {label}")
    ratios = [sorted(o[0] / p[0] for o, p in zip(runs["mlp"][n], runs["mlp"]["plain"])) for n in names]
    axes[2].bar(names, [r[len(r) // 2] for r in ratios], color=["#888", "#2a7", "#c55"][: len(names)])
    axes[2].axhline(1.02, ls="--", color="k", lw=0.8, label="target 1.02")
    axes[2].set_ylim(0.8, max(1.4, max(max(r) for r in ratios) + 0.05))
    axes[2].set_title("MLP 256-1024-1024-10 / plain (wall)")
    axes[2].legend(fontsize=8)
    _save(fig, result, "bench_overhead.png")


def plot_memory(plt: Any) -> None:
    """Per-rank model-state memory of each strategy next to its analytic bytes-per-parameter expectation."""
    bars: list[tuple[str, float, float]] = []  # label, measured MiB, expected MiB
    stamp = None
    fsdp = _load("fsdp_memory")
    if fsdp is not None:
        d, stamp = fsdp["data"], fsdp
        for variant, label in (("ddp", "ddp"), ("fsdp_raw", "fsdp2 raw"), ("phalanx", "phalanx fsdp")):
            bars.append(
                (
                    label,
                    d["peak_growth_bytes"][variant] / 2**20,
                    d["bytes_per_param_expected"][variant] * d["params"] / 2**20,
                )
            )
    for precision in ("32_true", "bf16_mixed"):
        ds = _load(f"deepspeed_memory_{precision}")
        if ds is not None:
            d, stamp = ds["data"], stamp or ds
            expected = d["bytes_per_param_expected"]
            bars.append((f"ddp ({d['precision']})", d["ddp_mib"], expected["ddp"] * d["params"] / 2**20))
            bars.append((f"ZeRO-3 ({d['precision']})", d["zero3_mib"], expected["zero3"] * d["params"] / 2**20))
    if not bars or stamp is None:
        return
    fig, ax = plt.subplots(figsize=(10, 4))
    xs = range(len(bars))
    ax.bar([x - 0.2 for x in xs], [b[1] for b in bars], width=0.4, label="measured peak per rank", color="#2a7")
    ax.bar(
        [x + 0.2 for x in xs],
        [b[2] for b in bars],
        width=0.4,
        label="analytic: bytes/param x params / ranks",
        color="#bbb",
    )
    ax.set_xticks(list(xs), [b[0] for b in bars], fontsize=8)
    ax.set_ylabel("MiB per rank (params + grads + Adam)")
    ax.set_title("per-rank model-state memory, 2 ranks, ~50M parameters")
    ax.legend(fontsize=8)
    _save(fig, stamp, "bench_memory.png")


def plot_launch(plt: Any) -> None:
    """Launch-to-first-step per start method, torchrun as the reference."""
    result = _load("ddp")
    if result is None or "launch_seconds" not in result["data"]:
        return
    launches = result["data"]["launch_seconds"]
    names = list(launches)
    values = [sorted(v) for v in launches.values()]
    medians = [v[len(v) // 2] for v in values]
    errors = [[m - v[0] for m, v in zip(medians, values)], [v[-1] - m for m, v in zip(medians, values)]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(names, medians, yerr=errors, capsize=4, color=["#888"] + ["#2a7"] * (len(names) - 1))
    ax.set_ylabel("seconds, command start -> slowest rank's first step")
    ax.set_title(f"launch to first step, {result['data']['devices']} ranks")
    _save(fig, result, "bench_launch.png", bottom=0.05)


#: One colour per strategy in the sweep plots.
_COLORS = {
    "ddp": "#555",
    "fsdp": "#2a7",
    "deepspeed_stage_2": "#c83",
    "deepspeed_stage_3": "#c33",
    "model_parallel": "#36c",
}


def plot_memory_sweep(plt: Any) -> None:
    """Per-rank bytes vs parameter count per strategy, measured (markers) and planned (dashed), per rank count."""
    result = _load("memory_sweep")
    if result is None:
        return
    data = result["data"]
    rank_counts = sorted({r["ranks"] for r in data["results"]})
    fig, axes = plt.subplots(1, len(rank_counts), figsize=(5.6 * len(rank_counts), 4.4), sharey=True, squeeze=False)
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
    _save(fig, result, "bench_memory_sweep.png")


def plot_estimate_vs_measured(plt: Any) -> None:
    """The planner's per-rank estimate against the measured bytes, every point of the sweep, with a +-10 % band."""
    result = _load("memory_sweep")
    if result is None:
        return
    rows = result["data"]["results"]
    if not rows:
        return
    fig, (ax, rax) = plt.subplots(1, 2, figsize=(11, 4.8))
    measured = [r[k] / 2**20 for r in rows for k in ("measured_live", "peak_rss_growth")]
    low, high = min(measured) / 1.5, max(measured) * 1.5
    line = [low, high]
    ax.fill_between(line, [v * 0.9 for v in line], [v * 1.1 for v in line], color="#ddd", label="+-10 %")
    ax.plot(line, line, "k-", lw=0.8, label="estimate = measured")
    markers = {2: "o", 4: "s"}
    for name in result["data"]["strategies"]:
        for ranks in sorted({r["ranks"] for r in rows}):
            mine = [r for r in rows if r["strategy"] == name and r["ranks"] == ranks]
            if mine:
                ys = [r["estimate"]["total"] / 2**20 for r in mine]
                style = {
                    "marker": markers.get(ranks, "^"),
                    "ls": "",
                    "color": _COLORS.get(name),
                    "ms": 6,
                    "alpha": 0.85,
                }
                for key, extra in (("measured_live", {}), ("peak_rss_growth", {"mfc": "none", "alpha": 0.6})):
                    xs = [r[key] / 2**20 for r in mine]
                    label = f"{name}, {ranks} ranks" if key == "measured_live" else None
                    ax.plot(xs, ys, label=label, **{**style, **extra})
                    rax.plot(xs, [y / x for x, y in zip(xs, ys)], **{**style, **extra})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.set_xlabel("measured MiB per rank (filled: live tensors; hollow: peak RSS growth)")
    ax.set_ylabel("planner estimate MiB per rank (phalanx plan total)")
    ax.set_title("estimate vs measured, memory sweep")
    ax.legend(fontsize=6.5, loc="upper left", ncol=1)
    rax.axhspan(0.9, 1.1, color="#ddd")
    rax.axhline(1.0, color="k", lw=0.8)
    rax.set_xscale("log")
    rax.set_xlim(low, high)
    rax.grid(True, which="both", lw=0.3, alpha=0.5)
    rax.set_xlabel("measured MiB per rank")
    rax.set_ylabel("estimate / measured")
    rax.set_title("as a ratio (filled: live tensors, hollow: peak RSS)")
    _save(fig, result, "bench_estimate_vs_measured.png")


def main() -> int:
    """Draw every plot whose results exist."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for plot in (plot_overhead, plot_memory, plot_launch, plot_memory_sweep, plot_estimate_vs_measured):
        plot(plt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
