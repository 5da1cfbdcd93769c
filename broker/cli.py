"""`mini-broker [server.properties] [--override key=value ...]`, as kafka-server-start.sh."""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys
from importlib.metadata import version

import uvloop

from broker.config import KEYS, BrokerConfig, ConfigError
from broker.logging import configure


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
    parser.add_argument("--version", action="version", version=version("mini-broker"))
    return parser


async def _serve(config: BrokerConfig) -> None:
    from broker.server import Broker

    broker = Broker(config)
    await broker.start()
    # What is alive after start (modules, codecs, loaded logs) stays alive: keep it out of the
    # collector's scans so a full collection only walks what requests allocate. The purgatory
    # benchmark measured GC pauses as the main source of timer lateness (docs/benchmarks.md).
    gc.collect()
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await broker.stop()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = BrokerConfig.from_properties(args.config, args.override)
    except (ConfigError, OSError) as exc:
        print(f"mini-broker: {exc}", file=sys.stderr)
        return 2
    configure(config["log.level"], config["log.format"])
    try:
        uvloop.run(_serve(config))
    except ConfigError as exc:  # found only at start: a key store that cannot be loaded
        print(f"mini-broker: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
