"""Redis URLs, parsed without a client: the settings check them at startup, `redis_client`
connects with them."""

from __future__ import annotations

from urllib.parse import urlsplit

SENTINEL_SCHEME = "redis+sentinel"


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, int]:
    """(Sentinel addresses, master name, db) of a ``redis+sentinel://`` URL; ValueError saying
    what is wrong otherwise."""
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        raise ValueError(f"not a {SENTINEL_SCHEME}:// URL: {url!r}")
    sentinels = []
    for address in filter(None, parts.netloc.split(",")):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"Sentinel address {address!r} in {url!r} is not host:port")
        sentinels.append((host, int(port)))
    if not sentinels:
        raise ValueError(f"no Sentinel address in {url!r}")
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(f"want {SENTINEL_SCHEME}://host:port[,host:port]/<master name>[/<db>], got {url!r}")
    return sentinels, path[0], int(path[1]) if len(path) == 2 else 0
