"""The dead letters, counted per reason, the newest first: ``onceflow dlq list`` as a page."""

from __future__ import annotations

import time
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from onceflow_client.dlq import DLQ_TOPICS, DeadLetters, Letter, LetterFilter, reason_counts
from onceflow_tools.console.pages import Pages

LETTERS_SHOWN = 200  # the newest letters a page lists; the counts are of all
FILTERS = ("topic", "stage", "job", "stream", "reason", "record_id")


def _row(letter: Letter) -> dict[str, Any]:
    failed_at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(letter.failed_at_ms / 1000)) if letter.failed_at_ms else ""
    return {
        "topic": letter.topic, "place": f"{letter.partition}@{letter.offset}", "stage": letter.stage,
        "error_class": letter.error_class, "message": letter.message, "record_id": letter.record_id or "",
        "job": letter.job or "", "failed_at": failed_at,
    }


class LetterPages:
    def __init__(self, pages: Pages) -> None:
        self.pages = pages
        self.console = pages.console

    def routes(self) -> list[Route]:
        return [Route("/letters", self.letters)]

    async def letters(self, request: Request) -> Response:
        params = request.query_params
        topic = params.get("topic") or None
        if topic is not None and topic not in DLQ_TOPICS:
            return self.pages.problem(request, 400, f"topic: {topic!r} is no dead-letter topic (known: {', '.join(DLQ_TOPICS)})")
        keep = LetterFilter(
            stage=params.get("stage") or None, job=params.get("job") or None, reason=params.get("reason") or None,
            record_id=params.get("record_id") or None, stream=params.get("stream") or None,
        )
        found, failure = await run_in_threadpool(self._letters, topic, keep)
        rows = [_row(letter) for letter in reversed(found[-LETTERS_SHOWN:])]
        return self.pages.page(
            request, "letters.html", 503 if failure else 200, counts=reason_counts(found).most_common(), total=len(found),
            rows=rows, filters={k: params.get(k, "") for k in FILTERS}, topics=DLQ_TOPICS, problem=failure, shown=LETTERS_SHOWN,
        )

    def _letters(self, topic: str | None, keep: LetterFilter) -> tuple[list[Letter], str]:
        common = self.console.common
        try:
            with DeadLetters(common.kafka_bootstrap, common.topic_prefix, [topic] if topic else None, common.kafka_client_config()) as reader:
                return reader.list(keep, timeout_s=self.console.settings.lookup_timeout_s), ""
        except Exception as exc:  # noqa: BLE001 - an unreadable topic is a line on the page, not an error page
            return [], f"dead letters: {type(exc).__name__}: {exc}"
