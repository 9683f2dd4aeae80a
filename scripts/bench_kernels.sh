#!/usr/bin/env bash
# Builds and runs the kernel micro-benchmarks (bench/bench_kernels.cpp) and
# prints a table: format x rows, GB/s with 1 and 2 threads, next to the
# read-bandwidth probe measured in the same run; then the fast mode's GMAC/s.
#   scripts/bench_kernels.sh [BUILD_DIR] [-- extra Google Benchmark flags]
# e.g. scripts/bench_kernels.sh build -- --benchmark_filter='q4_0|ReadBandwidth'
#      scripts/bench_kernels.sh build -- --benchmark_repetitions=3   (medians)
# The raw results are kept in BUILD_DIR/bench_kernels.json.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build_dir=build
if [ $# -gt 0 ] && [ "$1" != "--" ]; then build_dir="$1"; shift; fi
[ "${1:-}" = "--" ] && shift
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" -G Ninja
fi
cmake --build "$build_dir" --target megakern_bench_kernels -j "$(nproc)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)  cpus: $(nproc)" >&2
json="$build_dir/bench_kernels.json"
"$build_dir/megakern_bench_kernels" --benchmark_out="$json" --benchmark_out_format=json "$@"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 - "$json" <<'PY'
import json, re, sys
doc = json.load(open(sys.argv[1]))
probe, table, fmts = {}, {}, []
fast, ffmts, fma, loops = {}, [], {}, {}
bench = doc["benchmarks"]
# With --benchmark_repetitions, use the medians only.
if any(b.get("run_type") == "aggregate" for b in bench):
    bench = [b for b in bench if b.get("aggregate_name") == "median"]
for b in bench:
    name = b["name"]
    m = re.match(r"BM_ReadBandwidth(_end)?/threads:(\d+)", name)
    if m:
        probe.setdefault(int(m.group(2)), []).append(b["GB/s"])
        continue
    m = re.match(r"BM_FmaPeak/threads:(\d+)", name)
    if m:
        fma[int(m.group(1))] = b["GMAC/s"]
        continue
    m = re.match(r"BM_LoopPeak/([^/]+)/threads:(\d+)", name)
    if m:
        loops.setdefault(m.group(1), {})[int(m.group(2))] = b["GMAC/s"]
        continue
    m = re.match(r"BM_MatmulFast/([^/]+)/rows:(\d+)/threads:(\d+)", name)
    if m:
        f = m.group(1)
        if f not in ffmts: ffmts.append(f)
        fast[(f, int(m.group(2)), int(m.group(3)))] = b["GMAC/s"]
        continue
    m = re.match(r"BM_Matmul/([^/]+)/rows:(\d+)/threads:(\d+)", name)
    if m:
        f, r, t = m.group(1), int(m.group(2)), int(m.group(3))
        if f not in fmts: fmts.append(f)
        table[(f, r, t)] = (b["GB/s"], b["real_time"], b.get("pct_probe", 0))
if fma:
    print("f32 FMA peak (GMAC/s, all threads): " + ", ".join(f"{t} thread{'s' if t > 1 else ''}: {v:.1f}" for t, v in sorted(fma.items())))
if loops:
    print("integer loop peaks (GMAC/s, 1 / 2 threads): " + ", ".join(
        f"{k} " + " / ".join(f"{v[t]:.1f}" for t in sorted(v)) for k, v in loops.items()))
if probe:
    print("read-bandwidth probe (GB/s, start / end of run): " +
          ", ".join(f"{t} thread{'s' if t > 1 else ''}: " + " / ".join(f"{v:.1f}" for v in vs) for t, vs in sorted(probe.items())))
rows = sorted({r for (_, r, _) in table})
print(f"{'format':<10} " + " ".join(f"{'r=' + str(r) + ' 1t/2t':>15}" for r in rows) + "   (GB/s of weights; 1-row % of probe 1t/2t; t(8)/t(1) 1t/2t)")
for f in fmts:
    cells = []
    for r in rows:
        a, b = table.get((f, r, 1)), table.get((f, r, 2))
        cells.append(f"{(a[0] if a else 0):6.1f}/{(b[0] if b else 0):<6.1f}".rjust(15))
    one1, one2 = table.get((f, 1, 1)), table.get((f, 1, 2))
    e1, e2 = table.get((f, 8, 1)), table.get((f, 8, 2))
    extra = ""
    if one1 and one2: extra += f"   {one1[2]:.0f}%/{one2[2]:.0f}%"
    if one1 and one2 and e1 and e2: extra += f"   {e1[1] / one1[1]:.2f}x/{e2[1] / one2[1]:.2f}x"
    print(f"{f:<10} " + " ".join(cells) + extra)
if fast:
    frows = sorted({r for (_, r, _) in fast})
    print(f"fast mode {'':<0}" + " ".join(f"{'r=' + str(r) + ' 1t/2t':>15}" for r in frows) + "   (GMAC/s)")
    for f in ffmts:
        print(f"{f:<10}" + " ".join(f"{fast.get((f, r, 1), 0):6.1f}/{fast.get((f, r, 2), 0):<6.1f}".rjust(15) for r in frows))
PY
