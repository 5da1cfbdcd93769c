import pytest

from broker.config import BrokerConfig, ConfigError, read_properties
from broker.security.config_checks import check_listener_security


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
        ("default.replication.factor=0", "default.replication.factor"),
        ("min.insync.replicas=0", "min.insync.replicas"),
        ("replica.lag.time.max.ms=0", "replica.lag.time.max.ms"),
        ("replica.high.watermark.checkpoint.interval.ms=0",
         "replica.high.watermark.checkpoint.interval.ms"),
        ("request.processing.mode=parallel", "request.processing.mode"),
    ],
)
def test_bad_keys_and_values_name_the_key(override, key):
    """Refused when read or, for a listener's security keys, when checked at start (before
    any listener is bound, as Kafka checks them when it builds the listener's channel)."""
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_listener_security(BrokerConfig.from_properties(None, [override]))


def test_properties_continuation_lines(tmp_path):
    p = tmp_path / "x.properties"
    p.write_text("listeners=PLAINTEXT://127.0.0.1:1,\\\n  PLAINTEXT://127.0.0.1:2\n! bang\n")
    assert read_properties(p) == {"listeners": "PLAINTEXT://127.0.0.1:1,PLAINTEXT://127.0.0.1:2"}


# -- listeners, as Kafka's KafkaConfig reads them ---------------------------------------------
def _cfg(**overrides: str) -> BrokerConfig:
    return BrokerConfig.from_dict({k.replace("_", "."): v for k, v in overrides.items()})


def _raw(raw: dict[str, str]) -> BrokerConfig:
    return BrokerConfig.from_dict(raw)


def _secured(raw: dict[str, str]) -> BrokerConfig:
    """A configuration whose listeners' TLS and SASL keys were checked, as at start."""
    config = BrokerConfig.from_dict(raw)
    check_listener_security(config)
    return config


@pytest.fixture()
def pem(tmp_path):
    """A PEM key store file and a CA file (contents are read only when a context is built)."""
    keystore = tmp_path / "broker.keystore.pem"
    keystore.write_text("-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n")
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n")
    return keystore, ca


def test_listener_specs_names_protocols_and_wildcard_host(pem):
    keystore, _ = pem
    cfg = _raw({
        "listeners": "plaintext://127.0.0.1:9092,INTERNAL://:9093,SSL://[::1]:9094,"
                     "SASL_SSL://localhost:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,internal:sasl_plaintext,"
                                          "SSL:SSL,SASL_SSL:SASL_SSL",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(keystore)})
    assert [(s.name, s.security_protocol, s.host, s.port) for s in cfg.listener_specs()] == [
        ("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092),
        ("INTERNAL", "SASL_PLAINTEXT", "", 9093),  # empty host: every interface
        ("SSL", "SSL", "::1", 9094),
        ("SASL_SSL", "SASL_SSL", "localhost", 0),
    ]
    assert cfg.listener == ("127.0.0.1", 9092)  # the first listener, as before
    assert cfg.advertised == ("127.0.0.1", 9092)
    adv = cfg.advertised_endpoints()
    assert adv["SSL"] == ("::1", 9094) and adv["SASL_SSL"] == ("localhost", 0)
    assert adv["INTERNAL"][0]  # an empty host is advertised as this machine's name


def test_advertised_listeners_override_per_listener():
    cfg = _cfg(listeners="PLAINTEXT://0.0.0.0:9092,CLIENT://127.0.0.1:9093",
               listener_security_protocol_map="PLAINTEXT:PLAINTEXT,CLIENT:PLAINTEXT",
               advertised_listeners="PLAINTEXT://broker.example:19092")
    assert cfg.advertised_endpoints() == {"PLAINTEXT": ("broker.example", 19092),
                                          "CLIENT": ("127.0.0.1", 9093)}
    assert cfg.advertised == ("broker.example", 19092)


@pytest.mark.parametrize("raw, message", [
    ({"listeners": "PLAINTEXT://h:1,PLAINTEXT://h:2"}, "different name"),
    ({"listeners": "PLAINTEXT://h:1,plaintext://h:2"}, "different name"),  # names normalised
    ({"listeners": "PLAINTEXT://h:1,CLIENT://h:1",
      "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CLIENT:PLAINTEXT"},
     "different port"),
    ({"listeners": "INTERNAL://h:1"}, "no security protocol defined for listener INTERNAL"),
    ({"listener.security.protocol.map": "PLAINTEXT:TLS"}, "invalid security protocol"),
    ({"listener.security.protocol.map": "PLAINTEXT"}, "expected NAME:PROTOCOL"),
    ({"listeners": "PLAINTEXT//h:1"}, "expected NAME://host:port"),
    ({"listeners": "://h:1"}, "expected NAME://host:port"),
    ({"listeners": "PLAINTEXT://h:70000"}, "port out of range"),
    ({"advertised.listeners": "OTHER://h:1",
      "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,OTHER:PLAINTEXT"},
     "not in listeners"),
    ({"listeners": "PLAINTEXT://0.0.0.0:9092"}, "0.0.0.0"),
    ({"advertised.listeners": "PLAINTEXT://0.0.0.0:9092"}, "0.0.0.0"),
])
def test_listener_refusals(raw, message):
    with pytest.raises(ConfigError, match=message):
        _raw(raw)


def test_duplicate_ports_allowed_for_port_zero_and_ipv4_plus_ipv6():
    m = "PLAINTEXT:PLAINTEXT,V6:PLAINTEXT,B:PLAINTEXT"
    _raw({"listeners": "PLAINTEXT://127.0.0.1:0,V6://127.0.0.1:0",
          "listener.security.protocol.map": m})
    _raw({"listeners": "PLAINTEXT://127.0.0.1:9092,V6://[::1]:9092",
          "listener.security.protocol.map": m})
    with pytest.raises(ConfigError, match="different port"):
        _raw({"listeners": "PLAINTEXT://127.0.0.1:9092,V6://[::1]:9092,B://10.0.0.1:9092",
              "listener.security.protocol.map": m})
    # advertised.listeners may share ports (Kafka's requireDistinctPorts=false)
    _raw({"listeners": "PLAINTEXT://127.0.0.1:9092,V6://127.0.0.1:9093",
          "advertised.listeners": "PLAINTEXT://lb:9092,V6://lb:9092",
          "listener.security.protocol.map": m})


def test_listener_prefixed_keys_override_the_plain_key(pem):
    keystore, ca = pem
    cfg = _raw({
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        "sasl.enabled.mechanisms": "SCRAM-SHA-256",
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config":
            'org.apache.kafka.common.security.plain.PlainLoginModule required '
            'user_alice="alice-secret";',
        "listener.name.sasl_ssl.ssl.keystore.type": "PEM",
        "listener.name.sasl_ssl.ssl.keystore.location": str(keystore),
        "listener.name.sasl_ssl.ssl.client.auth": "required",
        "listener.name.sasl_ssl.connections.max.reauth.ms": "60000",
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(ca)})
    assert cfg.listener_value("SASL_PLAINTEXT", "sasl.enabled.mechanisms") == ["PLAIN"]
    assert cfg.listener_value("SASL_SSL", "sasl.enabled.mechanisms") == ["SCRAM-SHA-256"]
    assert cfg.listener_value("sasl_ssl", "ssl.client.auth") == "required"
    assert cfg.listener_value("SASL_PLAINTEXT", "ssl.client.auth") == "none"
    assert cfg.listener_value("SASL_SSL", "connections.max.reauth.ms") == 60000  # parsed
    assert cfg.listener_value("SASL_PLAINTEXT", "connections.max.reauth.ms") == 0
    assert cfg.listener_value("SASL_SSL", "ssl.truststore.location") == str(ca)  # plain key
    jaas = cfg.listener_value("SASL_PLAINTEXT", "plain.sasl.jaas.config")
    assert 'user_alice="alice-secret"' in jaas
    assert cfg.listener_value("SASL_SSL", "plain.sasl.jaas.config") is None
    assert cfg.listener_value("SASL_PLAINTEXT", "scram-sha-256.sasl.jaas.config") is None
    assert "listener.name.sasl_ssl.ssl.client.auth" in cfg.listener_overrides()
    # a dynamic change re-reads the static text: the prefixed values survive it
    layered = cfg.layered({"num.partitions": "3"})
    cfg.update_from(layered)
    assert cfg.listener_value("SASL_PLAINTEXT", "sasl.enabled.mechanisms") == ["PLAIN"]


@pytest.mark.parametrize("key, value, message", [
    ("listener.name.plaintext.log.dirs", "/x", "unknown configuration key"),
    ("listener.name.PLAINTEXT.ssl.client.auth", "none", "lower case"),
    ("listener.name.plaintext.gssapi.sasl.jaas.config", "x", "unknown configuration key"),
    ("listener.name.plaintext", "x", "unknown configuration key"),
    ("listener.name.other.ssl.client.auth", "none", "no listener named OTHER"),
    ("listener.name.plaintext.ssl.client.auth", "sometimes",
     r"listener\.name\.plaintext\.ssl\.client\.auth"),
    ("listener.name.plaintext.connections.max.reauth.ms", "-5",
     r"listener\.name\.plaintext\.connections\.max\.reauth\.ms"),
])
def test_listener_prefixed_key_refusals(key, value, message):
    with pytest.raises(ConfigError, match=message):
        _raw({key: value})


@pytest.mark.parametrize("extra, message", [
    ({}, "needs a key store"),
    ({"ssl.keystore.location": "{ks}"}, "only PEM key stores"),  # type defaults to JKS
    ({"ssl.keystore.type": "PKCS12", "ssl.keystore.location": "{ks}"}, "only PEM"),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.location": "{ks}",
      "ssl.keystore.password": "x"}, "cannot be given with a PEM key store"),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.location": "/nonexistent.pem"},
     "no such file"),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.key": "k"}, "certificate.chain is not"),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": "c"},
     "ssl.keystore.key is not"),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.key": "k",
      "ssl.keystore.certificate.chain": "c", "ssl.keystore.location": "{ks}"}, "use one"),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.location": "{ks}",
      "ssl.truststore.location": "{ca}"}, "only PEM trust stores"),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.location": "{ks}",
      "ssl.truststore.type": "PEM", "ssl.truststore.location": "{ca}",
      "ssl.truststore.certificates": "c"}, "use one"),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.location": "{ks}",
      "ssl.enabled.protocols": "TLSv1.2,SSLv3"}, "unknown protocol 'SSLv3'"),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.location": "{ks}",
      "ssl.cipher.suites": "TLS_NO_SUCH_SUITE"}, "unknown cipher suite"),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.location": "{ks}",
      "ssl.principal.mapping.rules": "RULE:^CN=(.*?)$/$1/X/"}, "invalid rule"),
])
def test_tls_listener_refusals(pem, extra, message):
    keystore, ca = pem
    raw = {"listeners": "SSL://127.0.0.1:0",
           **{k: v.format(ks=keystore, ca=ca) for k, v in extra.items()}}
    with pytest.raises(ConfigError, match=message):
        _secured(raw)


def test_tls_listener_accepted_with_a_pem_key_store_file_or_inline(pem):
    keystore, ca = pem
    _secured({"listeners": "SSL://127.0.0.1:0", "ssl.keystore.type": "PEM",
          "ssl.keystore.location": str(keystore), "ssl.truststore.type": "PEM",
          "ssl.truststore.location": str(ca), "ssl.client.auth": "required",
          "ssl.cipher.suites": "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,TLS_AES_128_GCM_SHA256"})
    _secured({"listeners": "SSL://127.0.0.1:0", "ssl.keystore.type": "PEM",
          "ssl.keystore.certificate.chain": "chain", "ssl.keystore.key": "key"})
    # a PLAINTEXT-only broker never looks at the ssl keys (Kafka's JKS defaults stay harmless)
    _secured({"ssl.keystore.location": "/nonexistent.jks"})


@pytest.mark.parametrize("mechanisms, message", [
    (None, "GSSAPI is Kafka's default"),  # sasl.enabled.mechanisms left at Kafka's default
    ("PLAIN,OAUTHBEARER", "OAUTHBEARER is not served"),
    ("", "is empty"),
])
def test_sasl_listener_mechanism_refusals(mechanisms, message):
    raw = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0"}
    if mechanisms is not None:
        raw["sasl.enabled.mechanisms"] = mechanisms
    with pytest.raises(ConfigError, match=message) as info:
        _secured(raw)
    assert "sasl.enabled.mechanisms" in str(info.value)


def test_sasl_mechanisms_checked_per_listener():
    cfg = _secured({"listeners": "SASL_PLAINTEXT://127.0.0.1:0",
                "listener.name.sasl_plaintext.sasl.enabled.mechanisms":
                    "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"})
    assert cfg.listener_value("SASL_PLAINTEXT", "sasl.enabled.mechanisms") == [
        "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    assert cfg["sasl.enabled.mechanisms"] == ["GSSAPI"]  # the plain key keeps Kafka's default


FAST_GROUPS = {"group.consumer.min.session.timeout.ms": "1000",
               "group.consumer.session.timeout.ms": "6000",
               "group.consumer.min.heartbeat.interval.ms": "100",
               "group.consumer.heartbeat.interval.ms": "500"}


def test_group_keys_accepted_within_their_bounds():
    config = BrokerConfig.from_dict({**FAST_GROUPS, "group.consumer.assignors":
                                     "org.apache.kafka.coordinator.group.assignor.RangeAssignor"})
    assert config["group.consumer.session.timeout.ms"] == 6000
    assert config["group.coordinator.rebalance.protocols"] == ["classic", "consumer"]


@pytest.mark.parametrize("raw, message", [
    ({"group.consumer.assignors": "sticky"}, "unknown assignor 'sticky'"),
    ({"group.consumer.assignors": ""}, "group.consumer.assignors"),
    ({"group.coordinator.rebalance.protocols": "consumer"}, "expected classic"),
    ({"group.coordinator.rebalance.protocols": "classic,share"}, "expected classic"),
    ({"group.consumer.session.timeout.ms": "6000"},
     "group.consumer.session.timeout.ms=6000 must lie within"),
    ({**FAST_GROUPS, "group.consumer.heartbeat.interval.ms": "50"},
     "group.consumer.heartbeat.interval.ms=50 must lie within"),
    ({"group.consumer.max.heartbeat.interval.ms": "4000"},
     "group.consumer.max.heartbeat.interval.ms=4000 is below"),
    ({**FAST_GROUPS, "group.consumer.heartbeat.interval.ms": "6000",
      "group.consumer.max.heartbeat.interval.ms": "15000"}, "must be less than"),
])
def test_group_key_refusals(raw, message):
    """What Kafka's GroupCoordinatorConfig refuses at start, refused here at start too."""
    with pytest.raises(ConfigError, match=message):
        BrokerConfig.from_dict(raw)
