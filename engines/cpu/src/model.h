/* A llama-family decoder (Llama, Qwen2, SmolLM2) over quantized weights and a paged fp16 KV
 * cache. The caller (Python) owns scheduling: it assigns KV blocks and passes block tables. */
#ifndef HS_MODEL_H
#define HS_MODEL_H

#include <stdint.h>

#include "kernels.h"
#include "threadpool.h"

typedef struct {
    int type;          /* enum hs_type */
    int rows, cols;    /* rows = output features */
    size_t row_bytes;
    void *data;        /* owned, 64-byte aligned */
} hs_mat;

typedef struct {
    hs_mat wq, wk, wv, wo, w_gate, w_up, w_down;
    float *attn_norm, *ffn_norm, *bq, *bk, *bv; /* biases: Qwen2 only */
} hs_layer;

typedef struct {
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab;
    int rope_neox;     /* 0: adjacent pairs (GGUF llama), 1: halves (Qwen2, NeoX) */
    float eps, rope_base;
} hs_config;

typedef struct hs_model hs_model;

hs_model *hs_model_create(const hs_config *config, hs_pool *pool, const hs_kernels *kernels,
                          int nrc);
void hs_model_destroy(hs_model *model);
const hs_config *hs_model_config(const hs_model *model);

/* Copies a tensor in, each pool thread first-touching the rows it will compute. `which`:
 * 0 tok_embd, 1 output, 2 output_norm, 10+ per layer: 10 wq 11 wk 12 wv 13 wo 14 w_gate
 * 15 w_up 16 w_down 17 attn_norm 18 ffn_norm 19 bq 20 bk 21 bv. Returns 0 or -1. */
int hs_model_set(hs_model *model, int which, int layer, int type, int rows, int cols,
                 const void *data);
/* Allocates the KV cache: n_blocks blocks of block_size tokens. Returns 0 or -1. */
int hs_model_alloc_kv(hs_model *model, int n_blocks, int block_size);
size_t hs_model_weight_bytes(const hs_model *model);
/* Weight bytes one decode step of one token reads: every layer matrix, the output head (the
 * embedding table where it is tied) and one embedding row. The decode roofline's divisor. */
size_t hs_model_token_bytes(const hs_model *model);
size_t hs_model_kv_bytes(const hs_model *model);

/* The KV hand-off: copies n rows of one layer between the cache and caller buffers. Row i is
 * cache slot slots[i] (block * block_size + offset); k and v are [n][n_head_kv * head_dim] fp16,
 * K after RoPE. write: buffers -> cache (import); read: cache -> buffers (export). Returns 0, or
 * -1 when the cache is not allocated or a layer or slot is out of range. */
int hs_model_write_kv(hs_model *model, int layer, int n, const int32_t *slots, const void *k,
                      const void *v);
int hs_model_read_kv(const hs_model *model, int layer, int n, const int32_t *slots, void *k,
                     void *v);

/* One step over n tokens (any mix of prefill chunks and decode tokens of several sequences).
 * Token i of sequence seq[i] at position pos[i] has its K/V written to its slot, then attends to
 * positions 0..pos[i] of that sequence. block_tables is [n_seqs][max_blocks]. Logits are
 * computed for the tokens listed in logit_index (n_logits of them) into logits
 * [n_logits][n_vocab]. Returns 0, or -1 on bad arguments. */
int hs_model_forward(hs_model *model, int n, const int32_t *tokens, const int32_t *pos,
                     const int32_t *seq, const int32_t *block_tables, int n_seqs,
                     int max_blocks, const int32_t *logit_index, int n_logits, float *logits);

/* Per-phase wall time of steps (embed, norm, qkv, rope_kv, attention, o_proj, gate_up, swiglu,
 * down, logits), summed while profiling is on: set_profiling turns it on or off and zeroes the
 * sums; hs_model_profile points at the phase names and their seconds, returns their count.
 * Off by default (two clock reads per phase when on). */
void hs_model_set_profiling(hs_model *model, int on);
int hs_model_profile(const hs_model *model, const char *const **names, const double **seconds);
/* Strips (16 weight rows) of the batched decode products so far, and in *stolen how many of them
 * a thread took from another's share once its own were done (model.c's work stealing): how
 * unevenly the threads got through their shares. */
unsigned long long hs_model_strips(const hs_model *model, unsigned long long *stolen);

/* 64-byte aligned memory (free with free()); from 2 MiB up, 2 MiB aligned and advised onto
 * transparent huge pages. Weights, the KV cache and the bandwidth probe use it. */
void *hs_alloc_large(size_t bytes);

/* The parallel quantized matrix product used by the model, for tests and benchmarks:
 * out[n][rows] = x[n][cols] @ W^T. From hs_wide_min_rows() activation rows on (48, or
 * HETEROSERVE_WIDE_MIN), a variant with a matrix unit (k->wide) computes it there. */
int hs_wide_min_rows(void);
/* Activation rows from which a variant's int8 tile-unit products (k->wide8_*, amx) take every
 * whole group of 16 rows of a 32-row pass; fewer run on the register tiles, whose arithmetic is
 * avx512vnni's bit for bit (so an amx decode step of fewer sequences computes as avx512vnni's,
 * which the exact KV hand-off relies on). On the 16-core host (cpu_engine_profile --baseline,
 * docs/benchmarks.md, the sixth session of 2026-11-28) a 16-sequence step ran 2-44 % faster
 * with its products on the tile unit than as two passes of register tiles on the 1.1B, 13-42 %
 * on the 8B q4_0 (three runs on two machines), once the tile unit's blocks were scaled without
 * gathers; before that the register tiles had been ahead, and this was 24. */
#define HS_WIDE8_MIN 16
void hs_matmul(hs_pool *pool, const hs_kernels *k, int nrc, const hs_mat *w, int n,
               const float *x, float *out);

#endif
