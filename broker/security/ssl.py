"""TLS for SSL and SASL_SSL listeners: Kafka's PEM key stores on the standard library's ssl,
and the principal of a client certificate as Kafka names it.

Kafka reads its ``ssl.*`` keys per listener (``listener.name.<listener>.ssl.*`` overriding the
plain key), builds one SSL engine factory per listener, and names a TLS client by its
certificate's subject: ``X500Principal.getName()`` (RFC 2253, most specific name first) passed
through ``ssl.principal.mapping.rules`` (SslPrincipalMapper). The same happens here:

- ``server_ssl_context(cfg, listener)``: the key store (``ssl.keystore.location``, one PEM file
  with the private key and its certificate chain, or ``ssl.keystore.certificate.chain`` plus
  ``ssl.keystore.key`` inline; an encrypted key takes ``ssl.key.password``), the trust store
  (``ssl.truststore.location`` or ``ssl.truststore.certificates``; none: the system's CAs, as the
  JVM's default trust store), ``ssl.client.auth``, ``ssl.enabled.protocols`` and
  ``ssl.cipher.suites``.
- ``principal_builder(cfg, listener)``: ssl object -> User:<mapped DN>, User:ANONYMOUS without a
  client certificate.

Cipher suites: Kafka takes the IANA names Java uses (TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384);
OpenSSL names TLS 1.2 suites its own way (ECDHE-RSA-AES256-GCM-SHA384). Each name is rewritten
by the rule in ``_openssl_candidates`` and must then be a suite this OpenSSL knows (OpenSSL names
are accepted as they are). Python's ssl cannot narrow the TLS 1.3 suites (OpenSSL's
SSL_CTX_set_ciphersuites is not exposed): TLS 1.3 names are accepted, and when the list names
only TLS 1.3 suites the listener accepts only TLS 1.3, when it names only TLS 1.2 suites only
up to TLS 1.2 (as a Java engine without a TLS 1.3 suite cannot negotiate TLS 1.3); a list with
both logs once that TLS 1.3 keeps OpenSSL's default suites.
"""

from __future__ import annotations

import os
import re
import ssl
import tempfile
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from broker.config_error import ConfigError
from broker.security.principal import ANONYMOUS, USER_TYPE, KafkaPrincipal

if TYPE_CHECKING:
    from broker.config import BrokerConfig

logger = structlog.get_logger("broker.security")

_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
                "required": ssl.CERT_REQUIRED}
_TLS_VERSIONS = {"TLSv1": ssl.TLSVersion.TLSv1, "TLSv1.1": ssl.TLSVersion.TLSv1_1,
                 "TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
# RFC 8446's suites: the same name in IANA's registry and in OpenSSL.
TLS13_SUITES = frozenset({"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384",
                          "TLS_CHACHA20_POLY1305_SHA256", "TLS_AES_128_CCM_SHA256",
                          "TLS_AES_128_CCM_8_SHA256"})


# -- the context ---------------------------------------------------------------------------------
def server_ssl_context(cfg: BrokerConfig, listener_name: str) -> ssl.SSLContext:
    """The TLS server context of one listener (ConfigError naming the listener on a bad store)."""

    def value(key: str) -> object:
        return cfg.listener_value(listener_name, key)

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    key_password = str(value("ssl.key.password") or "")
    location = str(value("ssl.keystore.location") or "")
    try:
        if location:
            text = Path(location).read_text()
            _load_key_store(ctx, text, key_password)
        else:
            chain = str(value("ssl.keystore.certificate.chain") or "")
            key = str(value("ssl.keystore.key") or "")
            _load_key_store(ctx, chain + "\n" + key, key_password)
    except (OSError, ValueError) as exc:
        where = location or "ssl.keystore.certificate.chain/ssl.keystore.key"
        raise ConfigError(f"listener {listener_name}: cannot load the PEM key store "
                          f"{where}: {_reason(exc)}") from None
    trust_location = str(value("ssl.truststore.location") or "")
    trust_certs = str(value("ssl.truststore.certificates") or "")
    client_auth = str(value("ssl.client.auth"))
    try:
        if trust_location:
            ctx.load_verify_locations(cadata=normalise_pem(Path(trust_location).read_text()))
        elif trust_certs:
            ctx.load_verify_locations(cadata=normalise_pem(trust_certs))
        elif client_auth != "none":
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    except (OSError, ValueError) as exc:
        where = trust_location or "ssl.truststore.certificates"
        raise ConfigError(f"listener {listener_name}: cannot load the PEM trust store "
                          f"{where}: {_reason(exc)}") from None
    ctx.verify_mode = _CLIENT_AUTH[client_auth]
    versions = sorted(_TLS_VERSIONS[v] for v in value("ssl.enabled.protocols"))  # type: ignore[attr-defined]
    if versions:
        ctx.minimum_version, ctx.maximum_version = versions[0], versions[-1]
    _apply_cipher_suites(ctx, listener_name, list(value("ssl.cipher.suites")))  # type: ignore[call-overload]
    return ctx


def _reason(exc: BaseException) -> str:
    """An error's text without anything it quotes from a key store."""
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc)


_PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----(.*?)-----END \1-----", re.DOTALL)


def normalise_pem(text: str) -> str:
    """PEM blocks re-wrapped as OpenSSL reads them. Kafka's PemStore takes a block's base64
    with any whitespace (a properties value continued over lines arrives with spaces where the
    line breaks were); OpenSSL wants 64-character lines. Blocks with headers (legacy encrypted
    keys: Proc-Type, DEK-Info) are kept as they are."""
    out = []
    for m in _PEM_BLOCK.finditer(text):
        kind, body = m.group(1), m.group(2)
        if ":" in body:
            out.append(m.group(0).strip())
            continue
        b64 = "".join(body.split())
        lines = [b64[i:i + 64] for i in range(0, len(b64), 64)]
        out.append("\n".join([f"-----BEGIN {kind}-----", *lines, f"-----END {kind}-----"]))
    return "\n".join(out) + "\n" if out else ""


def _load_key_store(ctx: ssl.SSLContext, text: str, key_password: str) -> None:
    """Loads a PEM private key and its certificate chain from text, never leaving it on disk:
    OpenSSL reads files only, so the text goes to an anonymous memory file (memfd), or, where
    there is none, to a private 0600 temporary file removed as soon as it is read."""
    blocks = normalise_pem(text)
    certs = [b for b in _PEM_BLOCK.finditer(blocks) if b.group(1) == "CERTIFICATE"]
    keys = [b for b in _PEM_BLOCK.finditer(blocks) if b.group(1).endswith("PRIVATE KEY")]
    if not certs:
        raise ValueError("no certificate (-----BEGIN CERTIFICATE-----) found")
    if len(keys) != 1:
        raise ValueError(f"expected one private key, found {len(keys)}")
    # The leaf certificate first, its chain after it, then the key.
    pem = "\n".join([c.group(0) for c in certs] + [keys[0].group(0)]) + "\n"

    def password() -> bytes:
        if not key_password:
            raise ValueError("the private key is encrypted: set ssl.key.password")
        return key_password.encode()

    with _secret_file(pem.encode()) as path:
        ctx.load_cert_chain(path, password=password)


class _secret_file:
    """A path whose content is ``data``, readable by this process only, gone on exit."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.fd = -1
        self.path = ""

    def __enter__(self) -> str:
        memfd_create = getattr(os, "memfd_create", None)
        if memfd_create is not None and Path("/proc/self/fd").is_dir():
            self.fd = memfd_create("mini-broker-keystore", os.MFD_CLOEXEC)
            os.write(self.fd, self.data)
            return f"/proc/self/fd/{self.fd}"
        self.fd, self.path = tempfile.mkstemp(prefix="mini-broker-", suffix=".pem")  # 0600
        os.write(self.fd, self.data)
        return self.path

    def __exit__(self, *exc: object) -> None:
        if self.path:
            os.unlink(self.path)
        if self.fd >= 0:
            os.close(self.fd)


# -- cipher suites -------------------------------------------------------------------------------
@cache
def _openssl_ciphers() -> dict[str, str]:
    """Every TLS 1.2-and-older suite this OpenSSL knows: OpenSSL name -> protocol."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.set_ciphers("ALL:COMPLEMENTOFALL:@SECLEVEL=0")
    return {c["name"]: c["protocol"] for c in ctx.get_ciphers() if c["protocol"] != "TLSv1.3"}


_KX_AUTH = {  # IANA key exchange + authentication -> OpenSSL's prefixes, most usual first
    "RSA": ("",), "ECDHE_RSA": ("ECDHE-RSA-", "ECDHE-"), "ECDHE_ECDSA": ("ECDHE-ECDSA-",),
    "DHE_RSA": ("DHE-RSA-",), "DHE_DSS": ("DHE-DSS-",), "DH_anon": ("ADH-",),
    "ECDH_anon": ("AECDH-",), "PSK": ("PSK-",), "DHE_PSK": ("DHE-PSK-",),
    "PSK_DHE": ("DHE-PSK-",), "RSA_PSK": ("RSA-PSK-",), "ECDHE_PSK": ("ECDHE-PSK-",),
    "SRP_SHA": ("SRP-",), "SRP_SHA_RSA": ("SRP-RSA-",), "SRP_SHA_DSS": ("SRP-DSS-",),
}
_BULK = re.compile(r"(AES|ARIA|CAMELLIA)_(128|256)_(GCM|CBC|CCM)(_8)?(?:_(SHA\d*|MD5))?")


def _openssl_candidates(iana: str) -> Iterator[str]:
    """The rule from an IANA TLS 1.2 suite name to OpenSSL's: TLS_<kx>_<auth>_WITH_<bulk>
    becomes <kx>-<auth>-<bulk> with plain RSA key exchange dropped, AES_128 written AES128, a
    CBC mode left out (ECDHE-RSA-AES128-SHA256), except in PSK and SRP suites
    (PSK-AES128-CBC-SHA), CCM_8 written CCM8, and no hash after CCM or CHACHA20-POLY1305."""
    if not iana.startswith("TLS_") or "_WITH_" not in iana:
        return
    kx_auth, bulk = iana[4:].split("_WITH_", 1)
    prefixes = _KX_AUTH.get(kx_auth, ())
    bodies: list[str] = []
    m = _BULK.fullmatch(bulk)
    if m is not None:
        alg, bits, mode, eight, mac = m.groups()
        if mode == "CBC":
            bodies += [f"{alg}{bits}-{mac}", f"{alg}{bits}-CBC-{mac}", f"{alg}-{bits}-CBC-{mac}"]
        elif mode == "GCM":
            bodies.append(f"{alg}{bits}-GCM-{mac}")
        else:
            bodies.append(f"{alg}{bits}-CCM{'8' if eight else ''}")
    elif bulk == "CHACHA20_POLY1305_SHA256":
        bodies.append("CHACHA20-POLY1305")
    elif bulk.startswith("NULL_"):
        bodies.append("NULL-" + bulk[5:])
    elif bulk == "3DES_EDE_CBC_SHA":
        bodies.append("DES-CBC3-SHA")
    for prefix in prefixes:
        for body in bodies:
            yield prefix + body


def openssl_cipher_names(suites: list[str]) -> tuple[list[str], list[str]]:
    """ssl.cipher.suites -> (OpenSSL names of the TLS 1.2 suites, the TLS 1.3 suites named);
    ValueError naming a suite this OpenSSL does not know."""
    known = _openssl_ciphers()
    tls12: list[str] = []
    tls13: list[str] = []
    for suite in suites:
        if suite in TLS13_SUITES:
            tls13.append(suite)
            continue
        if suite in known:
            tls12.append(suite)
            continue
        name = next((c for c in _openssl_candidates(suite) if c in known), None)
        if name is None:
            raise ValueError(f"unknown cipher suite {suite!r} (give IANA names as Kafka does, "
                             f"e.g. TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384)")
        tls12.append(name)
    return tls12, tls13


def _apply_cipher_suites(ctx: ssl.SSLContext, listener: str, suites: list[str]) -> None:
    if not suites:
        return
    try:
        tls12, tls13 = openssl_cipher_names(suites)
    except ValueError as exc:
        raise ConfigError(f"listener {listener}: ssl.cipher.suites: {exc}") from None
    try:
        if tls12:
            ctx.set_ciphers(":".join(tls12))
        if not tls13:
            ctx.maximum_version = min(ctx.maximum_version, ssl.TLSVersion.TLSv1_2,
                                      key=_version_rank)
        elif not tls12:
            ctx.minimum_version = max(ctx.minimum_version, ssl.TLSVersion.TLSv1_3,
                                      key=_version_rank)
        else:
            logger.warning("TLS 1.3 cipher suites cannot be narrowed: OpenSSL's defaults stay "
                        "enabled for TLS 1.3", listener=listener, tls13_suites=tls13)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"listener {listener}: ssl.cipher.suites: {_reason(exc)}") from None
    if _version_rank(ctx.minimum_version) > _version_rank(ctx.maximum_version):
        raise ConfigError(f"listener {listener}: ssl.cipher.suites and ssl.enabled.protocols "
                          f"leave no TLS version both allow")


def _version_rank(v: ssl.TLSVersion) -> int:
    """MINIMUM_SUPPORTED/MAXIMUM_SUPPORTED are magic values (-2, -1): rank them as such."""
    if v == ssl.TLSVersion.MINIMUM_SUPPORTED:
        return 0
    if v == ssl.TLSVersion.MAXIMUM_SUPPORTED:
        return 1 << 20
    return int(v)


# -- the client certificate's distinguished name -------------------------------------------------
# Attribute types Java's X500Principal.getName() writes by keyword (RFC 2253's list); any other
# type is written as its OID with the value as '#' and the hex of its DER encoding.
_RFC2253_KEYWORDS = {
    "2.5.4.3": "CN", "2.5.4.6": "C", "2.5.4.7": "L", "2.5.4.8": "ST", "2.5.4.10": "O",
    "2.5.4.11": "OU", "2.5.4.9": "STREET", "0.9.2342.19200300.100.1.25": "DC",
    "0.9.2342.19200300.100.1.1": "UID",
}
# DirectoryString types Java writes as text (PrintableString, T61String, IA5String,
# GeneralString, BMPString, UTF8String); any other tag is written as hex.
_STRING_TAGS = frozenset({0x13, 0x14, 0x16, 0x1B, 0x1E, 0x0C})
_ESCAPED = set(',=+<>#;"\\')


def _tlv(data: bytes, pos: int) -> tuple[int, int, int]:
    """One DER element at ``pos``: (tag, start of its content, end of its content)."""
    tag = data[pos]
    length = data[pos + 1]
    pos += 2
    if length & 0x80:
        n = length & 0x7F
        if n == 0 or n > 4:
            raise ValueError("unsupported DER length")
        length = int.from_bytes(data[pos:pos + n], "big")
        pos += n
    if pos + length > len(data):
        raise ValueError("truncated DER")
    return tag, pos, pos + length


def _children(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(tag, content start, content end, element start) of each element in [start, end)."""
    pos = start
    while pos < end:
        tag, s, e = _tlv(data, pos)
        yield tag, s, e, pos
        pos = e


def _oid(raw: bytes) -> str:
    parts: list[int] = []
    value = 0
    for b in raw:
        value = (value << 7) | (b & 0x7F)
        if not b & 0x80:
            parts.append(value)
            value = 0
    first = parts[0] if parts else 0
    head = [min(first // 40, 2), first - 40 * min(first // 40, 2)]
    return ".".join(str(p) for p in head + parts[1:])


def subject_dn(der_cert: bytes) -> str:
    """The certificate's subject as Java's X500Principal.getName() (RFC 2253) writes it: the
    most specific RDN first, attributes of one RDN joined by '+', RFC 2253 keywords, and
    Java's escaping (``,=+<>#;"\\`` escaped, leading and trailing spaces escaped)."""
    _tag, cs, ce = _tlv(der_cert, 0)  # Certificate
    _tag, ts, te = _tlv(der_cert, cs)  # TBSCertificate
    fields = list(_children(der_cert, ts, te))
    if fields and fields[0][0] == 0xA0:  # [0] version
        fields = fields[1:]
    # serialNumber, signature, issuer, validity, subject
    _tag, ss, se, _ = fields[4]
    rdns = []
    for _t, rs, re_, _p in _children(der_cert, ss, se):  # RDN: SET OF AttributeTypeAndValue
        avas = []
        for _t2, as_, ae, _p2 in _children(der_cert, rs, re_):
            (otag, os_, oe, _), (vtag, vs, ve, vp) = list(_children(der_cert, as_, ae))[:2]
            avas.append(_ava(_oid(der_cert[os_:oe]), vtag, der_cert[vs:ve], der_cert[vp:ve]))
        rdns.append("+".join(avas))
    return ",".join(reversed(rdns))


def _ava(oid: str, tag: int, content: bytes, encoded: bytes) -> str:
    keyword = _RFC2253_KEYWORDS.get(oid)
    if keyword is None or tag not in _STRING_TAGS:
        return f"{keyword or oid}=#{encoded.hex()}"
    text = content.decode("utf-8", errors="replace")  # Java decodes the bytes as UTF-8
    chars = []
    for c in text:
        if c in _ESCAPED:
            chars.append("\\" + c)
        elif c == "\0":
            chars.append("\\00")
        else:
            chars.append(c)
    value = "".join(chars)
    lead = len(value) - len(value.lstrip(" \r"))
    trail = len(value) - len(value.rstrip(" \r"))
    if lead == len(value):
        value = "".join("\\" + c for c in value)
    elif lead or trail:
        end = len(value) - trail
        value = ("".join("\\" + c for c in value[:lead]) + value[lead:end]
                 + "".join("\\" + c for c in value[end:]))
    return f"{keyword}={value}"


# -- ssl.principal.mapping.rules -----------------------------------------------------------------
_RULE = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(,\s*|$)")
_RULE_PARSER = re.compile(_RULE)
_BACK_REFERENCE = re.compile(r"\$(\d+)")


class NoMatchingRule(ValueError):
    """No rule of ssl.principal.mapping.rules applies to a distinguished name."""


class _Rule:
    def __init__(self, pattern: str | None = None, replacement: str = "",
                 lower: bool = False, upper: bool = False) -> None:
        self.is_default = pattern is None
        try:
            self.pattern = re.compile(pattern) if pattern is not None else None
        except re.error as exc:
            raise ValueError(f"invalid rule pattern {pattern!r}: {exc}") from None
        self.replacement = replacement
        self.lower = lower
        self.upper = upper

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        m = self.pattern.fullmatch(dn)
        if m is None:
            return None
        replacement = _escape_literal_back_references(self.replacement, self.pattern.groups)
        result = self.pattern.sub(lambda mm: _java_replacement(mm, replacement), dn)
        if self.lower:
            return result.lower()
        if self.upper:
            return result.upper()
        return result

    def __str__(self) -> str:
        if self.pattern is None:
            return "DEFAULT"
        case = "/L" if self.lower else "/U" if self.upper else ""
        return f"RULE:{self.pattern.pattern}/{self.replacement}{case}"


def _escape_literal_back_references(value: str, groups: int) -> str:
    """Kafka's rule: a $n naming a group the pattern lacks is literal text, after dropping
    trailing digits while the number is too big ($12 with one group is $1 then "2")."""
    if groups == 0:
        return value
    original = value
    for m in _BACK_REFERENCE.finditer(original):
        digits = m.group(1)
        if digits.startswith("0"):
            continue
        index = int(digits)
        while index > groups and index >= 10:
            index //= 10
        if index > groups:
            start = m.start(1)  # positions in the original text, as Kafka's loop uses them
            value = value[:start - 1] + "\\" + value[start - 1:]
    return value


def _java_replacement(m: re.Match[str], replacement: str) -> str:
    """Java's Matcher.appendReplacement: \\x is a literal x, $n a group (digits taken while
    the number stays a group), ${name} a named group."""
    out: list[str] = []
    i, n = 0, len(replacement)
    groups = m.re.groups
    while i < n:
        c = replacement[i]
        if c == "\\":
            i += 1
            if i >= n:
                raise ValueError("character to be escaped is missing")
            out.append(replacement[i])
            i += 1
        elif c == "$":
            i += 1
            if i >= n:
                raise ValueError("illegal group reference: group index is missing")
            if replacement[i] == "{":
                end = replacement.find("}", i)
                if end < 0:
                    raise ValueError("named capturing group is missing trailing '}'")
                out.append(m.group(replacement[i + 1:end]) or "")
                i = end + 1
                continue
            if not "0" <= replacement[i] <= "9":
                raise ValueError("illegal group reference")
            ref = int(replacement[i])
            i += 1
            while i < n and "0" <= replacement[i] <= "9":
                bigger = ref * 10 + int(replacement[i])
                if bigger > groups:
                    break
                ref = bigger
                i += 1
            if ref > groups:
                raise ValueError(f"no group {ref}")
            out.append(m.group(ref) or "")
        else:
            out.append(c)
            i += 1
    return "".join(out)


class SslPrincipalMapper:
    """Kafka's ssl.principal.mapping.rules: comma-separated ``DEFAULT`` (the DN itself) or
    ``RULE:pattern/replacement/[LU]`` (a Java regular expression matching the whole DN, its
    replacement, then lower or upper case); the first rule that applies names the user."""

    def __init__(self, rules: str | None) -> None:
        texts = _split_rules("DEFAULT" if rules is None else rules)  # "": no rule at all
        self.rules = [r for r in map(_parse_rule, texts) if r is not None]

    def get_name(self, dn: str) -> str:
        for rule in self.rules:
            name = rule.apply(dn)
            if name is not None:
                return name
        raise NoMatchingRule(f"no ssl.principal.mapping.rules rule applies to {dn}")

    def __str__(self) -> str:
        return f"SslPrincipalMapper(rules = [{', '.join(str(r) for r in self.rules)}])"


def _split_rules(rules: str) -> list[str]:
    return [m.group(1) for m in _RULE_SPLITTER.finditer(rules.strip())]


def _parse_rule(text: str) -> _Rule | None:
    m = _RULE_PARSER.match(text)
    if m is None or m.end() != len(text):
        rest = text[m.end():] if m is not None else text
        raise ValueError(f"invalid rule {text!r}, unmatched text {rest!r}")
    if m.group(1) is not None:
        return _Rule()
    if m.group(2) is not None:
        return _Rule(m.group(2), m.group(4), m.group(6) == "L", m.group(6) == "U")
    return None  # empty rules are ignored


# -- the principal ------------------------------------------------------------------------------
def principal_builder(cfg: BrokerConfig,
                      listener_name: str) -> Callable[[ssl.SSLObject | None], KafkaPrincipal]:
    """A TLS connection's principal, as Kafka's DefaultKafkaPrincipalBuilder names it: the
    verified client certificate's subject through ssl.principal.mapping.rules, User:ANONYMOUS
    without one. NoMatchingRule (a ValueError) when no rule applies: Kafka fails that
    connection's authentication."""
    mapper = SslPrincipalMapper(cfg.listener_value(listener_name, "ssl.principal.mapping.rules"))

    def build(ssl_object: ssl.SSLObject | None) -> KafkaPrincipal:
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            return ANONYMOUS
        return KafkaPrincipal(USER_TYPE, mapper.get_name(subject_dn(der)))

    return build
