/* Token sampling from logits: greedy, temperature, top-k, top-p, from a seeded generator.
 * Portable C (no ISA variants): a step samples a few rows of n_vocab values, split across the
 * pool by rows. The engine samples here so that logits never cross into Python. */
#ifndef HS_SAMPLE_H
#define HS_SAMPLE_H

#include <stdint.h>

#include "threadpool.h"

/* Temperatures at or below this are greedy: 1 / T would overflow the logits' scale. */
#define HS_MIN_TEMPERATURE 1e-6f

typedef struct {
    float temperature; /* <= HS_MIN_TEMPERATURE: greedy (the first of the largest logits) */
    int top_k;         /* keep the k largest logits (ties at the k-th kept); <= 0: all */
    float top_p;       /* then the most probable tokens whose mass first reaches top_p; >= 1: all */
    uint64_t state;    /* generator state (splitmix64), advanced once per sampled token */
} hs_sampling;

/* A candidate token of top-p sampling (scratch). */
typedef struct { float p; int32_t id; } hs_candidate;

/* Next uniform double in [0, 1) from *state. */
double hs_uniform(uint64_t *state);

/* One token from logits[n]. `prob` and `cand` (n entries each) are scratch; greedy sampling
 * needs neither (NULL). NaN logits are never chosen. Returns the token id, or -1 when no logit
 * is a number (or scratch is missing). */
int hs_sample(const float *logits, int n, hs_sampling *s, float *prob, hs_candidate *cand);

/* out[r] = hs_sample(logits + r * n, ...) for each of `rows` rows, split across the pool;
 * params[r].state advances. Returns 0, or -1 when a row had no number or scratch could not be
 * allocated. */
int hs_sample_rows(hs_pool *pool, const float *logits, int rows, int n, hs_sampling *params,
                   int32_t *out);

#endif
