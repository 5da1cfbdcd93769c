"""Throw-away certificates for the listener and TLS tests, made with the `cryptography` package.

A CA, a broker certificate for 127.0.0.1/localhost and client certificates with any subject
(``x509.Name``, so tests control RDN order, multi-valued RDNs and string types), written as the
PEM files Kafka's ``ssl.keystore.type=PEM`` reads: one keystore file with the PKCS#8 key and the
certificate chain, and the CA as the truststore. Key files are mode 0600. Leaf certificates
carry key usage, extended key usage (serverAuth or clientAuth) and key identifiers.

This is the one certificate maker of the tests: tests/support/certs.py builds on it.
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

_OIDS = {"CN": NameOID.COMMON_NAME, "OU": NameOID.ORGANIZATIONAL_UNIT_NAME,
         "O": NameOID.ORGANIZATION_NAME, "L": NameOID.LOCALITY_NAME,
         "ST": NameOID.STATE_OR_PROVINCE_NAME, "C": NameOID.COUNTRY_NAME}


def dn(attrs: dict[str, str]) -> x509.Name:
    """A subject from attributes by short name (CN, OU, O, L, ST, C), most significant first
    as in openssl's -subj and x509.Name; RFC 4514 text lists them in reverse."""
    return x509.Name([x509.NameAttribute(_OIDS[k], v) for k, v in attrs.items()])


@dataclass(frozen=True)
class Issued:
    key_pem: str  # PKCS#8 (encrypted when a password was given)
    chain_pem: str  # leaf first, then the CA
    keystore: Path  # key + chain in one file (ssl.keystore.location)
    cert: Path  # chain only (a client's ssl.certificate.location / certfile)
    key: Path  # key only (a client's ssl.key.location / keyfile)
    der: bytes  # the leaf, DER

    @property
    def subject(self) -> str:
        """RFC 4514 (what Java's X500Principal.getName() prints for these names)."""
        return x509.load_der_x509_certificate(self.der).subject.rfc4514_string()


def _write_private(path: Path, text: str) -> None:
    """A key-bearing file, readable by its owner only (mode 0600)."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(text)


class CertAuthority:
    def __init__(self, directory: Path, cn: str = "mini-broker test CA") -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False,
                                         False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()),
                           critical=False)
            .sign(self.key, hashes.SHA256()))
        self.ca_pem = self.cert.public_bytes(serialization.Encoding.PEM).decode()
        self.ca_path = self.dir / "ca.pem"
        self.ca_path.write_text(self.ca_pem)

    def issue(self, label: str, subject: x509.Name, *, server: bool = False,
              password: str | None = None) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(self.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, True, False, False, False,
                                         False), critical=True)  # digitalSignature, keyAgreement
            .add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self.key.public_key()), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        encryption: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(password.encode()) if password
            else serialization.NoEncryption())
        key_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8, encryption).decode()
        chain_pem = cert.public_bytes(serialization.Encoding.PEM).decode() + self.ca_pem
        keystore = self.dir / f"{label}.keystore.pem"
        _write_private(keystore, key_pem + chain_pem)
        cert_path = self.dir / f"{label}.crt.pem"
        cert_path.write_text(chain_pem)
        key_path = self.dir / f"{label}.key.pem"
        _write_private(key_path, key_pem)
        return Issued(key_pem, chain_pem, keystore, cert_path, key_path,
                      cert.public_bytes(serialization.Encoding.DER))

    def server(self, label: str = "broker", password: str | None = None) -> Issued:
        return self.issue(label, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]),
                          server=True, password=password)

    def client(self, label: str, **attrs: str) -> Issued:
        """A client certificate; attributes by short name, most specific first as written in
        the DN (client("alice", CN="alice", O="Example", C="US"))."""
        return self.issue(label, dn(dict(reversed(attrs.items()))))
