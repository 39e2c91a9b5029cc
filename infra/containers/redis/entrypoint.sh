#!/bin/sh
# As the redis image does: a redis-server started without a config file would refuse every client
# beyond loopback (protected mode), and the compose network is beyond loopback. No port is
# published beyond the host's loopback (docker-compose.yml).
if [ "${1:-}" = redis-server ]; then
    exec "$@" --protected-mode no
fi
exec "$@"
