#!/bin/sh
# The optional second device run: the smallest attention, prefill and cache cases under
# compute-sanitizer's memcheck and racecheck, logged to $OUT/sanitize.log.
here=$(cd "$(dirname "$0")" && pwd)
. "$here/setup.sh"
if [ -z "$COMPUTE_SANITIZER" ]; then
  say "no compute-sanitizer on this machine"
  exit 1
fi
say "== sanitizer sections"
exec "$here/gpu_run" --out "$out" --sanitize
