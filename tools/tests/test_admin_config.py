"""Admin-plane settings without a network: TLS settings, the services config, table helpers."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from onceflow.admin import ClientTLS, ServerTLS, fleet
from onceflow.config import CommonSettings
from onceflow_tools.cli.admin import _ranges, _short

pytestmark = pytest.mark.admin


def test_server_tls_is_off_unless_cert_and_key_are_set() -> None:
    assert ServerTLS.from_settings(CommonSettings()) is None
    tls = ServerTLS.from_settings(CommonSettings(tls_cert_file="c.pem", tls_key_file="k.pem"))
    assert tls == ServerTLS("c.pem", "k.pem") and tls.mode == "TLS"
    both = CommonSettings(tls_cert_file="c.pem", tls_key_file="k.pem", tls_client_ca_file="ca.pem")
    assert ServerTLS.from_settings(both).mode == "mTLS"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "settings",
    [{"tls_cert_file": "c.pem"}, {"tls_key_file": "k.pem"}, {"tls_client_ca_file": "ca.pem"}],
    ids=["cert-without-key", "key-without-cert", "client-ca-without-cert"],
)
def test_half_configured_server_tls_fails_at_startup(settings: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="ONCEFLOW_TLS_"):
        CommonSettings(**settings)


def test_client_tls_from_options() -> None:
    assert ClientTLS.of() is None
    assert ClientTLS.of(ca_file="ca.pem") == ClientTLS("ca.pem")
    with pytest.raises(ValueError, match="needs its key"):
        ClientTLS.of(cert_file="c.pem")
    with pytest.raises(ValueError, match="cannot read TLS file"):
        ClientTLS("/no/such/ca.pem").credentials()


def test_the_services_config(tmp_path: Path) -> None:
    shipped = fleet.load_endpoints(fleet.services_file())
    assert [(e.name, e.address) for e in shipped] == [
        ("ingest", "127.0.0.1:15051"), ("acker", "127.0.0.1:15052"), ("dedup", "127.0.0.1:15053"),
        ("compute", "127.0.0.1:15054"), ("sink", "127.0.0.1:15055"), ("source", "127.0.0.1:15056"),
    ]
    broken = tmp_path / "services.toml"
    broken.write_text('[[service]]\nname = "acker"\n')
    with pytest.raises(ValueError, match="entry 1 needs a name and an address"):
        fleet.load_endpoints(broken)


def test_table_helpers() -> None:
    assert _ranges([0, 1, 2, 3]) == "0-3"
    assert _ranges([0, 2, 3, 7]) == "0,2-3,7"
    refused = "UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection refused"
    assert _short(refused) == "UNAVAILABLE: Connection refused"
    assert _short("DEADLINE_EXCEEDED: Deadline Exceeded") == "DEADLINE_EXCEEDED: Deadline Exceeded"
