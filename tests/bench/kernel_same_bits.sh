#!/bin/bash
# Whether a change to an x86 kernel source keeps every bit of its quantized products (mm_*, the
# register tiles, and wide8_*, the int8 tiles: not the bf16 wide path, attention or SwiGLU):
# builds the file as it is and as it was at REV, each linked with the rest of the working
# tree's engine sources, runs tests/bench/kernel_same_bits.c with both, and compares the outputs
# byte for byte (exit 1 on any difference). The variant run is the file's own (x86_amx.c: amx,
# x86_avx512.c: avx512vnni, x86_avx2.c: avx2; amx includes the working tree's x86_avx512.c,
# so a change there is checked as avx512vnni). Where the CPU does not grant AMX the amx variant
# runs on the kernel test's emulated tiles (engines/cpu/tests/amx_emulate.h), the same integer
# arithmetic.
#
#   tests/bench/kernel_same_bits.sh REV [FILE]
#     FILE     x86_amx.c (default), x86_avx512.c or x86_avx2.c, under engines/cpu/src
#   NEW=path   compare that file against REV's instead of the working tree's FILE
#   BUILD=dir  build there (kept) instead of a temporary folder (removed)
set -euo pipefail
here=$PWD
abs() { case "$1" in /*) echo "$1" ;; *) echo "$here/$1" ;; esac; }
if [ -n "${NEW:-}" ]; then NEW=$(abs "$NEW"); fi
if [ -n "${BUILD:-}" ]; then BUILD=$(abs "$BUILD"); fi
cd "$(dirname "$0")/../.."
rev=${1:?usage: $0 REV [FILE]} file=${2:-x86_amx.c}
[ $# -le 2 ] || { echo "usage: $0 REV [FILE] (the variant is FILE's own)" >&2; exit 2; }
case "$file" in
  x86_amx.c) variant=amx ;;
  x86_avx512.c) variant=avx512vnni ;;
  x86_avx2.c) variant=avx2 ;;
  *) echo "FILE '$file': x86_amx.c, x86_avx512.c or x86_avx2.c" >&2; exit 2 ;;
esac
S=engines/cpu/src
new_src=${NEW:-$S/$file}
[ -f "$new_src" ] || { echo "NEW '$new_src': no such file" >&2; exit 2; }
old_text=$(git show "$rev:$S/$file" 2>/dev/null) || { echo "REV '$rev': no $S/$file there" >&2; exit 2; }
if [ -n "${BUILD:-}" ]; then B=$BUILD; mkdir -p "$B"; else B=$(mktemp -d /tmp/same-bits.XXXXXX); trap 'rm -rf "$B"' EXIT; fi
printf '%s\n' "$old_text" > "$B/old_$file"
EMU=()
if ! grep -qw amx_tile /proc/cpuinfo; then EMU=(-DHS_AMX_EMULATE=1 -Iengines/cpu/tests); fi
CF=(-O3 -std=gnu11 -I$S "${EMU[@]}")
X512=(-mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512vnni)
AMX=("${X512[@]}" -mavx512vbmi -mavx512bf16 -mamx-tile -mamx-int8 -mamx-bf16)
flags() { case "$1" in x86_amx.c) echo "${AMX[@]}" ;; x86_avx512.c) echo "${X512[@]}" ;; *) echo -mavx2 -mfma -mf16c ;; esac; }
objs=()
for f in ref dispatch threadpool model bandwidth sample; do gcc "${CF[@]}" -c $S/$f.c -o "$B/$f.o"; objs+=("$B/$f.o"); done
for f in x86_avx2.c x86_avx512.c x86_amx.c; do
  [ "$f" = "$file" ] && continue
  # shellcheck disable=SC2046
  gcc "${CF[@]}" $(flags "$f") -c "$S/$f" -o "$B/$f.o"; objs+=("$B/$f.o")
done
for side in old new; do
  src=$new_src; [ $side = old ] && src=$B/old_$file
  # shellcheck disable=SC2046
  gcc "${CF[@]}" $(flags "$file") -c "$src" -o "$B/${side}_$file.o"
  gcc "${CF[@]}" tests/bench/kernel_same_bits.c "${objs[@]}" "$B/${side}_$file.o" -lm -lpthread \
    -o "$B/$side"
  echo -n "$side ($([ $side = old ] && echo "$rev" || echo "$new_src")): "
  "$B/$side" "$variant" "$B/$side.bin"
done
if cmp -s "$B/old.bin" "$B/new.bin"; then
  echo "same bits: $variant's products from $file at $rev and now are byte for byte identical"
else
  echo "DIFFERENT: $variant's products from $file differ between $rev and now" >&2
  cmp "$B/old.bin" "$B/new.bin" | head -3 >&2
  exit 1
fi
