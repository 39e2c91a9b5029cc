"""TLS for the services' gRPC ports. Servers take theirs from ``CommonSettings``; every client
(CLI, health probe, process harness, IngestClient) opens its channel through ``channel``, so
plaintext and TLS are decided in one place."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from onceflow.config import CommonSettings
from onceflow_client.tls import ClientTLS, read_tls_file, sync_channel

__all__ = ["ClientTLS", "ServerTLS", "channel"]


@dataclass(frozen=True)
class ServerTLS:
    cert_file: str
    key_file: str
    # Set: clients must present a certificate signed by this CA (mutual TLS).
    client_ca_file: str = ""

    @classmethod
    def from_settings(cls, common: CommonSettings) -> ServerTLS | None:
        """None (plaintext) unless ONCEFLOW_TLS_CERT_FILE and ONCEFLOW_TLS_KEY_FILE are set."""
        if not common.tls_cert_file:
            return None
        return cls(common.tls_cert_file, common.tls_key_file, common.tls_client_ca_file)

    @property
    def mode(self) -> str:
        return "mTLS" if self.client_ca_file else "TLS"

    def credentials(self) -> grpc.ServerCredentials:
        client_ca = read_tls_file(self.client_ca_file) if self.client_ca_file else None
        return grpc.ssl_server_credentials(
            [(read_tls_file(self.key_file), read_tls_file(self.cert_file))],
            root_certificates=client_ca,
            require_client_auth=client_ca is not None,
        )


def channel(
    address: str, tls: ClientTLS | None = None, options: Sequence[tuple[str, object]] = (), bearer: str | None = None
) -> grpc.Channel:
    """A channel to a onceflow service: TLS when ``tls`` is given, plaintext otherwise; calls
    without a token of their own carry ``bearer``, by default ONCEFLOW_READ_TOKEN (or the admin
    token) when set."""
    from onceflow.admin.auth import ClientTokens, with_bearer  # auth builds on this module's settings

    chan = sync_channel(address, tls, options)
    return with_bearer(chan, ClientTokens().bearer() if bearer is None else bearer)
