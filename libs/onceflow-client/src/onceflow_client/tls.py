"""How a client reaches a onceflow service: plaintext on loopback, TLS (and a client
certificate, for services that require one) beyond it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc


def read_tls_file(path: str) -> bytes:
    """The bytes of a certificate or key file; a ValueError naming the file when it cannot be
    read. The servers' TLS (onceflow.admin.tls) reads its files through this too."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read TLS file {path}: {exc.strerror}") from None


@dataclass(frozen=True)
class ClientTLS:
    # Empty: verify the server against the system's roots.
    ca_file: str = ""
    # Both set: present this certificate (servers with a client CA require one).
    cert_file: str = ""
    key_file: str = ""

    @classmethod
    def of(cls, ca_file: str = "", cert_file: str = "", key_file: str = "") -> ClientTLS | None:
        """None (plaintext) when nothing is set, so options and env vars map straight onto it."""
        if not (ca_file or cert_file or key_file):
            return None
        if bool(cert_file) != bool(key_file):
            raise ValueError("a client certificate needs its key, and a key its certificate")
        return cls(ca_file, cert_file, key_file)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=read_tls_file(self.ca_file) if self.ca_file else None,
            private_key=read_tls_file(self.key_file) if self.key_file else None,
            certificate_chain=read_tls_file(self.cert_file) if self.cert_file else None,
        )


Options = Sequence[tuple[str, object]]


def sync_channel(address: str, tls: ClientTLS | None = None, options: Options = ()) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls.credentials(), options=options)


def aio_channel(address: str, tls: ClientTLS | None = None, options: Options = ()) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, tls.credentials(), options=options)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries ``token`` (none without one)."""
    return (("authorization", f"Bearer {token}"),) if token else ()
