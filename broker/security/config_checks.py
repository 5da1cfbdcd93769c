"""The listener security keys Kafka checks when it builds a listener's channel (its SSL
engine factory and SASL server settings), checked here before any listener is bound: a PEM key
store and trust store given consistently, known TLS versions, cipher suites and principal
mapping rules, and SASL mechanisms this broker serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.config import LISTENER_PREFIX, SASL_MECHANISMS, TLS_VERSIONS, BrokerConfig
from broker.config_error import ConfigError
from broker.security.ssl import SslPrincipalMapper, openssl_cipher_names


def check_listener_security(config: BrokerConfig) -> None:
    """Every listener's TLS and SASL keys (ConfigError naming the key as it was given)."""
    for spec in config.listener_specs():
        if spec.security_protocol in ("SSL", "SASL_SSL"):
            check_tls(config, spec.name)
        if spec.security_protocol.startswith("SASL_"):
            check_sasl(config, spec.name)


def check_tls(config: BrokerConfig, listener: str) -> None:
    """Kafka's PEM key store and trust store rules (DefaultSslEngineFactory), per listener;
    the files' contents are read when the listener's TLS context is built at start."""
    def value(key: str) -> Any:
        return config.listener_value(listener, key)

    def where(key: str) -> str:
        return config.listener_key_name(listener, key)

    prefix = f"listener {listener}"
    key, chain = value("ssl.keystore.key"), value("ssl.keystore.certificate.chain")
    location, ktype = value("ssl.keystore.location"), value("ssl.keystore.type")
    if key or chain or location:
        if ktype.upper() != "PEM":
            raise ConfigError(
                f"{prefix}: {where('ssl.keystore.type')}={ktype}: only PEM key stores are "
                f"served; set ssl.keystore.type=PEM (convert a JKS or PKCS12 store to one "
                f"PEM file holding the private key and the certificate chain)")
        if value("ssl.keystore.password"):
            raise ConfigError(
                f"{prefix}: {where('ssl.keystore.password')} cannot be given with a PEM key "
                f"store; an encrypted private key takes ssl.key.password")
    if key and not chain:
        raise ConfigError(f"{prefix}: {where('ssl.keystore.key')} is given but "
                          f"ssl.keystore.certificate.chain is not")
    if chain and not key:
        raise ConfigError(f"{prefix}: {where('ssl.keystore.certificate.chain')} is given "
                          f"but ssl.keystore.key is not")
    if key and location:
        raise ConfigError(f"{prefix}: both {where('ssl.keystore.location')} and an inline "
                          f"ssl.keystore.key are given; use one")
    if not key and not location:
        raise ConfigError(
            f"{prefix} (listeners) is {config.security_protocol_map().get(listener)} and needs "
            f"a key store: set ssl.keystore.type=PEM with ssl.keystore.location (one PEM "
            f"file: private key and certificate chain), or ssl.keystore.certificate.chain "
            f"and ssl.keystore.key, optionally as {LISTENER_PREFIX}{listener.lower()}.ssl.*")
    if location and not Path(location).is_file():
        raise ConfigError(f"{prefix}: {where('ssl.keystore.location')}={location}: "
                          f"no such file")
    certs, tloc = value("ssl.truststore.certificates"), value("ssl.truststore.location")
    ttype = value("ssl.truststore.type")
    if (certs or tloc) and ttype.upper() != "PEM":
        raise ConfigError(
            f"{prefix}: {where('ssl.truststore.type')}={ttype}: only PEM trust stores are "
            f"served; set ssl.truststore.type=PEM (a PEM file of CA certificates)")
    if (certs or tloc) and value("ssl.truststore.password"):
        raise ConfigError(f"{prefix}: {where('ssl.truststore.password')} cannot be given "
                          f"with a PEM trust store")
    if certs and tloc:
        raise ConfigError(f"{prefix}: both {where('ssl.truststore.location')} and "
                          f"ssl.truststore.certificates are given; use one")
    if tloc and not Path(tloc).is_file():
        raise ConfigError(f"{prefix}: {where('ssl.truststore.location')}={tloc}: no such file")
    for version in value("ssl.enabled.protocols"):
        if version not in TLS_VERSIONS:
            raise ConfigError(
                f"{prefix}: {where('ssl.enabled.protocols')}: unknown protocol {version!r} "
                f"(expected {', '.join(TLS_VERSIONS)})")
    try:
        openssl_cipher_names(value("ssl.cipher.suites"))
    except ValueError as exc:
        raise ConfigError(f"{prefix}: {where('ssl.cipher.suites')}: {exc}") from None
    try:
        SslPrincipalMapper(value("ssl.principal.mapping.rules"))
    except ValueError as exc:
        raise ConfigError(f"{prefix}: {where('ssl.principal.mapping.rules')}: {exc}") from None

def check_sasl(config: BrokerConfig, listener: str) -> None:
    mechanisms = config.listener_value(listener, "sasl.enabled.mechanisms")
    where = config.listener_key_name(listener, "sasl.enabled.mechanisms")
    served = ", ".join(SASL_MECHANISMS)
    if not mechanisms:
        raise ConfigError(f"listener {listener} uses SASL but {where} is empty: set it to "
                          f"one or more of {served}")
    for mechanism in mechanisms:
        if mechanism not in SASL_MECHANISMS:
            default = (" (GSSAPI is Kafka's default)" if mechanism == "GSSAPI" else "")
            raise ConfigError(
                f"listener {listener}: SASL mechanism {mechanism} is not served{default}; "
                f"set {where} to one or more of {served}")
