"""timeline.png: prefill and decode demand, engine roles and GPU idle over time."""

from __future__ import annotations

from pathlib import Path

from .summary import Result


def plot_timeline(res: Result, path: Path, title: str = "") -> None:
    """Draw three stacked panels from the per-window timeline (deterministic bytes:
    the PNG metadata carries no date)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = res.timeline
    t = [w["t"] for w in tl]
    fig, ax = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    ax[0].plot(t, [w["prefill_demand"] / 1e6 for w in tl], label="prefill demand (prompt tokens queued)")
    ax[0].plot(t, [w["decode_admit"] / 1e6 for w in tl], label="decode admissions (prompt tokens)")
    ax[0].plot(t, [w["decode_tokens"] / 1e6 for w in tl], label="decode output tokens")
    ax[0].set_ylabel("M tokens / window")
    ax[0].legend(fontsize=8)
    ax[1].stackplot(
        t, [w["n_prefill"] for w in tl], [w["n_decode"] for w in tl], [w["n_mixed"] for w in tl],
        labels=["prefill", "decode", "mixed"],
    )
    ax[1].plot(t, [w["n_switching"] for w in tl], color="k", lw=1, label="switching")
    ax[1].set_ylabel("engines")
    ax[1].legend(fontsize=8, loc="upper right")
    idle, busy = [], []
    prev_b = prev_w = 0.0
    for w in tl:
        db, dw = w["busy_gpu_s"] - prev_b, w["wait_gpu_s"] - prev_w
        prev_b, prev_w = w["busy_gpu_s"], w["wait_gpu_s"]
        tot = db + dw
        idle.append(dw / tot if tot > 0 else 0.0)
        busy.append(db)
    ax[2].plot(t, idle, color="tab:red", label="sync-wait share of stepping GPU time")
    ax[2].set_ylabel("GPU idle ratio")
    ax[2].set_ylim(0, 1)
    ax[2].set_xlabel("simulated time (s)")
    ax[2].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(fig)


def plot_ideal_split(res: Result, path: Path, title: str = "") -> None:
    """ideal_split.png: per window, the engines prefill needs by throughput and decode by
    KV capacity and by step time (:mod:`prorsa_sim.idealsplit`), the budget line, the
    ideal split's prefill engines and the step boundaries (deterministic bytes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = res.timeline
    t = [w["t"] for w in tl]
    budget = res.summary["engines"]
    fig, ax = plt.subplots(2, 1, figsize=(10, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    ax[0].plot(t, [w.get("prefill_need", 0) for w in tl], color="tab:blue", lw=1, label="prefill, by throughput")
    ax[0].plot(t, [w.get("decode_need_kv", 0) for w in tl], color="tab:orange", lw=1, label="decode, by KV capacity")
    ax[0].plot(t, [w.get("decode_need_step", 0) for w in tl], color="tab:green", lw=1, ls="--",
               label="decode, by step time")
    ax[0].axhline(budget, color="k", lw=1, label=f"budget ({budget} engines)")
    ax[0].set_ylabel("engines needed")
    top = max([w.get("prefill_need", 0) for w in tl] + [w.get("decode_need", 0) for w in tl] + [0])
    ax[0].set_ylim(0, max(budget * 1.2, min(budget * 3, top * 1.05), 1))
    ax[0].legend(fontsize=8, loc="upper right")
    ax[1].step(t, [w.get("ideal_prefill") if w.get("ideal_prefill") is not None else float("nan") for w in tl],
               where="post", color="tab:blue", label="ideal split: prefill engines")
    ax[1].step(t, [w["n_prefill"] + 0.5 * w["n_mixed"] for w in tl], where="post", color="0.5", lw=1,
               label="run's prefill engines (mixed count half)")
    ax[1].set_ylim(0, budget)
    ax[1].set_ylabel("prefill engines")
    ax[1].set_xlabel("simulated time (s)")
    prev = None
    for w in tl:
        if prev is not None and w.get("step", 0) != prev:
            for a in ax:
                a.axvline(w["t"], color="0.8", lw=0.8, zorder=0)
        prev = w.get("step", 0)
    moves = res.summary.get("ideal_split", {}).get("moves_max")
    ax[1].legend(fontsize=8, loc="upper right", title=f"max move within a measured step: {moves} engines",
                 title_fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(fig)
