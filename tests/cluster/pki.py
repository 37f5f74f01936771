"""The test cluster's PKI: one CA, the apiserver's serving cert, a client cert per component."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _write_key(path: Path, key) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


class ClusterPKI:
    """Creates the certificates a loopback control plane needs, under `directory`."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        now = dt.datetime.now(dt.UTC)
        self._not_before = now - dt.timedelta(minutes=5)
        self._not_after = now + VALIDITY
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = _name("heteroserve-test-ca")
        self._ca_cert = (
            self._builder(ca_name, ca_name, self._ca_key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True,
                    content_commitment=False, key_encipherment=False, data_encipherment=False,
                    key_agreement=False, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca = KeyPair(self.dir / "ca.crt", self.dir / "ca.key")
        self.ca.cert.write_bytes(self._ca_cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self.ca.key, self._ca_key)

    def _builder(self, subject, issuer, public_key) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_after)
        )

    def issue(
        self,
        name: str,
        common_name: str,
        organization: str | None = None,
        *,
        server_names: tuple[str, ...] = (),
    ) -> KeyPair:
        """A leaf certificate: a server cert when `server_names` is given, else a client cert."""
        key = ec.generate_private_key(ec.SECP256R1())
        builder = self._builder(
            _name(common_name, organization), self._ca_cert.subject, key.public_key()
        )
        if server_names:
            alt: list[x509.GeneralName] = []
            for entry in server_names:
                try:
                    alt.append(x509.IPAddress(ipaddress.ip_address(entry)))
                except ValueError:
                    alt.append(x509.DNSName(entry))
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
            usage = ExtendedKeyUsageOID.SERVER_AUTH
        else:
            usage = ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        pair = KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pair.key, key)
        return pair

    def service_account_keys(self) -> KeyPair:
        """The key pair the apiserver signs and verifies service-account tokens with."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pair = KeyPair(self.dir / "sa.pub", self.dir / "sa.key")
        pair.cert.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        _write_key(pair.key, key)
        return pair
