/* Attention over a paged KV cache on the CPU, fused in one pass: one query row per row of `tables`/`seq_lens`
   (a decode step's sequences, or a prompt's tokens, each seeing the keys up to its own length).

   torch has no fused CPU kernel for this; in plain torch each layer's decode attention with 16 sequences is
   about twenty small ops, and the batched bf16 matmuls at their heart run far below memory speed because
   every (sequence, page, head) product is a tiny [group, dim] x [dim, page] matrix. Here each (sequence, KV
   head) task streams its keys and values once, in token blocks, with an online softmax (as in
   flash-decoding), all in float32; the query heads sharing that KV head (the GQA group) are served by the
   same pass over memory.

   Element types: 0 = float32, 1 = bfloat16. q is [num_seqs, num_q_heads, head_dim] and out the same, both
   contiguous and of the cache's type. The cache is addressed through strides (in elements; head_dim is the
   unit-stride axis), so both the plain [pages, slots, heads, dim] layout and the CPU's head-major memory
   work. Tasks are shared among OpenMP threads (torch's own pool, see kernels/cpu/build.py).

   What runs: with AVX-512, head sizes that are multiples of 16 take the vector path below; with AVX2 and
   FMA but no AVX-512 (most laptops), multiples of 8 take paged_decode_avx2.h's (the same plan in 8 lanes);
   the rest the portable one, which the compiler vectorizes. On AVX2 CPUs this kernel serves every attention
   call, prompts included, so that path matters: a prompt arrives as one query row per token, and the AVX2
   path must beat the torch twin there too. A row's arithmetic never depends on the other rows.

   Quantized caches (paged_decode_quant; blocks of 32 rotated values, kv_quant.h): each task loop above has a
   `quant` form that dequantizes a block's keys, then its values, into a float32 scratch and runs the float32
   block math on it unchanged, with the query rotated in and the output rotated back. So a row reads the
   quantized bytes from memory (about a quarter of bfloat16's at 4 bits) and its result is, to the bit, the
   float32 kernel's on the dequantized pages with the rotated query, the output rotated back and rounded to
   q's type: what a prompt gets when kernels/cpu/kv_quant.py runs it over float32 copies of its pages. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "kv_quant.h"

#define MAX_DIM 256
#define MAX_GROUP 16
#define BLOCK 32

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
} Work;

static inline void load_row(const void *base, int64_t offset, int dtype, int64_t n, float *dst) {
    if (dtype == 1) {
        const uint16_t *src = (const uint16_t *)base + offset;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_float(src[i]);
    } else {
        memcpy(dst, (const float *)base + offset, (size_t)n * sizeof(float));
    }
}

/* Where tokens start .. start + count - 1 of one KV head live, in elements from the cache's start. */
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

/* The online-softmax update for one query head and a block of raw scores: turns the scores into weights
   (in place) and returns the factor the head's earlier accumulation must shrink by. */
static inline float softmax_block(float *scores, int64_t count, float *running_max, float *running_sum) {
    float block_max = scores[0];
    for (int64_t j = 1; j < count; j++) block_max = scores[j] > block_max ? scores[j] : block_max;
    const float new_max = block_max > *running_max ? block_max : *running_max;
    const float shrink = *running_max == -INFINITY ? 0.0f : exp_poly(*running_max - new_max);
    float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
    for (int64_t j = 0; j < count; j++) {
        scores[j] = exp_poly(scores[j] - new_max);
        block_sum += scores[j];
    }
    *running_sum = *running_sum * shrink + block_sum;
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

/* A quantized cache's query row at `offset` of q as float32, rotated (as kv_quant.rotate). */
static void load_rotated(const Work *w, int64_t offset, float *dst) {
    load_row(w->q, offset, w->dtype, w->head_dim, dst);
    for (int64_t b = 0; b < w->head_dim; b += KVQ_GROUP) kvq_rotate(dst + b);
}

/* store_row for a quantized cache: the float32 row scaled, rotated back, then rounded to out's type. */
static void store_rotated(const Work *w, int64_t offset, const float *src, float factor) {
    float row[MAX_DIM];
    for (int64_t i = 0; i < w->head_dim; i++) row[i] = src[i] * factor;
    for (int64_t b = 0; b < w->head_dim; b += KVQ_GROUP) kvq_rotate(row + b);
    store_row(w->out, offset, w->dtype, w->head_dim, row, 1.0f);
}

/* Rows offsets[0..count) (bytes) of a quantized cache -> float32 rows of head_dim at dst, one after another. */
static __attribute__((noinline)) void dequantize_rows(const Work *w, const void *cache, const int64_t *offsets,
                                                      int64_t count, float *dst) {
    kvq_dequantize_rows((const uint8_t *)cache, offsets, count, w->bits, w->head_dim, dst);
}

static void run_task_generic(const Work *w, int64_t task) {
    const int64_t seq = task / w->num_kv_heads, kv_head = task % w->num_kv_heads;
    const int64_t dim = w->head_dim, group = w->num_q_heads / w->num_kv_heads;
    const int64_t length = w->seq_lens[seq];
    const int64_t first = w->window > 0 && length > w->window ? length - w->window : 0;
    const int64_t *table = w->tables + seq * w->table_stride;

    float q[MAX_GROUP][MAX_DIM], acc[MAX_GROUP][MAX_DIM], row[MAX_DIM];
    float running_max[MAX_GROUP], running_sum[MAX_GROUP], scores[MAX_GROUP][BLOCK];
    for (int64_t g = 0; g < group; g++) {
        if (w->bits)
            load_rotated(w, (seq * w->num_q_heads + kv_head * group + g) * dim, q[g]);
        else
            load_row(w->q, (seq * w->num_q_heads + kv_head * group + g) * dim, w->dtype, dim, q[g]);
        for (int64_t i = 0; i < dim; i++) {
            q[g][i] *= w->scale;
            acc[g][i] = 0.0f;
        }
        running_max[g] = -INFINITY;
        running_sum[g] = 0.0f;
    }

    for (int64_t start = first; start < length; start += BLOCK) {
        const int64_t count = length - start < BLOCK ? length - start : BLOCK;
        int64_t offsets[BLOCK];
        block_offsets(w, table, kv_head, start, count, offsets);
        for (int64_t j = 0; j < count; j++) {
            if (w->bits)
                dequantize_rows(w, w->k, offsets + j, 1, row);
            else
                load_row(w->k, offsets[j], w->dtype, dim, row);
            for (int64_t g = 0; g < group; g++) {
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int64_t i = 0; i < dim; i++) dot += q[g][i] * row[i];
                scores[g][j] = dot;
            }
        }
        for (int64_t g = 0; g < group; g++) {
            const float shrink = softmax_block(scores[g], count, &running_max[g], &running_sum[g]);
            if (shrink != 1.0f) {
#pragma omp simd
                for (int64_t i = 0; i < dim; i++) acc[g][i] *= shrink;
            }
        }
        for (int64_t j = 0; j < count; j++) {
            if (w->bits)
                dequantize_rows(w, w->v, offsets + j, 1, row);
            else
                load_row(w->v, offsets[j], w->dtype, dim, row);
            for (int64_t g = 0; g < group; g++) {
                const float p = scores[g][j];
#pragma omp simd
                for (int64_t i = 0; i < dim; i++) acc[g][i] += p * row[i];
            }
        }
    }

    for (int64_t g = 0; g < group; g++) {
        const float inv = running_sum[g] > 0.0f ? 1.0f / running_sum[g] : 0.0f;
        if (w->bits)
            store_rotated(w, (seq * w->num_q_heads + kv_head * group + g) * dim, acc[g], inv);
        else
            store_row(w->out, (seq * w->num_q_heads + kv_head * group + g) * dim, w->dtype, dim, acc[g], inv);
    }
}

#if defined(__AVX512F__)
#include <immintrin.h>

/* 16 bf16 or float32 values from `base` + offset as 16 floats. */
static inline __m512 load16(const void *base, int64_t offset, int dtype) {
    if (dtype == 1) {
        const __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + offset));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
    }
    return _mm512_loadu_ps((const float *)base + offset);
}

/* r[j] = the sum of the 16 lanes of a[j]: a transpose-and-add tree, about 3 operations per vector instead of
   a full horizontal sum for each. */
static inline __m512 sum_lanes16(const __m512 *a) {
    __m512 pairs[8], quads[4];
    for (int i = 0; i < 8; i++)
        pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        const __m512d lo = _mm512_castps_pd(pairs[2 * i]), hi = _mm512_castps_pd(pairs[2 * i + 1]);
        quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(lo, hi)), _mm512_castpd_ps(_mm512_unpackhi_pd(lo, hi)));
    }
    /* quads[i]: in each 128-bit lane, that lane's partial sums of a[4i] .. a[4i + 3]; now add across lanes */
    const __m512 e0 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x88), _mm512_shuffle_f32x4(quads[0], quads[1], 0xDD));
    const __m512 e1 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x88), _mm512_shuffle_f32x4(quads[2], quads[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e0, e1, 0x88), _mm512_shuffle_f32x4(e0, e1, 0xDD));
}

/* run_task_generic with 16-token blocks: each key and value row is read once for the whole GQA group and
   the group's scores are summed 16 at a time. `group` and `chunks` (head_dim / 16) are constants where the
   dispatcher below instantiates it, so the loops unroll and the accumulators stay in registers. With `quant`,
   a quantized cache's blocks are dequantized into `scratch` first and read as float32 (see the top). */
static inline __attribute__((always_inline)) void task_avx512(const Work *w, int64_t task, const int64_t group,
                                                              const int64_t chunks, const int quant) {
    const int64_t seq = task / w->num_kv_heads, kv_head = task % w->num_kv_heads, dim = w->head_dim;
    const int64_t length = w->seq_lens[seq];
    const int64_t first = w->window > 0 && length > w->window ? length - w->window : 0;
    const int64_t *table = w->tables + seq * w->table_stride;

    __m512 q[MAX_GROUP][MAX_DIM / 16], acc[MAX_GROUP][MAX_DIM / 16], partial[MAX_GROUP][16];
    float running_max[MAX_GROUP], running_sum[MAX_GROUP], weights[MAX_GROUP][16];
    float rotated[MAX_DIM], scratch[16 * MAX_DIM];
    int64_t rows[16];
    const int dtype = quant ? 0 : w->dtype; /* of the rows the loops read */
    const __m512 scale = _mm512_set1_ps(w->scale);
    for (int64_t g = 0; g < group; g++) {
        const int64_t at = (seq * w->num_q_heads + kv_head * group + g) * dim;
        if (quant) load_rotated(w, at, rotated);
        for (int64_t c = 0; c < chunks; c++) {
            q[g][c] = _mm512_mul_ps(quant ? _mm512_loadu_ps(rotated + 16 * c) : load16(w->q, at + 16 * c, w->dtype),
                                    scale);
            acc[g][c] = _mm512_setzero_ps();
        }
        running_max[g] = -INFINITY;
        running_sum[g] = 0.0f;
    }

    for (int64_t start = first; start < length; start += 16) {
        const int64_t count = length - start < 16 ? length - start : 16;
        int64_t offsets[16];
        block_offsets(w, table, kv_head, start, count, offsets);
        const void *keys = w->k, *values = w->v;
        const int64_t *at = offsets;
        if (quant) {
            dequantize_rows(w, w->k, offsets, count, scratch);
            for (int64_t j = 0; j < count; j++) rows[j] = j * dim;
            keys = values = scratch;
            at = rows;
        }
        for (int64_t j = 0; j < 16; j++) {
            __m512 sums[MAX_GROUP];
#pragma GCC unroll 16
            for (int64_t g = 0; g < group; g++) sums[g] = _mm512_setzero_ps();
            if (j < count) {
#pragma GCC unroll 16
                for (int64_t c = 0; c < chunks; c++) {
                    const __m512 key = load16(keys, at[j] + 16 * c, dtype);
#pragma GCC unroll 16
                    for (int64_t g = 0; g < group; g++) sums[g] = _mm512_fmadd_ps(q[g][c], key, sums[g]);
                }
            }
#pragma GCC unroll 16
            for (int64_t g = 0; g < group; g++) partial[g][j] = sums[g];
        }
        for (int64_t g = 0; g < group; g++) {
            _mm512_storeu_ps(weights[g], sum_lanes16(partial[g]));
            const float shrink = softmax_block(weights[g], count, &running_max[g], &running_sum[g]);
            if (shrink != 1.0f) {
                const __m512 factor = _mm512_set1_ps(shrink);
#pragma GCC unroll 16
                for (int64_t c = 0; c < chunks; c++) acc[g][c] = _mm512_mul_ps(acc[g][c], factor);
            }
        }
        if (quant) dequantize_rows(w, w->v, offsets, count, scratch);
        for (int64_t j = 0; j < count; j++) {
#pragma GCC unroll 16
            for (int64_t c = 0; c < chunks; c++) {
                const __m512 value = load16(values, at[j] + 16 * c, dtype);
#pragma GCC unroll 16
                for (int64_t g = 0; g < group; g++)
                    acc[g][c] = _mm512_fmadd_ps(_mm512_set1_ps(weights[g][j]), value, acc[g][c]);
            }
        }
    }

    float row[MAX_DIM];
    for (int64_t g = 0; g < group; g++) {
        for (int64_t c = 0; c < chunks; c++) _mm512_storeu_ps(row + 16 * c, acc[g][c]);
        const float inv = running_sum[g] > 0.0f ? 1.0f / running_sum[g] : 0.0f;
        if (quant)
            store_rotated(w, (seq * w->num_q_heads + kv_head * group + g) * dim, row, inv);
        else
            store_row(w->out, (seq * w->num_q_heads + kv_head * group + g) * dim, w->dtype, dim, row, inv);
    }
}

/* Instances for the common head sizes (64, 128) and GQA groups (1 to 8), float and quantized caches (Q 0 or
   1); others take the general ones. */
#define INSTANCE(Q, G, C) \
    static void task_q##Q##_g##G##_c##C(const Work *w, int64_t task) { task_avx512(w, task, G, C, Q); }
#define INSTANCES(Q, C) INSTANCE(Q, 1, C) INSTANCE(Q, 2, C) INSTANCE(Q, 3, C) INSTANCE(Q, 4, C) INSTANCE(Q, 5, C) \
    INSTANCE(Q, 6, C) INSTANCE(Q, 7, C) INSTANCE(Q, 8, C)
#define ROW(Q, C) {task_q##Q##_g1_c##C, task_q##Q##_g2_c##C, task_q##Q##_g3_c##C, task_q##Q##_g4_c##C, \
                   task_q##Q##_g5_c##C, task_q##Q##_g6_c##C, task_q##Q##_g7_c##C, task_q##Q##_g8_c##C}
INSTANCES(0, 4)
INSTANCES(0, 8)
INSTANCES(1, 4)
INSTANCES(1, 8)
static void (*const instances[2][2][8])(const Work *, int64_t) = {{ROW(0, 4), ROW(0, 8)}, {ROW(1, 4), ROW(1, 8)}};

static void run_task_avx512(const Work *w, int64_t task) {
    const int64_t group = w->num_q_heads / w->num_kv_heads, chunks = w->head_dim / 16;
    if ((chunks == 4 || chunks == 8) && group <= 8)
        instances[w->bits != 0][chunks / 8][group - 1](w, task);
    else if (w->bits)
        task_avx512(w, task, group, chunks, 1);
    else
        task_avx512(w, task, group, chunks, 0);
}
#elif defined(__AVX2__) && defined(__FMA__)
#include "paged_decode_avx2.h"
#endif

static void run_task(const Work *w, int64_t task) {
#if defined(__AVX512F__)
    if (w->head_dim % 16 == 0) {
        run_task_avx512(w, task);
        return;
    }
#elif defined(__AVX2__) && defined(__FMA__)
    if (w->head_dim % 8 == 0) {
        run_task_avx2(w, task);
        return;
    }
#endif
    run_task_generic(w, task);
}

#if !defined(TANDEM_PART) || TANDEM_PART == 0 /* part 1 makes the bfloat16 AVX2 instances only */
static void run_tasks(const Work *base, int64_t num_seqs, int64_t num_threads) {
    const int64_t num_tasks = num_seqs * base->num_kv_heads;
    /* Tasks differ in length (sequences do), so threads take them as they come. */
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads) if (num_threads > 1 && num_tasks > 1)
    for (int64_t task = 0; task < num_tasks; task++) run_task(base, task);
}

/* Returns 0, or -1 for arguments outside what the kernel handles (the caller checks them first). */
int paged_decode_attention(const void *q, const void *k_cache, const void *v_cache, void *out, int64_t page_stride,
                           int64_t slot_stride, int64_t head_stride, const int64_t *tables, int64_t table_stride,
                           const int64_t *seq_lens, int64_t num_seqs, int64_t num_q_heads, int64_t num_kv_heads,
                           int64_t head_dim, int64_t page_size, int64_t window, float scale, int dtype,
                           int64_t num_threads) {
    if (head_dim > MAX_DIM || num_kv_heads <= 0 || num_q_heads % num_kv_heads != 0 ||
        num_q_heads / num_kv_heads > MAX_GROUP || (dtype != 0 && dtype != 1))
        return -1;
    const Work base = {q, k_cache, v_cache, out, page_stride, slot_stride, head_stride, tables, table_stride,
                       seq_lens, num_q_heads, num_kv_heads, head_dim, page_size, window, scale, dtype, 0};
    run_tasks(&base, num_seqs, num_threads);
    return 0;
}

/* paged_decode_attention over a quantized cache of `bits` (8, 6 or 4) bits: strides in bytes, head_dim a
   multiple of 32, q and out float32 (dtype 0) or bfloat16 (1) in their own (unrotated) basis. */
int paged_decode_quant(const void *q, const void *k_cache, const void *v_cache, void *out, int64_t page_stride,
                       int64_t slot_stride, int64_t head_stride, const int64_t *tables, int64_t table_stride,
                       const int64_t *seq_lens, int64_t num_seqs, int64_t num_q_heads, int64_t num_kv_heads,
                       int64_t head_dim, int64_t page_size, int64_t window, float scale, int dtype, int bits,
                       int64_t num_threads) {
    if (head_dim > MAX_DIM || head_dim % KVQ_GROUP || num_kv_heads <= 0 || num_q_heads % num_kv_heads != 0 ||
        num_q_heads / num_kv_heads > MAX_GROUP || (dtype != 0 && dtype != 1) || (bits != 4 && bits != 6 && bits != 8))
        return -1;
    const Work base = {q, k_cache, v_cache, out, page_stride, slot_stride, head_stride, tables, table_stride,
                       seq_lens, num_q_heads, num_kv_heads, head_dim, page_size, window, scale, dtype, bits};
    run_tasks(&base, num_seqs, num_threads);
    return 0;
}
#endif
