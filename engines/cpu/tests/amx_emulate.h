/* The AMX tile instructions that x86_amx.c uses, in plain C, for kernel tests on machines whose
 * CPU (or kernel) does not grant AMX: the development VM and CI. Built only into the emulated
 * kernel test (CMake -DHS_AMX_EMULATE=ON, tests/e2e/test_native_kernels.py); never into the wheel.
 *
 * It checks the kernels' logic - tile configuration, which tile holds what, loads and stores
 * with their strides, the pipelines' order - against the same references as the real tiles;
 * not the hardware's timing, nor its exact bf16 rounding (tdpbf16ps is summed here in float
 * per pair, in k order; the kernel test's bf16 bounds hold either way).
 *
 * Semantics (Intel SDM, AMX): a tile has rows[t] rows of colsb[t] bytes (at most 16 x 64);
 * loads zero what lies past them; tdpbssd C[m][n] += sum_k sum_i s8 A[m][4k+i] * s8 B[k][4n+i]
 * for k < colsb(A) / 4; tdpbf16ps the same over pairs of bf16 into fp32. */
#ifndef HS_AMX_EMULATE_H
#define HS_AMX_EMULATE_H

#include <stdint.h>
#include <string.h>

typedef struct {
    uint8_t rows[8];
    uint16_t colsb[8];
    _Alignas(64) uint8_t data[8][16][64];
} hs_emu_tiles;

static __thread hs_emu_tiles hs_emu;

static inline void hs_emu_loadconfig(const void *config) {
    const uint8_t *c = (const uint8_t *)config; /* palette, start_row, 14 reserved, colsb[16], rows[16] */
    memset(&hs_emu, 0, sizeof hs_emu);
    for (int t = 0; t < 8; t++) {
        memcpy(&hs_emu.colsb[t], c + 16 + 2 * t, 2);
        hs_emu.rows[t] = c[48 + t];
    }
}

static inline void hs_emu_loadd(int t, const void *base, size_t stride) {
    memset(hs_emu.data[t], 0, sizeof hs_emu.data[t]);
    for (int r = 0; r < hs_emu.rows[t]; r++)
        memcpy(hs_emu.data[t][r], (const char *)base + (size_t)r * stride, hs_emu.colsb[t]);
}

static inline void hs_emu_stored(int t, void *base, size_t stride) {
    for (int r = 0; r < hs_emu.rows[t]; r++)
        memcpy((char *)base + (size_t)r * stride, hs_emu.data[t][r], hs_emu.colsb[t]);
}

static inline void hs_emu_zero(int t) { memset(hs_emu.data[t], 0, sizeof hs_emu.data[t]); }

static inline void hs_emu_dpbssd(int c, int a, int b) {
    const int m_rows = hs_emu.rows[c], n_cols = hs_emu.colsb[c] / 4, k_pairs = hs_emu.colsb[a] / 4;
    for (int m = 0; m < m_rows; m++)
        for (int n = 0; n < n_cols; n++) {
            int32_t acc;
            memcpy(&acc, &hs_emu.data[c][m][4 * n], 4);
            for (int k = 0; k < k_pairs; k++)
                for (int i = 0; i < 4; i++)
                    acc += (int32_t)(int8_t)hs_emu.data[a][m][4 * k + i] *
                           (int32_t)(int8_t)hs_emu.data[b][k][4 * n + i];
            memcpy(&hs_emu.data[c][m][4 * n], &acc, 4);
        }
}

static inline float hs_emu_bf16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline void hs_emu_dpbf16ps(int c, int a, int b) {
    const int m_rows = hs_emu.rows[c], n_cols = hs_emu.colsb[c] / 4, k_pairs = hs_emu.colsb[a] / 4;
    for (int m = 0; m < m_rows; m++)
        for (int n = 0; n < n_cols; n++) {
            float acc;
            memcpy(&acc, &hs_emu.data[c][m][4 * n], 4);
            for (int k = 0; k < k_pairs; k++)
                acc += hs_emu_bf16(&hs_emu.data[a][m][4 * k]) * hs_emu_bf16(&hs_emu.data[b][k][4 * n]) +
                       hs_emu_bf16(&hs_emu.data[a][m][4 * k + 2]) * hs_emu_bf16(&hs_emu.data[b][k][4 * n + 2]);
            memcpy(&hs_emu.data[c][m][4 * n], &acc, 4);
        }
}

#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbssd
#undef _tile_dpbf16ps
#define _tile_loadconfig(config) hs_emu_loadconfig(config)
#define _tile_release() memset(&hs_emu, 0, sizeof hs_emu)
#define _tile_loadd(t, base, stride) hs_emu_loadd((t), (base), (size_t)(stride))
#define _tile_stored(t, base, stride) hs_emu_stored((t), (base), (size_t)(stride))
#define _tile_zero(t) hs_emu_zero(t)
#define _tile_dpbssd(c, a, b) hs_emu_dpbssd((c), (a), (b))
#define _tile_dpbf16ps(c, a, b) hs_emu_dpbf16ps((c), (a), (b))

#endif
