#!/bin/bash
# The x86 variants' attend_rows (a prefill chunk's attention, the exact contract's arithmetic)
# on one thread, without Python or the wheel: builds the engine's C sources with gcc and
# tests/bench/attend_rows.c, and with BASE=<rev> also that revision's engine sources (git
# archive), then runs the builds alternately ROUNDS times and prints one row per run.
#   VARIANTS="avx512vnni avx2"   the kernel variants (those this CPU grants)
#   SHAPES="64 3 2048;64 8 2048" HD GROUP POSITIONS (default: SmolLM2's 64-wide heads, 3 per KV
#                                head, and the 1.1B's 8)
#   BASE=HEAD  ROUNDS=3  REPS=10  (best of REPS passes per run)
#   DEFS="-DAXPY_ROWS=5"         defines for the current build only (x86_common.h's tile sizes)
#   DECODE="4 512 90000"         instead, tests/bench/attend_decode.c: attend_f16 (a decode
#                                token's attention) of GROUP heads over POSITIONS cached rows
#                                STRIDE fp16s apart, every KV head of the stride in turn, far
#                                past the caches (ns per KV head and position)
#   FMA_THREADS=2                also the vector unit's FMA rate on 1 and on this many threads
#                                (tests/bench/fma_peak.c): the bound the attention runs against
#                                (default: nproc; 0 leaves it out)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD:-/tmp/attend-rows}
rm -rf "$B" && mkdir -p "$B"
build() { # TAG SOURCE-FOLDER [DEFINES]
  local o="$B/$1" S=$2 CF="-O3 -std=gnu11 -fPIC -I$2 ${3:-}"
  mkdir -p "$o"
  gcc $CF -c "$S/ref.c" -o "$o/ref.o"
  gcc $CF -c "$S/dispatch.c" -o "$o/dispatch.o"
  gcc $CF -mavx2 -mfma -mf16c -c "$S/x86_avx2.c" -o "$o/avx2.o"
  gcc $CF -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512vnni \
      -c "$S/x86_avx512.c" -o "$o/avx512.o"
  gcc $CF -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx512vbmi -mavx512bf16 \
      -mamx-tile -mamx-int8 -mamx-bf16 -c "$S/x86_amx.c" -o "$o/amx.o"
  gcc $CF tests/bench/attend_rows.c "$o"/*.o -lm -o "$o/attend_rows"
  gcc $CF tests/bench/attend_decode.c "$o"/*.o -lm -o "$o/attend_decode"
}
TAGS=cur
build cur engines/cpu/src "${DEFS:-}"
if [ -n "${BASE:-}" ]; then
  mkdir -p "$B/base-src"
  git archive "$BASE" engines/cpu/src | tar -x -C "$B/base-src"
  build base "$B/base-src/engines/cpu/src"
  TAGS="base cur"
fi
lscpu | grep -E "Model name|L1d|L2 cache" || true
fma_threads=${FMA_THREADS:-$(nproc)}
if [ "$fma_threads" != 0 ]; then
  gcc -O2 -mavx2 -mfma tests/bench/fma_peak.c -lpthread -o "$B/fma_peak"
  "$B/fma_peak" "$fma_threads"
fi
if [ -n "${DECODE:-}" ]; then
  read -r -a decode <<< "$DECODE"
  [ ${#decode[@]} -eq 3 ] || { echo "DECODE '$DECODE': write GROUP STRIDE POSITIONS" >&2; exit 2; }
  echo "| build | variant | shape | ns per position | ns per row-position | check |"
  echo "|---|---|---|---|---|---|"
  for v in ${VARIANTS:-avx512vnni}; do
    for _ in $(seq "${ROUNDS:-3}"); do
      for t in $TAGS; do "$B/$t/attend_decode" "$t" "$v" "${decode[@]}"; done
    done
  done
  exit 0
fi
echo "| build | variant | head | heads per KV head | positions | ms (best of ${REPS:-10}) | ns per row-position | check |"
echo "|---|---|---|---|---|---|---|---|"
IFS=';' read -r -a shapes <<< "${SHAPES:-64 3 2048;64 8 2048}"
for v in ${VARIANTS:-avx512vnni}; do
  for shape in "${shapes[@]}"; do
    for _ in $(seq "${ROUNDS:-3}"); do
      for t in $TAGS; do "$B/$t/attend_rows" "$t" "$v" $shape "${REPS:-10}"; done
    done
  done
done | tee "$B/runs.md"
echo
echo "medians over the rounds (ns per row-position):"
echo "| build | variant | head | heads per KV head | positions | median ns | runs |"
echo "|---|---|---|---|---|---|---|"
# the rows grouped by build, variant and shape, in the order first seen; the median of column 8
awk -F'|' '{ key = $2 "|" $3 "|" $4 "|" $5 "|" $6; if (!(key in n)) order[++keys] = key;
             v[key, ++n[key]] = $8 + 0 }
     END { for (i = 1; i <= keys; i++) { key = order[i]; m = n[key];
             for (a = 1; a <= m; a++) for (b = a + 1; b <= m; b++)
               if (v[key, b] < v[key, a]) { x = v[key, a]; v[key, a] = v[key, b]; v[key, b] = x }
             med = m % 2 ? v[key, (m + 1) / 2] : (v[key, m / 2] + v[key, m / 2 + 1]) / 2;
             printf "|%s| %.3f | %d |\n", key, med, m } }' "$B/runs.md"
