"""What every page family of the console shares: the fleet it shows (`Console`) and the
rendering of a page or of a problem page (`Pages`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from onceflow.admin.tls import ClientTLS
from onceflow.config import CommonSettings
from onceflow_tools.console.settings import ConsoleSettings
from onceflow_tools.console.watch import FleetWatch

HERE = Path(__file__).parent
CALL_TIMEOUT_S = 5.0


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


class Pages:
    """The templates, and the console every page is about."""

    def __init__(self, console: Console) -> None:
        self.console = console
        # Autoescape everywhere: keys, values and record ids are user data and may hold HTML.
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True)
        self.templates = Jinja2Templates(env=env)
        self.templates.env.filters["json"] = lambda value: json.dumps(value, indent=2, default=str)

    def page(self, request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
        return self.templates.TemplateResponse(
            request, template, {"poll_interval_s": self.console.settings.poll_interval_s, **context}, status_code=status_code
        )

    def problem(self, request: Request, status_code: int, what: str) -> Response:
        heading = {404: "Not found", 400: "Bad request"}.get(status_code, "Unavailable")
        return self.page(request, "problem.html", status_code, heading=heading, what=what)
