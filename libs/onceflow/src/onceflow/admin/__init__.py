"""The gRPC server base every service uses: its RPCs, Admin, health, reflection, auth."""

from onceflow.admin.server import AdminControls, ServiceServer, StatusSnapshot

__all__ = ["AdminControls", "ServiceServer", "StatusSnapshot"]
