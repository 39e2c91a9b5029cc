#!/usr/bin/env bash
# Installs Debian's Chromium for the console's browser tests (`pytest -m console`). Playwright
# drives this system browser by its path; it never downloads one of its own.
set -euo pipefail
command -v chromium >/dev/null && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y --no-install-recommends chromium >/dev/null \
  || { $sudo apt-get update -qq && $sudo apt-get install -y --no-install-recommends chromium >/dev/null; }
command -v chromium >/dev/null
