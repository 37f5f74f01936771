/* GGUF quantization block layouts, defined once (ggml-common.h is the reference).
 *
 * 32 weights per block. q4_0: fp16 scale d + 16 bytes of nibbles; element j is the low nibble of
 * byte j, element j+16 the high nibble; value = (nibble - 8) * d. q4_1: d, fp16 min m, nibbles;
 * value = nibble * d + m. q8_0: d + 32 int8. Activations are quantized on the fly to block_q8a
 * (float scale and the scaled sum, used by q4_1's min term); that format is internal.
 */
#ifndef HS_BLOCKS_H
#define HS_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#define HS_QK 32

typedef uint16_t hs_fp16;

typedef struct { hs_fp16 d; uint8_t qs[HS_QK / 2]; } block_q4_0;
typedef struct { hs_fp16 d; hs_fp16 m; uint8_t qs[HS_QK / 2]; } block_q4_1;
typedef struct { hs_fp16 d; int8_t qs[HS_QK]; } block_q8_0;
typedef struct { float d; float s; int8_t qs[HS_QK]; } block_q8a;

#ifdef __cplusplus
#define HS_STATIC_ASSERT static_assert
#else
#define HS_STATIC_ASSERT _Static_assert
#endif
HS_STATIC_ASSERT(sizeof(block_q4_0) == 18, "q4_0 block is 18 bytes");
HS_STATIC_ASSERT(sizeof(block_q4_1) == 20, "q4_1 block is 20 bytes");
HS_STATIC_ASSERT(sizeof(block_q8_0) == 34, "q8_0 block is 34 bytes");

/* GGUF tensor type ids (ggml_type). */
enum hs_type { HS_F32 = 0, HS_F16 = 1, HS_Q4_0 = 2, HS_Q4_1 = 3, HS_Q8_0 = 8 };

static inline size_t hs_row_bytes(int type, int64_t cols) {
    switch (type) {
    case HS_F32: return (size_t)cols * 4;
    case HS_F16: return (size_t)cols * 2;
    case HS_Q4_0: return (size_t)(cols / HS_QK) * sizeof(block_q4_0);
    case HS_Q4_1: return (size_t)(cols / HS_QK) * sizeof(block_q4_1);
    case HS_Q8_0: return (size_t)(cols / HS_QK) * sizeof(block_q8_0);
    default: return 0;
    }
}

float hs_fp16_to_fp32(hs_fp16 h);
hs_fp16 hs_fp32_to_fp16(float f);
extern float hs_fp16_table[1 << 16];
static inline float hs_f16(hs_fp16 h) { return hs_fp16_table[h]; }

#endif
