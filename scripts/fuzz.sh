#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a
# bounded time, at low priority. Not part of the default tests.
#   scripts/fuzz.sh [SECONDS] [TARGET...]    (default 60 s each; all targets)
#   scripts/fuzz.sh --replay [TARGET...]     run every seed input once (the
#                                            committed corpora and the GGUF
#                                            seeds), no fuzzing: CI's check
# Targets: gguf safetensors tokenizer chat server_request (fuzz/fuzz_*.cpp).
# Seed corpora are committed under fuzz/corpus/<target>/; what the fuzzer
# adds goes to fuzz-corpus/<target>/ (not committed), crashes to
# fuzz-crashes/<target>/. A summary line per target (runs, coverage) is
# printed at the end; the exit status is non-zero if any target crashed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
replay=0
if [ "${1:-}" = "--replay" ]; then replay=1; shift; set -- 0 "$@"; fi
seconds="${1:-60}"
case "$seconds" in ''|*[!0-9]*) echo "fuzz: SECONDS must be a positive integer, got '$seconds'" >&2; exit 2 ;; esac
shift || true
all=(gguf safetensors tokenizer chat server_request)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")
for t in "${targets[@]}"; do
  [ -f "fuzz/fuzz_$t.cpp" ] || { echo "fuzz: unknown target '$t' (known: ${all[*]})" >&2; exit 2; }
done
command -v clang++ >/dev/null || { echo "fuzz: clang++ is needed (scripts/setup.sh installs it)" >&2; exit 1; }
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DMEGAKERN_FUZZ=ON -DMEGAKERN_TESTS=OFF >/dev/null
nice -n 10 cmake --build build-fuzz -j "$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}")

# The GGUF seeds: the first 64 KiB of each fetched model (header and metadata).
mkdir -p fuzz-corpus/gguf
for m in models/*.gguf; do
  [ -f "$m" ] && head -c 65536 "$m" > "fuzz-corpus/gguf/$(basename "$m").head"
done

export MEGAKERN_MODELS_DIR="${MEGAKERN_MODELS_DIR:-$root/models}"
status=0
summary=()
if ((replay)); then
  # Each committed seed (and each GGUF head) once through its target.
  for t in "${targets[@]}"; do
    dirs=()
    [ -d "fuzz/corpus/$t" ] && dirs+=("fuzz/corpus/$t")
    [ "$t" = gguf ] && dirs+=("fuzz-corpus/gguf")
    n=0
    for d in "${dirs[@]}"; do n=$((n + $(find "$d" -type f | wc -l))); done
    if [ "$n" -eq 0 ]; then
      echo "fuzz: $t has no seed inputs to replay" >&2; status=1; continue
    fi
    mkdir -p "fuzz-crashes/$t"
    log="fuzz-crashes/$t/replay.log"
    if "build-fuzz/fuzz_$t" -runs=0 -timeout=30 -rss_limit_mb=4096 "${dirs[@]}" >"$log" 2>&1; then
      summary+=("$t: $n seed inputs replayed, no failure")
    else
      status=1
      summary+=("$t: FAILED on a seed input (see $log)")
      grep -m5 -E "ERROR|SUMMARY|Running:" "$log" >&2 || true
    fi
  done
  printf 'fuzz replay:\n'
  printf '  %s\n' "${summary[@]}"
  exit $status
fi
for t in "${targets[@]}"; do
  mkdir -p "fuzz-corpus/$t" "fuzz-crashes/$t"
  seeds=()
  [ -d "fuzz/corpus/$t" ] && seeds=("fuzz/corpus/$t")
  log="fuzz-crashes/$t/last.log"
  echo "fuzz: $t for ${seconds}s"
  if ! nice -n 10 "build-fuzz/fuzz_$t" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=4096 \
      -artifact_prefix="fuzz-crashes/$t/" -print_final_stats=1 "fuzz-corpus/$t" "${seeds[@]}" >"$log" 2>&1; then
    status=1
    echo "fuzz: $t FAILED (see $log)" >&2
    grep -m5 -E "ERROR|SUMMARY|Test unit written" "$log" >&2 || true
  fi
  runs=$(grep -oE "stat::number_of_executed_units: *[0-9]+" "$log" | grep -oE "[0-9]+$" || echo "?")
  cov=$(grep -oE "cov: [0-9]+ ft: [0-9]+" "$log" | tail -1 || echo "cov: ?")
  summary+=("$t: $runs runs, $cov, corpus $(ls "fuzz-corpus/$t" | wc -l) inputs")
done
printf 'fuzz summary (%ss each):\n' "$seconds"
printf '  %s\n' "${summary[@]}"
exit $status
