#!/bin/bash
# Which index registers qemu-user's x86 emulation gets wrong in an AVX2 gather (vpgatherqq): builds
# one program with a gather per index register ymm0..ymm15 (mask and destination two others),
# then runs it natively and under `qemu-x86_64 -cpu max` (the e2e test's AVX2-only CPU). Each line:
# the index register and the four table entries read (right: 8 19 5 6 -> 108 119 105 106).
# qemu 7.2.22 (Debian 12) read an index in ymm4 as none: every lane entry 0 (docs/benchmarks.md,
# eighteenth round; x86_common.h's expf4_pd keeps its index in ymm1 for it).
set -euo pipefail
B=${BUILD:-/tmp/qemu-gather-index}
mkdir -p "$B"
{
  echo '#include <stdio.h>'
  echo '#include <immintrin.h>'
  echo 'static const long long tab[32] = {100,101,102,103,104,105,106,107,108,109,110,111,112,'
  echo '  113,114,115,116,117,118,119,120,121,122,123,124,125,126,127,128,129,130,131};'
  echo 'int main(void) {'
  echo '  long long o[4]; const long long ix[4] = {8, 19, 5, 6};'
  for i in $(seq 0 15); do
    m=$(( (i + 1) % 16 )) d=$(( (i + 2) % 16 ))
    echo "  __asm__ volatile(\"vmovdqu %1, %%ymm$i\\n\\tvpcmpeqd %%ymm$m, %%ymm$m, %%ymm$m\\n\\t\""
    echo "    \"vpxor %%ymm$d, %%ymm$d, %%ymm$d\\n\\tvpgatherqq %%ymm$m, (%2,%%ymm$i,8), %%ymm$d\\n\\t\""
    echo "    \"vmovdqu %%ymm$d, %0\" : \"=m\"(*(__m256i *)o) : \"m\"(*(const __m256i *)ix), \"r\"(tab)"
    echo "    : \"ymm$i\", \"ymm$m\", \"ymm$d\", \"memory\");"
    echo "  printf(\"index ymm$i: %lld %lld %lld %lld\\n\", o[0], o[1], o[2], o[3]);"
  done
  echo '  return 0;'
  echo '}'
} > "$B/gather.c"
gcc -O2 -mavx2 "$B/gather.c" -o "$B/gather"
echo "## native"; "$B/gather"
if command -v qemu-x86_64 >/dev/null; then
  echo "## $(qemu-x86_64 --version | head -1)"; qemu-x86_64 -cpu max "$B/gather"
else
  echo "qemu-x86_64 is missing (Debian: qemu-user)"
fi
