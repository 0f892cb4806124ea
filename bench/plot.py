"""Figures of benchmark results, drawn from their JSON (matplotlib, the `bench` extra).

`plot_dispatch(result, path)` draws `bench.dispatch`'s result into one PNG: computations per
second per mode (log scale), and the size sweep, Isthmus throughput relative to JAX op-by-op
against JAX's time per computation, with the 95% line that `smallest_matching_ms` uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

BASELINE_COLOURS = {"jax": "tab:blue", "ray": "tab:orange", "isthmus": "tab:green"}


def _colour(mode: str) -> str:
    return BASELINE_COLOURS.get(mode.split("_", 1)[0], "tab:gray")


def plot_dispatch(result: dict[str, Any], path: Path) -> None:
    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter

    fig, (bars, sweep) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    rates: dict[str, float] = result["computations_per_s"]
    modes = list(rates)
    bars.barh(modes, [rates[m] for m in modes], color=[_colour(m) for m in modes])
    bars.set_xscale("log")
    bars.invert_yaxis()
    bars.set_xlabel("computations per second (log scale; chain16: stages)")
    bars.set_title(f"dispatch of a 4-device psum + add, {result['config']['steps']} per round")
    for y, m in enumerate(modes):
        bars.annotate(f"{rates[m]:,.0f}", (rates[m], y), xytext=(3, 0), textcoords="offset points",
                      va="center", fontsize=8)

    rows = result["size_sweep"]
    ms = [row["jax_ms_per_computation"] for row in rows]
    for mode in ("isthmus_opbyop", "isthmus_chained"):
        points = [(x, row["relative_to_jax"][mode]) for x, row in zip(ms, rows, strict=True)
                  if mode in row["relative_to_jax"]]
        if points:
            sweep.plot(*zip(*points, strict=True), marker="o", label=mode)
    threshold = result["config"]["match_threshold"]
    sweep.axhline(threshold, color="gray", linestyle="--", linewidth=1, label=f"{threshold:.0%} of JAX")
    sweep.axhline(1.0, color="tab:blue", linewidth=1, label="jax_opbyop")
    sweep.set_xscale("log")
    sweep.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    sweep.xaxis.set_minor_formatter(NullFormatter())
    sweep.set_xlabel("JAX op-by-op ms per computation (v @ w + 1, float32[n, n])")
    sweep.set_ylabel("throughput relative to JAX op-by-op")
    sweep.set_title("size sweep")
    sweep.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_control_flow(result: dict[str, Any], path: Path) -> None:
    """`bench.control_flow`'s iterations per second per mode (log scale)."""
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates: dict[str, float] = result["iterations_per_s"]
    modes = list(rates)
    colours = {"ingraph": "tab:green", "client": "tab:orange", "jax": "tab:blue"}
    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.barh(modes, [rates[m] for m in modes], color=[colours.get(m.split("_")[0], "tab:gray") for m in modes])
    ax.set_xscale("log")
    ax.set_xlabel("loop iterations per second (log)")
    ratio = result["ratios"]["ingraph_vs_client_loop"]
    ax.set_title(f"in-graph vs client-driven loop: {ratio:.1f}x (body on two islands)")
    for y, m in enumerate(modes):
        ax.text(rates[m], y, f" {rates[m]:,.0f}", va="center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
