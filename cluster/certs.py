"""Certificates for trying TLS and for small clusters: a CA and the certificates it signs, EC
P-256 keys, made with `cryptography` (a dependency of the server extra). Used by `raftq up
--tls`, `raftq config init --tls` and LocalCluster(tls=...) (so the tests).

A node certificate names its hosts in subjectAltName (IP addresses as IP entries, names as DNS
entries) and allows both server and client authentication: nodes present theirs when they call
each other. A client certificate allows client authentication only. Keys are written unencrypted
(PKCS#8 PEM) and, like everything private here, mode 0600.
"""
from __future__ import annotations

import datetime as _dt
import ipaddress
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .files import write_private


def _name(common_name: str, org: str = "raftq") -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)


def make_ca(common_name: str = "raftq CA", days: int = 3650, *, now: _dt.datetime | None = None):
    """A self-signed CA that signs leaf certificates only (path length 0): (certificate, key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    start = (now or _now()) - _dt.timedelta(minutes=5)      # a peer's clock a little behind
    name = _name(common_name)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(int.from_bytes(secrets.token_bytes(16), "big") >> 1)
            .not_valid_before(start).not_valid_after(start + _dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def san_entries(hosts) -> list[x509.GeneralName]:
    out = []
    for h in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h.strip("[]"))))
        except ValueError:
            out.append(x509.DNSName(h))
    return out


def make_leaf(ca_cert, ca_key, common_name: str, hosts=(), *, days: int = 825, server: bool = True,
              client: bool = True, now: _dt.datetime | None = None):
    """A certificate signed by the CA for `hosts` (IP addresses or DNS names): (certificate, key).
    `server`/`client` choose its extended key usages (a node's has both)."""
    key = ec.generate_private_key(ec.SECP256R1())
    start = (now or _now()) - _dt.timedelta(minutes=5)
    end = min(start + _dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
    b = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca_cert.subject)
         .public_key(key.public_key()).serial_number(int.from_bytes(secrets.token_bytes(16), "big") >> 1)
         .not_valid_before(start).not_valid_after(end)
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                      content_commitment=False, key_encipherment=False, data_encipherment=False,
                                      key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
         .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
         .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False))
    if hosts:
        b = b.add_extension(x509.SubjectAlternativeName(san_entries(hosts)), critical=False)
    return b.sign(ca_key, hashes.SHA256()), key


def cert_pem(cert) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def key_pem(key) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def write_pair(cert_path: Path, key_path: Path, cert, key) -> None:
    """The certificate and its key, each 0600 and written atomically."""
    write_private(Path(cert_path), cert_pem(cert))
    write_private(Path(key_path), key_pem(key))


def load_pair(cert_path: Path, key_path: Path):
    cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    key = serialization.load_pem_private_key(Path(key_path).read_bytes(), password=None)
    return cert, key


def valid_for(cert, days: float, now: _dt.datetime | None = None) -> bool:
    """Whether `cert` is valid now and for at least `days` more."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return cert.not_valid_before_utc <= now and cert.not_valid_after_utc - now >= _dt.timedelta(days=days)


def issued_by(cert, ca_cert) -> bool:
    """Whether `ca_cert` signed `cert` (its signature verifies with the CA's key)."""
    try:
        cert.verify_directly_issued_by(ca_cert)
        return True
    except (ValueError, TypeError, Exception):
        return False
