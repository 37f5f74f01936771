#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double hs_uniform(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

static int argmax(const float *x, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
    return best;
}

/* The k-th largest (k >= 1) of a[0..n), which it reorders (quickselect, Hoare partition). */
static float kth_largest(float *a, int n, int k) {
    int lo = 0, hi = n - 1;
    const int target = k - 1;
    while (lo < hi) {
        float x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi], pivot;
        if (x < y) { float t = x; x = y; y = t; }            /* x >= y */
        pivot = z > x ? x : z > y ? z : y;                   /* median of three */
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] > pivot) i++;
            while (a[j] < pivot) j--;
            if (i <= j) {
                const float t = a[i]; a[i] = a[j]; a[j] = t;
                i++; j--;
            }
        }
        if (target <= j) hi = j;
        else if (target >= i) lo = i;
        else return a[target]; /* between j and i: equal to the pivot */
    }
    return a[target];
}

static int by_probability(const void *a, const void *b) {
    const hs_candidate *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

int hs_sample(const float *logits, int n, hs_sampling *s, float *prob, hs_candidate *cand) {
    const int top = argmax(logits, n);
    if (top < 0 || !(s->temperature > HS_MIN_TEMPERATURE)) return top;
    if (!prob || !cand) return -1;
    const float max = logits[top], inv_t = 1.0f / s->temperature;
    float cutoff = -INFINITY;
    if (s->top_k > 0 && s->top_k < n) {
        int count = 0;
        for (int i = 0; i < n; i++)
            if (!isnan(logits[i])) prob[count++] = logits[i];
        if (s->top_k < count) cutoff = kth_largest(prob, count, s->top_k);
    }
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        const float l = logits[i];
        prob[i] = (l >= cutoff && !isnan(l)) ? expf((l - max) * inv_t) : 0.0f;
        sum += prob[i];
    }
    if (s->top_p < 1.0f) {
        /* Tokens below `least` together hold less than (1 - top_p) of the mass, so the most
         * probable tokens reach top_p before any of them: only the rest need sorting. */
        const double least = (1.0 - (double)s->top_p) * sum / (2.0 * n);
        int m = 0;
        for (int i = 0; i < n; i++)
            if (prob[i] > 0.0f && prob[i] >= least) cand[m++] = (hs_candidate){prob[i], i};
        qsort(cand, (size_t)m, sizeof *cand, by_probability);
        const double target = (double)s->top_p * sum;
        double kept = 0.0;
        int keep = m;
        for (int j = 0; j < m; j++) {
            kept += cand[j].p;
            if (kept >= target) { keep = j + 1; break; }
        }
        for (int i = 0; i < n; i++) prob[i] = 0.0f;
        sum = 0.0;
        for (int j = 0; j < keep; j++) {
            prob[cand[j].id] = cand[j].p;
            sum += cand[j].p;
        }
    }
    const double u = hs_uniform(&s->state) * sum;
    double acc = 0.0;
    int last = top;
    for (int i = 0; i < n; i++) {
        if (prob[i] <= 0.0f) continue;
        acc += prob[i];
        last = i;
        if (acc > u) return i;
    }
    return last; /* u within rounding of the total */
}

void hs_logprobs(const float *logits, int n, int chosen, const hs_sampling *s) {
    if (s->n_logprobs < 0) return;
    const int k = s->n_logprobs < HS_MAX_LOGPROBS ? s->n_logprobs : HS_MAX_LOGPROBS;
    const int top = argmax(logits, n);
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        if (!isnan(logits[i])) sum += exp((double)logits[i] - logits[top]);
    const double lse = logits[top] + log(sum);
    s->logprob_id[0] = chosen;
    s->logprob[0] = (float)(logits[chosen] - lse);
    /* The k largest by insertion into a sorted list: k <= 20, and most logits fail the first
     * comparison with the k-th. Strict comparisons keep the lower id first among equals. */
    int32_t *ids = s->logprob_id + 1;
    float *vals = s->logprob + 1;
    int kept = 0;
    for (int i = 0; i < n && k > 0; i++) {
        const float l = logits[i];
        if (isnan(l) || (kept == k && !(l > vals[k - 1]))) continue;
        int j = kept < k ? kept++ : k - 1;
        while (j > 0 && l > vals[j - 1]) {
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        vals[j] = l;
        ids[j] = i;
    }
    for (int j = 0; j < kept; j++) vals[j] = (float)(vals[j] - lse);
    for (int j = kept; j < k; j++) {
        vals[j] = -INFINITY;
        ids[j] = -1;
    }
}

typedef struct {
    const float *logits;
    int rows, n;
    hs_sampling *params;
    int32_t *out;
    char *scratch; /* per thread: n probabilities, n candidates, n added-to logits */
} sample_ctx;

size_t hs_sample_scratch_bytes(int threads, int n) {
    return (size_t)threads * (size_t)n * (2 * sizeof(float) + sizeof(hs_candidate));
}

static void sample_task(void *p, int ith, int nth) {
    sample_ctx *t = p;
    int r0, r1;
    hs_split(t->rows, 1, ith, nth, &r0, &r1);
    char *mine = t->scratch + hs_sample_scratch_bytes(ith, t->n);
    float *prob = (float *)mine;
    hs_candidate *cand = (hs_candidate *)(mine + sizeof(float) * (size_t)t->n);
    float *added = (float *)(cand + t->n);
    for (int r = r0; r < r1; r++) {
        hs_sampling *s = &t->params[r];
        const float *row = t->logits + (size_t)r * t->n;
        if (s->n_add > 0) {
            memcpy(added, row, sizeof(float) * (size_t)t->n);
            for (int i = 0; i < s->n_add; i++) added[s->add_id[i]] += s->add[i];
            row = added;
        }
        t->out[r] = hs_sample(row, t->n, s, prob, cand);
        if (t->out[r] >= 0) hs_logprobs(row, t->n, t->out[r], s);
    }
}

int hs_sample_rows(hs_pool *pool, const float *logits, int rows, int n, hs_sampling *params,
                   int32_t *out, void *scratch) {
    sample_ctx t = {logits, rows, n, params, out, scratch};
    if (rows > 1)
        hs_pool_run(pool, sample_task, &t);
    else
        sample_task(&t, 0, 1);
    for (int r = 0; r < rows; r++)
        if (out[r] < 0) return -1;
    return 0;
}
