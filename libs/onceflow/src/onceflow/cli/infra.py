"""`onceflow infra up | down | status | logs | install | topics`."""

import typer

app = typer.Typer(no_args_is_help=True, help="Local Kafka (KRaft) and Redis on 127.0.0.1.")
