/* Token sampling from logits: greedy, temperature, top-k, top-p, from a seeded generator;
 * optional additions to a few logits first (OpenAI's logit_bias and the frequency/presence
 * penalties, which the caller folds into one sparse list), and optional log-probabilities.
 * Portable C (no ISA variants): a step samples a few rows of n_vocab values, split across the
 * pool by rows. The engine samples here so that logits never cross into Python. */
#ifndef HS_SAMPLE_H
#define HS_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "threadpool.h"

/* Temperatures at or below this are greedy: 1 / T would overflow the logits' scale. */
#define HS_MIN_TEMPERATURE 1e-6f

typedef struct {
    float temperature; /* <= HS_MIN_TEMPERATURE: greedy (the first of the largest logits) */
    int top_k;         /* keep the k largest logits (ties at the k-th kept); <= 0: all */
    float top_p;       /* then the most probable tokens whose mass first reaches top_p; >= 1: all */
    uint64_t state;    /* generator state (splitmix64), advanced once per sampled token */
    /* Added to the row's logits before anything else: logits[add_id[i]] += add[i] (ids within
     * the vocabulary, each at most once). n_add == 0: the row is used as it is. */
    const int32_t *add_id;
    const float *add;
    int n_add;
    /* < 0: no log-probabilities. Else logprob[0] / logprob_id[0] receive the chosen token's
     * log-probability and id, and entries 1..n_logprobs the n_logprobs most probable tokens in
     * descending order (ties: the lower id first). They are of the row after the additions and
     * at temperature 1 (OpenAI's definition: neither temperature nor top-k/top-p apply). */
    int n_logprobs;
    float *logprob;
    int32_t *logprob_id;
} hs_sampling;

/* The most log-probabilities a row may ask for (OpenAI's top_logprobs maximum). */
#define HS_MAX_LOGPROBS 20

/* A candidate token of top-p sampling (scratch). */
typedef struct { float p; int32_t id; } hs_candidate;

/* Next uniform double in [0, 1) from *state. */
double hs_uniform(uint64_t *state);

/* One token from logits[n]. `prob` and `cand` (n entries each) are scratch; greedy sampling
 * needs neither (NULL). NaN logits are never chosen. Returns the token id, or -1 when no logit
 * is a number (or scratch is missing). */
int hs_sample(const float *logits, int n, hs_sampling *s, float *prob, hs_candidate *cand);

/* The log-probabilities s asks for (see hs_sampling.n_logprobs) of `chosen` in logits[n]. */
void hs_logprobs(const float *logits, int n, int chosen, const hs_sampling *s);

/* Scratch hs_sample_rows needs for a pool of `threads` and rows of n logits. */
size_t hs_sample_scratch_bytes(int threads, int n);

/* out[r] = hs_sample(logits + r * n, ...) for each of `rows` rows (after the row's additions,
 * made on a copy: `logits` is not written), with its log-probabilities where asked for, split
 * across the pool; params[r].state advances. `scratch`: hs_sample_scratch_bytes(pool size, n) bytes, 4-byte
 * aligned, kept by the caller from step to step. Returns 0, or -1 when a row had no number. */
int hs_sample_rows(hs_pool *pool, const float *logits, int rows, int n, hs_sampling *params,
                   int32_t *out, void *scratch);

#endif
