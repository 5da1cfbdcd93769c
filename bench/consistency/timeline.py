"""The run as a picture: faults as shaded spans over the records acknowledged and read per
second, and the client errors per second below."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bench.consistency.workload import Result

COLOURS = {"kill": "tab:red", "stop": "tab:orange", "pause": "tab:purple",
           "power-loss": "black", "isolate": "tab:brown", "partition": "tab:pink",
           "slow": "tab:olive", "move-leader": "tab:cyan"}


def per_second(times: list[float], seconds: float) -> tuple[list[int], list[int]]:
    counts = Counter(int(t) for t in times)
    xs = list(range(int(seconds) + 1))
    return xs, [counts.get(x, 0) for x in xs]


def draw(result: Result, path: Path) -> Path:
    """Write the timeline PNG of ``result`` to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = result.history
    acked = [s.acked_s for s in h.sends if s.acked_s is not None and s.error is None]
    read = [p.at_s for p in h.polls() for _ in p.records]
    errors = [e.at_s for e in result.errors]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 5),
                                      gridspec_kw={"height_ratios": [3, 1]})
    for label, times in (("acknowledged/s", acked), ("read/s, all consumers", read)):
        xs, ys = per_second(times, result.seconds)
        top.step(xs, ys, where="post", label=label)
    xs, ys = per_second(errors, result.seconds)
    bottom.step(xs, ys, where="post", color="tab:red", label="client errors/s")
    seen: set[str] = set()
    for f in result.faults:
        end = f.end_s if f.end_s is not None else result.seconds
        colour = COLOURS.get(f.kind, "tab:gray")
        for ax in (top, bottom):
            ax.axvspan(f.start_s, end, color=colour, alpha=0.2,
                       label=None if f.kind in seen or ax is bottom else f.kind)
        seen.add(f.kind)
    failures = result.analysis.failures()
    verdict = "no anomaly" if not failures else ", ".join(f"{k} {n}"
                                                          for k, n in failures.items())
    top.set_title(f"bench.consistency: {result.topic}, {verdict}")
    top.set_ylabel("records/s")
    bottom.set_ylabel("errors/s")
    bottom.set_xlabel("seconds since start")
    top.legend(loc="upper right", fontsize="small")
    bottom.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
