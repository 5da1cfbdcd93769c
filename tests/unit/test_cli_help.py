"""--help a person can read, --help-config for one key, and the start-up log's helpers:
redaction by Kafka's secret keys, the effective configuration, the ready line."""

from __future__ import annotations

import pytest

from broker import cli
from broker.config import KEYS, BrokerConfig
from broker.logging import ready_message, redact, render_config


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        cli.main(list(argv))
    out = capsys.readouterr()
    return done.value.code or 0, out.out, out.err


def test_help_has_usage_and_example_first_then_keys_under_headings(capsys) -> None:
    code, text, _ = _run(capsys, "--help")
    assert code == 0
    assert text.startswith("usage: mini-broker")
    assert text.index("examples:") < text.index("configuration keys:")
    starts = [text.index(f"\n{title}:\n") for title in cli.HEADINGS]
    assert starts == sorted(starts)  # every heading, in order
    for key in KEYS.values():
        section = text[:text.index(f"\n  {key.name} (default ") + 1]
        assert section.rindex(f"\n{cli.heading(key.name)}:\n") == max(
            section.rfind(f"\n{t}:\n") for t in cli.HEADINGS), key.name
    assert "9223372036854775807" not in text and "2147483647" not in text
    assert "  group.max.size (default unbounded)\n" in text
    assert "  log.flush.interval.messages (default unbounded)\n" in text
    assert "  listener.name.<listener>.<key>\n" in text
    assert "  listener.name.<listener>.<mechanism>.sasl.jaas.config\n" in text
    assert "  log.retention.hours -> log.retention.ms in hours\n" in text
    # Wrapped: only a key's own line may run past 79 columns (a long default).
    long_lines = [ln for ln in text.splitlines() if len(ln) > 79]
    assert all(ln.startswith("  ") and " (default " in ln for ln in long_lines), long_lines


def test_help_config_for_a_key_an_alias_a_listener_form_and_kafkas_key(capsys) -> None:
    code, text, _ = _run(capsys, "--help-config", "log.retention.ms")
    assert code == 0 and text.startswith("log.retention.ms  [log]\n")
    assert "  default: 604800000\n" in text and "  range: -1 .. unbounded\n" in text
    assert "other names: log.retention.minutes, log.retention.hours" in text
    _, text, _ = _run(capsys, "--help-config", "log.retention.hours")
    assert " ".join(text.split()).startswith(
        "log.retention.hours: Kafka's other name for log.retention.ms in hours, used when "
        "log.retention.ms and log.retention.minutes are not given.")
    assert "\nlog.retention.ms  [log]\n" in text
    _, text, _ = _run(capsys, "--help-config", "listener.name.sasl_ssl.ssl.key.password")
    assert "ssl.key.password for this listener only" in text
    assert "secret: its value is never logged" in text
    _, text, _ = _run(capsys, "--help-config", "replica.selector.class")
    assert "Kafka's key, not used by mini-broker" in text
    _, text, _ = _run(capsys, "--help-config", "group.max.size")
    assert "  default: unbounded\n" in text and "  range: 1 .. unbounded\n" in text


def test_help_config_for_a_typo_suggests_the_key(capsys) -> None:
    code, text, err = _run(capsys, "--help-config", "log.retension.ms")
    assert code == 2 and text == ""
    assert "log.retension.ms (did you mean log.retention.ms?)" in err


def test_unknown_keys_stop_the_command_naming_them_all(capsys) -> None:
    code = cli.main(["--override", "num.partitons=2", "--override", "foo.bar=1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "num.partitons (did you mean num.partitions?)" in err and "foo.bar" in err


def test_redaction_hides_kafkas_secret_keys_only() -> None:
    shown = redact({
        "ssl.keystore.password": "p", "ssl.key.password": "p", "ssl.keystore.key": "k",
        "sasl.jaas.config": "j", "listener.name.sasl_ssl.ssl.key.password": "p",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": "j",
        "sasl.enabled.mechanisms": ["PLAIN"], "ssl.keystore.type": "PEM",
        "ssl.keystore.location": "/etc/k.pem", "ssl.truststore.password": ""})
    assert shown == {
        "ssl.keystore.password": "[redacted]", "ssl.key.password": "[redacted]",
        "ssl.keystore.key": "[redacted]", "sasl.jaas.config": "[redacted]",
        "listener.name.sasl_ssl.ssl.key.password": "[redacted]",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": "[redacted]",
        "sasl.enabled.mechanisms": ["PLAIN"], "ssl.keystore.type": "PEM",
        "ssl.keystore.location": "/etc/k.pem", "ssl.truststore.password": ""}


def test_effective_configuration_is_one_line_per_key_secrets_hidden() -> None:
    cfg = BrokerConfig.from_dict({"num.partitions": "3", "ssl.key.password": "hunter2"})
    text = render_config(cfg)
    lines = text.splitlines()
    assert len(lines) == len(KEYS)
    assert any(ln.startswith("* num.partitions ") and ln.endswith(" = 3") for ln in lines)
    assert any(ln.startswith("  log.dirs ") and ln.endswith(" = ./data") for ln in lines)
    assert "hunter2" not in text and any(
        ln.startswith("* ssl.key.password ") and ln.endswith("= [redacted]") for ln in lines)


def test_ready_line() -> None:
    assert ready_message({"PLAINTEXT": ("127.0.0.1", 9092)}, "http://127.0.0.1:9404/metrics",
                         ["./data"]) == ("listening on PLAINTEXT://127.0.0.1:9092, metrics "
                                         "http://127.0.0.1:9404/metrics, data ./data")
    assert ready_message({"PLAINTEXT": ("", 9092), "SSL": ("::1", 9093)}, None,
                         ["/a", "/b"]) == ("listening on PLAINTEXT://0.0.0.0:9092 and "
                                           "SSL://[::1]:9093, metrics off, data /a, /b")
