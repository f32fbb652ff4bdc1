#!/usr/bin/env bash
# Saves screenshots of the dashboard's main pages into docs/img: runs examples/dashboard
# (a backlog of 20,000 poison messages) on a port of its own and drives Chromium through
# its pages (tools/uishots, in the tools module).
set -euo pipefail
cd "$(dirname "$0")/.."
port=${WARREN_UI_PORT:-18080}
export WARREN_UI_PASSWORD=screenshots
mkdir -p .bin
go build -o .bin/dashboard-demo ./examples/dashboard
.bin/dashboard-demo -backlog 20000 -listen "127.0.0.1:$port" -password "$WARREN_UI_PASSWORD" > .bin/dashboard-demo.log 2>&1 &
demo=$!
trap 'kill $demo 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  grep -q "^dashboard on" .bin/dashboard-demo.log && break
  kill -0 $demo 2>/dev/null || { cat .bin/dashboard-demo.log; exit 1; }
  sleep 1
done
sleep 25 # a few samples for the charts (every 10s)
# tools/ is a module of its own: the program runs from there, and writes into ../docs/img.
(cd tools && go run ./uishots -url "http://127.0.0.1:$port/warren/" -queue warren.example.dashboard.orders -out ../docs/img)
