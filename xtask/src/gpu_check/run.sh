#!/bin/sh
# The GPU run: set-up (setup.sh), then every section in its own process (gpu_run), logs and
# figures in $OUT as they come, a short summary printed at the end.
started=$(date +%s)
here=$(cd "$(dirname "$0")" && pwd)
. "$here/setup.sh"
say "== sections"
exec "$here/gpu_run" --out "$out" --started-at "$started"
