"""Admin auth decisions, without a network."""

from types import SimpleNamespace

from onceflow.admin.auth import TokenAuthInterceptor
import pytest

pytestmark = pytest.mark.foundation

PASSED = object()


def _decide(token: str, method: str, metadata: tuple = ()) -> object:
    details = SimpleNamespace(method=method, invocation_metadata=metadata)
    return TokenAuthInterceptor(token).intercept_service(lambda _d: PASSED, details)


def test_read_only_calls_pass_without_token():
    assert _decide("secret", "/onceflow.v1.Admin/Status") is PASSED


def test_mutating_calls_need_the_right_bearer_token():
    assert _decide("secret", "/onceflow.v1.Admin/Pause", (("authorization", "Bearer secret"),)) is PASSED
    assert _decide("secret", "/onceflow.v1.Admin/Pause", (("authorization", "Bearer nope"),)) is not PASSED
    assert _decide("secret", "/onceflow.v1.Admin/Drain") is not PASSED
    assert _decide("", "/onceflow.v1.Admin/Resume", (("authorization", "Bearer "),)) is not PASSED
