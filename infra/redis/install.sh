#!/usr/bin/env bash
# Installs Redis from Debian's package. onceflow never uses the system service: `onceflow infra up`
# starts its own redis-server on 127.0.0.1 with a project-local data folder and AOF on.
set -euo pipefail
command -v redis-server >/dev/null && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y --no-install-recommends redis-server >/dev/null \
  || { $sudo apt-get update -qq && $sudo apt-get install -y --no-install-recommends redis-server >/dev/null; }
# The package may start a system instance on 6379; it is not ours, leave it be.
command -v redis-server >/dev/null
