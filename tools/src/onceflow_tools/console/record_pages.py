"""A record's story (``onceflow record`` as a page), and forgetting its id at the gate."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from onceflow_tools.admin_client import CallFailed
from onceflow_tools.console import grpc_calls, records
from onceflow_tools.console.pages import CALL_TIMEOUT_S, Pages


class RecordPages:
    def __init__(self, pages: Pages) -> None:
        self.pages = pages
        self.console = pages.console

    def routes(self) -> list[Route]:
        return [Route("/records", self.record_page), Route("/records/forget", self.forget, methods=["POST"])]

    def _refused(self, request: Request, record_id: str, problem: str) -> Response:
        return self.pages.page(request, "record.html", 400, record_id=record_id, story=None, problem=problem, message="")

    async def record_page(self, request: Request) -> Response:
        record_id = request.query_params.get("id", "")
        if "id" not in request.query_params:
            return self.pages.page(request, "record.html", record_id="", story=None, problem="", message="")
        problem = records.check_record_id(record_id)
        if problem:
            return self._refused(request, record_id, problem)
        console = self.console
        story = await run_in_threadpool(
            records.look_up, record_id, console.common, console.serving("acker"), console.serving("dedup"), console.tls,
            CALL_TIMEOUT_S, console.settings.lookup_timeout_s,
        )
        status = 200 if story.found else 404
        return self.pages.page(request, "record.html", status, record_id=record_id, story=story, problem="", message="")

    async def forget(self, request: Request) -> Response:
        form = await request.form()
        record_id, token = str(form.get("record_id", "")), str(form.get("token", ""))
        problem = records.check_record_id(record_id)
        if problem:
            return self._refused(request, record_id, problem)
        results, failed = await self._forget(record_id, token)
        return self.pages.page(
            request, "record.html", 400 if failed else 200, record_id=record_id, story=None, problem="",
            message="; ".join(results) or "no dedup instance to ask", failed=failed,
        )

    async def _forget(self, record_id: str, token: str) -> tuple[list[str], bool]:
        """Ask the dedup instances in turn until one held the id: a line each, and whether
        none of them answered."""
        results, failed = [], True
        for address in self.console.serving("dedup"):
            try:
                reply = await run_in_threadpool(grpc_calls.forget, address, self.console.tls, record_id, token, CALL_TIMEOUT_S)
            except CallFailed as exc:
                results.append(f"forget refused by {exc}")
                continue
            failed = False
            if reply.forgotten:
                results.append(f"{address}: forgotten (partition {reply.partition}): a new copy will pass the gate")
                break
            results.append(f"{address}: not in its store")
        return results, failed
