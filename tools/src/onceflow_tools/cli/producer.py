"""`onceflow producer ...`: the producers ingest takes records from (docs/decisions/0027). The
file holds each producer's name and the sha256 of its token, never the token."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Annotated

import typer

from onceflow import streams
from onceflow.producers import PRODUCER_NAME, Producers, ProducersFileError, token_sha256
from onceflow_tools.cli.options import full_width_console

app = typer.Typer(no_args_is_help=True, help="Producers: who may send records to ingest, each with a token of its own.")
console = full_width_console()

File = Annotated[
    Path | None,
    typer.Option("--file", show_default=False, help="The producers file (default: ONCEFLOW_INGEST_PRODUCERS_FILE)."),
]


def _file(path: Path | None) -> Path:
    chosen = path or (Path(os.environ["ONCEFLOW_INGEST_PRODUCERS_FILE"]) if os.environ.get("ONCEFLOW_INGEST_PRODUCERS_FILE") else None)
    if chosen is None:
        console.print("[red]error:[/] name the producers file: --file, or ONCEFLOW_INGEST_PRODUCERS_FILE", highlight=False)
        raise typer.Exit(2)
    return chosen


@app.command()
def add(
    name: Annotated[str, typer.Argument(help="The producer's name: 1 to 100 of A-Z, a-z, 0-9, '_', '.', ':', '-'.")],
    file: File = None,
    stream: Annotated[
        list[str] | None,
        typer.Option("--stream", help="A stream it may write (repeat for more; 'default' for the default stream). None: every stream."),
    ] = None,
    certificate_cn: Annotated[
        str,
        typer.Option("--certificate-cn", help="Name it by the common name of its client certificate (mutual TLS) instead of a token."),
    ] = "",
) -> None:
    """Add producer NAME with a new random token, printed once (keep it: only its sha256 is stored),
    or named by its client certificate (--certificate-cn). Ingest reads the file at start: restart
    it to take the new producer."""
    path = _file(file)
    for one in stream or ():
        if one != streams.DEFAULT and not streams.STREAM_NAME.fullmatch(one):
            console.print(f"[red]refused:[/] stream {one!r}: 1 to 100 of A-Z, a-z, 0-9, '_' and '-'", highlight=False)
            raise typer.Exit(2)
    if not PRODUCER_NAME.fullmatch(name):
        console.print(f"[red]refused:[/] producer name {name!r}: 1 to 100 of A-Z, a-z, 0-9, '_', '.', ':' and '-'", highlight=False)
        raise typer.Exit(2)
    if path.exists():
        try:
            known = Producers.load(path)
        except ProducersFileError as exc:
            if "no [[producer]] entries" not in str(exc):
                console.print(f"[red]error:[/] {exc}", highlight=False)
                raise typer.Exit(2) from None
            known = Producers({})
        if name in {*known.by_digest.values(), *known.by_certificate.values()} or certificate_cn in known.by_certificate:
            console.print(f"[red]refused:[/] {path} has a producer {name}, or one with that certificate, already", highlight=False)
            raise typer.Exit(1)
    bound = f"streams = {json.dumps(sorted(set(stream)))}\n" if stream else ""
    if certificate_cn:
        with path.open("a") as out:
            out.write(f'\n[[producer]]\nname = "{name}"\ncertificate_cn = {json.dumps(certificate_cn)}\n{bound}')
        console.print(f"producer {name} added to {path}: named by a client certificate with CN {certificate_cn!r}", highlight=False)
        return
    token = secrets.token_urlsafe(32)
    with path.open("a") as out:
        out.write(f'\n[[producer]]\nname = "{name}"\ntoken_sha256 = "{token_sha256(token)}"\n{bound}')
    console.print(f"producer {name} added to {path}; its token (shown once):", highlight=False)
    print(token)


@app.command("hash")
def hash_(token: Annotated[str, typer.Argument(help="A token; '-' reads it from stdin.")] = "-") -> None:
    """The sha256 a producers file holds for TOKEN (for a token made elsewhere)."""
    value = typer.get_text_stream("stdin").read().strip() if token == "-" else token
    print(token_sha256(value))
