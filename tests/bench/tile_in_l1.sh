#!/bin/bash
# What one avx512vnni register tile costs with its data in L1 (tests/bench/tile_in_l1.c): the
# working tree's x86_avx512.c, and with REV also that revision's, built side by side and run in
# alternating processes. docs/benchmarks.md's per-tile figures (sixteenth round: the 2-block
# tail of 576-column rows) come from it. Needs AVX-512 VNNI; no Python, no wheel.
#   tests/bench/tile_in_l1.sh [--rev REV] [--type q8_0|q4_0] [--rounds N] [COLS ...]
# COLS default: 512 544 576 608 640 736 1536 (16 blocks; 17-20 and 23: tails of 1-4 and 7;
# 48). Prints, per width and build, the best and the median over N rounds (default 7) of each
# process's best pass, in ns a tile (2 weight rows x 4 activation rows).
set -euo pipefail
cd "$(dirname "$0")/../.."
rev="" type=q8_0 rounds=7 cols=()
while [ $# -gt 0 ]; do
  case $1 in
    --rev) rev=${2:?--rev takes a revision}; shift 2 ;;
    --type) type=${2:?--type takes q8_0 or q4_0}; shift 2 ;;
    --rounds) rounds=${2:?--rounds takes a count}; shift 2 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) cols+=("$1"); shift ;;
  esac
done
case $type in q8_0|q4_0) ;; *) echo "--type $type: q8_0 or q4_0" >&2; exit 2 ;; esac
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "--rounds $rounds: a count (1 or more)" >&2; exit 2; }
[ ${#cols[@]} -gt 0 ] || cols=(512 544 576 608 640 736 1536)
for c in "${cols[@]}"; do
  [[ $c =~ ^[1-9][0-9]*$ ]] && [ $((c % 32)) -eq 0 ] || { echo "COLS $c: a multiple of 32" >&2; exit 2; }
done
grep -q avx512_vnni /proc/cpuinfo || { echo "this CPU has no AVX-512 VNNI" >&2; exit 1; }
S=engines/cpu/src B=$(mktemp -d)
trap 'rm -rf "$B"' EXIT
CF="-O3 -std=gnu11 -fPIC -I$S"
X512="-mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512vnni"
AMX="$X512 -mavx512vbmi -mavx512bf16 -mamx-tile -mamx-int8 -mamx-bf16"
for f in ref dispatch threadpool model bandwidth sample; do gcc $CF -fopenmp -c $S/$f.c -o "$B/$f.o"; done
gcc $CF -mavx2 -mfma -mf16c -c $S/x86_avx2.c -o "$B/avx2.o"
gcc $CF $AMX -c $S/x86_amx.c -o "$B/amx.o"
builds=(cur)
mkdir -p "$B/cur" && cp $S/x86_avx512.c "$B/cur/"
if [ -n "$rev" ]; then
  mkdir -p "$B/rev" && git show "$rev:$S/x86_avx512.c" > "$B/rev/x86_avx512.c"
  builds+=(rev)
fi
for b in "${builds[@]}"; do
  # the wrapper includes that build's x86_avx512.c (its own folder first, the rest from $S)
  printf '#include "x86_avx512.c"\n%s\n%s\n' \
    'void t24(int nb, const uint8_t *w, size_t ws, const act_group *a, size_t as, float *out, size_t os) { tile(Q8_0, 2, 4, nb, w, ws, a, as, out, os); }' \
    'void t24q4(int nb, const uint8_t *w, size_t ws, const act_group *a, size_t as, float *out, size_t os) { tile(Q4_0, 2, 4, nb, w, ws, a, as, out, os); }' \
    > "$B/$b/wrap.c"
  gcc $CF $X512 -I"$B/$b" -c "$B/$b/wrap.c" -o "$B/$b/wrap.o"
  gcc $CF -fopenmp tests/bench/tile_in_l1.c "$B/$b/wrap.o" "$B"/{ref,dispatch,threadpool,model,bandwidth,sample,avx2,amx}.o \
    -lm -lpthread -o "$B/$b/tile"
done
lscpu | grep -E "Model name|L1d cache" | sed 's/  */ /g'
label() { [ "$1" = cur ] && echo "working tree" || echo "$rev"; }
echo "| columns (blocks) | build | best ns a tile | median ns a tile |"
echo "|---|---|---|---|"
for c in "${cols[@]}"; do
  for b in "${builds[@]}"; do : > "$B/$b/t$c"; done
  for _ in $(seq "$rounds"); do
    for b in "${builds[@]}"; do "$B/$b/tile" "$type" "$c" | cut -d' ' -f2 >> "$B/$b/t$c"; done
  done
  for b in "${builds[@]}"; do
    sort -n "$B/$b/t$c" > "$B/$b/s$c"
    echo "| $c ($((c / 32))) | $(label $b) | $(head -1 "$B/$b/s$c") | $(sed -n "$(( (rounds + 1) / 2 ))p" "$B/$b/s$c") |"
  done
done
