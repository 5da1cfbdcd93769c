"""Certificates for the TLS tests, made fresh per test run with the `cryptography` package.

A throw-away CA signs a broker certificate for 127.0.0.1 and localhost (SAN IP and DNS, so
clients that verify the host name accept it) and client certificates with chosen
distinguished names (for mTLS and ssl.principal.mapping.rules). Everything is written as PEM,
the format Kafka's `ssl.keystore.type=PEM` reads: one file holding the unencrypted PKCS#8 key
and the certificate chain (the keystore), one holding the CA (the truststore).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# P-256: key generation is instant, where RSA 2048 costs ~50 ms a key; every client here speaks it.
_CURVE = ec.SECP256R1()


@dataclass(frozen=True)
class Identity:
    """A key and certificate chain as PEM text and files."""

    key_pem: str  # PKCS#8, unencrypted
    cert_pem: str  # leaf first, then the CA
    key_path: Path
    cert_path: Path
    keystore_path: Path  # key + chain in one file, as ssl.keystore.location with type PEM
    subject: str  # RFC 4514 (what Java's X500Principal.getName() prints for these names)


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca_pem: str
    ca_path: Path  # the truststore: ssl.truststore.location / ssl.ca.location / cafile
    ca_key: ec.EllipticCurvePrivateKey
    ca_cert: x509.Certificate
    broker: Identity

    def client(self, name: str, subject: dict[str, str] | None = None) -> Identity:
        """A client certificate signed by the CA; subject attributes by short name (CN, OU,
        O, L, ST, C), CN=<name> when none are given."""
        attrs = subject or {"CN": name}
        cert, key = _issue(self.ca_cert, self.ca_key, _name(attrs), server=False)
        return _write(self.dir, name, key, cert, self.ca_cert)


_OIDS = {"CN": NameOID.COMMON_NAME, "OU": NameOID.ORGANIZATIONAL_UNIT_NAME,
         "O": NameOID.ORGANIZATION_NAME, "L": NameOID.LOCALITY_NAME,
         "ST": NameOID.STATE_OR_PROVINCE_NAME, "C": NameOID.COUNTRY_NAME}


def _name(attrs: dict[str, str]) -> x509.Name:
    """Attributes in the order given are the DN's most significant first, as in openssl's
    -subj; RFC 4514 text lists them in reverse (CN first when it was given last)."""
    return x509.Name([x509.NameAttribute(_OIDS[k], v) for k, v in attrs.items()])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _pem_cert(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _validity() -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.UTC)
    return now - datetime.timedelta(hours=1), now + datetime.timedelta(days=2)


def _issue(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, subject: x509.Name,
           server: bool) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(_CURVE)
    start, end = _validity()
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False,
                                            content_commitment=False, data_encipherment=False,
                                            key_agreement=True, key_cert_sign=False,
                                            crl_sign=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage(
                   [ExtendedKeyUsageOID.SERVER_AUTH if server
                    else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                   ca_key.public_key()), critical=False)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                              critical=False))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _write(directory: Path, name: str, key: ec.EllipticCurvePrivateKey,
           cert: x509.Certificate, ca: x509.Certificate) -> Identity:
    key_pem, chain = _pem_key(key), _pem_cert(cert) + _pem_cert(ca)
    key_path, cert_path = directory / f"{name}.key", directory / f"{name}.crt"
    keystore = directory / f"{name}.keystore.pem"
    key_path.write_text(key_pem)
    cert_path.write_text(chain)
    keystore.write_text(key_pem + chain)
    for p in (key_path, keystore):
        p.chmod(0o600)
    return Identity(key_pem, chain, key_path, cert_path, keystore,
                    cert.subject.rfc4514_string())


def make_pki(directory: Path, broker_subject: dict[str, str] | None = None) -> Pki:
    """A CA and a broker certificate for 127.0.0.1/localhost, as PEM files in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(_CURVE)
    ca_name = _name({"O": "mini-broker tests", "CN": "mini-broker test CA"})
    start, end = _validity()
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False,
                                            content_commitment=False, data_encipherment=False,
                                            key_agreement=False, key_cert_sign=True,
                                            crl_sign=True, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                              critical=False)
               .sign(ca_key, hashes.SHA256()))
    ca_pem = _pem_cert(ca_cert)
    ca_path = directory / "ca.crt"
    ca_path.write_text(ca_pem)
    cert, key = _issue(ca_cert, ca_key, _name(broker_subject or {"CN": "localhost"}),
                       server=True)
    broker = _write(directory, "broker", key, cert, ca_cert)
    return Pki(directory, ca_pem, ca_path, ca_key, ca_cert, broker)


def broker_ssl_overrides(pki: Pki, listener: str | None = None,
                         client_auth: str | None = None) -> dict[str, str]:
    """Broker keys for a PEM keystore file and a PEM truststore file, per listener when
    `listener` is given (`listener.name.<name lower-case>.ssl.*`)."""
    prefix = f"listener.name.{listener.lower()}." if listener else ""
    keys = {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki.broker.keystore_path),
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
