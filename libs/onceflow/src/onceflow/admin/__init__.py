"""The gRPC server base every service uses: its RPCs, Admin, health, reflection, auth, TLS."""

from onceflow.admin.auth import Tokens
from onceflow.admin.server import MAX_WORKERS, RESERVED_FOR_ADMIN, STREAM_THREADS, AdminControls, CallSlots, FixedControls, ServiceServer, StatusSnapshot
from onceflow.admin.tls import ClientTLS, ServerTLS, channel

__all__ = ["MAX_WORKERS", "RESERVED_FOR_ADMIN", "STREAM_THREADS", "AdminControls", "CallSlots", "FixedControls", "ClientTLS", "ServerTLS", "ServiceServer", "StatusSnapshot", "Tokens", "channel"]
