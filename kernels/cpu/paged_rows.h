/* One query row's attention over a paged KV cache, a block of keys at a time: what the decode kernel
   (paged_decode.c: one row per sequence) and the quantized prompt kernel (paged_prefill_quant.c: a prompt's
   rows in tiles) share, so a token's row is computed by the same operations, and so to the same bits, in both.

   A row is one token's GQA group (the query heads sharing one KV head) over keys first .. length - 1, where
   first is length - window under a sliding window (row_first), else 0. Its keys go in blocks of a fixed size
   from `first` on, the last one cut at `length`; per block, the group's scores, an online-softmax update, then
   the values. The row's state (its scaled query, accumulators, running maxima and sums) is wherever a struct
   of pointers says, so a kernel can hold one row (decode) or several side by side (a prompt's tile) and feed
   each the same blocks. Nothing a row computes depends on where its arrays lie: its sums go in a fixed order.

   Here: the struct of the portable path and its block function, and the helpers every path uses; the vector
   paths' forms are paged_decode_avx2.h's and paged_decode_avx512.h's. Element types: 0 = float32,
   1 = bfloat16. q is [rows, num_q_heads, head_dim] and out the same, both contiguous; the cache is addressed
   through strides (in elements, or in bytes for a quantized cache; head_dim is the unit-stride axis). */

#ifndef TANDEM_CPU_PAGED_ROWS_H
#define TANDEM_CPU_PAGED_ROWS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "kv_quant.h"

#define MAX_DIM 256
#define MAX_GROUP 16
#define BLOCK 32 /* keys per block on the portable path */

typedef struct {
    const void *q, *k, *v;
    void *out;
    int64_t page_stride, slot_stride, head_stride;
    const int64_t *tables;
    int64_t table_stride;
    const int64_t *seq_lens;
    int64_t num_q_heads, num_kv_heads, head_dim, page_size, window;
    float scale;
    int dtype; /* of q and out; and of the cache unless bits is set */
    int bits;  /* 0, or 8, 6, 4: a cache of quantized blocks (byte strides); q and out are then unrotated */
    const float *sinks; /* NULL, or float32 [num_q_heads]: each head's learned sink logit (softmax_start) */
} Work;

/* The first key a row of `length` keys sees. */
static inline int64_t row_first(const Work *w, int64_t length) {
    return w->window > 0 && length > w->window ? length - w->window : 0;
}

/* Where query head g of KV head kv_head's group starts in q's (and out's) row `row`, in elements. */
static inline int64_t head_offset(const Work *w, int64_t row, int64_t kv_head, int64_t g) {
    const int64_t group = w->num_q_heads / w->num_kv_heads;
    return (row * w->num_q_heads + kv_head * group + g) * w->head_dim;
}

static inline void load_row(const void *base, int64_t offset, int dtype, int64_t n, float *dst) {
    if (dtype == 1) {
        const uint16_t *src = (const uint16_t *)base + offset;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_float(src[i]);
    } else {
        memcpy(dst, (const float *)base + offset, (size_t)n * sizeof(float));
    }
}

/* Where tokens start .. start + count - 1 of one KV head live, in elements (bytes) from the cache's start. */
static inline void block_offsets(const Work *w, const int64_t *table, int64_t kv_head, int64_t start, int64_t count,
                                 int64_t *offsets) {
    int64_t page = start / w->page_size, slot = start % w->page_size;
    for (int64_t j = 0; j < count; j++) {
        offsets[j] = table[page] * w->page_stride + slot * w->slot_stride + kv_head * w->head_stride;
        if (++slot == w->page_size) {
            slot = 0;
            page++;
        }
    }
}

/* A query head's online-softmax state before its first key. With a sink (gpt-oss: a logit per query head that
   every row's softmax counts, a key with no value), the sink is taken as the row's first key: maximum = sink,
   sum = exp(sink - sink) = 1, nothing added to the accumulators. The blocks then fold the keys in as ever, so
   a sink far above or below the scores needs no care of its own (the keys' weights, or the sink's share of the
   sum, shrink to nothing: at most e^-87, where exp_poly stops), and every path, starting its rows here,
   applies it the same way. Without one: maximum -inf, sum 0. */
static inline void softmax_start(const Work *w, int64_t kv_head, int64_t g, float *running_max, float *running_sum) {
    const float sink = w->sinks ? w->sinks[kv_head * (w->num_q_heads / w->num_kv_heads) + g] : -INFINITY;
    *running_max = sink;
    *running_sum = sink > -INFINITY ? 1.0f : 0.0f; /* a sink of -inf is no sink */
}

/* Sums of 8 interleaved lanes, added in a fixed tree at the end: the compiler may vectorize it but not change
   the order (a vectorized `reduction` sums in an order that can depend on how it peels for alignment, so on
   where the arrays lie). */
static inline float sum_lanes(const float *x, int64_t n) {
    float lanes[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lanes[l] += x[i + l];
    for (; i < n; i++) lanes[i & 7] += x[i];
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

/* The dot product of a[0..n) and b[0..n), in sum_lanes' order. */
static inline float dot_lanes(const float *a, const float *b, int64_t n) {
    float lanes[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lanes[l] += a[i + l] * b[i + l];
    for (; i < n; i++) lanes[i & 7] += a[i] * b[i];
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

/* The online-softmax update for one query head and a block of raw scores: turns the scores into weights
   (in place) and returns the factor the head's earlier accumulation must shrink by. */
static inline float softmax_block(float *scores, int64_t count, float *running_max, float *running_sum) {
    float block_max = scores[0];
    for (int64_t j = 1; j < count; j++) block_max = scores[j] > block_max ? scores[j] : block_max;
    const float new_max = block_max > *running_max ? block_max : *running_max;
    const float shrink = *running_max == -INFINITY ? 0.0f : exp_poly(*running_max - new_max);
#pragma omp simd
    for (int64_t j = 0; j < count; j++) scores[j] = exp_poly(scores[j] - new_max);
    *running_sum = *running_sum * shrink + sum_lanes(scores, count);
    *running_max = new_max;
    return shrink;
}

static void store_row(void *base, int64_t offset, int dtype, int64_t n, const float *src, float factor) {
    if (dtype == 1) {
        uint16_t *dst = (uint16_t *)base + offset;
        for (int64_t i = 0; i < n; i++) dst[i] = float_to_bf16(src[i] * factor);
    } else {
        float *dst = (float *)base + offset;
        for (int64_t i = 0; i < n; i++) dst[i] = src[i] * factor;
    }
}

/* x[0..n) rotated block by block (n a multiple of 32), as kv_quant.rotate: with AVX2 in vectors (the same
   additions in the same pairs, so the same floats; the scalar butterflies were a tenth of a prompt row's time). */
static inline void rotate_row(float *x, int64_t n) {
#if defined(__AVX2__) && defined(__FMA__)
    for (int64_t b = 0; b < n; b += KVQ_GROUP) {
        __m256 v[4];
        for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + b + 8 * i);
        kvq_rotate_avx2(v);
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(x + b + 8 * i, v[i]);
    }
#else
    for (int64_t b = 0; b < n; b += KVQ_GROUP) kvq_rotate(x + b);
#endif
}

/* A quantized cache's query row at `offset` of q as float32, rotated (as kv_quant.rotate). */
static void load_rotated(const Work *w, int64_t offset, float *dst) {
    load_row(w->q, offset, w->dtype, w->head_dim, dst);
    rotate_row(dst, w->head_dim);
}

/* store_row for a quantized cache: the float32 row scaled, rotated back, then rounded to out's type. */
static void store_rotated(const Work *w, int64_t offset, const float *src, float factor) {
    float row[MAX_DIM];
    for (int64_t i = 0; i < w->head_dim; i++) row[i] = src[i] * factor;
    rotate_row(row, w->head_dim);
    store_row(w->out, offset, w->dtype, w->head_dim, row, 1.0f);
}

/* Rows offsets[0..count) (bytes) of a quantized cache -> float32 rows of head_dim at dst, one after another. */
static __attribute__((noinline)) void dequantize_rows(const Work *w, const void *cache, const int64_t *offsets,
                                                      int64_t count, float *dst) {
    kvq_dequantize_rows((const uint8_t *)cache, offsets, count, w->bits, w->head_dim, dst);
}

/* Where a row's state lives on the portable path: its GQA group's queries (scaled; rotated in for a quantized
   cache) and accumulators, query head g's at [g * head_dim ..), and per head the running maximum and sum. The
   vector paths' rows are the same with vectors. Pointers, so that a tile's rows can lie side by side. */
typedef struct {
    float *q, *acc, *running_max, *running_sum;
} Row;

static void row_start(const Work *w, int64_t row, int64_t kv_head, const Row *r) {
    const int64_t dim = w->head_dim, group = w->num_q_heads / w->num_kv_heads;
    for (int64_t g = 0; g < group; g++) {
        if (w->bits)
            load_rotated(w, head_offset(w, row, kv_head, g), r->q + g * dim);
        else
            load_row(w->q, head_offset(w, row, kv_head, g), w->dtype, dim, r->q + g * dim);
        for (int64_t i = 0; i < dim; i++) {
            r->q[g * dim + i] *= w->scale;
            r->acc[g * dim + i] = 0.0f;
        }
        softmax_start(w, kv_head, g, &r->running_max[g], &r->running_sum[g]);
    }
}

/* One block of `count` keys and values for a row, as float32 rows of head_dim one after another. */
static void row_block(const Work *w, const Row *r, const float *keys, const float *values, int64_t count) {
    const int64_t dim = w->head_dim, group = w->num_q_heads / w->num_kv_heads;
    float scores[MAX_GROUP][BLOCK];
    for (int64_t j = 0; j < count; j++) {
        const float *key = keys + j * dim;
        for (int64_t g = 0; g < group; g++) scores[g][j] = dot_lanes(r->q + g * dim, key, dim);
    }
    for (int64_t g = 0; g < group; g++) {
        const float shrink = softmax_block(scores[g], count, &r->running_max[g], &r->running_sum[g]);
        if (shrink != 1.0f) {
#pragma omp simd
            for (int64_t i = 0; i < dim; i++) r->acc[g * dim + i] *= shrink;
        }
    }
    for (int64_t j = 0; j < count; j++) {
        const float *value = values + j * dim;
        for (int64_t g = 0; g < group; g++) {
            const float p = scores[g][j];
#pragma omp simd
            for (int64_t i = 0; i < dim; i++) r->acc[g * dim + i] += p * value[i];
        }
    }
}

static void row_finish(const Work *w, int64_t row, int64_t kv_head, const Row *r) {
    const int64_t group = w->num_q_heads / w->num_kv_heads;
    for (int64_t g = 0; g < group; g++) {
        const float inv = r->running_sum[g] > 0.0f ? 1.0f / r->running_sum[g] : 0.0f;
        if (w->bits)
            store_rotated(w, head_offset(w, row, kv_head, g), r->acc + g * w->head_dim, inv);
        else
            store_row(w->out, head_offset(w, row, kv_head, g), w->dtype, w->head_dim, r->acc + g * w->head_dim, inv);
    }
}

#endif
