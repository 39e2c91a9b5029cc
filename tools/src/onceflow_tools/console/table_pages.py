"""The result tables: the jobs compute runs with the versions in the registry, and one job's
table a page at a time, read from a sink."""

from __future__ import annotations

import base64
import binascii
from typing import Any
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from onceflow.kafka.registry import read_registry
from onceflow_tools.admin_client import CallFailed
from onceflow_tools.console import grpc_calls
from onceflow_tools.console.pages import CALL_TIMEOUT_S, Pages
from onceflow_sink import versions


def _encode_token(token: bytes) -> str:
    return base64.urlsafe_b64encode(token).decode()


def _decode_token(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode(), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("page: not a page token this console gave out") from None


def _limit(request: Request, default: int) -> int:
    """The ``limit`` asked for, else ``default``; ValueError outside 1 to 10000."""
    if "limit" not in request.query_params:
        return default
    limit = int(request.query_params["limit"])
    if not 1 <= limit <= 10_000:
        raise ValueError
    return limit


class TablePages:
    def __init__(self, pages: Pages) -> None:
        self.pages = pages
        self.console = pages.console

    def routes(self) -> list[Route]:
        return [Route("/tables", self.tables), Route("/tables/{job}", self.table)]

    async def tables(self, request: Request) -> Response:
        if request.query_params.get("job"):  # the "open" form
            return RedirectResponse(f"/tables/{quote(request.query_params['job'], safe='')}", status_code=303)
        known, problem = await self._jobs()
        rows, versions_problem = await run_in_threadpool(self._versions)
        return self.pages.page(request, "tables.html", jobs=known, problem=problem, versions=rows, versions_problem=versions_problem)

    def _versions(self) -> tuple[list[dict[str, Any]], str]:
        """Every version in the registry that runs, as `onceflow job status` shows it (no rate:
        a page load does not wait for a sample)."""
        common = self.console.common
        try:
            jobs = sorted(read_registry(common, timeout_s=CALL_TIMEOUT_S))
            rows = []
            for name in jobs:
                for status in versions.status(common, name, sample_s=0):
                    rows.append({
                        "job": name, "name": status.name, "state": status.version.state.value, "live": status.live,
                        "module": status.version.module, "map_behind": status.map_behind.records,
                        "merge_behind": "-" if status.merge_behind is None else status.merge_behind.records,
                    })
            return rows, ""
        except Exception as exc:  # noqa: BLE001 - the registry unreadable is a line on the page, not an error page
            return [], f"job versions: {type(exc).__name__}: {exc}"

    async def _jobs(self) -> tuple[list[dict[str, Any]], str]:
        """The jobs the first compute instance that answers runs, or why none said."""
        serving = self.console.serving("compute")
        problem = "no compute instance configured"
        for address in serving:
            try:
                found = await run_in_threadpool(grpc_calls.jobs, address, self.console.tls, CALL_TIMEOUT_S)
            except CallFailed as exc:
                problem = f"compute {exc}"
                continue
            return [{"name": j.name, "kind": j.kind, "key": j.key, "running": j.running} for j in found], ""
        return [], problem

    async def table(self, request: Request) -> Response:
        job = request.path_params["job"]
        prefix = request.query_params.get("prefix", "")
        try:
            limit = _limit(request, self.console.settings.page_size)
        except ValueError:
            return self.pages.problem(request, 400, f"limit: {request.query_params['limit']!r}, want 1 to 10000")
        try:
            token = _decode_token(request.query_params.get("page", ""))
        except ValueError as exc:
            return self.pages.problem(request, 400, str(exc))
        sinks = self.console.serving("sink")
        if not sinks:
            return self.pages.problem(request, 503, "no sink is configured to read result tables from")
        try:
            reply = await run_in_threadpool(grpc_calls.scan_page, sinks[0], self.console.tls, job, prefix, limit, token, CALL_TIMEOUT_S)
        except CallFailed as exc:
            status = 400 if exc.code == "INVALID_ARGUMENT" else 503
            return self.pages.problem(request, status, f"scan refused by {exc}")
        if not reply.rows and not token:  # an empty first page: is there such a job at all?
            known, _ = await self._jobs()
            if known and job not in {j["name"] for j in known}:
                names = ", ".join(j["name"] for j in known)
                return self.pages.problem(request, 404, f"no job named {job!r} (compute knows {names})")
        rows = [{"key": r.key, "value": r.value.decode("utf-8", "replace")} for r in reply.rows]
        return self.pages.page(
            request, "table.html", job=job, prefix=prefix, limit=limit, rows=rows, first=not token, version=reply.table,
            next_page=_encode_token(reply.next_page_token) if reply.next_page_token else "",
        )
