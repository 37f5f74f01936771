#include "sample.h"

#include <math.h>
#include <stdlib.h>

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

typedef struct {
    const float *logits;
    int rows, n;
    hs_sampling *params;
    int32_t *out;
    char *scratch; /* per thread: n probabilities, then n candidates */
} sample_ctx;

size_t hs_sample_scratch_bytes(int threads, int n) {
    return (size_t)threads * (size_t)n * (sizeof(float) + sizeof(hs_candidate));
}

static void sample_task(void *p, int ith, int nth) {
    sample_ctx *t = p;
    int r0, r1;
    hs_split(t->rows, 1, ith, nth, &r0, &r1);
    char *mine = t->scratch + hs_sample_scratch_bytes(ith, t->n);
    float *prob = (float *)mine;
    hs_candidate *cand = (hs_candidate *)(mine + sizeof(float) * (size_t)t->n);
    for (int r = r0; r < r1; r++)
        t->out[r] = hs_sample(t->logits + (size_t)r * t->n, t->n, &t->params[r], prob, cand);
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
