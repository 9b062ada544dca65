"""corral's certificate authority, for the hosts whose HTTPS the proxy must read.

Made once per installation in the config directory: `ca/corral-ca.key` (mode 0600 in a
0700 folder, never shown to a sandbox) and `ca/corral-ca.pem`, the certificate sandboxes
trust. The proxy asks `server_context(host)` for a TLS context presenting a certificate for
`host` signed by it; leaf certificates share one key, made per server, are valid for a week
and are kept in memory (their files, which `ssl` needs, in a 0700 folder of the run root).
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import ipaddress
import os
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from corral.errors import SandboxError
from corral.fsafe import CREATE_FLAGS, NotPrivate, private_dir

CA_KEY = "corral-ca.key"
CA_CERT = "corral-ca.pem"
CA_DAYS = 3650
LEAF_DAYS = 7
MAX_LEAVES = 512


class CAUnavailable(SandboxError):
    """corral's CA cannot be read or made (its folder is not private, a file is broken)."""


class CertificateAuthority:
    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate, leaves: Path):
        self.key = key
        self.cert = cert
        self.cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        self.leaves = leaves
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self.server_context = functools.lru_cache(maxsize=MAX_LEAVES)(self._server_context)

    @classmethod
    def load_or_create(cls, folder: Path, leaves: Path) -> CertificateAuthority:
        """The installation's CA in `folder`, made on first use; leaf files go in `leaves`.
        Raises `CAUnavailable`."""
        try:
            private_dir(folder)
            private_dir(leaves)
        except NotPrivate as exc:
            raise CAUnavailable(f"{exc}: corral's CA needs a private folder") from exc
        key_path, cert_path = folder / CA_KEY, folder / CA_CERT
        if not key_path.exists():
            _write_private(key_path, _new_key_pem())
            cert_path.unlink(missing_ok=True)
        try:
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except (OSError, ValueError) as exc:
            raise CAUnavailable(f"cannot read corral's CA key {key_path}: {exc}") from exc
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise CAUnavailable(f"{key_path} is not an EC key")
        if not cert_path.exists():
            cert_path.write_bytes(_ca_cert(key).public_bytes(serialization.Encoding.PEM))
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        return cls(key, cert, leaves)

    def _server_context(self, host: str) -> ssl.SSLContext:
        """A server-side TLS context with a certificate for `host` (a name or an address)."""
        chain = self.leaves / f"{_file_name(host)}.pem"
        key = self._leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        leaf = self._leaf(host).public_bytes(serialization.Encoding.PEM)
        _write_private(chain, key + leaf + self.cert_pem, replace=True)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(chain)
        context.set_alpn_protocols(["http/1.1"])
        return context

    def _leaf(self, host: str) -> x509.Certificate:
        now = datetime.datetime.now(datetime.UTC)
        try:
            alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
        except ValueError:
            alt = x509.DNSName(host)
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self.cert.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )


def _new_key_pem() -> bytes:
    return ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _ca_cert(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "corral"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"corral local CA ({os.uname().nodename})"),
        ]
    )
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _write_private(path: Path, data: bytes, *, replace: bool = False) -> None:
    """Write a 0600 file that did not exist (or, with `replace`, replace it whole)."""
    target = path.with_name(path.name + ".new") if replace else path
    if replace:
        target.unlink(missing_ok=True)
    fd = os.open(target, CREATE_FLAGS, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    if replace:
        os.replace(target, path)


def _file_name(host: str) -> str:
    return hashlib.sha256(host.encode()).hexdigest()[:32]
