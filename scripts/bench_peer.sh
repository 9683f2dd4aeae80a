#!/usr/bin/env bash
# megakern against llama.cpp on the same GGUF file, same thread count, rounds
# interleaved (megakern first in odd rounds, llama.cpp first in even ones) so
# that a machine whose load drifts disturbs both alike.
#
# Usage: scripts/bench_peer.sh [--build-only] [MODEL.gguf]
#   ROUNDS=3 THREADS=2 scripts/bench_peer.sh models/smollm2-135m.gguf
#
# Measured per round, on each engine:
#   b1      batch-1 decode tok/s      megakern bench --batch 1     | llama-bench -p 0 -n 64
#   b8      batch-8 decode, aggregate megakern bench --batch 8     | llama-batched-bench -npp 16 -ntg 64 -npl 8
#   pp512   512-token prompt tok/s    megakern bench --prompt 512  | llama-bench -p 512 -n 0
# megakern runs in both numerics modes (exact, fast) in each round; llama.cpp
# with flash attention on. The table shows the median over rounds of each
# figure and megakern / llama.cpp ratios of those medians.
#
# Measure on a quiet machine: llama.cpp's OpenMP workers spin at barriers, so
# on a machine whose cores are shared with other work its figures collapse
# (SmolLM2 batch-1 decode: 7.4 tok/s at load average 7 on 2 cores, against
# ~190 unloaded) and the ratios mean nothing.
#
# A second peer: IK_DIR=<dir with llama-bench and llama-batched-bench> (a
# CPU build of ik_llama.cpp, for instance) runs in every round beside
# llama.cpp with the same flags (its batched bench prints a table, which is
# read instead of JSON lines). The report names the host CPU, megakern's
# kernel builds (`kernels:` of megakern bench) and the bandwidth probe.
#
# llama.cpp is built once, CPU only (-DGGML_NATIVE=ON), from the source
# vendored in the llama-cpp-python sdist on PyPI, into build-peer/ (ignored by
# git; not part of setup or CI). LLAMA_CPP_PYTHON_VERSION picks the sdist.
# On hosts with AMX the build leaves AMX out (-mno-amx-*) unless PEER_AMX=1:
# this llama.cpp's AMX matrix product crashes (SIGSEGV in
# ggml_backend_amx_mul_mat) on every prompt on the Sapphire Rapids VMs here,
# while its AVX-512 / VNNI paths and weight repacking stay on.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PEER="${PEER_DIR:-$ROOT/build-peer}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
THREADS="${THREADS:-2}"
ROUNDS="${ROUNDS:-3}"
MEGAKERN="${MEGAKERN:-$ROOT/build/megakern}"
IK_DIR="${IK_DIR:-}"
BIN="$PEER/llama-build/bin"

build_peer() {
  if [[ -x "$BIN/llama-bench" && -x "$BIN/llama-batched-bench" && -x "$BIN/llama-quantize" ]]; then return; fi
  mkdir -p "$PEER"
  local sdist="$PEER/llama_cpp_python-$VERSION.tar.gz"
  if [[ ! -f "$sdist" ]]; then
    echo "[peer] downloading the llama-cpp-python $VERSION sdist" >&2
    python3 -m pip download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$PEER" >&2
  fi
  local src="$PEER/llama_cpp_python-$VERSION/vendor/llama.cpp"
  [[ -d "$src" ]] || tar -xzf "$sdist" -C "$PEER"
  local flags=""
  if grep -qw amx_tile /proc/cpuinfo && [[ "${PEER_AMX:-0}" != 1 ]]; then flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"; fi
  echo "[peer] building llama.cpp from $src (CPU only, native${flags:+, without AMX}; takes a while)" >&2
  cmake -S "$src" -B "$PEER/llama-build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF >&2
  nice -n 15 cmake --build "$PEER/llama-build" -j2 \
    --target llama-bench llama-batched-bench llama-quantize llama-perplexity >&2
}

BUILD_ONLY=0
if [[ "${1:-}" == "--build-only" ]]; then BUILD_ONLY=1; shift; fi
build_peer
if [[ $BUILD_ONLY == 1 ]]; then echo "llama.cpp tools in $BIN"; exit 0; fi

MODEL="${1:?usage: scripts/bench_peer.sh [--build-only] MODEL.gguf}"
[[ -f "$MODEL" ]] || { echo "error: model file '$MODEL' not found" >&2; exit 1; }
[[ -x "$MEGAKERN" ]] || { echo "error: $MEGAKERN not built (cmake --build build --target megakern)" >&2; exit 1; }
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "error: ROUNDS must be a positive integer, got '$ROUNDS'" >&2; exit 1; }
if [[ -n "$IK_DIR" ]]; then
  for t in llama-bench llama-batched-bench; do
    [[ -x "$IK_DIR/$t" ]] || { echo "error: IK_DIR='$IK_DIR' has no executable $t" >&2; exit 1; }
  done
fi

# Raw outputs (JSON and logs of every run) are kept for inspection.
OUT="$(mktemp -d "${TMPDIR:-/tmp}/bench_peer.XXXXXX")"
echo "[peer] $MODEL, $THREADS threads, $ROUNDS rounds; raw results in $OUT" >&2
t_start=$(date +%s)

run_megakern() {  # $1: round
  "$MEGAKERN" bench -m "$MODEL" --numerics exact,fast --executor mega --batch 1,8 --steps 64 --warmup 4 \
    --rounds 1 -t "$THREADS" --probe-mib 64 --json "$OUT/mk-decode-$1.json" > "$OUT/mk-decode-$1.log" 2>&1
  "$MEGAKERN" bench -m "$MODEL" --numerics exact,fast --executor mega --prompt 512 --rounds 1 -t "$THREADS" \
    --json "$OUT/mk-prompt-$1.json" > "$OUT/mk-prompt-$1.log" 2>&1
}
run_peer() {  # $1: round, $2: tag (ll, ik), $3: bin dir, $4...: extra batched-bench flags
  local r="$1" tag="$2" bin="$3"; shift 3
  "$bin/llama-bench" -m "$MODEL" -t "$THREADS" -p 0 -n 64 -fa 1 -r 1 -o json > "$OUT/$tag-decode-$r.json" 2> "$OUT/$tag-decode-$r.log"
  "$bin/llama-bench" -m "$MODEL" -t "$THREADS" -p 512 -n 0 -fa 1 -r 1 -o json > "$OUT/$tag-prompt-$r.json" 2> "$OUT/$tag-prompt-$r.log"
  "$bin/llama-batched-bench" -m "$MODEL" -t "$THREADS" -tb "$THREADS" -c 1024 -b 512 -ub 512 -fa on \
    -npp 16 -ntg 64 -npl 8 "$@" > "$OUT/$tag-batched-$r.log" 2>&1
}
run_llama() {  # $1: round
  run_peer "$1" ll "$BIN" --output-format jsonl
  if [[ -n "$IK_DIR" ]]; then run_peer "$1" ik "$IK_DIR"; fi
}

for ((r = 1; r <= ROUNDS; r++)); do
  echo "[peer] round $r of $ROUNDS" >&2
  if ((r % 2)); then run_megakern "$r"; run_llama "$r"; else run_llama "$r"; run_megakern "$r"; fi
done

cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
isa="$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -x -E 'avx2|avx512f|avx512_vnni|avx_vnni|avx512_bf16|amx_int8' | tr '\n' ' ')"
python3 - "$OUT" "$ROUNDS" "$MODEL" "$THREADS" "$(( $(date +%s) - t_start ))" "$cpu" "$isa" "${IK_DIR:+1}" <<'EOF'
import json, re, statistics, sys
out, rounds, model, threads, secs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
cpu, isa, with_ik = sys.argv[6], sys.argv[7], sys.argv[8] == "1"
peers = [("ll", "llama.cpp")] + ([("ik", "ik_llama.cpp")] if with_ik else [])
kernels, probes = set(), []
fig = {}  # (engine, metric) -> [tok/s per round]
def add(key, v): fig.setdefault(key, []).append(v)
for r in range(1, rounds + 1):
    d = json.load(open(f"{out}/mk-decode-{r}.json"))
    kernels.add(d.get("kernels", "?"))
    if "probe_gbs" in d: probes.append(d["probe_gbs"])
    for x in d["results"]:
        mode = x["executor"].split("/")[-1] if "/" in x["executor"] else "exact"
        add((f"megakern {mode}", f"b{x['batch']}"), x["tokens_per_s"])
    p = json.load(open(f"{out}/mk-prompt-{r}.json"))
    for x in p["results"]:
        add((f"megakern {x['case'].split('/')[-1]}", "pp512"), x["tokens_per_s"])
    for tag, peer in peers:
        for name, metric in (("decode", "b1"), ("prompt", "pp512")):
            for x in json.load(open(f"{out}/{tag}-{name}-{r}.json")):
                add((peer, metric), x["avg_ts"])
        found = False
        for line in open(f"{out}/{tag}-batched-{r}.log"):
            m = re.search(r"\{.*\"speed_tg\".*\}", line)
            # The table form: | PP | TG | B | N_KV | T_PP | S_PP | T_TG | S_TG | T | S |
            t = re.match(r"^\|\s*16\s*\|\s*64\s*\|\s*8\s*\|", line)
            if m:
                add((peer, "b8"), json.loads(m.group(0))["speed_tg"]); found = True
            elif t:
                add((peer, "b8"), float(line.strip().strip("|").split("|")[7])); found = True
        if not found:
            sys.exit(f"error: no llama-batched-bench result in {out}/{tag}-batched-{r}.log")
med = {k: statistics.median(v) for k, v in fig.items()}
metrics = ["b1", "b8", "pp512"]
print(f"\n{model}: {threads} threads, median of {rounds} interleaved round(s), tokens/s ({secs} s in all)")
print(f"host: {cpu}; flags: {isa.strip()}")
print(f"megakern kernels: {'; '.join(sorted(kernels))}")
if probes:
    print(f"read-bandwidth probe: {min(probes):.1f}-{max(probes):.1f} GB/s over the rounds")
print(f"{'engine':<20}" + "".join(f"{m:>10}" for m in metrics))
engines = [p for _, p in peers] + ["megakern exact", "megakern fast"]
for e in engines:
    print(f"{e:<20}" + "".join(f"{med.get((e, m), float('nan')):>10.1f}" for m in metrics))
for _, peer in peers:
    for e in ("megakern exact", "megakern fast"):
        print(f"{e + ' / ' + peer.split('.')[0]:<20}" + "".join(
            f"{med[(e, m)] / med[(peer, m)]:>9.2f}x" if (e, m) in med and (peer, m) in med else f"{'-':>10}"
            for m in metrics))
EOF
