"""The console's web app: server-rendered pages (Jinja2, every value escaped) and one stream of
server-sent events that keeps them live. Every number comes from a `FleetWatch` snapshot or a
call made for the request; the app holds no state of its own beyond the rate history."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import jinja2
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Receive, Scope, Send

from onceflow.admin.tls import ClientTLS
from onceflow.config import CommonSettings
from onceflow.kafka.registry import read_registry
from onceflow_client.dlq import DLQ_TOPICS, DeadLetters, Letter, LetterFilter, reason_counts
from onceflow_tools.admin_client import CallFailed
from onceflow_tools.console import graph, grpc_calls, records
from onceflow_tools.console.settings import ConsoleSettings
from onceflow_tools.console.watch import FleetWatch
from onceflow_sink import versions

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
CALL_TIMEOUT_S = 5.0
LETTERS_SHOWN = 200  # the newest letters a page lists; the counts are of all
# How often the event stream looks for a newer snapshot (the watch publishes once a poll).
STREAM_TICK_S = 0.25


@dataclass
class Console:
    watch: FleetWatch
    settings: ConsoleSettings
    common: CommonSettings
    tls: ClientTLS | None = None

    def serving(self, name: str) -> list[str]:
        """Addresses of ``name``'s instances, those that answered the last poll first."""
        node = self.watch.service(name)
        if node is None:
            return []
        up = [i["address"] for i in node["instances"] if i["status"] is not None]
        return up + [a for a in self.watch.addresses(name) if a not in up]


def _encode_token(token: bytes) -> str:
    return base64.urlsafe_b64encode(token).decode()


def _decode_token(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode(), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("page: not a page token this console gave out") from None


def build(console: Console) -> Starlette:
    # Autoescape everywhere: keys, values and record ids are user data and may hold HTML.
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True)
    templates = Jinja2Templates(env=env)
    templates.env.filters["json"] = lambda value: json.dumps(value, indent=2, default=str)

    def page(request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
        return templates.TemplateResponse(
            request, template, {"poll_interval_s": console.settings.poll_interval_s, **context}, status_code=status_code
        )

    def problem(request: Request, status_code: int, what: str) -> Response:
        heading = {404: "Not found", 400: "Bad request"}.get(status_code, "Unavailable")
        return page(request, "problem.html", status_code, heading=heading, what=what)

    async def pipeline(request: Request) -> Response:
        names = console.watch.names()
        places, edges = graph.layout(names)
        return page(
            request, "pipeline.html", snapshot=console.watch.snapshot(), places=places, edges=edges,
            width=graph.WIDTH, height=graph.HEIGHT, node_w=graph.NODE_W, node_h=graph.NODE_H,
        )

    async def snapshot(_request: Request) -> Response:
        return JSONResponse(console.watch.snapshot())

    open_streams = [0]  # live event streams now

    async def events(request: Request) -> Response:
        service = request.query_params.get("service", "")
        if service and console.watch.service(service) is None:
            return JSONResponse({"error": f"no service named {service!r}"}, status_code=404)

        if open_streams[0] >= console.settings.max_event_streams:
            return JSONResponse(
                {"error": f"{open_streams[0]} live streams are open, the most this console serves "
                          "(ONCEFLOW_CONSOLE_MAX_EVENT_STREAMS): try again shortly"},
                status_code=503, headers={"Retry-After": "5"},
            )
        open_streams[0] += 1  # one event loop: no lock needed

        async def stream() -> AsyncIterator[str]:
            try:
                last = None
                while not await request.is_disconnected():
                    current = console.watch.snapshot()
                    if current.get("at") != last:
                        last = current.get("at")
                        data = console.watch.service(service) if service else current
                        yield f"data: {json.dumps(data)}\n\n"
                    await asyncio.sleep(STREAM_TICK_S)
            finally:
                open_streams[0] -= 1

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    async def service_page(request: Request) -> Response:
        name = request.path_params["name"]
        data = console.watch.service(name)
        if data is None:
            return problem(request, 404, f"no service named {name!r} in this console's fleet")
        return page(request, "service.html", name=name, data=data, actions=grpc_calls.ACTIONS, message="", failed=False)

    async def service_action(request: Request) -> Response:
        name, action = request.path_params["name"], request.path_params["action"]
        data = console.watch.service(name)
        if data is None:
            return problem(request, 404, f"no service named {name!r} in this console's fleet")
        if action not in grpc_calls.ACTIONS:
            return problem(request, 404, f"no action {action!r}: one of {', '.join(grpc_calls.ACTIONS)}")
        form = await request.form()
        token = str(form.get("token", ""))
        results, failed = [], False
        for address in console.watch.addresses(name):
            try:
                state = await run_in_threadpool(grpc_calls.admin_action, address, console.tls, action, token, CALL_TIMEOUT_S)
                results.append(f"{address}: {action} done, state {state}")
            except CallFailed as exc:
                failed = True
                results.append(f"{action} refused by {exc}")
        log.info("console action %s on %s: %s", action, name, "; ".join(results))
        await run_in_threadpool(console.watch.poll)  # show the new state at once
        return page(
            request, "service.html", 400 if failed else 200, name=name, data=console.watch.service(name),
            actions=grpc_calls.ACTIONS, message="; ".join(results), failed=failed,
        )

    async def record_page(request: Request) -> Response:
        record_id = request.query_params.get("id", "")
        if "id" not in request.query_params:
            return page(request, "record.html", record_id="", story=None, problem="", message="")
        problem = records.check_record_id(record_id)
        if problem:
            return page(request, "record.html", 400, record_id=record_id, story=None, problem=problem, message="")
        story = await run_in_threadpool(
            records.look_up, record_id, console.common, console.serving("acker"), console.serving("dedup"), console.tls,
            CALL_TIMEOUT_S, console.settings.lookup_timeout_s,
        )
        status = 200 if story.found else 404
        return page(request, "record.html", status, record_id=record_id, story=story, problem="", message="")

    async def forget(request: Request) -> Response:
        form = await request.form()
        record_id, token = str(form.get("record_id", "")), str(form.get("token", ""))
        problem = records.check_record_id(record_id)
        if problem:
            return page(request, "record.html", 400, record_id=record_id, story=None, problem=problem, message="")
        results, failed = [], True
        for address in console.serving("dedup"):
            try:
                reply = await run_in_threadpool(grpc_calls.forget, address, console.tls, record_id, token, CALL_TIMEOUT_S)
            except CallFailed as exc:
                results.append(f"forget refused by {exc}")
                continue
            failed = False
            if reply.forgotten:
                results.append(f"{address}: forgotten (partition {reply.partition}): a new copy will pass the gate")
                break
            results.append(f"{address}: not in its store")
        return page(
            request, "record.html", 400 if failed else 200, record_id=record_id, story=None, problem="",
            message="; ".join(results) or "no dedup instance to ask", failed=failed,
        )

    async def tables(request: Request) -> Response:
        if request.query_params.get("job"):  # the "open" form
            return RedirectResponse(f"/tables/{quote(request.query_params['job'], safe='')}", status_code=303)
        known, problem = await _jobs()
        versions, versions_problem = await run_in_threadpool(_versions)
        return page(request, "tables.html", jobs=known, problem=problem, versions=versions, versions_problem=versions_problem)

    def _versions() -> tuple[list[dict[str, Any]], str]:
        """Every version in the registry that runs, as `onceflow job status` shows it (no rate:
        a page load does not wait for a sample)."""
        try:
            jobs = sorted(read_registry(console.common, timeout_s=CALL_TIMEOUT_S))
            rows = []
            for name in jobs:
                for status in versions.status(console.common, name, sample_s=0):
                    rows.append({
                        "job": name, "name": status.name, "state": status.version.state.value, "live": status.live,
                        "module": status.version.module, "map_behind": status.map_behind.records,
                        "merge_behind": "-" if status.merge_behind is None else status.merge_behind.records,
                    })
            return rows, ""
        except Exception as exc:  # noqa: BLE001 - the registry unreadable is a line on the page, not an error page
            return [], f"job versions: {type(exc).__name__}: {exc}"

    async def _jobs() -> tuple[list[dict[str, Any]], str]:
        for address in console.serving("compute"):
            try:
                found = await run_in_threadpool(grpc_calls.jobs, address, console.tls, CALL_TIMEOUT_S)
            except CallFailed as exc:
                problem = f"compute {exc}"
                continue
            return [{"name": j.name, "kind": j.kind, "key": j.key, "running": j.running} for j in found], ""
        return [], problem if console.serving("compute") else "no compute instance configured"

    async def table(request: Request) -> Response:
        job = request.path_params["job"]
        prefix = request.query_params.get("prefix", "")
        limit = console.settings.page_size
        try:
            if "limit" in request.query_params:
                limit = int(request.query_params["limit"])
                if not 1 <= limit <= 10_000:
                    raise ValueError
        except ValueError:
            return problem(request, 400, f"limit: {request.query_params['limit']!r}, want 1 to 10000")
        try:
            token = _decode_token(request.query_params.get("page", ""))
        except ValueError as exc:
            return problem(request, 400, str(exc))
        sinks = console.serving("sink")
        if not sinks:
            return problem(request, 503, "no sink is configured to read result tables from")
        try:
            reply = await run_in_threadpool(grpc_calls.scan_page, sinks[0], console.tls, job, prefix, limit, token, CALL_TIMEOUT_S)
        except CallFailed as exc:
            status = 400 if exc.code == "INVALID_ARGUMENT" else 503
            return problem(request, status, f"scan refused by {exc}")
        if not reply.rows and not token:  # an empty first page: is there such a job at all?
            known, _ = await _jobs()
            if known and job not in {j["name"] for j in known}:
                names = ", ".join(j["name"] for j in known)
                return problem(request, 404, f"no job named {job!r} (compute knows {names})")
        rows = [{"key": r.key, "value": r.value.decode("utf-8", "replace")} for r in reply.rows]
        return page(
            request, "table.html", job=job, prefix=prefix, limit=limit, rows=rows, first=not token, version=reply.table,
            next_page=_encode_token(reply.next_page_token) if reply.next_page_token else "",
        )

    async def letters(request: Request) -> Response:
        """The dead letters, counted per reason, the newest first: ``onceflow dlq list`` as a page."""
        params = request.query_params
        topic = params.get("topic") or None
        if topic is not None and topic not in DLQ_TOPICS:
            return problem(request, 400, f"topic: {topic!r} is no dead-letter topic (known: {', '.join(DLQ_TOPICS)})")
        keep = LetterFilter(
            stage=params.get("stage") or None, job=params.get("job") or None, reason=params.get("reason") or None,
            record_id=params.get("record_id") or None, stream=params.get("stream") or None,
        )
        found, failure = await run_in_threadpool(_letters, topic, keep)
        shown = list(reversed(found[-LETTERS_SHOWN:]))
        rows = [
            {"topic": l.topic, "place": f"{l.partition}@{l.offset}", "stage": l.stage, "error_class": l.error_class,
             "message": l.message, "record_id": l.record_id or "", "job": l.job or "",
             "failed_at": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(l.failed_at_ms / 1000)) if l.failed_at_ms else ""}
            for l in shown
        ]
        return page(
            request, "letters.html", 503 if failure else 200, counts=reason_counts(found).most_common(), total=len(found),
            rows=rows, filters={k: params.get(k, "") for k in ("topic", "stage", "job", "stream", "reason", "record_id")},
            topics=DLQ_TOPICS, problem=failure, shown=LETTERS_SHOWN,
        )

    def _letters(topic: str | None, keep: LetterFilter) -> tuple[list[Letter], str]:
        common = console.common
        try:
            with DeadLetters(common.kafka_bootstrap, common.topic_prefix, [topic] if topic else None, common.kafka_client_config()) as reader:
                return reader.list(keep, timeout_s=console.settings.lookup_timeout_s), ""
        except Exception as exc:  # noqa: BLE001 - an unreadable topic is a line on the page, not an error page
            return [], f"dead letters: {type(exc).__name__}: {exc}"

    async def not_found(request: Request, _exc: Exception) -> Response:
        return problem(request, 404, f"no page at {request.url.path}")

    routes = [
        Route("/", pipeline),
        Route("/api/snapshot", snapshot),
        Route("/events", events),
        Route("/services/{name}", service_page),
        Route("/services/{name}/{action}", service_action, methods=["POST"]),
        Route("/records", record_page),
        Route("/records/forget", forget, methods=["POST"]),
        Route("/tables", tables),
        Route("/tables/{job}", table),
        Route("/letters", letters),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    hosts = ["127.0.0.1", "localhost", "[::1]", "::1", console.settings.host, *console.settings.allowed_hosts]
    return Starlette(
        routes=routes, exception_handlers={404: not_found},
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts), Middleware(SameOriginPosts, allowed_hosts=hosts)],
    )


class SameOriginPosts:
    """A POST (an action: pause, drain, forget) whose Origin is another site's is refused (403):
    a page elsewhere cannot make the operator's browser act here. A request without Origin (a
    script, curl) is let through: the action still needs the admin token the operator types."""

    def __init__(self, app: ASGIApp, allowed_hosts: list[str]) -> None:
        self.app = app
        self.allowed = set(allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            origin = Headers(scope=scope).get("origin")
            if origin is not None and (urlsplit(origin).hostname or "") not in self.allowed:
                response = PlainTextResponse(f"refused: a POST from {origin}, another site", status_code=403)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
