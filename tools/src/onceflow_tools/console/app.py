"""The console's web app: server-rendered pages (Jinja2, every value escaped) and one stream of
server-sent events that keeps them live. Every number comes from a `FleetWatch` snapshot or a
call made for the request; the app holds no state of its own beyond the rate history.

Each page family registers its own routes (pipeline_pages, live, service_pages, record_pages,
table_pages, letter_pages); `build` composes them behind the host and origin checks."""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from onceflow_tools.console.letter_pages import LetterPages
from onceflow_tools.console.live import EventStreams
from onceflow_tools.console.pages import HERE, Console, Pages
from onceflow_tools.console.pipeline_pages import PipelinePages
from onceflow_tools.console.record_pages import RecordPages
from onceflow_tools.console.service_pages import ServicePages
from onceflow_tools.console.table_pages import TablePages


def build(console: Console) -> Starlette:
    pages = Pages(console)

    async def not_found(request: Request, _exc: Exception) -> Response:
        return pages.problem(request, 404, f"no page at {request.url.path}")

    routes: list[BaseRoute] = [
        *PipelinePages(pages).routes(),
        *EventStreams(console).routes(),
        *ServicePages(pages).routes(),
        *RecordPages(pages).routes(),
        *TablePages(pages).routes(),
        *LetterPages(pages).routes(),
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
