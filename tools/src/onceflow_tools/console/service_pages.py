"""A service's page, and the admin actions (pause, resume, drain, ...) its buttons post."""

from __future__ import annotations

import logging

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from onceflow_tools.admin_client import CallFailed
from onceflow_tools.console import grpc_calls
from onceflow_tools.console.pages import CALL_TIMEOUT_S, Pages

log = logging.getLogger(__name__)


class ServicePages:
    def __init__(self, pages: Pages) -> None:
        self.pages = pages
        self.console = pages.console

    def routes(self) -> list[Route]:
        return [
            Route("/services/{name}", self.service_page),
            Route("/services/{name}/{action}", self.service_action, methods=["POST"]),
        ]

    def _unknown(self, request: Request, name: str) -> Response:
        return self.pages.problem(request, 404, f"no service named {name!r} in this console's fleet")

    async def service_page(self, request: Request) -> Response:
        name = request.path_params["name"]
        data = self.console.watch.service(name)
        if data is None:
            return self._unknown(request, name)
        return self.pages.page(request, "service.html", name=name, data=data, actions=grpc_calls.ACTIONS, message="", failed=False)

    async def service_action(self, request: Request) -> Response:
        name, action = request.path_params["name"], request.path_params["action"]
        if self.console.watch.service(name) is None:
            return self._unknown(request, name)
        if action not in grpc_calls.ACTIONS:
            return self.pages.problem(request, 404, f"no action {action!r}: one of {', '.join(grpc_calls.ACTIONS)}")
        form = await request.form()
        results, failed = await self._act(name, action, str(form.get("token", "")))
        log.info("console action %s on %s: %s", action, name, "; ".join(results))
        await run_in_threadpool(self.console.watch.poll)  # show the new state at once
        return self.pages.page(
            request, "service.html", 400 if failed else 200, name=name, data=self.console.watch.service(name),
            actions=grpc_calls.ACTIONS, message="; ".join(results), failed=failed,
        )

    async def _act(self, name: str, action: str, token: str) -> tuple[list[str], bool]:
        """``action`` on every instance of ``name``: a line each, and whether any refused."""
        results, failed = [], False
        for address in self.console.watch.addresses(name):
            try:
                state = await run_in_threadpool(grpc_calls.admin_action, address, self.console.tls, action, token, CALL_TIMEOUT_S)
                results.append(f"{address}: {action} done, state {state}")
            except CallFailed as exc:
                failed = True
                results.append(f"{action} refused by {exc}")
        return results, failed
