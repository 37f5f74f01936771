#include "model.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define ATTN_SPAN 256 /* positions per attention item (see attn_task) */

/* Query rows whose one-span outputs a thread holds at once: attend_f16's heads of a token, or
 * attend_rows' rows of a block. */
#define SPAN_ROWS (HS_ATTN_ROWS > HS_ATTN_GROUP ? HS_ATTN_ROWS : HS_ATTN_GROUP)

/* Phases of a step, for hs_model_profile: wall time of each, summed over steps while on. */
enum { P_EMBED, P_NORM, P_QKV, P_ROPE_KV, P_ATTN, P_WO, P_GATE_UP, P_SWIGLU, P_DOWN, P_LOGITS,
       P_COUNT };
static const char *const phase_names[P_COUNT] = {
    "embed", "norm", "qkv", "rope_kv", "attention", "o_proj", "gate_up", "swiglu", "down",
    "logits"};

/* One thread's share of a batched product's weight rows, in strips of STEAL_ROWS: [begin, end)
 * in one word, so that its owner (from the front) and the other threads (from the back) claim
 * strips with one compare-and-swap each. A cache line of its own. */
struct steal_range {
    _Alignas(64) _Atomic unsigned long long strips;
};

struct hs_model {
    hs_config c;
    hs_pool *pool;
    const hs_kernels *k;
    int nrc;
    hs_mat tok_embd, output;
    float *output_norm;
    hs_layer *layers;
    int n_blocks, block_size;
    hs_fp16 *k_cache, *v_cache; /* [layer][slot][n_head_kv * head_dim] */
    /* scratch, grown to the largest batch seen */
    int cap;
    float *x, *xb, *q, *kv_k, *kv_v, *att, *gate, *up;
    /* attention work of the step (see attn_task): block b holds tokens attn_block[b] up to
     * attn_block[b + 1] and its items start at attn_first[b]; token i's per-span partial results
     * (when it has more than one span) are at attn_part[i] in `partial` */
    int *attn_first, *attn_block, attn_blocks;
    int attn_spans_max;         /* > 0: the items go KV head, span, block (see attn_task) */
    long long *attn_cost;       /* then: the work before each item of one KV head (attn_plan) */
    size_t attn_cost_cap;
    char *attn_packed;          /* [threads][attend_bytes(head_dim, ATTN_SPAN)]: packed K/V */
    size_t attn_packed_bytes;
    size_t *attn_part, partial_cap;
    float *partial;
    float *span_acc;            /* [threads][SPAN_ROWS * head_dim]: one span's outputs */
    float *rope_cos, *rope_sin; /* [n][head_dim / 2]: computed once per step, shared by layers */
    float *inv_freq;            /* [head_dim / 2]: base^(-2i / head_dim) */
    void *qa;              /* quantized activations: the kernel table's layout */
    void *wa;              /* activations packed for the wide products (wide_pack), or NULL */
    int wide_min;          /* activation rows from which products go to the wide kernel */
    struct steal_range *ranges; /* [3][threads]: batched products' strips (matmul_steal_task) */
    unsigned long long strips;  /* strips of those products so far, */
    _Atomic unsigned long long stolen; /* and how many of them a thread took from another */
    int profiling;
    double profile[P_COUNT];
};

static void *aligned(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? (bytes + 63) / 64 * 64 : 64) != 0) return NULL;
    return p;
}

/* Weight matrices and the KV cache, when 2 MiB or more, on transparent huge pages where the
 * kernel allows them (its default "madvise" mode): one TLB entry per 2 MiB of the weight stream
 * instead of 512. HETEROSERVE_HUGEPAGES=0 turns it off (docs/benchmarks.md compares both). */
void *hs_alloc_large(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    const char *opt = getenv("HETEROSERVE_HUGEPAGES"); /* "0": 4 KiB pages only */
    if (bytes < huge || (opt && strcmp(opt, "0") == 0)) return aligned(bytes);
    void *p = NULL;
    if (posix_memalign(&p, huge, bytes) != 0) return NULL;
    madvise(p, bytes / huge * huge, MADV_HUGEPAGE);
    return p;
}

/* Activation rows from which a product goes to the kernel's bf16 matrix-unit path (wide), where
 * it has one: HETEROSERVE_WIDE_MIN (>= 2), else WIDE_MIN. Below it, the int8 tile products
 * (wide8, from HS_WIDE8_MIN rows of a pass, model.h) and the register tiles. The bf16 path
 * dequantizes every weight of a product once, whatever its rows. On the 16-core host (tests/bench/cpu_engine_profile) it took
 * 277 ms for an 8B step of 16 sequences against the int8 tiles' 136 ms (cpu_engine_vs_llamacpp),
 * and prefilled 2.2x the register tiles' rate; 48 is an estimate from single-core costs on the
 * 2-core VM (dequantizing a weight against one int8 block's scaling per 16 rows), not a measured
 * break-even. */
#define WIDE_MIN 48
int hs_wide_min_rows(void) {
    const char *s = getenv("HETEROSERVE_WIDE_MIN");
    const int v = s && *s ? atoi(s) : 0;
    return v >= 2 ? v : WIDE_MIN;
}

/* Packed activation groups the wide kernel reads for n rows: pairs of HS_WIDE_ROWS. */
static size_t wide_groups(int n) { return (size_t)(n + 2 * HS_WIDE_ROWS - 1) / (2 * HS_WIDE_ROWS) * 2; }

hs_model *hs_model_create(const hs_config *config, hs_pool *pool, const hs_kernels *kernels,
                          int nrc) {
    if (config->n_embd % HS_QK || config->n_ff % HS_QK || config->n_head % config->n_head_kv)
        return NULL;
    hs_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->c = *config;
    m->pool = pool;
    m->k = kernels;
    m->nrc = (nrc == 1 || nrc == 2 || nrc == 4) ? nrc : 0;
    m->wide_min = hs_wide_min_rows();
    /* (NULL: every product takes the static split) */
    m->ranges = aligned(3 * (size_t)hs_pool_size(pool) * sizeof(struct steal_range));
    m->layers = calloc((size_t)config->n_layer, sizeof(hs_layer));
    m->inv_freq = malloc(sizeof(float) * (size_t)(config->head_dim / 2));
    for (int i = 0; i < config->head_dim / 2; i++)
        m->inv_freq[i] = powf(config->rope_base, -2.0f * (float)i / (float)config->head_dim);
    return m;
}

static void free_mat(hs_mat *w) { free(w->data); w->data = NULL; }

void hs_model_destroy(hs_model *m) {
    if (!m) return;
    for (int l = 0; l < m->c.n_layer; l++) {
        hs_layer *L = &m->layers[l];
        hs_mat *mats[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) free_mat(mats[i]);
        free(L->attn_norm); free(L->ffn_norm); free(L->bq); free(L->bk); free(L->bv);
    }
    free(m->layers);
    if (m->output.data != m->tok_embd.data) free_mat(&m->output);
    free_mat(&m->tok_embd);
    free(m->output_norm);
    free(m->k_cache); free(m->v_cache);
    free(m->x); free(m->xb); free(m->q); free(m->kv_k); free(m->kv_v); free(m->att);
    free(m->gate); free(m->up); free(m->qa); free(m->wa); free(m->ranges);
    free(m->attn_first); free(m->attn_block); free(m->attn_part); free(m->partial);
    free(m->attn_cost); free(m->span_acc); free(m->attn_packed);
    free(m->rope_cos); free(m->rope_sin); free(m->inv_freq);
    free(m);
}

const hs_config *hs_model_config(const hs_model *m) { return &m->c; }

static int is_quantized(int type) { return type == HS_Q4_0 || type == HS_Q4_1 || type == HS_Q8_0; }

/* Whether `k` keeps weights of `type` in a layout of its own (pack_row at load). */
static int packs(const hs_kernels *k, int type) { return k->pack_row && is_quantized(type); }

/* Weight rows per one-token product: NRC where it is set (1, 2 or 4), otherwise by the row's
 * width. Wide rows (HS_WIDE_ROW_BLOCKS blocks, 1024 columns, or more) take one row at a time,
 * one forward stream per thread, the pattern the prefetchers serve best from memory; narrow
 * rows (models small enough to sit in the last-level cache) take four, sharing each activation
 * load and the per-row reduction between them. tests/bench/cpu_engine_variants.py --nrc
 * 0,1,2,4, 2-core VM, batch-1 tok/s for NRC 1 / 2 / 4: the 1.1B model (2048- and 5632-wide
 * rows) 49.0 / 47.4 / 43.2, SmolLM2 q4_0 (576 wide, 1536 in its down projection) 375.7 /
 * 411.3 / 422.8. */
static int tile_rows(int nrc, const hs_mat *w) {
    return nrc ? nrc : w->cols >= HS_WIDE_ROW_BLOCKS * HS_QK ? 1 : 4;
}

typedef struct { const hs_kernels *k; int nrc; hs_mat *w; const char *src; } touch_ctx;

/* Each thread copies (or packs) the rows it will later compute: first touch puts them on its
 * NUMA node. */
static void touch_task(void *p, int ith, int nth) {
    touch_ctx *t = p;
    const hs_mat *w = t->w;
    int r0, r1;
    hs_split(w->rows, tile_rows(t->nrc, w), ith, nth, &r0, &r1);
    if (r1 <= r0) return;
    if (packs(t->k, w->type)) {
        for (int r = r0; r < r1; r++)
            t->k->pack_row(w->type, t->src + (size_t)r * w->row_bytes,
                           (char *)w->data + (size_t)r * w->row_bytes, w->cols);
    } else {
        memcpy((char *)w->data + (size_t)r0 * w->row_bytes, t->src + (size_t)r0 * w->row_bytes,
               (size_t)(r1 - r0) * w->row_bytes);
    }
}

static int set_mat(hs_model *m, hs_mat *w, int type, int rows, int cols, const void *data) {
    const size_t rb = hs_row_bytes(type, cols);
    if (!rb || (type != HS_F32 && type != HS_F16 && cols % HS_QK)) return -1;
    free_mat(w);
    *w = (hs_mat){type, rows, cols, rb, hs_alloc_large(rb * (size_t)rows)};
    if (!w->data) return -1;
    touch_ctx t = {m->k, m->nrc, w, data};
    hs_pool_run(m->pool, touch_task, &t);
    return 0;
}

static int set_vec(float **dst, int type, int n, int expect, const void *data) {
    if (type != HS_F32 || n != expect) return -1;
    free(*dst);
    *dst = aligned((size_t)n * 4);
    if (!*dst) return -1;
    memcpy(*dst, data, (size_t)n * 4);
    return 0;
}

int hs_model_set(hs_model *m, int which, int layer, int type, int rows, int cols,
                 const void *data) {
    const hs_config *c = &m->c;
    const int kv = c->n_head_kv * c->head_dim, qd = c->n_head * c->head_dim;
    if (which >= 10 && (layer < 0 || layer >= c->n_layer)) return -1;
    hs_layer *L = which >= 10 ? &m->layers[layer] : NULL;
    switch (which) {
    case 0: return (rows == c->n_vocab && cols == c->n_embd) ? set_mat(m, &m->tok_embd, type, rows, cols, data) : -1;
    case 1: return (rows == c->n_vocab && cols == c->n_embd) ? set_mat(m, &m->output, type, rows, cols, data) : -1;
    case 2: return set_vec(&m->output_norm, type, cols, c->n_embd, data);
    case 10: return (rows == qd && cols == c->n_embd) ? set_mat(m, &L->wq, type, rows, cols, data) : -1;
    case 11: return (rows == kv && cols == c->n_embd) ? set_mat(m, &L->wk, type, rows, cols, data) : -1;
    case 12: return (rows == kv && cols == c->n_embd) ? set_mat(m, &L->wv, type, rows, cols, data) : -1;
    case 13: return (rows == c->n_embd && cols == qd) ? set_mat(m, &L->wo, type, rows, cols, data) : -1;
    case 14: return (rows == c->n_ff && cols == c->n_embd) ? set_mat(m, &L->w_gate, type, rows, cols, data) : -1;
    case 15: return (rows == c->n_ff && cols == c->n_embd) ? set_mat(m, &L->w_up, type, rows, cols, data) : -1;
    case 16: return (rows == c->n_embd && cols == c->n_ff) ? set_mat(m, &L->w_down, type, rows, cols, data) : -1;
    case 17: return set_vec(&L->attn_norm, type, cols, c->n_embd, data);
    case 18: return set_vec(&L->ffn_norm, type, cols, c->n_embd, data);
    case 19: return set_vec(&L->bq, type, cols, qd, data);
    case 20: return set_vec(&L->bk, type, cols, kv, data);
    case 21: return set_vec(&L->bv, type, cols, kv, data);
    default: return -1;
    }
}

/* Where layer's rows begin in k_cache and v_cache (elements): each layer holds a row of
 * n_head_kv * head_dim halves for each of the cache's slots. */
static inline size_t kv_layer(const hs_model *m, int layer) {
    return (size_t)layer * m->n_blocks * m->block_size * m->c.n_head_kv * m->c.head_dim;
}

static int kv_rows_valid(const hs_model *m, int layer, int n, const int32_t *slots) {
    if (!m->k_cache || layer < 0 || layer >= m->c.n_layer || n < 0) return 0;
    for (int i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= m->n_blocks * m->block_size) return 0;
    return 1;
}

int hs_model_write_kv(hs_model *m, int layer, int n, const int32_t *slots, const void *k,
                      const void *v) {
    if (!kv_rows_valid(m, layer, n, slots)) return -1;
    const size_t kvd = (size_t)m->c.n_head_kv * m->c.head_dim, row = kvd * sizeof(hs_fp16);
    const size_t layer_off = kv_layer(m, layer);
    for (int i = 0; i < n; i++) {
        memcpy(m->k_cache + layer_off + (size_t)slots[i] * kvd, (const char *)k + i * row, row);
        memcpy(m->v_cache + layer_off + (size_t)slots[i] * kvd, (const char *)v + i * row, row);
    }
    return 0;
}

int hs_model_read_kv(const hs_model *m, int layer, int n, const int32_t *slots, void *k, void *v) {
    if (!kv_rows_valid(m, layer, n, slots)) return -1;
    const size_t kvd = (size_t)m->c.n_head_kv * m->c.head_dim, row = kvd * sizeof(hs_fp16);
    const size_t layer_off = kv_layer(m, layer);
    for (int i = 0; i < n; i++) {
        memcpy((char *)k + i * row, m->k_cache + layer_off + (size_t)slots[i] * kvd, row);
        memcpy((char *)v + i * row, m->v_cache + layer_off + (size_t)slots[i] * kvd, row);
    }
    return 0;
}

int hs_model_alloc_kv(hs_model *m, int n_blocks, int block_size) {
    const size_t per = (size_t)m->c.n_layer * n_blocks * block_size * m->c.n_head_kv * m->c.head_dim;
    free(m->k_cache); free(m->v_cache);
    m->k_cache = hs_alloc_large(per * 2);
    m->v_cache = hs_alloc_large(per * 2);
    m->n_blocks = n_blocks;
    m->block_size = block_size;
    if (!m->k_cache || !m->v_cache) return -1;
    memset(m->k_cache, 0, per * 2);
    memset(m->v_cache, 0, per * 2);
    return 0;
}

static size_t layer_bytes(const hs_model *m) {
    size_t total = 0;
    for (int l = 0; l < m->c.n_layer; l++) {
        const hs_layer *L = &m->layers[l];
        const hs_mat *mats[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) total += mats[i]->row_bytes * mats[i]->rows;
    }
    return total;
}

static int separate_output(const hs_model *m) {
    return m->output.data && m->output.data != m->tok_embd.data;
}

size_t hs_model_weight_bytes(const hs_model *m) {
    size_t total = m->tok_embd.row_bytes * m->tok_embd.rows + layer_bytes(m);
    if (separate_output(m)) total += m->output.row_bytes * m->output.rows;
    return total;
}

size_t hs_model_token_bytes(const hs_model *m) {
    const hs_mat *out = separate_output(m) ? &m->output : &m->tok_embd;
    return layer_bytes(m) + out->row_bytes * out->rows
         + (separate_output(m) ? m->tok_embd.row_bytes : 0); /* the looked-up embedding row */
}

size_t hs_model_kv_bytes(const hs_model *m) {
    return 2 * 2 * (size_t)m->c.n_layer * m->n_blocks * m->block_size * m->c.n_head_kv * m->c.head_dim;
}

static int grow(hs_model *m, int n) {
    if (n <= m->cap) return 0;
    const hs_config *c = &m->c;
    const int qd = c->n_head * c->head_dim, kv = c->n_head_kv * c->head_dim;
    const int widest = c->n_ff > qd ? (c->n_ff > c->n_embd ? c->n_ff : c->n_embd) : (qd > c->n_embd ? qd : c->n_embd);
    float **bufs[] = {&m->x, &m->xb, &m->q, &m->kv_k, &m->kv_v, &m->att, &m->gate, &m->up};
    const int widths[] = {c->n_embd, c->n_embd, qd, kv, kv, qd, c->n_ff, c->n_ff};
    for (int i = 0; i < 8; i++) {
        free(*bufs[i]);
        *bufs[i] = aligned((size_t)n * widths[i] * 4);
        if (!*bufs[i]) return -1;
    }
    free(m->qa);
    m->qa = aligned((size_t)n * m->k->act_bytes(widest));
    free(m->wa);
    m->wa = NULL;
    if (m->k->wide && n >= m->wide_min) {
        m->wa = aligned(wide_groups(n) * m->k->wide_group_bytes(widest));
        if (!m->wa) return -1;
    }
    if (!m->span_acc)
        m->span_acc = aligned(sizeof(float) * (size_t)hs_pool_size(m->pool) * SPAN_ROWS *
                              (size_t)c->head_dim);
    if (!m->attn_packed && m->k->attend_pack) {
        m->attn_packed_bytes = (m->k->attend_bytes(c->head_dim, ATTN_SPAN) + 63) / 64 * 64;
        m->attn_packed = aligned(m->attn_packed_bytes * (size_t)hs_pool_size(m->pool));
        if (!m->attn_packed) return -1;
    }
    free(m->attn_first); free(m->attn_block); free(m->attn_part);
    m->attn_first = malloc(sizeof(int) * ((size_t)n + 1));
    m->attn_block = malloc(sizeof(int) * ((size_t)n + 1));
    m->attn_part = malloc(sizeof(size_t) * (size_t)n);
    if (!m->attn_first || !m->attn_block || !m->attn_part || !m->span_acc) return -1;
    free(m->rope_cos); free(m->rope_sin);
    m->rope_cos = aligned((size_t)n * (c->head_dim / 2) * 4);
    m->rope_sin = aligned((size_t)n * (c->head_dim / 2) * 4);
    if (!m->rope_cos || !m->rope_sin) return -1;
    m->cap = n;
    return m->qa ? 0 : -1;
}

/* ---- parallel matrix products ------------------------------------------------------------ */

typedef struct {
    const hs_kernels *k;
    int nrc, n;
    const hs_mat *w[3];
    float *out[3];
    const char *qa;        /* quantized activations: n rows, qa_stride bytes apart */
    size_t qa_stride;
    const float *x;        /* float activations (f16/f32 weights) */
    const char *wa;        /* the activations packed for k->wide, or NULL: the register tiles */
    struct steal_range *ranges; /* set: the threads take strips (matmul_steal_task) */
    _Atomic unsigned long long *stolen; /* counts the strips taken from another thread */
} matmul_ctx;

/* Activation rows per pass over a thread's weight rows in batched products: the packed
 * activations of a pass stay in L2 while the weight rows stream through. */
#define COL_CHUNK 32
/* Weight rows and activation rows per packed product (the kernels' widest tile; activation
 * rows up to the variant's mm_cols where it sets one). */
#define MM_TILE 4

static void matmul_quantized(const matmul_ctx *t, const hs_mat *w, float *out, int r0, int r1,
                             int *gathered) {
    const int nb = w->cols / HS_QK;
    const hs_mm_fn mm = w->type == HS_Q4_0 ? t->k->mm_q4_0 : w->type == HS_Q4_1 ? t->k->mm_q4_1
                      : t->k->mm_q8_0;
    const char *data = w->data;
    if (t->n == 1) { /* decode of one sequence: tile_rows weight rows per product */
        const int tile = tile_rows(t->nrc, w);
        for (int r = r0; r < r1; r += tile) {
            const int rows = r1 - r < tile ? r1 - r : tile;
            mm(nb, data + (size_t)r * w->row_bytes, w->row_bytes, rows, t->qa, t->qa_stride, 1,
               out + r, (size_t)w->rows);
        }
        return;
    }
    if (t->wa && t->k->wide(w->type, w->cols, data + (size_t)r0 * w->row_bytes, w->row_bytes,
                            r1 - r0, t->wa, t->n, out + r0, (size_t)w->rows) == 0)
        return; /* (-1: its scratch could not be had; the tiles below compute it instead) */
    const hs_wide8_fn wide8 = w->type == HS_Q4_0 ? t->k->wide8_q4_0 : w->type == HS_Q4_1
                            ? t->k->wide8_q4_1 : t->k->wide8_q8_0;
    for (int c0 = 0; c0 < t->n; c0 += COL_CHUNK) {
        const int c1 = t->n - c0 < COL_CHUNK ? t->n : c0 + COL_CHUNK;
        int i0 = c0;
        if (wide8 && r1 > r0 && c1 - c0 >= HS_WIDE8_MIN) { /* int8 tile-unit products first;
                                                          * the columns they leave, below */
            /* (a thread that takes its rows in strips converts the activations once: the
             * later calls pass NULL, hs_wide8_fn; only with one chunk of columns) */
            const int again = gathered && *gathered;
            i0 += wide8(nb, data + (size_t)r0 * w->row_bytes, w->row_bytes, r1 - r0,
                        again ? NULL : t->qa + (size_t)c0 * t->qa_stride, t->qa_stride, c1 - c0,
                        out + (size_t)c0 * w->rows + r0, (size_t)w->rows);
            if (gathered) *gathered = 1;
        }
        if (i0 >= c1) continue;
        const int ct = t->k->mm_cols ? t->k->mm_cols : MM_TILE;
        for (int r = r0; r < r1; r += MM_TILE) {
            const int rows = r1 - r < MM_TILE ? r1 - r : MM_TILE;
            for (int i = i0; i < c1; i += ct)
                mm(nb, data + (size_t)r * w->row_bytes, w->row_bytes, rows,
                   t->qa + (size_t)i * t->qa_stride, t->qa_stride, c1 - i < ct ? c1 - i : ct,
                   out + (size_t)i * w->rows + r, (size_t)w->rows);
        }
    }
}

static void matmul_rows(const matmul_ctx *t, const hs_mat *w, float *out, int ith, int nth) {
    int r0, r1; /* the wide kernel's strips are 16 rows (two at a time) */
    hs_split(w->rows, t->wa && is_quantized(w->type) ? HS_WIDE_ROWS : tile_rows(t->nrc, w), ith,
             nth, &r0, &r1);
    if (is_quantized(w->type)) {
        matmul_quantized(t, w, out, r0, r1, NULL);
        return;
    }
    for (int r = r0; r < r1; r++) /* f16/f32 weights (small tensors of some files) */
        for (int i = 0; i < t->n; i++) {
            const char *row = (const char *)w->data + (size_t)r * w->row_bytes;
            const float *x = t->x + (size_t)i * w->cols;
            out[(size_t)i * w->rows + r] = w->type == HS_F16
                ? t->k->dot_f16(w->cols, (const hs_fp16 *)row, x) : t->k->dot_f32(w->cols, (const float *)row, x);
        }
}

static void matmul_task(void *p, int ith, int nth) {
    const matmul_ctx *t = p;
    for (int i = 0; i < 3 && t->w[i]; i++) matmul_rows(t, t->w[i], t->out[i], ith, nth);
}

/* Batched products (2 to COL_CHUNK activation rows: decode steps of several sequences) take
 * their weight rows in strips of STEAL_ROWS, the int8 tile path's strip. Each thread starts with
 * the strips of the static split (the rows it touched first at load, its NUMA node's, to within
 * a strip), from the front, one at a time; once its own are done it takes the other threads' last strips,
 * from the back. A thread slowed down (a vCPU that gets less of its core, an interrupt) then no
 * longer holds up the whole product: every product ends in a barrier. Which thread computes a
 * row changes none of its bits (each row's sums are its own). */
#define STEAL_ROWS 16

static int claim_front(struct steal_range *r, int *strip) {
    unsigned long long v = atomic_load_explicit(&r->strips, memory_order_relaxed);
    for (;;) {
        const unsigned b = (unsigned)(v >> 32), e = (unsigned)v;
        if (b >= e) return 0;
        if (atomic_compare_exchange_weak_explicit(&r->strips, &v, v + (1ULL << 32),
                                                  memory_order_relaxed, memory_order_relaxed)) {
            *strip = (int)b;
            return 1;
        }
    }
}

static int claim_back(struct steal_range *r, int *strip) {
    unsigned long long v = atomic_load_explicit(&r->strips, memory_order_relaxed);
    for (;;) {
        const unsigned b = (unsigned)(v >> 32), e = (unsigned)v;
        if (b >= e) return 0;
        if (atomic_compare_exchange_weak_explicit(&r->strips, &v, v - 1, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *strip = (int)e - 1;
            return 1;
        }
    }
}

static void steal_strip(const matmul_ctx *t, int i, int strip, int *gathered) {
    const hs_mat *w = t->w[i];
    const int r0 = strip * STEAL_ROWS, r1 = r0 + STEAL_ROWS < w->rows ? r0 + STEAL_ROWS : w->rows;
    matmul_quantized(t, w, t->out[i], r0, r1, gathered);
}

static void matmul_steal_task(void *p, int ith, int nth) {
    const matmul_ctx *t = p;
    int gathered = 0, strip;
    for (int i = 0; i < 3 && t->w[i]; i++)
        while (claim_front(&t->ranges[i * nth + ith], &strip)) steal_strip(t, i, strip, &gathered);
    for (int i = 0; i < 3 && t->w[i]; i++)
        for (int d = 1; d < nth; d++)
            while (claim_back(&t->ranges[i * nth + (ith + d) % nth], &strip)) {
                atomic_fetch_add_explicit(t->stolen, 1, memory_order_relaxed);
                steal_strip(t, i, strip, &gathered);
            }
}

/* Whether a product of n activation rows takes its strips as matmul_steal_task does: batched,
 * every matrix quantized, every activation row in one chunk of columns (the int8 tile path's
 * activations converted once a thread), not the bf16 wide path, more than one thread. */
static int steals(const hs_model *m, int n, const hs_mat *const w[3], const char *wa) {
    if (!m->ranges || n < 2 || n > COL_CHUNK || wa || hs_pool_size(m->pool) < 2) return 0;
    for (int i = 0; i < 3 && w[i]; i++)
        if (!is_quantized(w[i]->type)) return 0;
    return 1;
}

/* Prepares n activation rows of `cols` values for the products: quantized into the table's
 * layout (`stride` bytes apart) unless already done, and packed for the wide kernel (groups of
 * HS_WIDE_ROWS, wide_groups(n) of them) where `wa` is set. */
typedef struct {
    const hs_kernels *k;
    int n, cols, quantize;
    const float *x;
    char *qa;
    size_t stride;
    char *wa;
} quant_ctx;

static void quant_task(void *p, int ith, int nth) {
    const quant_ctx *t = p;
    int i0, i1;
    if (t->quantize) {
        hs_split(t->n, 1, ith, nth, &i0, &i1);
        for (int i = i0; i < i1; i++)
            t->k->quantize_act(t->x + (size_t)i * t->cols, t->qa + (size_t)i * t->stride, t->cols);
    }
    if (!t->wa) return;
    const size_t bytes = t->k->wide_group_bytes(t->cols);
    hs_split((int)wide_groups(t->n), 1, ith, nth, &i0, &i1);
    for (int g = i0; g < i1; g++) {
        const int left = t->n - g * HS_WIDE_ROWS;
        t->k->wide_pack(t->x + (size_t)g * HS_WIDE_ROWS * t->cols, t->cols,
                        left < 0 ? 0 : left < HS_WIDE_ROWS ? left : HS_WIDE_ROWS,
                        t->wa + (size_t)g * bytes);
    }
}

static void prepare_rows(hs_pool *pool, const hs_kernels *k, int n, const float *x, int cols,
                         int quantize, char *qa, size_t stride, char *wa) {
    quant_ctx q = {k, n, cols, quantize, x, qa, stride, wa};
    if (!quantize && !wa) return;
    if (n >= 4) /* a prefill chunk or a batch: its rows are prepared in parallel */
        hs_pool_run(pool, quant_task, &q);
    else
        quant_task(&q, 0, 1);
}

/* Quantizes one activation row into m->qa, at the stride of `cols`-wide inputs. */
static void quantize_row(hs_model *m, int i, const float *x, int cols) {
    m->k->quantize_act(x, (char *)m->qa + (size_t)i * m->k->act_bytes(cols), cols);
}

/* out_i[n][w_i.rows] = x[n][cols] @ w_i^T for up to three matrices sharing the input; `ready`:
 * the per-token task that produced x has already quantized it into m->qa (one barrier less). */
static void matmul3(hs_model *m, int n, const float *x, int cols, int ready, const hs_mat *w0,
                    float *o0, const hs_mat *w1, float *o1, const hs_mat *w2, float *o2) {
    const size_t stride = m->k->act_bytes(cols);
    char *wa = m->wa && n >= m->wide_min && is_quantized(w0->type) ? m->wa : NULL;
    prepare_rows(m->pool, m->k, n, x, cols, !ready, m->qa, stride, wa);
    matmul_ctx t = {m->k, m->nrc, n, {w0, w1, w2}, {o0, o1, o2}, m->qa, stride, x, wa, NULL,
                    &m->stolen};
    const hs_mat *const ws[3] = {w0, w1, w2};
    if (steals(m, n, ws, wa)) {
        const int nth = hs_pool_size(m->pool);
        for (int i = 0; i < 3 && ws[i]; i++) {
            const int strips = (ws[i]->rows + STEAL_ROWS - 1) / STEAL_ROWS;
            m->strips += (unsigned long long)strips;
            for (int j = 0; j < nth; j++) {
                int b, e;
                hs_split(strips, 1, j, nth, &b, &e);
                atomic_store_explicit(&m->ranges[i * nth + j].strips,
                                      (unsigned long long)b << 32 | (unsigned)e, memory_order_relaxed);
            }
        }
        t.ranges = m->ranges; /* (hs_pool_run's posting publishes the stores) */
        hs_pool_run(m->pool, matmul_steal_task, &t);
        return;
    }
    hs_pool_run(m->pool, matmul_task, &t);
}

void hs_matmul(hs_pool *pool, const hs_kernels *k, int nrc, const hs_mat *w, int n,
               const float *x, float *out) {
    const size_t stride = k->act_bytes(w->cols);
    char *qa = aligned((size_t)n * (stride ? stride : 1));
    hs_mat packed = *w;
    if (packs(k, w->type)) { /* the model packs at load; here a packed copy serves one product */
        packed.data = aligned(w->row_bytes * (size_t)w->rows);
        for (int r = 0; r < w->rows; r++)
            k->pack_row(w->type, (const char *)w->data + (size_t)r * w->row_bytes,
                        (char *)packed.data + (size_t)r * w->row_bytes, w->cols);
    }
    char *wa = k->wide && n >= hs_wide_min_rows() && is_quantized(w->type)
             ? aligned(wide_groups(n) * k->wide_group_bytes(w->cols)) : NULL;
    if (is_quantized(w->type)) prepare_rows(pool, k, n, x, w->cols, 1, qa, stride, wa);
    matmul_ctx t = {k, nrc, n, {&packed, NULL, NULL}, {out, NULL, NULL}, qa, stride, x, wa, NULL,
                    NULL};
    hs_pool_run(pool, matmul_task, &t);
    if (packed.data != w->data) free(packed.data);
    free(qa);
    free(wa);
}

/* ---- elementwise ------------------------------------------------------------------------- */

static void rmsnorm(const hs_kernels *k, float *out, const float *x, const float *weight, int d,
                    float eps) {
    const float scale = 1.0f / sqrtf(k->dot_f32(d, x, x) / (float)d + eps);
    for (int j = 0; j < d; j++) out[j] = x[j] * scale * weight[j];
}

/* Rotates every head of one token by the angles of its position (cos/sin precomputed). */
static void rope(float *v, int n_heads, int head_dim, const float *cosv, const float *sinv,
                 int neox) {
    for (int h = 0; h < n_heads; h++) {
        float *x = v + h * head_dim;
        for (int i = 0; i < head_dim / 2; i++) {
            const int a = neox ? i : 2 * i, b = neox ? i + head_dim / 2 : 2 * i + 1;
            const float x0 = x[a], x1 = x[b];
            x[a] = x0 * cosv[i] - x1 * sinv[i];
            x[b] = x0 * sinv[i] + x1 * cosv[i];
        }
    }
}

/* ---- attention over the paged cache ------------------------------------------------------- */

typedef struct {
    hs_model *m;
    size_t layer_off; /* where this layer's rows begin in k_cache and v_cache (kv_layer) */
    int n;
    const int32_t *pos, *seq, *block_tables;
    int max_blocks;
} attn_ctx;

static inline size_t slot_of(const attn_ctx *t, int s, int p) {
    const int block = t->block_tables[(size_t)s * t->max_blocks + p / t->m->block_size];
    return (size_t)block * t->m->block_size + p % t->m->block_size;
}

/* Where, in k_cache and v_cache, the row of KV head kvh at position p of sequence s lies in
 * this step's layer. */
static inline size_t kv_row(const attn_ctx *t, int s, int p, int kvh) {
    const hs_model *m = t->m;
    const size_t hd = (size_t)m->c.head_dim, kvd = m->c.n_head_kv * hd;
    return t->layer_off + slot_of(t, s, p) * kvd + kvh * hd;
}

/* The attention of a step is split into items: one KV head of a block of tokens over one span
 * of ATTN_SPAN of its positions, all the query heads sharing that KV head at once. A block is
 * one token (attend_f16, the decode case), or, where the kernels have attend_rows, up to
 * HS_ATTN_ROWS / heads-per-KV-head consecutive tokens of a sequence in the same span (a prefill
 * chunk: each K and V row converted and loaded once for all of them). A long context thus
 * spreads over the pool even for one token, and a one-token block's items depend on its
 * position alone, never on the rest of the batch. A token with several spans keeps each span's
 * running max, sum and output in `partial`, combined in span order afterwards (attn_combine). */
static int attn_spans(int32_t pos) { return (pos + ATTN_SPAN) / ATTN_SPAN; }

/* Tokens per block: 1 unless attend_rows can take the heads of several. */
static int block_tokens(const hs_model *m) {
    const hs_config *c = &m->c;
    const int group = c->n_head / c->n_head_kv;
    if (!m->k->attend_rows || c->head_dim % 32 || c->head_dim > HS_ATTN_HD || group > HS_ATTN_ROWS)
        return 1;
    return HS_ATTN_ROWS / group;
}

/* Blocks, items and partial offsets of the step. Returns 1 when a token has several spans (they
 * need attn_combine), 0 when none has, -1 when out of memory. */
static int attn_plan(hs_model *m, int n, const int32_t *pos, const int32_t *seq) {
    const hs_config *c = &m->c;
    const size_t per_span = (size_t)c->n_head * (c->head_dim + 2);
    const int most = block_tokens(m);
    size_t part = 0;
    int items = 0, b = 0, spans_max = 0, several = 0;
    for (int i = 0; i < n; i++) {
        const int spans = attn_spans(pos[i]);
        m->attn_part[i] = part;
        if (spans > 1) part += per_span * (size_t)spans;
        const int head = b == 0 ? -1 : m->attn_block[b - 1], len = i - head;
        if (head >= 0 && len < most && seq[i] == seq[i - 1] && pos[i] == pos[i - 1] + 1 &&
            pos[i] / ATTN_SPAN == pos[head] / ATTN_SPAN)
            continue; /* joins the block of token i - 1 */
        m->attn_block[b] = i;
        m->attn_first[b++] = items;
        items += c->n_head_kv * spans;
        spans_max = spans > spans_max ? spans : spans_max;
    }
    m->attn_block[b] = n;
    m->attn_first[b] = items;
    m->attn_blocks = b;
    for (int j = 0; j < b; j++) several |= m->attn_block[j + 1] - m->attn_block[j] > 1;
    m->attn_spans_max = several ? spans_max : 0;
    if (several) { /* each item's work (attn_task splits the items by it) */
        const size_t per_kvh = (size_t)spans_max * (size_t)b;
        if (per_kvh + 1 > m->attn_cost_cap) {
            free(m->attn_cost);
            m->attn_cost = malloc(sizeof(long long) * (per_kvh + 1));
            m->attn_cost_cap = m->attn_cost ? per_kvh + 1 : 0;
            if (!m->attn_cost) return -1;
        }
        long long work = 0;
        for (int span = 0; span < spans_max; span++)
            for (int j = 0; j < b; j++) {
                m->attn_cost[(size_t)span * b + j] = work;
                const int i0 = m->attn_block[j], tokens = m->attn_block[j + 1] - i0;
                const int left = pos[i0 + tokens - 1] + 1 - span * ATTN_SPAN;
                if (span < attn_spans(pos[i0])) /* its query rows x positions */
                    work += (long long)tokens * (left < ATTN_SPAN ? left : ATTN_SPAN);
            }
        m->attn_cost[per_kvh] = work;
    }
    if (part > m->partial_cap) {
        free(m->partial);
        m->partial = aligned(part * 4);
        m->partial_cap = m->partial ? part : 0;
        if (!m->partial) return -1;
    }
    return part > 0;
}

/* Head h of token i, this span's output (spans == 1: final, divided by its sum; otherwise kept
 * with its running max and sum for attn_combine). */
static void attn_store(hs_model *m, int i, int h, int span, int spans, const float *acc, float mx,
                       float sum) {
    const hs_config *c = &m->c;
    const int hd = c->head_dim;
    if (spans == 1) {
        float *out = m->att + (size_t)i * c->n_head * hd + (size_t)h * hd;
        for (int d = 0; d < hd; d++) out[d] = acc[d] / sum;
        return;
    }
    float *part = m->partial + m->attn_part[i] + ((size_t)span * c->n_head + h) * (hd + 2);
    memcpy(part, acc, sizeof(float) * (size_t)hd);
    part[hd] = mx;
    part[hd + 1] = sum;
}

/* Whether a one-token block's item fetches the next item's first rows ahead (fetch_item); a
 * measurement knob (0: off), 1 in the engine. */
#ifndef ATTN_NEXT_ITEM
#define ATTN_NEXT_ITEM 1
#endif

/* Item w of a step of one-token blocks (decode order: block by block, each block's spans and
 * their KV heads in turn): its block, searched from block b (at or before w's), its KV head and
 * span. Span by span, a thread's consecutive items read neighbouring parts of the same cached
 * positions (a position's KV heads lie side by side, so one KV head's rows are a whole position
 * apart); KV head by KV head (before 08e21bd) SmolLM2 q4_0's attention at 2048 positions took
 * 2.91 against 2.65 ms a token on a Zen 4 VM (cpu_engine_profile --depth 2048 --baseline
 * 46a9d8f, medians of 7 alternating processes, their ranges overlapping). */
static int decode_item(const attn_ctx *t, int w, int b, int *kvh, int *span) {
    const hs_model *m = t->m;
    while (m->attn_first[b + 1] <= w) b++;
    const int item = w - m->attn_first[b];
    *span = item / m->c.n_head_kv, *kvh = item % m->c.n_head_kv;
    return b;
}

/* The K and V rows of the first kernel span (HS_ATTN_SPAN positions) of one-token item w (block
 * b's, or a later block's), fetched into L2 while the item before it runs. attend_f16 fetches
 * each later span of an item ahead itself, but not its first: without this a quarter of a
 * 256-position item's rows came in on demand, a whole cached position apart. */
static void fetch_item(const attn_ctx *t, int w, int b) {
    const hs_model *m = t->m;
    int kvh, span;
    b = decode_item(t, w, b, &kvh, &span);
    const int i0 = m->attn_block[b], p0 = span * ATTN_SPAN, len = t->pos[i0] + 1;
    const int count = len - p0 < HS_ATTN_SPAN ? len - p0 : HS_ATTN_SPAN;
    for (int j = 0; j < count; j++) {
        const size_t row = kv_row(t, t->seq[i0], p0 + j, kvh);
        for (size_t at = 0; at < (size_t)m->c.head_dim * sizeof(hs_fp16); at += 64) {
            __builtin_prefetch((const char *)(m->k_cache + row) + at, 0, 2);
            __builtin_prefetch((const char *)(m->v_cache + row) + at, 0, 2);
        }
    }
}

/* A prefill step's items [begin, end) for thread ith of nth: consecutive items (a thread's
 * packed K/V rows serve its run of one KV head and span), as many as give it an even share of
 * the rows x positions (attn_cost). Split by count instead, the share went uneven where the KV
 * heads do not divide among the threads: with SmolLM2's 3 on 2 threads, one thread took the
 * first KV head and the cheap early blocks or spans of the second, the other their expensive
 * rest (a 256-token prompt: 1.25 against 1.75 KV heads' work). */
static void attn_share(const hs_model *m, int total, int ith, int nth, int *begin, int *end) {
    const int per = total / m->c.n_head_kv;
    const long long kv_work = m->attn_cost[per], all = kv_work * m->c.n_head_kv;
    const long long from = all * ith / nth, to = all * (ith + 1) / nth;
    long long want[2] = {from, to};
    int at[2];
    for (int e = 0; e < 2; e++) { /* the first item whose work before it is want[e] or more */
        int lo = 0, hi = total;
        while (lo < hi) {
            const int w = lo + (hi - lo) / 2;
            if ((long long)(w / per) * kv_work + m->attn_cost[w % per] >= want[e]) hi = w;
            else lo = w + 1;
        }
        at[e] = lo;
    }
    *begin = ith == 0 ? 0 : at[0];
    *end = ith == nth - 1 ? total : at[1];
}

/* Items: with one-token blocks only (decode), block by block, each block's spans and their KV
 * heads in turn (decode_item). With blocks of several tokens (a prefill chunk), KV head,
 * span, then block (items of blocks with fewer spans left empty): a thread's consecutive items
 * then mostly share a KV head and span, whose K/V rows it packs once (attend_pack, extended as
 * later blocks see more positions) for all those blocks' attend_rows. */
static void attn_task(void *p, int ith, int nth) {
    const attn_ctx *t = p;
    hs_model *m = t->m;
    const hs_config *c = &m->c;
    const int hd = c->head_dim, group = c->n_head / c->n_head_kv;
    const float scale = 1.0f / sqrtf((float)hd);
    const hs_fp16 *kp[ATTN_SPAN], *vp[ATTN_SPAN];
    float mx[SPAN_ROWS], sum[SPAN_ROWS];
    float *acc_base = m->span_acc + (size_t)ith * SPAN_ROWS * hd;
    char *packed = m->attn_packed ? m->attn_packed + (size_t)ith * m->attn_packed_bytes : NULL;
    int packed_seq = -1, packed_kvh = -1, packed_span = -1, packed_count = 0;
    const int nb = m->attn_blocks, smax = m->attn_spans_max;
    const int total = smax ? c->n_head_kv * smax * nb : m->attn_first[nb];
    int w0, w1, b = 0;
    if (smax) /* an even share of the work, not of the items: see attn_share */
        attn_share(m, total, ith, nth, &w0, &w1);
    else
        hs_split(total, 1, ith, nth, &w0, &w1);
    for (int w = w0; w < w1; w++) {
        int kvh, span;
        if (smax) {
            b = w % nb, span = w / nb % smax, kvh = w / nb / smax;
            if (span >= attn_spans(t->pos[m->attn_block[b]])) continue;
        } else {
            b = decode_item(t, w, b, &kvh, &span);
        }
        const int i0 = m->attn_block[b], tokens = m->attn_block[b + 1] - i0;
        const int spans = attn_spans(t->pos[i0]), s0 = t->seq[i0];
        const int p0 = span * ATTN_SPAN, len = t->pos[i0 + tokens - 1] + 1;
        const int count = len - p0 < ATTN_SPAN ? len - p0 : ATTN_SPAN;
        if (tokens > 1) { /* a block: every head of every token in one attend_rows call */
            if (s0 != packed_seq || kvh != packed_kvh || span != packed_span) packed_count = 0;
            if (count > packed_count) {
                for (int j = packed_count / 32 * 32; j < count; j++) {
                    const size_t row = kv_row(t, s0, p0 + j, kvh);
                    kp[j] = m->k_cache + row;
                    vp[j] = m->v_cache + row;
                }
                m->k->attend_pack(hd, kp, vp, packed_count, count, packed);
                packed_seq = s0, packed_kvh = kvh, packed_span = span, packed_count = count;
            }
            const float *q[HS_ATTN_ROWS];
            float *acc[HS_ATTN_ROWS];
            int lim[HS_ATTN_ROWS], r = 0;
            for (int i = i0; i < i0 + tokens; i++)
                for (int g = 0; g < group; g++, r++) {
                    q[r] = m->q + (size_t)i * c->n_head * hd + (size_t)(kvh * group + g) * hd;
                    acc[r] = acc_base + (size_t)r * hd;
                    lim[r] = t->pos[i] + 1 - p0;
                    mx[r] = -INFINITY, sum[r] = 0.0f;
                }
            memset(acc_base, 0, sizeof(float) * (size_t)r * hd);
            m->k->attend_rows(hd, r, scale, q, lim, packed, count, mx, sum, acc);
            r = 0;
            for (int i = i0; i < i0 + tokens; i++)
                for (int g = 0; g < group; g++, r++)
                    attn_store(m, i, kvh * group + g, span, spans, acc[r], mx[r], sum[r]);
            continue;
        }
        for (int j = 0; j < count; j++) {
            const size_t row = kv_row(t, s0, p0 + j, kvh);
            kp[j] = m->k_cache + row;
            vp[j] = m->v_cache + row;
        }
        if (ATTN_NEXT_ITEM && !smax && w + 1 < w1) fetch_item(t, w + 1, b);
        for (int h0 = kvh * group; h0 < (kvh + 1) * group; h0 += HS_ATTN_GROUP) {
            const int left = (kvh + 1) * group - h0, ng = left < HS_ATTN_GROUP ? left : HS_ATTN_GROUP;
            for (int g = 0; g < ng; g++) mx[g] = -INFINITY, sum[g] = 0.0f;
            memset(acc_base, 0, sizeof(float) * (size_t)ng * hd);
            m->k->attend_f16(hd, ng, scale, m->q + (size_t)i0 * c->n_head * hd + (size_t)h0 * hd,
                             kp, vp, count, mx, sum, acc_base);
            for (int g = 0; g < ng; g++)
                attn_store(m, i0, h0 + g, span, spans, acc_base + (size_t)g * hd, mx[g], sum[g]);
        }
    }
}

/* Each (token, head) of a token with several spans: the spans' outputs weighted by
 * exp(span max - overall max), over their sums weighted the same way, in span order. */
static void attn_combine(void *p, int ith, int nth) {
    const attn_ctx *t = p;
    hs_model *m = t->m;
    const hs_config *c = &m->c;
    const int hd = c->head_dim;
    int w0, w1;
    hs_split(t->n * c->n_head, 1, ith, nth, &w0, &w1);
    for (int w = w0; w < w1; w++) {
        const int i = w / c->n_head, h = w % c->n_head, spans = attn_spans(t->pos[i]);
        if (spans == 1) continue;
        const float *first = m->partial + m->attn_part[i] + (size_t)h * (hd + 2);
        const size_t step = (size_t)c->n_head * (hd + 2); /* from one span to the next */
        float max = -INFINITY, total = 0.0f;
        for (int s = 0; s < spans; s++)
            if (first[s * step + hd] > max) max = first[s * step + hd];
        float *out = m->att + (size_t)i * c->n_head * hd + (size_t)h * hd;
        memset(out, 0, sizeof(float) * (size_t)hd);
        for (int s = 0; s < spans; s++) {
            const float *part = first + s * step, weight = expf(part[hd] - max);
            total += part[hd + 1] * weight;
            for (int d = 0; d < hd; d++) out[d] += weight * part[d];
        }
        for (int d = 0; d < hd; d++) out[d] /= total;
    }
}

/* SwiGLU, then quantization for the down projection. With at least as many tokens as threads
 * each thread takes whole rows and quantizes them; with fewer (one-token decode above all) the
 * elements are split across the pool and the few rows quantized after it. */
typedef struct { hs_model *m; int n, by_rows; } swiglu_ctx;

/* The kernels' faster SwiGLU (k->swiglu_wide) serves steps of SWIGLU_VECTOR_MIN tokens or more:
 * HS_WIDE8_MIN (model.h), from which amx's products run on the tile unit and differ from
 * avx512vnni's anyway. A decode step of fewer sequences (its products on the register tiles, avx512vnni's bits:
 * the kernel test's exact_packed_dot) stays bit for bit avx512vnni's (k->swiglu, or the scalar
 * loop: glibc's expf), which the exact KV hand-off relies on (prefill/exact.py). */
#define SWIGLU_VECTOR_MIN HS_WIDE8_MIN

static void swiglu_range(const swiglu_ctx *t, float *gate, const float *up, size_t begin,
                         size_t end) {
    if (end <= begin) return;
    if (t->m->k->swiglu_wide && t->n >= SWIGLU_VECTOR_MIN) {
        t->m->k->swiglu_wide(end - begin, gate + begin, up + begin);
        return;
    }
    if (t->m->k->swiglu) {
        t->m->k->swiglu(end - begin, gate + begin, up + begin);
        return;
    }
    for (size_t j = begin; j < end; j++) gate[j] = gate[j] / (1.0f + expf(-gate[j])) * up[j];
}

static void swiglu_task(void *p, int ith, int nth) {
    const swiglu_ctx *t = p;
    const int ff = t->m->c.n_ff;
    if (!t->by_rows) {
        const size_t count = (size_t)t->n * ff, chunk = (count + (size_t)nth - 1) / (size_t)nth;
        const size_t begin = chunk * (size_t)ith;
        swiglu_range(t, t->m->gate, t->m->up, begin, begin + chunk < count ? begin + chunk : count);
        return;
    }
    int i0, i1;
    hs_split(t->n, 1, ith, nth, &i0, &i1);
    for (int i = i0; i < i1; i++) {
        swiglu_range(t, t->m->gate + (size_t)i * ff, t->m->up + (size_t)i * ff, 0, (size_t)ff);
        quantize_row(t->m, i, t->m->gate + (size_t)i * ff, ff);
    }
}

static void swiglu(hs_model *m, int n) {
    swiglu_ctx sw = {m, n, n >= hs_pool_size(m->pool)};
    hs_pool_run(m->pool, swiglu_task, &sw);
    if (!sw.by_rows)
        for (int i = 0; i < n; i++) quantize_row(m, i, m->gate + (size_t)i * m->c.n_ff, m->c.n_ff);
}

/* ---- per-token work between the products, split across the pool by tokens ----------------- */

typedef struct {
    hs_model *m;
    const hs_layer *L;
    const float *norm;     /* residual_norm: RMSNorm weight, or NULL for the add alone */
    int add;               /* residual_norm: x += xb first */
    const attn_ctx *at;    /* qkv_post: the positions, slots and layer of the K/V rows */
} token_ctx;

/* x += xb (the sublayer's output), then xb = RMSNorm(x) for the next sublayer's input. */
static void residual_norm_task(void *p, int ith, int nth) {
    const token_ctx *t = p;
    hs_model *m = t->m;
    const int d = m->c.n_embd;
    int i0, i1;
    hs_split(t->at->n, 1, ith, nth, &i0, &i1);
    for (int i = i0; i < i1; i++) {
        float *x = m->x + (size_t)i * d, *xb = m->xb + (size_t)i * d;
        if (t->add)
            for (int j = 0; j < d; j++) x[j] += xb[j];
        if (t->norm) {
            rmsnorm(m->k, xb, x, t->norm, d, m->c.eps);
            quantize_row(m, i, xb, d); /* the next product's input */
        }
    }
}

/* Biases (Qwen2), RoPE on q and k, and k/v into each token's cache slot. */
static void qkv_post_task(void *p, int ith, int nth) {
    const token_ctx *t = p;
    hs_model *m = t->m;
    const hs_config *c = &m->c;
    const hs_layer *L = t->L;
    const int hd = c->head_dim, kvd = c->n_head_kv * hd, qd = c->n_head * hd, half = hd / 2;
    int i0, i1;
    hs_split(t->at->n, 1, ith, nth, &i0, &i1);
    for (int i = i0; i < i1; i++) {
        float *q = m->q + (size_t)i * qd, *k = m->kv_k + (size_t)i * kvd, *v = m->kv_v + (size_t)i * kvd;
        if (L->bq) for (int j = 0; j < qd; j++) q[j] += L->bq[j];
        if (L->bk) for (int j = 0; j < kvd; j++) k[j] += L->bk[j];
        if (L->bv) for (int j = 0; j < kvd; j++) v[j] += L->bv[j];
        const float *cv = m->rope_cos + (size_t)i * half, *sv = m->rope_sin + (size_t)i * half;
        rope(q, c->n_head, hd, cv, sv, c->rope_neox);
        rope(k, c->n_head_kv, hd, cv, sv, c->rope_neox);
        const size_t slot = slot_of(t->at, t->at->seq[i], t->at->pos[i]);
        m->k->to_f16(kvd, k, m->k_cache + t->at->layer_off + slot * kvd);
        m->k->to_f16(kvd, v, m->v_cache + t->at->layer_off + slot * kvd);
    }
}

/* Per-token tasks of one token run on the calling thread: waking the pool costs more. */
static void run_tokens(hs_model *m, int n, hs_task task, void *ctx) {
    if (n > 1)
        hs_pool_run(m->pool, task, ctx);
    else
        task(ctx, 0, 1);
}

/* ---- the step ------------------------------------------------------------------------------ */

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs the statement, adding its wall time to phase p while profiling is on. */
#define PHASE(p, ...)                                                                           \
    do {                                                                                       \
        const double t0_ = m->profiling ? seconds() : 0.0;                                     \
        __VA_ARGS__;                                                                           \
        if (m->profiling) m->profile[p] += seconds() - t0_;                                    \
    } while (0)

unsigned long long hs_model_strips(const hs_model *m, unsigned long long *stolen) {
    *stolen = atomic_load_explicit(&m->stolen, memory_order_relaxed);
    return m->strips;
}

void hs_model_set_profiling(hs_model *m, int on) {
    m->profiling = on != 0;
    memset(m->profile, 0, sizeof m->profile);
}

int hs_model_profile(const hs_model *m, const char *const **names, const double **seconds_out) {
    *names = phase_names;
    *seconds_out = m->profile;
    return P_COUNT;
}

/* One pass of the layers over n validated tokens. */
static int forward_step(hs_model *m, int n, const int32_t *tokens, const int32_t *pos,
                        const int32_t *seq, const int32_t *block_tables, int max_blocks,
                        const int32_t *logit_index, int n_logits, float *logits) {
    const hs_config *c = &m->c;
    const int several = grow(m, n) == 0 ? attn_plan(m, n, pos, seq) : -1; /* spans to combine */
    if (several < 0) return -1;
    const int d = c->n_embd, hd = c->head_dim, qd = c->n_head * hd;
    const hs_mat *emb = &m->tok_embd;
    char *row = packs(m->k, emb->type) ? m->qa : NULL; /* scratch: qa is rewritten before use */
    const double t_embed = m->profiling ? seconds() : 0.0;
    for (int i = 0; i < n; i++) {
        const char *src = (const char *)emb->data + (size_t)tokens[i] * emb->row_bytes;
        if (row) {
            m->k->unpack_row(emb->type, src, row, d);
            src = row;
        }
        hs_dequantize_row(emb->type, src, m->x + (size_t)i * d, d);
    }
    attn_ctx at = {m, 0, n, pos, seq, block_tables, max_blocks};
    const int half = hd / 2;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < half; j++) {
            const float theta = (float)pos[i] * m->inv_freq[j];
            m->rope_cos[(size_t)i * half + j] = cosf(theta);
            m->rope_sin[(size_t)i * half + j] = sinf(theta);
        }
    if (m->profiling) m->profile[P_EMBED] += seconds() - t_embed;
    for (int l = 0; l < c->n_layer; l++) {
        const hs_layer *L = &m->layers[l];
        at.layer_off = kv_layer(m, l);
        token_ctx tc = {m, L, L->attn_norm, l > 0, &at};
        PHASE(P_NORM, run_tokens(m, n, residual_norm_task, &tc)); /* the previous FFN residual */
        PHASE(P_QKV, matmul3(m, n, m->xb, d, 1, &L->wq, m->q, &L->wk, m->kv_k, &L->wv, m->kv_v));
        PHASE(P_ROPE_KV, run_tokens(m, n, qkv_post_task, &tc));
        PHASE(P_ATTN, {
            hs_pool_run(m->pool, attn_task, &at);
            if (several) hs_pool_run(m->pool, attn_combine, &at);
        });
        PHASE(P_WO, matmul3(m, n, m->att, qd, 0, &L->wo, m->xb, NULL, NULL, NULL, NULL));
        tc.norm = L->ffn_norm;
        tc.add = 1;
        PHASE(P_NORM, run_tokens(m, n, residual_norm_task, &tc));
        PHASE(P_GATE_UP, matmul3(m, n, m->xb, d, 1, &L->w_gate, m->gate, &L->w_up, m->up, NULL, NULL));
        PHASE(P_SWIGLU, swiglu(m, n));
        PHASE(P_DOWN, matmul3(m, n, m->gate, c->n_ff, 1, &L->w_down, m->xb, NULL, NULL, NULL, NULL));
    }
    token_ctx last = {m, NULL, NULL, 1, &at};
    PHASE(P_NORM, run_tokens(m, n, residual_norm_task, &last));
    const hs_mat *out = m->output.data ? &m->output : &m->tok_embd;
    PHASE(P_LOGITS, {
        for (int i = 0; i < n_logits; i++)
            rmsnorm(m->k, m->xb + (size_t)i * d, m->x + (size_t)logit_index[i] * d, m->output_norm, d, c->eps);
        if (n_logits > 0) matmul3(m, n_logits, m->xb, d, 0, out, logits, NULL, NULL, NULL, NULL);
    });
    return 0;
}

/* Steps wider than UBATCH tokens run as consecutive sub-steps of UBATCH tokens (as llama.cpp's
 * micro-batches): the scratch then stays that of UBATCH tokens, and the weights are streamed as
 * often as one wide step would (every COL_CHUNK tokens on the register and int8 tiles; once per
 * sub-step on amx's bf16 tiles, which dequantize each weight once per product). Allowed when
 * every sequence's tokens come in increasing positions, so that each token's keys and values are
 * written before a later sub-step attends to them. */
#define UBATCH 128

static int in_position_order(int n, const int32_t *pos, const int32_t *seq, int n_seqs) {
    int32_t *last = malloc(sizeof(int32_t) * (size_t)n_seqs);
    if (!last) return 0;
    for (int s = 0; s < n_seqs; s++) last[s] = -1;
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
        ok = pos[i] > last[seq[i]];
        last[seq[i]] = pos[i];
    }
    free(last);
    return ok;
}

int hs_model_forward(hs_model *m, int n, const int32_t *tokens, const int32_t *pos,
                     const int32_t *seq, const int32_t *block_tables, int n_seqs,
                     int max_blocks, const int32_t *logit_index, int n_logits, float *logits) {
    const hs_config *c = &m->c;
    if (n < 1 || !m->k_cache || !m->tok_embd.data) return -1;
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= c->n_vocab || seq[i] < 0 || seq[i] >= n_seqs ||
            pos[i] < 0 || pos[i] / m->block_size >= max_blocks)
            return -1;
        const int block = block_tables[(size_t)seq[i] * max_blocks + pos[i] / m->block_size];
        if (block < 0 || block >= m->n_blocks) return -1;
    }
    if (n_logits > n) return -1;
    for (int i = 0; i < n_logits; i++)
        if (logit_index[i] < 0 || logit_index[i] >= n) return -1;
    if (n <= UBATCH || !in_position_order(n, pos, seq, n_seqs))
        return forward_step(m, n, tokens, pos, seq, block_tables, max_blocks, logit_index,
                            n_logits, logits);
    int32_t *local = malloc(sizeof(int32_t) * (size_t)(n_logits ? n_logits : 1));
    float *rows = NULL; /* a sub-step's logits, when they cannot go straight to their rows */
    int rc = local ? 0 : -1;
    for (int i0 = 0; i0 < n && rc == 0; i0 += UBATCH) {
        const int cnt = n - i0 < UBATCH ? n - i0 : UBATCH;
        int k = 0, first = -1, direct = 1;
        for (int j = 0; j < n_logits; j++)
            if (logit_index[j] >= i0 && logit_index[j] < i0 + cnt) {
                if (first < 0) first = j;
                direct &= j == first + k; /* consecutive rows of `logits`, in order */
                local[k++] = logit_index[j] - i0;
            }
        if (direct) { /* the usual case: logits asked for in token order */
            rc = forward_step(m, cnt, tokens + i0, pos + i0, seq + i0, block_tables, max_blocks,
                              local, k, k ? logits + (size_t)first * c->n_vocab : NULL);
            continue;
        }
        if (!rows) rows = malloc(sizeof(float) * (size_t)n_logits * (size_t)c->n_vocab);
        if (!rows) {
            rc = -1;
            break;
        }
        rc = forward_step(m, cnt, tokens + i0, pos + i0, seq + i0, block_tables, max_blocks, local,
                          k, rows);
        k = 0; /* rows come back in the order of `local`, i.e. of logit_index within the range */
        for (int j = 0; j < n_logits && rc == 0; j++)
            if (logit_index[j] >= i0 && logit_index[j] < i0 + cnt)
                memcpy(logits + (size_t)j * c->n_vocab, rows + (size_t)k++ * c->n_vocab,
                       sizeof(float) * (size_t)c->n_vocab);
    }
    free(local);
    free(rows);
    return rc;
}
