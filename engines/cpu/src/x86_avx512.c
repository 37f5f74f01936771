/* AVX512-VNNI variant (with AVX512VL): the AVX2 kernels with vpdpbusd in place of
 * maddubs+madd. Compiled with -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512vnni. */
#define HS_VNNI 1
#define HS_KERNEL_NAME "avx512vnni"
#define HS_KERNEL_GETTER hs_kernels_avx512
#include "x86_avx2.c"
