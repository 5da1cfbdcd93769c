"""A PKI for the secured-broker tests and benchmarks, and the broker's and clients' settings.

The certificates come from tests/support/tls_certs.py's CertAuthority (the one certificate
maker): a throw-away CA, a broker certificate for 127.0.0.1 and localhost (SAN IP and DNS, so
clients that verify the host name accept it) and client certificates with chosen
distinguished names, as PEM files: a keystore (unencrypted PKCS#8 key + chain) and the CA
(the truststore), the format Kafka's `ssl.keystore.type=PEM` reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.support.tls_certs import CertAuthority, Issued, dn

# A key and certificate chain as PEM text and files (key_pem, chain_pem, key, cert, keystore,
# subject): what CertAuthority issues.
Identity = Issued


@dataclass(frozen=True)
class Pki:
    ca: CertAuthority
    broker: Identity

    @property
    def dir(self) -> Path:
        return self.ca.dir

    @property
    def ca_pem(self) -> str:
        return self.ca.ca_pem

    @property
    def ca_path(self) -> Path:  # the truststore: ssl.truststore.location / ssl.ca.location
        return self.ca.ca_path

    def client(self, name: str, subject: dict[str, str] | None = None) -> Identity:
        """A client certificate signed by the CA; subject attributes by short name (CN, OU,
        O, L, ST, C), CN=<name> when none are given."""
        return self.ca.issue(name, dn(subject or {"CN": name}))


def make_pki(directory: Path, broker_subject: dict[str, str] | None = None) -> Pki:
    """A CA and a broker certificate for 127.0.0.1/localhost, as PEM files in `directory`."""
    ca = CertAuthority(directory)
    broker = ca.issue("broker", dn(broker_subject or {"CN": "localhost"}), server=True)
    return Pki(ca, broker)


def broker_ssl_overrides(pki: Pki, listener: str | None = None,
                         client_auth: str | None = None) -> dict[str, str]:
    """Broker keys for a PEM keystore file and a PEM truststore file, per listener when
    `listener` is given (`listener.name.<name lower-case>.ssl.*`)."""
    prefix = f"listener.name.{listener.lower()}." if listener else ""
    keys = {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki.broker.keystore),
            "ssl.truststore.type": "PEM", "ssl.truststore.location": str(pki.ca_path)}
    if client_auth:
        keys["ssl.client.auth"] = client_auth
    return {prefix + k: v for k, v in keys.items()}


# -- a secured broker and the clients' settings for it ----------------------------------------

PLAIN_LOGIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")


def plain_jaas(users: dict[str, str]) -> str:
    """Kafka's broker-side PLAIN jaas text: `user_<name>="<password>"` per user."""
    entries = " ".join(f'user_{u}="{p}"' for u, p in users.items())
    return f"{PLAIN_LOGIN} required {entries};"


def secure_broker_overrides(pki: Pki, plain_users: dict[str, str],
                            mechanisms: tuple[str, ...] = MECHANISMS,
                            listeners: tuple[str, ...] = ("PLAINTEXT", "SASL_PLAINTEXT",
                                                          "SASL_SSL"),
                            acls: bool = True) -> dict[str, str]:
    """A broker with one listener per security protocol named after it (ephemeral ports),
    SASL on the SASL ones with the PLAIN users of `plain_users`, TLS from the PKI, and
    Kafka's StandardAuthorizer with User:admin as super user."""
    keys = {"listeners": ",".join(f"{name}://127.0.0.1:0" for name in listeners),
            "sasl.enabled.mechanisms": ",".join(mechanisms),
            **broker_ssl_overrides(pki)}
    for name in listeners:
        if name.startswith("SASL_") and "PLAIN" in mechanisms:
            keys[f"listener.name.{name.lower()}.plain.sasl.jaas.config"] = plain_jaas(plain_users)
    if acls:
        keys |= {"authorizer.class.name": STANDARD_AUTHORIZER, "super.users": "User:admin"}
    return keys


def confluent_config(bootstrap: str, protocol: str, mechanism: str | None = None,
                     user: str = "", password: str = "", ca: Path | None = None) -> dict:
    """librdkafka's keys (confluent-kafka, kcat's -X)."""
    conf: dict = {"bootstrap.servers": bootstrap, "security.protocol": protocol,
                  "broker.address.family": "v4"}
    if protocol.startswith("SASL_"):
        conf |= {"sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password}
    if protocol.endswith("SSL") and ca is not None:
        conf["ssl.ca.location"] = str(ca)
    return conf


def kafka_python_config(bootstrap: str, protocol: str, mechanism: str | None = None,
                        user: str = "", password: str = "", ca: Path | None = None) -> dict:
    """kafka-python's keyword arguments (KafkaProducer, KafkaConsumer, KafkaAdminClient)."""
    conf: dict = {"bootstrap_servers": bootstrap, "security_protocol": protocol}
    if protocol.startswith("SASL_"):
        conf |= {"sasl_mechanism": mechanism, "sasl_plain_username": user,
                 "sasl_plain_password": password}
    if protocol.endswith("SSL") and ca is not None:
        conf["ssl_cafile"] = str(ca)
    return conf


def aiokafka_config(bootstrap: str, protocol: str, mechanism: str | None = None,
                    user: str = "", password: str = "", ca: Path | None = None) -> dict:
    """aiokafka's keyword arguments: TLS through an ssl.SSLContext (host name checked)."""
    from aiokafka.helpers import create_ssl_context

    conf: dict = {"bootstrap_servers": bootstrap, "security_protocol": protocol}
    if protocol.startswith("SASL_"):
        conf |= {"sasl_mechanism": mechanism, "sasl_plain_username": user,
                 "sasl_plain_password": password}
    if protocol.endswith("SSL") and ca is not None:
        conf["ssl_context"] = create_ssl_context(cafile=str(ca))
    return conf


def kcat_args(conf: dict) -> list[str]:
    """A librdkafka configuration as kcat's `-b` and `-X key=value` arguments."""
    args = ["-b", conf["bootstrap.servers"]]
    for k, v in conf.items():
        if k != "bootstrap.servers":  # sasl.mechanisms: the name kcat's documentation uses
            args += ["-X", f"{'sasl.mechanisms' if k == 'sasl.mechanism' else k}={v}"]
    return args


# -- benchmarks: SASL_SSL with SCRAM-SHA-256 beside PLAINTEXT ---------------------------------

BENCH_USER, BENCH_PASSWORD = "bench", "bench-secret"


def bench_broker_overrides(pki: Pki) -> dict[str, str]:
    """PLAINTEXT (first: the broker's `bootstrap`, for setup) and SASL_SSL with SCRAM-SHA-256,
    no authorizer: what the benchmarks' TLS rows measure is the channel, not ACL checks."""
    return secure_broker_overrides(pki, {}, mechanisms=("SCRAM-SHA-256",),
                                   listeners=("PLAINTEXT", "SASL_SSL"), acls=False)


def add_bench_user(plaintext_bootstrap: str) -> None:
    """The benchmark's SCRAM-SHA-256 user, created over the PLAINTEXT listener."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": plaintext_bootstrap})
    upsert = UserScramCredentialUpsertion(
        BENCH_USER, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
        BENCH_PASSWORD.encode())
    admin.alter_user_scram_credentials([upsert])[BENCH_USER].result(30)


def bench_client_config(sasl_ssl_bootstrap: str, pki: Pki) -> dict:
    """librdkafka's settings for the benchmark user over SASL_SSL."""
    return confluent_config(sasl_ssl_bootstrap, "SASL_SSL", "SCRAM-SHA-256", BENCH_USER,
                            BENCH_PASSWORD, pki.ca_path)
