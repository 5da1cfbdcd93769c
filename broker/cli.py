"""`mini-broker [server.properties] [--override key=value ...]`, as kafka-server-start.sh."""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys
import textwrap
import time
from typing import Any

import structlog
import uvloop

from broker import gc_policy
from broker.config import (
    ALIASES,
    JAAS_SUFFIX,
    KEYS,
    LISTENER_PREFIX,
    PER_LISTENER_KEYS,
    SASL_MECHANISMS,
    BrokerConfig,
    ConfigError,
    Key,
    unknown_keys_message,
)
from broker.kafka_keys import KAFKA_BROKER_KEYS
from broker.logging import configure, is_secret, log_unused_keys
from broker.startup_error import StartupError

logger = structlog.get_logger("broker.cli")


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


WIDTH = 79
OURS = "mini-broker's own (not Kafka's)"
# Headings of --help; a key goes under the first whose test it passes.
_CLASSIFY: list[tuple[str, Any]] = [
    (OURS, lambda k: k not in KAFKA_BROKER_KEYS),
    ("security", lambda k: k.startswith(("ssl.", "sasl.", "authorizer.", "super.users",
                                          "allow.everyone", "connection.failed.auth",
                                          "connections.max.reauth", "security.",
                                          "inter.broker."))),
    ("listeners and connections", lambda k: k.startswith((
        "listener", "advertised.", "controller.listener", "socket.", "num.io.", "queued.",
        "max.connections", "connections."))),
    ("log cleaner", lambda k: k.startswith("log.cleaner.")),
    ("log", lambda k: k.startswith("log.")),
    ("groups and committed offsets", lambda k: k.startswith(("group.", "offsets."))),
    ("transactions", lambda k: k.startswith("transaction")),
    ("client telemetry", lambda k: k.startswith("telemetry.")),
    ("broker and topics", lambda k: True),
]
# The order --help shows them in.
HEADINGS = ["broker and topics", "listeners and connections", "log", "log cleaner",
            "groups and committed offsets", "transactions", "security", "client telemetry", OURS]
USAGE_EXAMPLE = """\
Start a Kafka-compatible broker from a server.properties file (Kafka's keys),
each --override replacing one key, as kafka-server-start.sh does.

examples:
  mini-broker config/server.properties
  mini-broker --override log.dirs=/tmp/mini-broker --override num.partitions=3
  mini-broker --help-config log.retention.ms
"""


def heading(name: str) -> str:
    return next(title for title, test in _CLASSIFY if test(name))


def default_text(key: Key) -> str:
    """A key's default as a person reads it: limits at a type's maximum are "unbounded"."""
    if not key.default:
        return "unset"
    return "unbounded" if _unbounded(key.default) else key.default


def _unbounded(text: str | int | float) -> bool:
    """Java's Long.MAX_VALUE, Integer.MAX_VALUE or Double.MAX_VALUE: Kafka's "no limit"."""
    try:
        number: int | float = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            return False
    return number in (2**63 - 1, 2**31 - 1, 1.7976931348623157e308)


def _range(key: Key) -> str | None:
    if key.min is None and key.max is None:
        return None
    high = "unbounded" if key.max is None or _unbounded(key.max) else str(key.max)
    return f"{key.min if key.min is not None else 'unbounded'} .. {high}"


def _wrap(text: str, indent: int = 6) -> str:
    return textwrap.fill(text, WIDTH, initial_indent=" " * indent,
                         subsequent_indent=" " * indent, break_on_hyphens=False,
                         break_long_words=False)


def keys_help() -> str:
    """Every key under its heading, its default in words and its doc wrapped; then Kafka's
    other names, the pattern keys, and what happens to the rest of Kafka's keys."""
    out = []
    for title in HEADINGS:
        keys = [k for k in KEYS.values() if heading(k.name) == title]
        if not keys:
            continue
        out.append(f"{title}:")
        for key in keys:
            out.append(f"  {key.name} (default {default_text(key)})")
            doc = ("[accepted, not used] " if key.unused else "") + key.doc
            out.append(_wrap(doc))
        out.append("")
    out.append("Kafka's other names (used when the key itself is not given):")
    for alias in ALIASES.values():
        unit = {60_000: " in minutes", 3_600_000: " in hours"}.get(alias.factor, "")
        out.append(f"  {alias.name} -> {alias.target}{unit}")
    out.append("")
    out.append("per listener and per SASL mechanism:")
    out.append(f"  {LISTENER_PREFIX}<listener>.<key>")
    out.append(_wrap("<listener> in lower case; <key> one of: "
                     + ", ".join(sorted(PER_LISTENER_KEYS)) + "."))
    out.append(f"  {LISTENER_PREFIX}<listener>.<mechanism>{JAAS_SUFFIX}")
    out.append(_wrap("The JAAS text of a SASL listener; <mechanism> one of "
                     + ", ".join(m.lower() for m in SASL_MECHANISMS) + "."))
    out.append("")
    out.append(_wrap("Every other key of Kafka's broker configuration is accepted with one "
                     "warning naming them: it does nothing here. A key Kafka does not know "
                     "either stops the broker. --help-config KEY tells about one key.", 0))
    return "\n".join(out)


def key_help(name: str) -> str:
    """What --help-config says about one key (ConfigError for a key nobody knows)."""
    if name in ALIASES:
        alias = ALIASES[name]
        unit = {60_000: " in minutes", 3_600_000: " in hours"}.get(alias.factor, "")
        stronger = [a.name for a in ALIASES.values() if a.target == alias.target]
        stronger = [alias.target, *stronger[:stronger.index(name)]]
        return _wrap(f"{name}: Kafka's other name for {alias.target}{unit}, used when "
                     f"{' and '.join(stronger)} {'is' if len(stronger) == 1 else 'are'} not "
                     f"given.", 0) + "\n\n" + key_help(alias.target)
    if name.startswith(LISTENER_PREFIX):
        _listener, _, key = name[len(LISTENER_PREFIX):].partition(".")
        if key.endswith(JAAS_SUFFIX):
            return _wrap(f"{name}: the JAAS text of one SASL mechanism on one listener; its "
                         f"value is never logged.", 0)
        if key in PER_LISTENER_KEYS:
            return f"{name}: {key} for this listener only.\n\n" + key_help(key)
    if name in KEYS:
        key = KEYS[name]
        lines = [f"{name}  [{heading(name)}]", f"  default: {default_text(key)}"]
        span = _range(key)
        if span:
            lines.append(f"  range: {span}")
        if key.unused:
            lines.append("  accepted for compatibility; nothing here reads it")
        if is_secret(name):
            lines.append("  secret: its value is never logged")
        others = [a.name for a in ALIASES.values() if a.target == name]
        if others:
            lines.append(f"  other names: {', '.join(others)}")
        lines.append(_wrap(key.doc, 2))
        return "\n".join(lines)
    if name in KAFKA_BROKER_KEYS:
        return _wrap(f"{name}: Kafka's key, not used by mini-broker: given, it is accepted "
                     f"and named in one warning at start.", 0)
    raise ConfigError(unknown_keys_message([name]))


class _HelpConfig(argparse.Action):
    """``--help-config KEY``: one key's default, range and meaning."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        try:
            print(key_help(str(values).strip()))
        except ConfigError as exc:
            parser.exit(2, f"mini-broker: {exc}\n")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mini-broker",
        description=USAGE_EXAMPLE,
        epilog="configuration keys:\n\n" + keys_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", nargs="?", help="server.properties file")
    parser.add_argument("--override", action="append", default=[], metavar="key=value",
                        help="override a configuration key (repeatable)")
    parser.add_argument("--help-config", action=_HelpConfig, metavar="KEY",
                        help="show one configuration key's default, range and meaning, and exit")
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
    # What start-up builds lives as long as the broker (a Log and a Partition per partition):
    # collections during it would walk that growing heap over and over for no garbage, so
    # none runs until the policy's own collection below.
    gc.disable()
    try:
        await broker.start()
    finally:
        gc.enable()
    # Set once started, so what start-up built is what freeze keeps out of later scans.
    began = time.perf_counter()
    thresholds = gc_policy.apply(config["minibroker.gc.policy"],
                                 config["minibroker.gc.gen0.threshold"])
    pauses = gc_policy.GcPauses().install()
    logger.debug("gc policy", policy=config["minibroker.gc.policy"], thresholds=list(thresholds),
             frozen=gc.get_freeze_count(),
             apply_ms=round((time.perf_counter() - began) * 1e3, 1))
    await stop.wait()
    pauses.uninstall()
    # What the collector took from the loop while serving, for the benchmarks that compare
    # the policies (bench.gc reads this line).
    logger.info("gc pauses", policy=config["minibroker.gc.policy"], **pauses.summary())
    await broker.stop()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = BrokerConfig.from_properties(args.config, args.override)
    except (ConfigError, OSError) as exc:
        print(f"mini-broker: {exc}", file=sys.stderr)
        return 2
    configure(config["log.level"], config["log.format"])
    log_unused_keys(config)
    from broker.log.handles import OpenFileLimitError  # the broker imports it anyway

    try:
        uvloop.run(_serve(config))
    except (ConfigError, StartupError) as exc:  # found only at start: a key store, a port
        print(f"mini-broker: {exc}", file=sys.stderr)
        return 2
    except OpenFileLimitError as exc:  # the recorded logs need more descriptors than allowed
        print(f"mini-broker: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
