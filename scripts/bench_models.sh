#!/usr/bin/env bash
# Decode benchmark of every architecture's bench preset and the real models:
# op-by-op vs megakernel at batch 1, 2, 4, 8, each run with its own bandwidth
# probe (megakern bench). Results: one JSON file per model in OUT_DIR
# (default build/bench), and the printed tables.
#   scripts/bench_models.sh [OUT_DIR] [-- extra megakern bench flags]
# Quiet machines only: the figures are meant to be compared within a run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out=build/bench
if [ $# -gt 0 ] && [ "$1" != "--" ]; then out="$1"; shift; fi
[ "${1:-}" = "--" ] && shift
mkdir -p "$out"
bin=build/megakern
[ -x "$bin" ] || { echo "bench_models: $bin not built (run scripts/setup.sh)" >&2; exit 1; }
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)  cpus: $(nproc)" >&2
run() {
  local name="$1"; shift
  echo "== $name"
  "$bin" bench -m "$name" --batch 1,2,4,8 --json "$out/$name.json" "$@"
}
run dense-bench --steps 16 --rounds 3 "$@"
run smollm2-135m --steps 32 --rounds 3 "$@"
run qwen3.8-bench --weights q4_0 --steps 8 --rounds 2 "$@"
run kimi-k3-bench --steps 6 --rounds 2 "$@"
run muse-spark-bench --steps 6 --rounds 2 "$@"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
