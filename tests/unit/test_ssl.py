"""TLS pieces without a broker: the client certificate's DN as Java's X500Principal.getName()
writes it, Kafka's SslPrincipalMapper rules (cases re-expressed from Kafka's own tests), cipher
suite names, and listener contexts built from generated PEM files, exercised over an in-memory
TLS handshake."""

from __future__ import annotations

import shutil
import ssl
import subprocess

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID, ObjectIdentifier

from broker.config import BrokerConfig, ConfigError
from broker.security.principal import ANONYMOUS, KafkaPrincipal
from broker.security.ssl import (
    NoMatchingRule,
    SslPrincipalMapper,
    _openssl_ciphers,
    normalise_pem,
    openssl_cipher_names,
    principal_builder,
    server_ssl_context,
    subject_dn,
)
from tests.support.tls_certs import CertAuthority


@pytest.fixture(scope="module")
def ca(tmp_path_factory) -> CertAuthority:
    return CertAuthority(tmp_path_factory.mktemp("pki"))


def _attr(oid: ObjectIdentifier, value: str, tag: x509.name._ASN1Type | None = None):
    return x509.NameAttribute(oid, value, tag) if tag is not None else x509.NameAttribute(
        oid, value)


# -- the distinguished name ----------------------------------------------------------------
def test_dn_most_specific_first(ca):
    cert = ca.client("dn1", CN="alice", OU="eng", O="Example", L="Paris", ST="IDF", C="FR")
    assert subject_dn(cert.der) == "CN=alice,OU=eng,O=Example,L=Paris,ST=IDF,C=FR"


def test_dn_rfc2253_escaping_as_java_writes_it(ca):
    name = x509.Name([
        _attr(NameOID.COUNTRY_NAME, "US"),
        _attr(NameOID.ORGANIZATION_NAME, "Duke, Inc."),  # ',' escaped
        _attr(NameOID.ORGANIZATIONAL_UNIT_NAME, "a+b=c<d>e;f\"g\\h#i"),  # all of ,=+<>#;"\
        _attr(NameOID.COMMON_NAME, " #lead and trail  "),  # leading space/'#', trailing spaces
    ])
    dn = subject_dn(ca.issue("dn2", name).der)
    assert dn == ('CN=\\ \\#lead and trail\\ \\ ,OU=a\\+b\\=c\\<d\\>e\\;f\\"g\\\\h\\#i,'
                  'O=Duke\\, Inc.,C=US')


def test_dn_multi_valued_rdn_and_unknown_types(ca):
    name = x509.Name([
        x509.RelativeDistinguishedName([_attr(NameOID.DOMAIN_COMPONENT, "com")]),
        x509.RelativeDistinguishedName([_attr(NameOID.DOMAIN_COMPONENT, "example")]),
        x509.RelativeDistinguishedName([_attr(NameOID.USER_ID, "u42")]),
        x509.RelativeDistinguishedName([_attr(NameOID.EMAIL_ADDRESS, "a@x.io"),
                                        _attr(NameOID.COMMON_NAME, "alice")]),
    ])
    dn = subject_dn(ca.issue("dn3", name).der)
    # Java writes RFC 2253's keywords (DC, UID, CN) and any other type as OID=#<DER hex>:
    # emailAddress is an IA5String (tag 0x16) of 6 bytes.
    email = "1.2.840.113549.1.9.1=#1606" + b"a@x.io".hex()
    rdn = {email, "CN=alice"}
    first, rest = dn.split(",", 1)
    assert set(first.split("+")) == rdn  # one RDN, its two values joined by '+'
    assert rest == "UID=u42,DC=example,DC=com"


def test_dn_utf8_and_printable_strings(ca):
    name = x509.Name([_attr(NameOID.COUNTRY_NAME, "DE"),
                      _attr(NameOID.COMMON_NAME, "Jürgen", x509.name._ASN1Type.UTF8String),
                      _attr(NameOID.SERIAL_NUMBER, "7", x509.name._ASN1Type.PrintableString)])
    assert subject_dn(ca.issue("dn4", name).der) == "2.5.4.5=#130137,CN=Jürgen,C=DE"


# -- ssl.principal.mapping.rules (after Kafka's SslPrincipalMapperTest) ------------------------
@pytest.mark.parametrize("rules", [
    "DEFAULT",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
    "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
    "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
    "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
    "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
])
def test_valid_rules(rules):
    SslPrincipalMapper(rules)


@pytest.mark.parametrize("rules", [
    "default", "DEFAUL", "DEFAULT/L", "DEFAULT/U",
    "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
    "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
])
def test_invalid_rules(rules):
    with pytest.raises(ValueError):
        SslPrincipalMapper(rules)


def test_first_matching_rule_names_the_user():
    mapper = SslPrincipalMapper(", ".join([
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
        "DEFAULT",
    ]))
    assert mapper.get_name("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "duke"
    assert mapper.get_name("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.get_name("cn=duke,ou=sme,dc=mycp,dc=com") == "DUKE@SME"
    assert mapper.get_name("cN=duke,OU=JavaSoft,O=Sun Microsystems") == "DUKE"
    assert mapper.get_name("OU=JavaSoft,O=Sun Microsystems,C=US") == \
        "OU=JavaSoft,O=Sun Microsystems,C=US"


@pytest.mark.parametrize("expected, rules", [
    ("[]", ""),
    ("[DEFAULT]", "DEFAULT"),
    ("[RULE:/]", "RULE://"),
    ("[RULE:/.*]", "RULE:/.*/"),
    ("[RULE:/.*/L]", "RULE:/.*/L"),
    ("[RULE:/, DEFAULT]", "RULE://,DEFAULT"),
    ("[RULE:/, DEFAULT]", "  RULE:// ,  DEFAULT  "),
    ("[RULE:   /     , DEFAULT]", "  RULE:   /     / ,  DEFAULT  "),
    ("[RULE:  /     /U, DEFAULT]", "  RULE:  /     /U   ,DEFAULT  "),
    ("[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]",
     "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  "),
    ("[]", ",   , , ,      , , ,   "),  # empty rules are ignored
    ("[RULE:/, DEFAULT]", ",,RULE://,,,DEFAULT,,"),
    ("[RULE: /   , DEFAULT]", ",  , RULE: /   /    ,,,   DEFAULT, ,   "),
    ("[RULE:   /  /U, DEFAULT]", "     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,"),
    (r"[RULE:\/\\\(\)\n\t/\/\/]", r"RULE:\/\\\(\)\n\t/\/\//"),  # escape sequences
    (r"[RULE:\**\/+/*/L, RULE:\/*\**/**]", r"RULE:\**\/+/*/L,RULE:\/*\**/**/"),
    (r"[RULE:,RULE:,/,RULE:,\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, RULE:, DEFAULT, "
     r"/DEFAULT, DEFAULT]",
     r"RULE:,RULE:,/,RULE:,\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, "
     r"/DEFAULT/,DEFAULT"),
])
def test_rules_splitting(expected, rules):
    assert str(SslPrincipalMapper(rules)) == f"SslPrincipalMapper(rules = {expected})"


def test_escaped_comma_in_a_dn():
    mapper = SslPrincipalMapper(r"RULE:^CN=((\\, *|\w)+)(,.*|$)/$1/,DEFAULT")
    assert mapper.get_name(r"CN=Tkac\, Adam,OU=ITZ,DC=geodis,DC=cz") == r"Tkac\, Adam"


def test_replacement_back_references_as_java():
    # $2 with one group is literal text (Kafka's escapeLiteralBackReferences); $12 with one
    # group is group 1 then "2"; \$ is a literal dollar.
    assert SslPrincipalMapper("RULE:^CN=(.*)$/$1-$2/").get_name("CN=a") == "a-$2"
    assert SslPrincipalMapper("RULE:^CN=(.*)$/$12/").get_name("CN=a") == "a2"
    assert SslPrincipalMapper(r"RULE:^CN=(.*)$/\$$1/").get_name("CN=a") == "$a"


def test_no_matching_rule_fails():
    with pytest.raises(NoMatchingRule):
        SslPrincipalMapper("RULE:^CN=(.*?),OU=Users$/$1/").get_name("CN=x,OU=Other")


# -- cipher suite names ------------------------------------------------------------------------
def test_iana_names_map_to_openssl_names():
    tls12, tls13 = openssl_cipher_names([
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        "TLS_RSA_WITH_AES_128_CBC_SHA", "TLS_DHE_RSA_WITH_AES_128_CBC_SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256", "TLS_AES_128_GCM_SHA256"])
    assert tls12 == ["ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-ECDSA-CHACHA20-POLY1305",
                     "AES128-SHA", "DHE-RSA-AES128-SHA256", "ECDHE-RSA-AES128-GCM-SHA256"]
    assert tls13 == ["TLS_AES_128_GCM_SHA256"]
    with pytest.raises(ValueError, match="unknown cipher suite"):
        openssl_cipher_names(["TLS_ECDHE_RSA_WITH_ROT13_SHA"])


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl command")
def test_rule_agrees_with_openssl_for_every_suite_it_knows():
    """`openssl ciphers -stdname` prints each suite's IANA and OpenSSL names side by side."""
    out = subprocess.run(["openssl", "ciphers", "-stdname", "ALL:COMPLEMENTOFALL:@SECLEVEL=0"],
                         capture_output=True, text=True, timeout=10, check=True).stdout
    known = _openssl_ciphers()
    pairs = [(p[0], p[2]) for p in (line.split() for line in out.splitlines())
             if p[0].startswith("TLS_") and "_WITH_" in p[0] and p[2] in known]
    assert len(pairs) > 50
    assert [(iana, openssl_cipher_names([iana])[0]) for iana, _ in pairs] == \
        [(iana, [name]) for iana, name in pairs]


# -- contexts from generated PEM files, over an in-memory handshake ----------------------------
def _config(**raw: str) -> BrokerConfig:
    return BrokerConfig.from_dict({"listeners": "SSL://127.0.0.1:0", "ssl.keystore.type": "PEM",
                                   **{k.replace("_", "."): v for k, v in raw.items()}})


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> tuple[ssl.SSLObject,
                                                                         ssl.SSLObject]:
    """Runs a TLS handshake between two SSLObjects over memory BIOs (ssl.SSLError on failure)."""
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    cli = client.wrap_bio(c_in, c_out, server_hostname="localhost")
    done = {"s": False, "c": False}
    for _ in range(20):
        for name, obj in (("c", cli), ("s", srv)):
            if not done[name]:
                try:
                    obj.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            # TLS 1.3: the server learns of a refused client certificate on the first read
            s_in.write(c_out.read())
            try:
                srv.read(1)
            except ssl.SSLWantReadError:
                pass
            return srv, cli
    raise AssertionError("handshake did not finish")


def _client(ca: CertAuthority, cert=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca.ca_path))
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
    return ctx


def test_context_from_keystore_file_and_inline_pem(ca):
    broker = ca.server("ctx-broker")
    from_file = server_ssl_context(_config(ssl_keystore_location=str(broker.keystore)), "SSL")
    srv, _ = _handshake(from_file, _client(ca))
    assert srv.version() in ("TLSv1.2", "TLSv1.3")
    # inline, as a properties file continued over lines delivers it: spaces for line breaks
    inline = server_ssl_context(BrokerConfig.from_dict({
        "listeners": "SSL://127.0.0.1:0",
        "listener.name.ssl.ssl.keystore.type": "PEM",
        "listener.name.ssl.ssl.keystore.certificate.chain": broker.chain_pem.replace("\n", " "),
        "listener.name.ssl.ssl.keystore.key": broker.key_pem.replace("\n", " ")}), "SSL")
    _handshake(inline, _client(ca))


def test_encrypted_key_takes_ssl_key_password(ca):
    broker = ca.server("ctx-enc", password="k3y-pass")
    ctx = server_ssl_context(_config(ssl_keystore_location=str(broker.keystore),
                                     ssl_key_password="k3y-pass"), "SSL")
    _handshake(ctx, _client(ca))
    with pytest.raises(ConfigError, match="set ssl.key.password"):
        server_ssl_context(_config(ssl_keystore_location=str(broker.keystore)), "SSL")
    with pytest.raises(ConfigError, match="cannot load the PEM key store") as info:
        server_ssl_context(_config(ssl_keystore_location=str(broker.keystore),
                                   ssl_key_password="wrong"), "SSL")
    assert "wrong" not in str(info.value) and "k3y-pass" not in str(info.value)


def test_client_auth_modes_and_the_principal(ca):
    broker = ca.server("ctx-mtls")
    alice = ca.client("ctx-alice", CN="alice", OU="eng", O="Example", C="US")
    base = {"ssl_keystore_location": str(broker.keystore), "ssl_truststore_type": "PEM",
            "ssl_truststore_location": str(ca.ca_path)}
    required = _config(**base, ssl_client_auth="required",
                       ssl_principal_mapping_rules="RULE:^CN=([^,]+),OU=eng.*$/$1/U,DEFAULT")
    ctx = server_ssl_context(required, "SSL")
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    srv, _ = _handshake(ctx, _client(ca, alice))
    assert principal_builder(required, "SSL")(srv) == KafkaPrincipal("User", "ALICE")
    with pytest.raises(ssl.SSLError):  # no client certificate: refused
        _handshake(ctx, _client(ca))
    stranger = CertAuthority(ca.dir / "other").client("ctx-stranger", CN="mallory")
    with pytest.raises(ssl.SSLError):  # a certificate the trust store does not vouch for
        _handshake(ctx, _client(ca, stranger))

    requested = _config(**base, ssl_client_auth="requested")
    ctx = server_ssl_context(requested, "SSL")
    assert ctx.verify_mode == ssl.CERT_OPTIONAL
    build = principal_builder(requested, "SSL")
    srv, _ = _handshake(ctx, _client(ca))
    assert build(srv) == ANONYMOUS
    srv, _ = _handshake(ctx, _client(ca, alice))
    assert build(srv) == KafkaPrincipal("User", "CN=alice,OU=eng,O=Example,C=US")

    none = _config(**base)
    srv, _ = _handshake(server_ssl_context(none, "SSL"), _client(ca, alice))
    assert principal_builder(none, "SSL")(srv) == ANONYMOUS  # not asked for: not sent
    assert principal_builder(none, "SSL")(None) == ANONYMOUS


def test_inline_truststore_certificates(ca):
    broker = ca.server("ctx-inline-trust")
    alice = ca.client("ctx-alice2", CN="alice")
    cfg = _config(ssl_keystore_location=str(broker.keystore), ssl_truststore_type="PEM",
                  ssl_truststore_certificates=ca.ca_pem, ssl_client_auth="required")
    srv, _ = _handshake(server_ssl_context(cfg, "SSL"), _client(ca, alice))
    assert principal_builder(cfg, "SSL")(srv).name == "CN=alice"


def test_enabled_protocols_and_cipher_suites(ca):
    broker = ca.server("ctx-proto")
    ks = str(broker.keystore)
    ctx = server_ssl_context(_config(ssl_keystore_location=ks,
                                     ssl_enabled_protocols="TLSv1.2"), "SSL")
    assert (ctx.minimum_version, ctx.maximum_version) == (ssl.TLSVersion.TLSv1_2,
                                                          ssl.TLSVersion.TLSv1_2)
    srv, _ = _handshake(ctx, _client(ca))
    assert srv.version() == "TLSv1.2"
    # only TLS 1.2 suites named: no TLS 1.3 (as a Java engine without a TLS 1.3 suite)
    ctx = server_ssl_context(_config(
        ssl_keystore_location=ks,
        ssl_cipher_suites="TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"), "SSL")
    srv, _ = _handshake(ctx, _client(ca))
    assert srv.version() == "TLSv1.2"
    assert srv.cipher()[0] == "ECDHE-ECDSA-AES128-GCM-SHA256"
    # a client offering only other TLS 1.2 suites is refused
    client = _client(ca)
    client.maximum_version = ssl.TLSVersion.TLSv1_2
    client.set_ciphers("ECDHE-ECDSA-AES256-GCM-SHA384")
    with pytest.raises(ssl.SSLError):
        _handshake(ctx, client)
    # only TLS 1.3 suites named: TLS 1.3 only
    ctx = server_ssl_context(_config(ssl_keystore_location=ks,
                                     ssl_cipher_suites="TLS_AES_256_GCM_SHA384"), "SSL")
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_3
    with pytest.raises(ConfigError, match="no TLS version"):
        server_ssl_context(_config(ssl_keystore_location=ks, ssl_enabled_protocols="TLSv1.2",
                                   ssl_cipher_suites="TLS_AES_256_GCM_SHA384"), "SSL")


def test_bad_pem_contents_named_at_start(ca, tmp_path):
    bad = tmp_path / "bad.pem"
    bad.write_text("not a pem file\n")
    with pytest.raises(ConfigError, match="no certificate"):
        server_ssl_context(_config(ssl_keystore_location=str(bad)), "SSL")
    keystore = ca.server("ctx-bad-trust").keystore
    with pytest.raises(ConfigError, match="cannot load the PEM trust store"):
        server_ssl_context(_config(ssl_keystore_location=str(keystore),
                                   ssl_truststore_type="PEM",
                                   ssl_truststore_location=str(bad)), "SSL")


def test_normalise_pem_rewraps_base64_and_keeps_headers():
    body = "QUJD" * 40
    text = f"junk -----BEGIN CERTIFICATE----- {body[:70]} {body[70:]} -----END CERTIFICATE-----"
    lines = normalise_pem(text).splitlines()
    assert lines[0] == "-----BEGIN CERTIFICATE-----" and lines[-1] == "-----END CERTIFICATE-----"
    assert "".join(lines[1:-1]) == body and max(len(x) for x in lines[1:-1]) == 64
    legacy = ("-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: X\n\nAAAA\n"
              "-----END RSA PRIVATE KEY-----")
    assert normalise_pem(legacy).strip() == legacy
