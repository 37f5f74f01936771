#!/bin/bash
# The amx variant's decode-batch products on an AMX host (the device machine: it needs no Python,
# no wheel): builds the engine's C sources with gcc, runs the kernel test natively first, then
# tests/bench/amx_products.c on an 8B-shaped gate/up matrix (28672 x 4096), q4_0 in 8 copies
# and q8_0 in 6 (528 and 750 MB against a 300 MB L3), and q4_0 in one copy (in cache: what is
# left when memory is not waited on).
#   BASE_AMX=path/to/x86_amx.c   also build that version of the amx variant (e.g. `git show
#                                REV:engines/cpu/src/x86_amx.c`, carried) and run it alternately
#   AHEADS="0 256 512"           also build the current one at these prefetch distances
#   DEFS="tag=-DA=1,-DB=2 ..."   also build the current one with these defines, one build per
#                                tag (x86_amx.c's WIDE8_* knobs; WIDE8_SKIP=1/2/4 leaves a step
#                                out, so that a build measures what the rest costs)
#                                (x86_avx512.c's PREFETCH, PF_HINT, PF_EVERY and REGTILE_SKIP=1
#                                too: the register tiles' prefetch, and what they cost without
#                                the scaling)
#   PATHS=wide8                  only the int8 tile path, at 16 and 32 rows; regtile only the
#                                register tiles, at 1, 8, 16 and 32 (avx512vnni's where the CPU
#                                does not grant AMX; default: all, which needs AMX)
#   SPECS="2 28672 4096 8;..."   the matrices (TYPE ROWS COLS COPIES; default: the three above)
#   THREADS="16 1"               the thread counts each matrix runs on (default: every core)
# Before the products it prints the cores' 512-bit vpdpbusd rate (tests/bench/fma_peak.c), on 1
# thread and on every core: the register tiles' bound (64 int8 products a vpdpbusd).
# Each line: TAG (base, cur, the distance or the DEFS tag), variant, path, type, shape, batch,
# threads, timings.
set -euo pipefail
cd "$(dirname "$0")/../.."
# the arguments checked before anything is built
IFS=';' read -r -a specs <<< "${SPECS:-2 28672 4096 8;8 28672 4096 6;2 28672 4096 1}"
for spec in "${specs[@]}"; do
  read -r -a fields <<< "$spec"
  [ ${#fields[@]} -eq 4 ] || { echo "SPECS item '$spec': write TYPE ROWS COLS COPIES" >&2; exit 2; }
done
set -f  # DEFS items are defines, not file patterns
taken=" cur base ${AHEADS:-} "
for item in ${DEFS:-}; do
  tag=${item%%=*}
  if [[ $item != *=* || ! $tag =~ ^[A-Za-z0-9_]+$ ]]; then
    echo "DEFS item '$item': write TAG=-DNAME=VALUE[,-DNAME=VALUE...]" >&2; exit 2
  fi
  case "$taken" in *" $tag "*) echo "DEFS tag '$tag' is taken (by base, cur, AHEADS or DEFS)" >&2; exit 2;; esac
  taken="$taken$tag "
done
set +f
case "${PATHS:-all}" in all|wide8|regtile) ;; *) echo "PATHS '${PATHS}': all, wide8 or regtile" >&2; exit 2;; esac
for t in ${THREADS:-}; do
  [[ $t =~ ^[1-9][0-9]*$ ]] || { echo "THREADS item '$t': a thread count (1 or more)" >&2; exit 2; }
done
S=engines/cpu/src B=${BUILD:-/tmp/amx-products}
mkdir -p "$B"
CF="-O3 -std=gnu11 -fPIC -fopenmp -I$S"
X512="-mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512vnni"
AMX="$X512 -mavx512vbmi -mavx512bf16 -mamx-tile -mamx-int8 -mamx-bf16"
pids=()  # every background compile, waited for one by one: a failed one stops the script
for f in ref dispatch threadpool model bandwidth sample; do gcc $CF -c $S/$f.c -o "$B/$f.o" & pids+=($!); done
gcc $CF -mavx2 -mfma -mf16c -c $S/x86_avx2.c -o "$B/avx2.o" & pids+=($!)
gcc $CF $X512 -c $S/x86_avx512.c -o "$B/avx512.o" & pids+=($!)
gcc $CF $AMX -c $S/x86_amx.c -o "$B/amx_cur.o" & pids+=($!)
TAGS=cur
if [ -n "${BASE_AMX:-}" ]; then gcc $CF $AMX -c "$BASE_AMX" -o "$B/amx_base.o" & pids+=($!); TAGS="base cur"; fi
for d in ${AHEADS:-}; do gcc $CF $AMX -DWIDE8_AHEAD="$d" -c $S/x86_amx.c -o "$B/amx_$d.o" & pids+=($!); TAGS="$TAGS $d"; done
set -f
for item in ${DEFS:-}; do
  tag=${item%%=*} flags=${item#*=}
  gcc $CF $AMX ${flags//,/ } -c $S/x86_amx.c -o "$B/amx_$tag.o" & pids+=($!); TAGS="$TAGS $tag"
done
set +f
for p in "${pids[@]}"; do wait "$p"; done
COMMON="$B/ref.o $B/dispatch.o $B/threadpool.o $B/model.o $B/bandwidth.o $B/sample.o $B/avx2.o $B/avx512.o"
gcc $CF engines/cpu/tests/kernel_test.c $COMMON "$B/amx_cur.o" -lm -lpthread -o "$B/kernel_test"
pids=()
for t in $TAGS; do
  gcc $CF tests/bench/amx_products.c $COMMON "$B/amx_$t.o" -lm -lpthread -o "$B/products_$t" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
"$B/kernel_test" > "$B/kernel_test.log" || { grep -m10 FAIL "$B/kernel_test.log"; tail -3 "$B/kernel_test.log"; exit 1; }
tail -2 "$B/kernel_test.log"
export OMP_PROC_BIND=close OMP_PLACES=cores
lscpu | grep -E "Model name|L2 cache|L3 cache|^CPU\(s\)"
gcc -O2 $AMX tests/bench/fma_peak.c -lpthread -o "$B/fma_peak"
"$B/fma_peak" "$(nproc)" | grep VNNI
for spec in "${specs[@]}"; do
  for threads in ${THREADS:-$(nproc)}; do
    for round in 1 2; do  # alternating: every tag twice
      for t in $TAGS; do
        OMP_NUM_THREADS=$threads "$B/products_$t" "$t" $spec "${PATHS:-all}"
      done
    done
  done
done
