"""The gRPC server base every service uses: its RPCs, Admin, health, reflection, auth, TLS."""

from onceflow.admin.server import AdminControls, ServiceServer, StatusSnapshot
from onceflow.admin.tls import ClientTLS, ServerTLS, channel

__all__ = ["AdminControls", "ClientTLS", "ServerTLS", "ServiceServer", "StatusSnapshot", "channel"]
