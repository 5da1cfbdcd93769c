import pytest

from broker.config import BrokerConfig, ConfigError, read_properties


def test_defaults_and_overrides(tmp_path):
    props = tmp_path / "server.properties"
    props.write_text("# comment\nnode.id=3\nlog.dirs = /a, /b\nnum.partitions: 4\n")
    overrides = ["num.partitions=6", "auto.create.topics.enable=false"]
    cfg = BrokerConfig.from_properties(props, overrides)
    assert cfg["node.id"] == 3
    assert cfg["log.dirs"] == ["/a", "/b"]
    assert cfg["num.partitions"] == 6
    assert cfg["auto.create.topics.enable"] is False
    assert cfg["log.segment.bytes"] == 1073741824
    assert cfg.listener == ("127.0.0.1", 9092)
    assert cfg.advertised == ("127.0.0.1", 9092)


@pytest.mark.parametrize(
    "override, key",
    [
        ("log.segmnt.bytes=100", "log.segmnt.bytes"),
        ("num.partitions=zero", "num.partitions"),
        ("num.partitions=0", "num.partitions"),
        ("auto.create.topics.enable=yes", "auto.create.topics.enable"),
        ("listeners=SSL://h:1", "listeners"),
        ("default.replication.factor=3", "default.replication.factor"),
        ("request.processing.mode=parallel", "request.processing.mode"),
    ],
)
def test_bad_keys_and_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        BrokerConfig.from_properties(None, [override])


def test_properties_continuation_lines(tmp_path):
    p = tmp_path / "x.properties"
    p.write_text("listeners=PLAINTEXT://127.0.0.1:1,\\\n  PLAINTEXT://127.0.0.1:2\n! bang\n")
    assert read_properties(p) == {"listeners": "PLAINTEXT://127.0.0.1:1,PLAINTEXT://127.0.0.1:2"}
