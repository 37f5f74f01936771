#!/bin/bash
# How much CPU time the hypervisor took from this VM while a command ran (/proc/stat's steal
# column against all columns, over every CPU and per CPU), and, with BUSY=1 first, how fast each
# CPU runs one fixed busy loop (Python, pinned with taskset): a shared host shows up as CPUs whose
# loop takes far longer than the fastest one's. The nineteenth round's host runs read 10.6 % of all
# CPU time stolen in one call and 0.04 % in another (docs/benchmarks.md).
#   tests/bench/cpu_steal.sh [COMMAND ARGS...]     (no command: a 10 s sleep)
#   BUSY=1 tests/bench/cpu_steal.sh python3 -m tests.bench.cpu_engine_profile ...
set -euo pipefail
case "${BUSY:-0}" in 0|1) ;; *) echo "BUSY '${BUSY}': 0 or 1" >&2; exit 2;; esac
[ -r /proc/stat ] || { echo "/proc/stat is not readable: Linux only" >&2; exit 2; }
if [ "${BUSY:-0}" = 1 ]; then
  echo "| CPU | busy loop ms |"
  echo "|---|---|"
  for c in $(taskset -pc $$ | sed 's/.*: //' | tr ',' ' '); do # "0-3,8" -> 0-3 8
    for cpu in $(seq "${c%-*}" "${c#*-}"); do
      s=$(date +%s%N)
      taskset -c "$cpu" python3 -c "sum(range(3 * 10**7))"
      echo "| $cpu | $(( ($(date +%s%N) - s) / 1000000 )) |"
    done
  done
fi
before=$(grep '^cpu' /proc/stat)
status=0
if [ $# -gt 0 ]; then "$@" || status=$?; else sleep 10; fi
after=$(grep '^cpu' /proc/stat)
# fields: name user nice system idle iowait irq softirq steal ...: steal over the sum of all
echo "| CPU | stolen % of its time |"
echo "|---|---|"
paste <(echo "$before") <(echo "$after") | awk '{
  n = NF / 2; all = 0
  for (i = 2; i <= n; i++) all += $(i + n) - $i
  steal = $(9 + n) - $9
  printf "| %s | %.2f |\n", ($1 == "cpu" ? "all" : substr($1, 4)), (all > 0 ? 100 * steal / all : 0)
}'
exit $status
