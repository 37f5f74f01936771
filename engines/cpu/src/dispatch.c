/* Runtime ISA dispatch: one wheel per architecture runs on every CPU of it. */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
static int has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
}
static int has_avx512vnni(void) {
    __builtin_cpu_init();
    return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}
/* AMX tile data needs the kernel's permission (Linux 5.16+), asked once for the process. The
 * amx variant also uses AVX512-VBMI (vpermb, the int8 tiles' q4 unpacking), which every CPU with
 * AMX has. */
static int has_amx(void) {
    static int state = -1;
    if (state < 0) {
        __builtin_cpu_init();
#ifdef HS_AMX_EMULATE /* the kernel test's emulated tiles (engines/cpu/tests/amx_emulate.h) */
        state = has_avx512vnni() && __builtin_cpu_supports("avx512bf16") &&
                __builtin_cpu_supports("avx512vbmi");
#else
        state = has_avx512vnni() && __builtin_cpu_supports("avx512bf16") &&
                __builtin_cpu_supports("avx512vbmi") &&
                __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8") &&
                __builtin_cpu_supports("amx-bf16") &&
                syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#endif
    }
    return state;
}
const hs_kernels *hs_kernels_neon(void) { return NULL; }
const hs_kernels *hs_kernels_dotprod(void) { return NULL; }
const hs_kernels *hs_kernels_i8mm(void) { return NULL; }
#define VARIANTS {&hs_kernels_ref, has_avx2() ? hs_kernels_avx2() : NULL, \
                  has_avx512vnni() ? hs_kernels_avx512() : NULL, has_amx() ? hs_kernels_amx() : NULL}
#elif defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif
const hs_kernels *hs_kernels_avx2(void) { return NULL; }
const hs_kernels *hs_kernels_avx512(void) { return NULL; }
const hs_kernels *hs_kernels_amx(void) { return NULL; }
static int has_dotprod(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }
static int has_i8mm(void) { return has_dotprod() && (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0; }
#define VARIANTS {&hs_kernels_ref, hs_kernels_neon(), has_dotprod() ? hs_kernels_dotprod() : NULL, \
                  has_i8mm() ? hs_kernels_i8mm() : NULL}
#else
const hs_kernels *hs_kernels_avx2(void) { return NULL; }
const hs_kernels *hs_kernels_avx512(void) { return NULL; }
const hs_kernels *hs_kernels_amx(void) { return NULL; }
const hs_kernels *hs_kernels_neon(void) { return NULL; }
const hs_kernels *hs_kernels_dotprod(void) { return NULL; }
const hs_kernels *hs_kernels_i8mm(void) { return NULL; }
#define VARIANTS {&hs_kernels_ref, NULL, NULL}
#endif

const hs_kernels *hs_kernels_by_name(const char *name) {
    const hs_kernels *all[] = VARIANTS;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i] && strcmp(all[i]->name, name) == 0) return all[i];
    return NULL;
}

const hs_kernels *hs_kernels_select(void) {
    const char *forced = getenv("HETEROSERVE_KERNELS");
    if (forced && *forced) {
        const hs_kernels *k = hs_kernels_by_name(forced);
        if (k) return k;
    }
    const hs_kernels *all[] = VARIANTS, *best = &hs_kernels_ref;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) best = all[i];
    return best;
}

const char *hs_kernels_available(void) {
    static char names[128];
    const hs_kernels *all[] = VARIANTS;
    names[0] = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (!all[i]) continue;
        if (names[0]) strcat(names, ",");
        strcat(names, all[i]->name);
    }
    return names;
}
