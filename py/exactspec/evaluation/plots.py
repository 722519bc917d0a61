"""The specification's eight plots (matplotlib, PNG and SVG) from a run's results."""
from __future__ import annotations

import os

from ..host.safe_files import replacing

PLOTS = ("survival", "waterfall", "break_even", "memory_latency", "entropy", "heatmap", "ecdf", "pareto")


def _save(fig, out_dir: str, name: str) -> list:
    paths = []
    for ext in ("png", "svg"):
        path = os.path.join(out_dir, f"{name}.{ext}")
        with replacing(path, "wb") as f:   # never through a link planted at the path
            fig.savefig(f, format=ext, dpi=110, bbox_inches="tight",
                        metadata={"Date": None} if ext == "svg" else None)   # no date: the same run, the same files
        paths.append(path)
    return paths


def write_plots(res: dict, out_dir: str) -> dict:
    """{plot name: [png, svg]} written under out_dir/plots/."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    d = os.path.join(out_dir, "plots")
    os.makedirs(d, exist_ok=True)
    done = {}
    for name in PLOTS:
        fig = plt.figure(figsize=(7.5, 4.8))
        globals()["_" + name](fig, res)
        done[name] = _save(fig, d, name)
        plt.close(fig)
    return done


def _survival(fig, res):
    ax = fig.add_subplot(111)
    for s in res["survival"]:
        if s["temperature"] == 0 and s["backend"] in ("wasm", "toy-wasm"):
            xs = [i + 1 for i, v in enumerate(s["S"]) if v is not None]
            ax.plot(xs, [s["S"][i - 1] for i in xs], marker="o", label=s["stratum"],
                    lw=2.5 if s["stratum"] == "all" else 1)
    ax.set(xlabel="proposal position i", ylabel="survival S_i", title="Survival by position and stratum (draft k = 8, T = 0, toy pair, WASM)", ylim=(0, 1.02))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, ncol=2)


def _waterfall(fig, res):
    rows = [w for w in res["waterfall"] if w]
    labels = [f"{w['backend']}:{w['arm']} T={w['temperature']:g}" for w in rows]
    for panel, (parts, title) in enumerate(((("load_runtime", "load_champion", "load_draft"), "cold: loads (once per engine)"),
                                            (("prefill", "draft", "verify_and_correct", "orchestrator", "sync_and_output"),
                                             "warm: one request (medians)"))):
        ax = fig.add_subplot(1, 2, panel + 1)
        for j, w in enumerate(rows):
            left = 0.0
            for i, p in enumerate(parts):
                v = w.get(p) or 0.0
                ax.barh(j, v, left=left, color=f"C{i + 3 * panel}", label=p if j == 0 else None)
                left += v
        ax.set_yticks(range(len(rows)), labels if panel == 0 else [""] * len(rows), fontsize=6)
        ax.set(xlabel="ms", title=title)
        ax.legend(fontsize=6, loc="lower right")
    fig.suptitle("Latency decomposition (correction is inside verify: one device call decides the round)", fontsize=9)


def _break_even(fig, res):
    ax = fig.add_subplot(111)
    for b in res["break_even"]:
        if b:
            ax.plot(b["curve_n"], b["curve_ratio"], marker="o", label=f"{b['backend']}:{b['arm']}")
    ax.axhline(1.0, color="grey", ls="--")
    ax.set(xscale="log", xlabel="session output length N (tokens)", ylabel="T_spec(N) / T_baseline(N), cold",
           title="Break-even (conversational strata; below 1: speculation wins)")
    ax.legend(fontsize=8)


def _memory_latency(fig, res):
    ax = fig.add_subplot(111)
    for p in res["topologies"]:
        if p["peak_bytes"] and p["median_latency_ms"]:
            ax.scatter(p["median_latency_ms"], p["peak_bytes"] / 2 ** 20)
            ax.annotate(p["name"], (p["median_latency_ms"], p["peak_bytes"] / 2 ** 20), fontsize=7)
    ax.set(xscale="log", xlabel="median completion latency (ms, warm)", ylabel="peak resident MiB (receipt categories)",
           title="Peak resident bytes vs median latency per topology")


def _entropy(fig, res):
    ax = fig.add_subplot(111)
    bins = [b for b in res["entropy"]["bins"] if b["rate"] is not None]
    ax.plot([(b["lo"] + b["hi"]) / 2 for b in bins], [b["rate"] for b in bins], marker="o")
    for b in bins:
        ax.annotate(str(b["n"]), ((b["lo"] + b["hi"]) / 2, b["rate"]), fontsize=7)
    ax.set(xlabel="draft entropy (nats; CPython reference draft on the browser's ids)", ylabel="acceptance rate",
           ylim=(0, 1.05), title="Acceptance vs draft entropy (draft k = 8, T = 0, toy pair, WASM; labels: n)")


def _heatmap(fig, res):
    h = res["heatmap"]
    for j, (key, title, cmap) in enumerate((("speed", "median speed-up", "RdYlGn"), ("quality", "greedy identity rate", "Greens"))):
        ax = fig.add_subplot(1, 2, j + 1)
        data = [[v if v is not None else float("nan") for v in row] for row in h[key]]
        im = ax.imshow(data, cmap=cmap, aspect="auto", vmin=0.5 if key == "speed" else 0, vmax=1.5 if key == "speed" else 1)
        ax.set_xticks(range(len(h["strata"])), h["strata"], rotation=70, fontsize=6)
        ax.set_yticks(range(len(h["methods"])), h["methods"] if j == 0 else [""] * len(h["methods"]), fontsize=6)
        ax.set_title(title, fontsize=9)
        for y, row in enumerate(h[key]):
            for x, v in enumerate(row):
                if v is not None:
                    ax.text(x, y, f"{v:.2f}", ha="center", va="center", fontsize=5)
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle("Method x stratum (toy pair, WASM, T = 0 and 1 pooled; request-time medians)", fontsize=10)


def _ecdf(fig, res):
    ax = fig.add_subplot(111)
    for name, (xs, ys) in res["ecdf"].items():
        ax.step(xs, ys, where="post", label=name)
    ax.axvline(1.0, color="grey", ls="--")
    ax.set(xscale="log", xlabel="per-request speed-up per generated token (vs champion alone)", ylabel="fraction of requests",
           title="ECDF of per-request speed-up")
    ax.legend(fontsize=7)


def _pareto(fig, res):
    ax = fig.add_subplot(111)
    pts = res["pareto"]["points"]
    for p in pts:
        ax.scatter(p["latency_ms"], p["peak_bytes"] / 2 ** 20, color="C1" if p["front"] else "C7")
        ax.annotate(p["name"], (p["latency_ms"], p["peak_bytes"] / 2 ** 20), fontsize=6)
    front = sorted((p for p in pts if p["front"]), key=lambda p: p["latency_ms"])
    ax.plot([p["latency_ms"] for p in front], [p["peak_bytes"] / 2 ** 20 for p in front], color="C1")
    ax.set(xscale="log", xlabel="median request latency (ms)", ylabel="peak resident MiB",
           title="Pareto frontier: latency x peak memory (no energy: browsers expose no energy counter)")
