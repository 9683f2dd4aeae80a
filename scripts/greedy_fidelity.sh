#!/usr/bin/env bash
# Greedy output of a quantised model against the f32 computation of the same
# weights (every matrix dequantised at load, --weights f32): for each prompt
# of a committed held-out set (bench/data/heldout_prompts.txt, one per line),
# N tokens greedy in the given numerics mode and with f32 weights, and
# whether the two texts are identical. Prints one line per prompt and the
# count of identical outputs.
#
#   scripts/greedy_fidelity.sh MODEL [NUMERICS=exact] [N=48] [EXECUTOR=mega]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model="${1:?usage: scripts/greedy_fidelity.sh MODEL [exact|fast] [N] [executor]}"
numerics="${2:-exact}"
n="${3:-48}"
executor="${4:-mega}"
bin="${MEGAKERN_BIN:-$root/build/megakern}"
prompts="$root/bench/data/heldout_prompts.txt"
[[ "$numerics" == exact || "$numerics" == fast ]] || { echo "numerics must be exact or fast, got '$numerics'" >&2; exit 2; }
[[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "N must be a positive integer, got '$n'" >&2; exit 2; }
same=0 total=0
while IFS= read -r p; do
  [[ -n "$p" ]] || continue
  total=$((total + 1))
  a="$("$bin" run -m "$model" -p "$p" -n "$n" --numerics "$numerics" --executor "$executor" 2>/dev/null)"
  b="$("$bin" run -m "$model" -p "$p" -n "$n" --weights f32 --executor "$executor" 2>/dev/null)"
  if [[ "$a" == "$b" ]]; then
    same=$((same + 1)); echo "[same]   $p"
  else
    # the first differing character, to see how far the outputs agree
    i=0; while [[ "${a:$i:1}" == "${b:$i:1}" ]]; do i=$((i + 1)); done
    echo "[differ at char $i] $p"
  fi
done < "$prompts"
echo "$model $numerics: $same of $total prompts give the f32 weights' greedy output ($n tokens, $executor)"
