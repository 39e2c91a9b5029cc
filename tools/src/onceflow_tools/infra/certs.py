"""Throwaway certificates for a local stack (`onceflow infra up --secure`) and TLS tests, made
with the openssl CLI (no Python crypto package in the venv): one CA, and leaf certificates it
signs for 127.0.0.1/localhost. Keys are unencrypted PKCS#8 PEM, which Kafka, Redis, gRPC and
librdkafka all read."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass(frozen=True)
class Leaf:
    cert: Path
    key: Path


@dataclass(frozen=True)
class CertAuthority:
    dir: Path
    cert: Path
    key: Path

    @classmethod
    def create(cls, directory: Path, name: str = "ca", days: int = 1) -> CertAuthority:
        directory.mkdir(parents=True, exist_ok=True)
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", str(days), "-subj", f"/CN=onceflow {name}",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=directory,
        )
        return cls(directory, directory / f"{name}.pem", directory / f"{name}.key")

    def issue(self, name: str, usage: str, days: int = 1) -> Leaf:
        """A leaf for ``usage`` serverAuth or clientAuth. gRPC checks the server's SAN against
        the address the client dialled, so servers get both the IP and the name."""
        extensions = self.dir / f"{name}.ext"
        extensions.write_text(
            "basicConstraints=CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage={usage}\n"
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        )
        _openssl(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=self.dir,
        )
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", self.cert.name, "-CAkey", self.key.name, "-CAcreateserial",
            "-out", f"{name}.pem", "-days", str(days), "-extfile", extensions.name, cwd=self.dir,
        )
        return Leaf(self.dir / f"{name}.pem", self.dir / f"{name}.key")
