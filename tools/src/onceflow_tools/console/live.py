"""The one stream of server-sent events that keeps the pages live: the whole snapshot, or one
service's part of it, each time the watch publishes a newer one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from onceflow_tools.console.pages import Console

# How often the event stream looks for a newer snapshot (the watch publishes once a poll).
STREAM_TICK_S = 0.25


class EventStreams:
    """``/events``, at most ``max_event_streams`` of them open at once."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.open = 0  # live event streams now

    def routes(self) -> list[Route]:
        return [Route("/events", self.events)]

    async def events(self, request: Request) -> Response:
        service = request.query_params.get("service", "")
        if service and self.console.watch.service(service) is None:
            return JSONResponse({"error": f"no service named {service!r}"}, status_code=404)
        if self.open >= self.console.settings.max_event_streams:
            return JSONResponse(
                {"error": f"{self.open} live streams are open, the most this console serves "
                          "(ONCEFLOW_CONSOLE_MAX_EVENT_STREAMS): try again shortly"},
                status_code=503, headers={"Retry-After": "5"},
            )
        self.open += 1  # one event loop: no lock needed
        return StreamingResponse(self._stream(request, service), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    async def _stream(self, request: Request, service: str) -> AsyncIterator[str]:
        watch = self.console.watch
        try:
            last = None
            while not await request.is_disconnected():
                current = watch.snapshot()
                if current.get("at") != last:
                    last = current.get("at")
                    data = watch.service(service) if service else current
                    yield f"data: {json.dumps(data)}\n\n"
                await asyncio.sleep(STREAM_TICK_S)
        finally:
            self.open -= 1
