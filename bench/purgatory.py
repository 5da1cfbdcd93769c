"""Purgatory benchmark: Kafka's TestPurgatoryPerformance on one event loop (docs/benchmarks.md).

Requests arrive with exponential inter-arrival times at ``--rate``; each is watched on
``--keys-per-request`` keys out of ``--key-space``; its completion time is drawn from a
log-normal fixed by its 75th/50th percentiles (low timeout rate: 60/20 ms; high: 400/200 ms).
Requests due before ``--timeout-ms`` are completed by a separate completion driver (a task that
calls ``force_complete`` at their time, like Kafka's completion thread); the rest expire.

``--impl wheel`` is purgatory/ (timing wheel, one loop callback per bucket, completion unlinks
at once, purge by estimated completed count). ``--impl heap`` is the design Kafka had before its
timing wheel (0.8's RequestPurgatory) in the same harness: one ``loop.call_at`` per request,
left in the loop's heap after completion, and completed requests left in the watcher lists
until a purge that is triggered by the total watcher size (checked after each expiration, as
0.8's reaper did) and scans every list.

    python -m bench.purgatory --impl wheel --scenario high --requests 1000000 --rate 150000 --json
    python -m bench.purgatory --sweep            # both impls and scenarios; docs/img/purgatory.png
    python -m bench.purgatory --memory           # peak RSS vs requests at a fixed rate

One JSON object per line: impl, scenario, requests, target_rate, actual_rate, cpu_ms,
peak_rss_mb, expired, completed, late_p99_ms (plus a few extra diagnostics). Lateness is
measured on the Timer's clock (purgatory.LoopClock: loop.time(), unrounded on uvloop).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Hashable, Iterator
from typing import Any

import numpy as np

from purgatory import DelayedOperation, LoopClock, Purgatory, Timer

SCENARIOS = {"low": (60.0, 20.0), "high": (400.0, 200.0)}  # (pct75, pct50) of completion ms
Z75 = 0.6744897501960817  # standard normal 75th percentile
HIST_RES = 10  # lateness histogram bins per ms
HIST_MAX_MS = 10_000
CHUNK = 2048  # requests per numpy batch: memory flat in --requests, each batch well under 1 ms
BATCH = 64  # most requests issued per loop iteration, so timer callbacks are not held up
GC_TUNED_GEN0 = 100_000  # above the live set of operations at the rates measured


class Stats:
    """Counts and the lateness histogram; constant size whatever the number of requests."""

    __slots__ = ("total", "done", "expired", "early", "hist", "tick_hist", "finished", "now_ms",
                 "timeout_ms")

    def __init__(self, total: int, timeout_ms: int, now_ms: Any, finished: asyncio.Future) -> None:
        self.total = total
        self.done = 0
        self.expired = 0
        self.early = 0
        self.hist = [0] * (HIST_MAX_MS * HIST_RES + 1)  # vs created + timeout
        self.tick_hist = [0] * (HIST_MAX_MS * HIST_RES + 1)  # vs that, rounded up to the ms
        self.finished = finished
        self.now_ms = now_ms
        self.timeout_ms = timeout_ms

    def p(self, q: float, hist: list[int] | None = None) -> float:
        if not self.expired:
            return 0.0
        rank = math.ceil(q * self.expired)
        seen = 0
        for i, n in enumerate(self.hist if hist is None else hist):
            seen += n
            if seen >= rank:
                return i / HIST_RES
        return HIST_MAX_MS


class FakeOperation(DelayedOperation):
    """Kafka's FakeOperation: completes once its completion time has passed."""

    __slots__ = ("completes_at", "created_ms", "stats", "data")

    def __init__(self, timeout_ms: int, stats: Stats, created_ms: float, latency_ms: float,
                 data: bytes) -> None:
        super().__init__(timeout_ms)
        self.stats = stats
        self.created_ms = created_ms
        self.completes_at = created_ms + latency_ms
        self.data = data

    def try_complete(self) -> bool:
        if self.stats.now_ms() >= self.completes_at:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        s = self.stats
        s.done += 1
        if s.done == s.total:
            s.finished.set_result(None)

    def on_expiration(self) -> None:
        s = self.stats
        s.expired += 1
        now = s.now_ms()
        deadline = self.created_ms + s.timeout_ms
        late = now - deadline
        if late < 0.0:
            if late < -1e-6:  # below that it is float noise of ms/1000*1000
                s.early += 1
            late = 0.0
        top = HIST_MAX_MS * HIST_RES
        s.hist[min(int(late * HIST_RES), top)] += 1
        tick_late = max(0.0, now - math.ceil(deadline - 1e-6))
        s.tick_hist[min(int(tick_late * HIST_RES), top)] += 1


class HeapPurgatory:
    """Kafka's pre-timing-wheel design (0.8's RequestPurgatory), for comparison: a timer entry
    per request that stays until its deadline, and watcher lists purged only when their total
    size passes the interval."""

    def __init__(self, loop: asyncio.AbstractEventLoop, purge_interval: int = 1000) -> None:
        self._time = LoopClock(loop).time  # the Timer's clock, so deadlines compare alike
        self._call_at = loop.call_at
        self._watchers: dict[Hashable, list[DelayedOperation]] = {}
        self.purge_interval = purge_interval
        self.watched = 0  # total watcher list entries (0.8 summed the lists; a counter is kinder)
        self.delayed = 0  # timer entries, completed ones included
        self.purges = 0

    def try_complete_else_watch(self, op: DelayedOperation, keys: tuple[Hashable, ...]) -> bool:
        if op.try_complete():
            return True
        watchers = self._watchers
        for key in keys:
            if op._completed:
                break
            lst = watchers.get(key)
            if lst is None:
                watchers[key] = [op]
            else:
                lst.append(op)
            self.watched += 1
        if op.try_complete():
            return True
        if not op._completed:
            self.delayed += 1
            when_ms = math.ceil(self._time() - 1e-6) + op.delay_ms
            self._call_at(when_ms / 1000.0, self._expire, op)
        return False

    def _expire(self, op: DelayedOperation) -> None:
        self.delayed -= 1
        if op._completed:
            return  # completed long ago; its entry only now leaves the queue
        op.run()
        # 0.8's reaper: after each expiration, purge the lists if they are long.
        if self.watched >= self.purge_interval:
            self.purge()

    def purge(self) -> None:
        self.purges += 1
        total = 0
        for key, ops in list(self._watchers.items()):
            live = [op for op in ops if not op._completed]
            if live:
                self._watchers[key] = live
            else:
                del self._watchers[key]
            total += len(live)
        self.watched = total


def workload(
    args: argparse.Namespace,
) -> Iterator[tuple[list[float], list[float], Iterator[tuple[str, ...]]]]:
    """Arrival offsets (s), completion latencies (ms) and watch keys, CHUNK requests at a time.

    Keys come from a lazy zip: a tuple exists only while its request is issued (zip even reuses
    it), instead of CHUNK tuples living long enough to be promoted and rescanned by the GC.
    """
    rng = np.random.default_rng(args.seed)
    pct75, pct50 = SCENARIOS[args.scenario]
    mu = math.log(pct50)
    sigma = (math.log(pct75) - mu) / Z75
    names = np.array([f"fakeKey{i}" for i in range(args.key_space)], dtype=object)
    offset = 0.0
    left = args.requests
    while left > 0:
        n = min(CHUNK, left)
        left -= n
        arrivals = np.cumsum(rng.exponential(1.0 / args.rate, n)) + offset
        offset = float(arrivals[-1])
        latencies = rng.lognormal(mu, sigma, n)
        idx = rng.integers(0, args.key_space, (args.keys_per_request, n))
        keys = zip(*[names[col].tolist() for col in idx], strict=True)
        yield arrivals.tolist(), latencies.tolist(), keys


def rusage_cpu_ms() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (r.ru_utime + r.ru_stime) * 1000.0


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


async def run_async(args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    loop_time = loop.time
    now_ms = LoopClock(loop).time  # the clock the Timer reads; lateness is measured on it

    finished: asyncio.Future[None] = loop.create_future()
    stats = Stats(args.requests, args.timeout_ms, now_ms, finished)
    timer: Timer | None = None
    if args.impl == "wheel":
        timer = Timer(loop, tick_ms=args.tick_ms, wheel_size=args.wheel_size)
        purgatory: Any = Purgatory("fake", timer, purge_interval=args.purge_interval,
                                   adaptive_purge=not args.fixed_purge)
    else:
        purgatory = HeapPurgatory(loop, purge_interval=args.purge_interval)
    try_complete_else_watch = purgatory.try_complete_else_watch

    # The completion driver's calendar: ms -> operations due then. Harness, same for both impls.
    calendar: dict[int, list[FakeOperation]] = {}
    generating = True

    async def completion_driver() -> None:
        next_ms = int(now_ms())
        while generating or calendar:
            now = int(now_ms())
            while next_ms <= now:
                ops = calendar.pop(next_ms, None)
                if ops:
                    for op in ops:
                        op.force_complete()
                next_ms += 1
            await asyncio.sleep(0.001)

    timeout_ms = args.timeout_ms
    data = bytes(args.request_size)
    chunks = workload(args)
    first = next(chunks)  # numpy warmed up before the measurement starts
    if args.gc in ("freeze", "tuned"):
        # What a server does once started: long-lived objects (modules, numpy) leave the
        # collector's view, so a full collection scans only what the run allocates.
        gc.collect()
        gc.freeze()
    if args.gc == "tuned":
        # gen0 above the live set: operations (acyclic) die by refcount before any collection.
        gc.set_threshold(GC_TUNED_GEN0, 10, 10)
    base_rss = peak_rss_mb()
    driver = asyncio.ensure_future(completion_driver())
    cpu0 = rusage_cpu_ms()
    t0 = loop_time()
    deadline = args.max_seconds or math.inf
    issued = 0
    for arrivals, latencies, keys in itertools.chain([first], chunks):
        n = len(arrivals)
        j = 0
        while j < n:
            now = loop_time() - t0
            if now > deadline:
                break
            budget = BATCH
            while j < n and arrivals[j] <= now and budget:
                latency = latencies[j]
                op = FakeOperation(timeout_ms, stats, now_ms(), latency, data)
                if latency < timeout_ms:
                    due = int(op.completes_at) + 1
                    lst = calendar.get(due)
                    if lst is None:
                        calendar[due] = [op]
                    else:
                        lst.append(op)
                try_complete_else_watch(op, next(keys))
                j += 1
                budget -= 1
            issued += BATCH - budget
            if j < n and arrivals[j] > now:
                # Ahead of schedule: sleep, at least a loop-timer tick (1 ms on uvloop), or the
                # generator would spin on call_soon and bill the spin to the purgatory.
                await asyncio.sleep(max(arrivals[j] - now, 0.001))
            else:
                await asyncio.sleep(0)
        if loop_time() - t0 > deadline:
            break  # saturated: stop issuing, report the requests actually issued
    t_gen = loop_time()
    generating = False
    stats.total = issued
    if stats.done >= issued and not finished.done():
        finished.set_result(None)
    await finished
    await driver
    cpu = rusage_cpu_ms() - cpu0
    wall = loop_time() - t0
    result: dict[str, Any] = {
        "impl": args.impl,
        "scenario": args.scenario,
        "requests": issued,
        "target_rate": args.rate,
        "actual_rate": round(issued / max(t_gen - t0, 1e-9)),
        "cpu_ms": round(cpu),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "expired": stats.expired,
        "completed": stats.done - stats.expired,
        "late_p99_ms": stats.p(0.99),
        # diagnostics
        "late_p50_ms": stats.p(0.50),
        "late_tick_p99_ms": stats.p(0.99, stats.tick_hist),
        "late_max_ms": stats.p(1.0),
        "early": stats.early,
        "base_rss_mb": round(base_rss, 1),
        "wall_s": round(wall, 2),
        "purges": purgatory.purges,
        "loop": args.loop,
        "gc": args.gc,
    }
    if args.fixed_purge:
        result["fixed_purge"] = True
    if timer is not None:
        result["timer_size_after"] = timer.size
        result["timer_callbacks"] = timer.callbacks_fired
        timer.close()
    return result


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    if args.gc == "off":
        gc.disable()
    if args.loop == "uvloop":
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    else:
        runner = asyncio.Runner()
    with runner:
        if args.profile:
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.0005)
            profiler.start()
            result = runner.run(run_async(args))
            profiler.stop()
            print(profiler.output_text(unicode=False, color=False, show_all=False),
                  file=sys.stderr)
        else:
            result = runner.run(run_async(args))
    return result


# -- sweep -------------------------------------------------------------------------------------

SWEEP_RATES = [10_000, 20_000, 30_000, 40_000, 60_000, 80_000, 100_000, 125_000, 150_000,
               175_000, 200_000, 250_000, 300_000]


def child(args: argparse.Namespace, **over: Any) -> dict[str, Any]:
    """One configuration in its own process, so peak RSS is that configuration's."""
    a = vars(args) | over
    cmd = [sys.executable, "-m", "bench.purgatory", "--json",
           "--impl", a["impl"], "--scenario", a["scenario"], "--requests", str(a["requests"]),
           "--rate", str(a["rate"]), "--keys-per-request", str(a["keys_per_request"]),
           "--key-space", str(a["key_space"]), "--timeout-ms", str(a["timeout_ms"]),
           "--purge-interval", str(a["purge_interval"]), "--loop", a["loop"],
           "--seed", str(a["seed"]), "--max-seconds", str(a["max_seconds"])]
    cmd += ["--gc", a["gc"]]
    if a["fixed_purge"]:
        cmd.append("--fixed-purge")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return json.loads(out.stdout.strip().splitlines()[-1])


def sweep_requests(rate: int, cap: int) -> int:
    """Requests per sweep point: 5 s worth of arrivals, within [50,000, cap]. The sweep uses
    fewer than the 1,000,000 of a single run (cap 200,000) to stay within minutes."""
    return min(cap, max(50_000, rate * 5))


def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    for scenario in ("low", "high"):
        for impl in ("wheel", "heap"):
            saturated = 0
            for rate in SWEEP_RATES:
                if rate > args.max_rate:
                    break
                n = sweep_requests(rate, args.sweep_requests)
                # Best of --repeat runs: on a shared machine a slower run measures a neighbour.
                row = max((child(args, impl=impl, scenario=scenario, rate=rate, requests=n,
                                 max_seconds=args.max_seconds or 15)
                           for _ in range(args.repeat)), key=lambda r: r["actual_rate"])
                rows.append(row)
                print(json.dumps(row), flush=True)
                if row["actual_rate"] < 0.9 * rate:
                    saturated += 1
                    if saturated >= 2:
                        break
    print(f"# sweep took {time.monotonic() - started:.0f} s", file=sys.stderr)
    print(markdown_table(rows), file=sys.stderr)
    draw(rows, args.figure)
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    cols = ["scenario", "impl", "requests", "target_rate", "actual_rate", "cpu_ms",
            "cpu_us_per_req", "peak_rss_mb", "expired", "completed", "late_p99_ms",
            "late_tick_p99_ms", "early"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        r = r | {"cpu_us_per_req": round(r["cpu_ms"] * 1000 / max(r["requests"], 1), 1)}
        out.append("| " + " | ".join(str(r[c]) for c in cols) + " |")
    return "\n".join(out)


def draw(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, ScalarFormatter

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    styles = {"wheel": ("tab:blue", "o"), "heap": ("tab:red", "s")}
    for col, scenario in enumerate(("low", "high")):
        ax_rate, ax_cpu = axes[0][col], axes[1][col]
        for impl, (color, marker) in styles.items():
            pts = [r for r in rows if r["impl"] == impl and r["scenario"] == scenario]
            if not pts:
                continue
            target = [r["target_rate"] / 1000 for r in pts]
            actual = [r["actual_rate"] / 1000 for r in pts]
            cpu_per_k = [r["cpu_ms"] / r["requests"] * 1000 for r in pts]
            ax_rate.plot(target, actual, color=color, marker=marker, label=impl)
            ax_cpu.plot(actual, cpu_per_k, color=color, marker=marker, label=impl)
        top = max((r["target_rate"] for r in rows), default=1) / 1000
        ax_rate.plot([0, top], [0, top], color="grey", linestyle=":", label="target")
        pct = SCENARIOS[scenario]
        ax_rate.set_title(f"{scenario} timeout rate (pct75/pct50 = {pct[0]:.0f}/{pct[1]:.0f} ms)")
        ax_rate.set_xlabel("target rate (k requests/s)")
        ax_rate.set_ylabel("actual rate (k requests/s)")
        ax_cpu.set_xlabel("actual rate (k requests/s)")
        ax_cpu.set_ylabel("CPU ms per 1,000 requests (log)")
        ax_cpu.set_yscale("log")
        ax_cpu.yaxis.set_major_formatter(ScalarFormatter())
        ax_cpu.yaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
        ax_cpu.yaxis.set_minor_formatter(ScalarFormatter())
        for ax in (ax_rate, ax_cpu):
            ax.grid(True, alpha=0.3)
            ax.legend()
    fig.suptitle("Purgatory: timing wheel vs per-request heap timer (one event loop, uvloop)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)


def memory(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Peak RSS against the number of requests at one rate: completed requests must not
    accumulate, so the wheel's line is flat."""
    rows = []
    for impl in ("wheel", "heap"):
        for n in (100_000, 300_000, 1_000_000):
            row = child(args, impl=impl, scenario="low", rate=args.memory_rate, requests=n,
                        max_seconds=args.max_seconds)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.purgatory", description=__doc__.split("\n")[0]
    )
    p.add_argument("--impl", choices=("wheel", "heap"), default="wheel")
    p.add_argument("--scenario", choices=tuple(SCENARIOS), default="low")
    p.add_argument("--requests", type=int, default=1_000_000)
    p.add_argument("--rate", type=int, default=100_000, help="target requests per second")
    p.add_argument("--keys-per-request", type=int, default=3)
    p.add_argument("--key-space", type=int, default=100)
    p.add_argument("--timeout-ms", type=int, default=200)
    p.add_argument("--request-size", type=int, default=100, help="bytes held by each request")
    p.add_argument("--purge-interval", type=int, default=1000)
    p.add_argument("--fixed-purge", action="store_true",
                   help="wheel: Kafka's purge rule (E - delayed > purge interval), not adaptive")
    p.add_argument("--tick-ms", type=int, default=1)
    p.add_argument("--wheel-size", type=int, default=20)
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-seconds", type=float, default=0,
                   help="stop issuing after this long (0: never); requests = those issued")
    p.add_argument("--gc", choices=("freeze", "tuned", "default", "off"), default="freeze",
                   help="freeze: gc.freeze() after setup (default); tuned: also gen0 threshold "
                   f"{GC_TUNED_GEN0:,}; default: CPython as is; off: diagnostic only")
    p.add_argument("--profile", action="store_true", help="pyinstrument report on stderr")
    p.add_argument("--json", action="store_true", help="print one JSON object per line")
    p.add_argument("--sweep", action="store_true", help="rates 10k..saturation, both impls")
    p.add_argument("--sweep-requests", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=1, help="sweep: best of N runs per point")
    p.add_argument("--max-rate", type=int, default=300_000)
    p.add_argument("--figure", default="docs/img/purgatory.png")
    p.add_argument("--plot-from", metavar="FILE",
                   help="redraw the figure and table from a sweep's JSON lines")
    p.add_argument("--memory", action="store_true", help="peak RSS for 100k, 300k, 1M requests")
    p.add_argument("--memory-rate", type=int, default=40_000)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.plot_from:
        with open(args.plot_from) as f:
            rows = [json.loads(line) for line in f if line.startswith("{")]
        print(markdown_table(rows))
        draw(rows, args.figure)
        return
    if args.sweep:
        sweep(args)
        return
    if args.memory:
        memory(args)
        return
    result = run_one(args)
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        for k, v in result.items():
            print(f"{k:>18}: {v}")


if __name__ == "__main__":
    main()
