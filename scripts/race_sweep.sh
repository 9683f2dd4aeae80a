#!/usr/bin/env bash
# The race checker (src/exec/race_check.h) over the full-size programs, built
# from shapes only, across a grid of team sizes and row counts: every
# megakernel schedule compile() gives, plain and (recurrent programs) with
# chained rows. Longer than a test (minutes per preset on 2 cores), so not in
# the ctest suite; the suite checks a spread of it (RaceCheck.FullSizePresets).
#   scripts/race_sweep.sh [--binary PATH] [--workers LIST] [--rows LIST] [PRESET ...]
# LIST as `megakern inspect --race-check` takes it (1,2,8 or 1-64). Default
# grid: workers 1,2,3,4,7,8,16,31,32,63,64 by rows 1,2,3,7,8,16,33,64, over
# kimi-k3, muse-spark-1.2 and qwen3.8-27b. Exits non-zero at the first race.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
binary="$root/build/megakern"
workers=1,2,3,4,7,8,16,31,32,63,64
rows=1,2,3,7,8,16,33,64
presets=()
while (($#)); do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --rows) rows="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    -*) echo "race_sweep: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) presets+=("$1"); shift ;;
  esac
done
((${#presets[@]})) || presets=(kimi-k3 muse-spark-1.2 qwen3.8-27b)
if [ ! -x "$binary" ]; then
  echo "race_sweep: $binary is not built (cmake --build build --target megakern)" >&2
  exit 1
fi
# The largest row count names the program's rows (--max-rows).
max_rows=$(printf '%s\n' "${rows//,/$'\n'}" | sed 's/.*-//' | sort -n | tail -1)
start=$SECONDS
for p in "${presets[@]}"; do
  t=$SECONDS
  "$binary" inspect --config "$p" --race-check --workers "$workers" --rows "$rows" --max-rows "$max_rows"
  echo "race_sweep: $p took $((SECONDS - t)) s"
done
echo "race_sweep: workers $workers x rows $rows over ${presets[*]}: $((SECONDS - start)) s"
