"""The benchmark's plots (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plots"]


def plots(summary: dict, out: Path, prediction: dict | None) -> None:
    """Write ``speedup_by_category.png``, ``acceptance_by_position.png`` and, for a k sweep,
    ``speedup_vs_k.png`` (measured and predicted) into ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def save(fig, ax, name: str) -> None:
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)

    names = [n for n in summary if n != "baseline"]
    cats = list(next(iter(summary.values()))["per_category"])
    fig, ax = plt.subplots(figsize=(max(6, len(cats) * 0.9), 4))
    width = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        vals = [summary[n]["per_category"][c]["speedup_median"] for c in cats]
        ax.bar([j + i * width for j in range(len(cats))], vals, width, label=n)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))], cats, rotation=45, ha="right")
    ax.set_ylabel("speedup over plain decoding (median)")
    save(fig, ax, "speedup_by_category.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for n in names:
        acc = summary[n]["acceptance_by_position"]
        if acc:
            ax.plot(range(1, len(acc) + 1), acc, marker="o", label=n)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance")
    ax.set_ylim(0, 1.05)
    save(fig, ax, "acceptance_by_position.png")

    if prediction:
        fig, ax = plt.subplots(figsize=(6, 4))
        for family, pts in prediction.items():
            ks = [p["k"] for p in pts]
            line = ax.plot(ks, [p["measured"] for p in pts], marker="o", label=f"{family} measured")[0]
            if all(p.get("predicted") is not None for p in pts):
                ax.plot(ks, [p["predicted"] for p in pts], ls="--", color=line.get_color(), label=f"{family} predicted")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xlabel("k (num_speculative_tokens)")
        ax.set_ylabel("speedup (decode phase, TPOT ratio)")
        save(fig, ax, "speedup_vs_k.png")


