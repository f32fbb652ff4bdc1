#!/usr/bin/env bash
# Makes sure a Chromium is installed for the dashboard's browser tests (ui/browser_test.go,
# driven with chromedp): $WARREN_CHROMIUM, or chromium on the PATH; else Debian's chromium
# package, installed with apt-get. The tests fail, they do not skip, without one.
set -euo pipefail

if [ -n "${WARREN_CHROMIUM:-}" ] || command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "chromium: not installed, and no apt-get to install it: install Chromium, or set WARREN_CHROMIUM to its path" >&2
  exit 1
fi
echo "chromium: installing Debian's chromium with apt-get"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
chromium --version
