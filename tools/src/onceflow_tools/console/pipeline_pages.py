"""The pipeline page (the graph of services) and the snapshot behind it, as JSON."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from onceflow_tools.console import graph
from onceflow_tools.console.pages import Pages


class PipelinePages:
    def __init__(self, pages: Pages) -> None:
        self.pages = pages
        self.watch = pages.console.watch

    def routes(self) -> list[Route]:
        return [Route("/", self.pipeline), Route("/api/snapshot", self.snapshot)]

    async def pipeline(self, request: Request) -> Response:
        places, edges = graph.layout(self.watch.names())
        return self.pages.page(
            request, "pipeline.html", snapshot=self.watch.snapshot(), places=places, edges=edges,
            width=graph.WIDTH, height=graph.HEIGHT, node_w=graph.NODE_W, node_h=graph.NODE_H,
        )

    async def snapshot(self, _request: Request) -> Response:
        return JSONResponse(self.watch.snapshot())
