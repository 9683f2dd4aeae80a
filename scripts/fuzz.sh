#!/usr/bin/env bash
# Builds the libFuzzer target for the GGUF reader with clang (ASan + UBSan) and
# runs it for a bounded time. Not part of the default tests.
#   scripts/fuzz.sh [SECONDS]     (default 60)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
seconds="${1:-60}"
case "$seconds" in ''|*[!0-9]*) echo "fuzz: SECONDS must be a positive integer, got '$seconds'" >&2; exit 2 ;; esac
command -v clang++ >/dev/null || { echo "fuzz: clang++ is needed (scripts/setup.sh installs it)" >&2; exit 1; }
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DMEGAKERN_FUZZ=ON -DMEGAKERN_TESTS=OFF >/dev/null
cmake --build build-fuzz --target fuzz_gguf -j "$(nproc)"
# Seed corpus: the first 64 KiB of each fetched model (header and metadata).
corpus=fuzz-corpus/gguf
mkdir -p "$corpus"
for m in models/*.gguf; do
  [ -f "$m" ] && head -c 65536 "$m" > "$corpus/$(basename "$m").head"
done
exec build-fuzz/fuzz_gguf -max_total_time="$seconds" -max_len=65536 -timeout=10 "$corpus"
