"""`onceflow topology`: the hops and the topics between them, from onceflow.topology."""

from __future__ import annotations

import typer

from onceflow import topology as pipeline


def topology(prefix: str = typer.Option("", help="A topic prefix (ONCEFLOW_TOPIC_PREFIX) to show names with.")) -> None:
    """Show what each hop reads, writes, keeps as state and dead-letters."""
    text = pipeline.describe()
    if prefix:
        for name in sorted((str(t) for t in pipeline.Topic), key=len, reverse=True):
            text = text.replace(name, prefix + name)
    typer.echo(text)
