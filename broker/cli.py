"""`mini-broker [server.properties] [--override key=value ...]`, as kafka-server-start.sh."""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys
import time
from typing import Any

import structlog
import uvloop

from broker import gc_policy
from broker.config import KEYS, BrokerConfig, ConfigError
from broker.logging import configure

log = structlog.get_logger("broker.cli")


class _Version(argparse.Action):
    """``--version``, reading the installed version only when asked: importlib.metadata (with
    the email and zip parsers it imports) is about 2 MB a running broker would keep."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 help: str = "show program's version number and exit") -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0,
                         help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        from importlib.metadata import version

        print(version("mini-broker"))
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    keys = "\n".join(f"  {k.name} (default {k.default or 'unset'}): {k.doc}" for k in KEYS.values())
    parser = argparse.ArgumentParser(
        prog="mini-broker",
        description="A Kafka-compatible broker. Configuration keys:\n" + keys,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", nargs="?", help="server.properties file")
    parser.add_argument("--override", action="append", default=[], metavar="key=value",
                        help="override a configuration key (repeatable)")
    parser.add_argument("--version", action=_Version)
    return parser


async def _serve(config: BrokerConfig) -> None:
    from broker.server import Broker

    # Handlers first: a SIGTERM that comes while starting (or while the policy's collection
    # runs) stops the broker cleanly once started, instead of killing it mid-start.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    broker = Broker(config)
    await broker.start()
    # Set once started, so what start-up built is what freeze keeps out of later scans.
    began = time.perf_counter()
    thresholds = gc_policy.apply(config["minibroker.gc.policy"],
                                 config["minibroker.gc.gen0.threshold"])
    pauses = gc_policy.GcPauses().install()
    log.info("gc policy", policy=config["minibroker.gc.policy"], thresholds=list(thresholds),
             frozen=gc.get_freeze_count(),
             apply_ms=round((time.perf_counter() - began) * 1e3, 1))
    await stop.wait()
    pauses.uninstall()
    # What the collector took from the loop while serving, for the benchmarks that compare
    # the policies (bench.gc reads this line).
    log.info("gc pauses", policy=config["minibroker.gc.policy"], **pauses.summary())
    await broker.stop()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = BrokerConfig.from_properties(args.config, args.override)
    except (ConfigError, OSError) as exc:
        print(f"mini-broker: {exc}", file=sys.stderr)
        return 2
    configure(config["log.level"], config["log.format"])
    from broker.log.handles import OpenFileLimitError  # the broker imports it anyway

    try:
        uvloop.run(_serve(config))
    except ConfigError as exc:  # found only at start: a key store that cannot be loaded
        print(f"mini-broker: {exc}", file=sys.stderr)
        return 2
    except OpenFileLimitError as exc:  # the recorded logs need more descriptors than allowed
        print(f"mini-broker: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
