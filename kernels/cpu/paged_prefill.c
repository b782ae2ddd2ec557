/* Causal attention of new tokens over a paged bfloat16 KV cache, flash-attention style: a prompt's, and also
   a decode step's or a verified draft's (kernels/cpu/attention.py sends every call here), since each query
   row is computed the same whatever rows share the call, and one kernel for all keeps a token's bits the
   same cold and after a prefix-cache hit.

   torch's CPU flash attention reads bfloat16 but does its arithmetic in float32, which makes attention a large
   share of a long prompt's first-token time. Here the products run on AVX512-BF16 dot products:

     scores: for a block of 64 keys, K is repacked so that each 32-bit lane holds one key's pair of
             dimensions (2i, 2i + 1); one dot-product instruction then adds q[2i] k[2i] + q[2i+1] k[2i+1]
             for 16 keys at once, and head_dim / 2 of them give 16 scores of one query row.
     values: the keys' softmax weights, rounded to bfloat16, multiply V repacked the same way by key
             pairs, into float32 output rows.
   Four query rows go through a key block together, so their dot-product chains overlap.

   A task is 16 new tokens of one sequence for one KV head; its query rows are those tokens times the query
   heads sharing the KV head. It walks the key blocks from the first visible one up to its last token,
   with an online softmax per row, and masks keys after each token (and before its sliding window).

   q [tokens, q_heads, head_dim] and out are contiguous bfloat16; the cache is addressed by strides as in
   paged_decode.c. head_dim must be a multiple of 32 (at most 256). Built only with AVX512-BF16;
   paged_prefill_attention returns -1 elsewhere and the torch twin is used. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

#define BLOCK 16  /* new tokens per task */
#define KEYS 64   /* keys per block: four 16-lane vectors */
#define KV (KEYS / 16)
#define MAX_DIM 256
#define MAX_GROUP 16
#define ROWS 4 /* query rows in flight at once */

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>

typedef struct {
    const uint16_t *q, *k, *v;
    uint16_t *out;
    int64_t page_stride, slot_stride, head_stride;
    const int64_t *tables;
    int64_t table_stride;
    const int64_t *seq_lens, *query_starts, *query_lens; /* per sequence */
    int64_t num_q_heads, num_kv_heads, head_dim, page_size, window;
    float scale;
    const float *sinks; /* NULL, or float32 [num_q_heads]: each head's sink logit */
} Work;

/* exp(x) for x <= 0, 16 lanes (exp_poly of bf16.h in intrinsics) */
static inline __m512 exp_neg16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
    const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
    __m512 p = _mm512_set1_ps(EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P5));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

static inline int64_t offset_of(const Work *w, const int64_t *table, int64_t kv_head, int64_t t) {
    return table[t / w->page_size] * w->page_stride + (t % w->page_size) * w->slot_stride + kv_head * w->head_stride;
}

/* keys[p][j] = dimension pair p of key start + j, for a whole block of KEYS keys: 16x16 tiles of 32-bit
   pairs transposed in registers (unpack 32, unpack 64, two 128-bit lane shuffles). A decode step repacks
   a block for only a few query rows, so this is much of its cost. */
static inline void repack_keys(const Work *w, const int64_t *table, int64_t kv_head, int64_t start, int64_t pairs,
                               uint32_t keys[][KEYS]) {
    for (int64_t j0 = 0; j0 < KEYS; j0 += 16) {
        const uint32_t *row[16];
        for (int i = 0; i < 16; i++) row[i] = (const uint32_t *)(w->k + offset_of(w, table, kv_head, start + j0 + i));
        for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
            __m512i r[16], t[16], u[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512((const void *)(row[i] + p0));
            for (int i = 0; i < 16; i += 2) { /* lane L: rows i, i+1 at columns 4L, 4L+1 (lo) and 4L+2, 4L+3 (hi) */
                t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
                t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
            }
            for (int m = 0; m < 16; m += 4) { /* u[m + c], lane L: rows m .. m+3 at column 4L + c */
                u[m] = _mm512_unpacklo_epi64(t[m], t[m + 2]);
                u[m + 1] = _mm512_unpackhi_epi64(t[m], t[m + 2]);
                u[m + 2] = _mm512_unpacklo_epi64(t[m + 1], t[m + 3]);
                u[m + 3] = _mm512_unpackhi_epi64(t[m + 1], t[m + 3]);
            }
            for (int c = 0; c < 4; c++) { /* column 4L + c: lane L of u[c], u[4 + c], u[8 + c], u[12 + c] */
                const __m512i lo01 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
                const __m512i hi01 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
                const __m512i lo23 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
                const __m512i hi23 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
                _mm512_store_si512((void *)&keys[p0 + c][j0], _mm512_shuffle_i32x4(lo01, lo23, 0x88));
                _mm512_store_si512((void *)&keys[p0 + 4 + c][j0], _mm512_shuffle_i32x4(lo01, lo23, 0xDD));
                _mm512_store_si512((void *)&keys[p0 + 8 + c][j0], _mm512_shuffle_i32x4(hi01, hi23, 0x88));
                _mm512_store_si512((void *)&keys[p0 + 12 + c][j0], _mm512_shuffle_i32x4(hi01, hi23, 0xDD));
            }
        }
    }
}

/* Scores, softmax update and weighted values of `n` query rows (r0 ..) against one repacked key block;
   the rows' dot-product chains are independent, which keeps the dot-product unit busy. */
static inline __attribute__((always_inline)) void rows_block(const Work *w, int64_t seq, int64_t kv_head,
                                                             int64_t block_start, int64_t first_pos, int64_t r0,
                                                             int64_t start, __m512i key_pos,
                                                             uint32_t keys[][KEYS], uint32_t values[][MAX_DIM],
                                                             float acc[][MAX_DIM], float *running_max,
                                                             float *running_sum, const int64_t n) {
    const int64_t dim = w->head_dim, pairs = dim / 2, chunks = dim / 16, group = w->num_q_heads / w->num_kv_heads;
    const int64_t length = w->seq_lens[seq];
    const uint32_t *qrow[ROWS];
    int64_t pos[ROWS];
    __m512 score[ROWS][KV];
#pragma GCC unroll 4
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = r0 + i, token = r / group, head = kv_head * group + r % group;
        pos[i] = first_pos + token;
        qrow[i] = (const uint32_t *)(w->q + ((w->query_starts[seq] + block_start + token) * w->num_q_heads + head) * dim);
#pragma GCC unroll 4
        for (int64_t b = 0; b < KV; b++) score[i][b] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < pairs; p++) {
#pragma GCC unroll 4
        for (int64_t b = 0; b < KV; b++) {
            const __m512bh k = (__m512bh)_mm512_load_si512(&keys[p][16 * b]);
#pragma GCC unroll 4
            for (int64_t i = 0; i < n; i++)
                score[i][b] = _mm512_dpbf16_ps(score[i][b], k, (__m512bh)_mm512_set1_epi32((int32_t)qrow[i][p]));
        }
    }
    uint32_t weight_pairs[ROWS][KEYS / 2] __attribute__((aligned(64)));
    __m512 factor[ROWS];
    const __m512 scale = _mm512_set1_ps(w->scale);
#pragma GCC unroll 4
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = r0 + i;
        __mmask16 visible[KV];
        __m512 block_max = _mm512_set1_ps(-INFINITY);
        int any = 0;
#pragma GCC unroll 4
        for (int64_t b = 0; b < KV; b++) {
            const __m512i at = _mm512_add_epi32(key_pos, _mm512_set1_epi32((int32_t)(16 * b)));
            /* visible: at <= pos, at < length, and inside the window */
            visible[b] = _mm512_cmple_epi32_mask(at, _mm512_set1_epi32((int32_t)pos[i])) &
                         _mm512_cmplt_epi32_mask(at, _mm512_set1_epi32((int32_t)length));
            if (w->window > 0)
                visible[b] &= _mm512_cmpgt_epi32_mask(at, _mm512_set1_epi32((int32_t)(pos[i] - w->window)));
            any |= visible[b];
            score[i][b] = _mm512_mul_ps(score[i][b], scale);
            block_max = _mm512_mask_max_ps(block_max, visible[b], block_max, score[i][b]);
        }
        float shrink = 1.0f;
        if (any) {
            const float top = _mm512_reduce_max_ps(block_max);
            const float new_max = top > running_max[r] ? top : running_max[r];
            shrink = running_max[r] == -INFINITY ? 0.0f : expf(running_max[r] - new_max);
            __m512 total = _mm512_setzero_ps();
#pragma GCC unroll 4
            for (int64_t b = 0; b < KV; b++) {
                const __m512 e = _mm512_maskz_mov_ps(visible[b], exp_neg16(_mm512_sub_ps(score[i][b], _mm512_set1_ps(new_max))));
                total = _mm512_add_ps(total, e);
                _mm256_store_si256((__m256i *)&weight_pairs[i][8 * b], (__m256i)_mm512_cvtneps_pbh(e));
            }
            running_sum[r] = running_sum[r] * shrink + _mm512_reduce_add_ps(total);
            running_max[r] = new_max;
        } else {
            memset(weight_pairs[i], 0, sizeof weight_pairs[i]);
        }
        factor[i] = _mm512_set1_ps(shrink);
    }
    for (int64_t c = 0; c < chunks; c++) {
        __m512 out[ROWS];
#pragma GCC unroll 4
        for (int64_t i = 0; i < n; i++) out[i] = _mm512_mul_ps(_mm512_load_ps(acc[r0 + i] + 16 * c), factor[i]);
        for (int64_t jp = 0; jp < KEYS / 2; jp++) {
            const __m512bh v = (__m512bh)_mm512_load_si512(&values[jp][16 * c]);
#pragma GCC unroll 4
            for (int64_t i = 0; i < n; i++)
                out[i] = _mm512_dpbf16_ps(out[i], v, (__m512bh)_mm512_set1_epi32((int32_t)weight_pairs[i][jp]));
        }
#pragma GCC unroll 4
        for (int64_t i = 0; i < n; i++) _mm512_store_ps(acc[r0 + i] + 16 * c, out[i]);
    }
}

#define ROW_KERNEL(N)                                                                                            \
    static void rows_##N(const Work *w, int64_t seq, int64_t kv_head, int64_t block_start, int64_t first_pos,    \
                         int64_t r0, int64_t start, __m512i key_pos, uint32_t keys[][KEYS],                       \
                         uint32_t values[][MAX_DIM], float acc[][MAX_DIM], float *running_max, float *running_sum) { \
        rows_block(w, seq, kv_head, block_start, first_pos, r0, start, key_pos, keys, values, acc, running_max,   \
                   running_sum, N);                                                                              \
    }
ROW_KERNEL(1) ROW_KERNEL(2) ROW_KERNEL(3) ROW_KERNEL(4)
static void (*const row_kernels[ROWS])(const Work *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, __m512i,
                                       uint32_t[][KEYS], uint32_t[][MAX_DIM], float[][MAX_DIM], float *, float *) = {
    rows_1, rows_2, rows_3, rows_4};

static void run_task(const Work *w, int64_t seq, int64_t kv_head, int64_t block_start) {
    const int64_t dim = w->head_dim, pairs = dim / 2, group = w->num_q_heads / w->num_kv_heads;
    const int64_t length = w->seq_lens[seq], q_len = w->query_lens[seq];
    const int64_t count = q_len - block_start < BLOCK ? q_len - block_start : BLOCK; /* new tokens here */
    const int64_t first_pos = length - q_len + block_start, last_pos = first_pos + count - 1;
    const int64_t *table = w->tables + seq * w->table_stride;
    const int64_t rows = count * group; /* row r: token r / group, query head kv_head * group + r % group */
    int64_t lowest = 0;
    if (w->window > 0 && first_pos - w->window + 1 > 0) lowest = first_pos - w->window + 1;

    float acc[BLOCK * MAX_GROUP][MAX_DIM] __attribute__((aligned(64)));
    float running_max[BLOCK * MAX_GROUP], running_sum[BLOCK * MAX_GROUP];
    for (int64_t r = 0; r < rows; r++) {
        memset(acc[r], 0, (size_t)dim * sizeof(float));
        /* a sink (gpt-oss) is the row's first key, one with no value, as in paged_rows.h's softmax_start */
        const float sink = w->sinks ? w->sinks[kv_head * group + r % group] : -INFINITY;
        running_max[r] = sink;
        running_sum[r] = sink > -INFINITY ? 1.0f : 0.0f;
    }
    uint32_t keys[MAX_DIM / 2][KEYS] __attribute__((aligned(64)));   /* [dimension pair][key] */
    uint32_t values[KEYS / 2][MAX_DIM] __attribute__((aligned(64))); /* [key pair][dimension] */
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);

    for (int64_t start = (lowest / KEYS) * KEYS; start <= last_pos; start += KEYS) {
        const int64_t n_keys = length - start < KEYS ? length - start : KEYS;
        /* repack this block's keys and values (missing keys as zeros) */
        if (n_keys == KEYS) {
            repack_keys(w, table, kv_head, start, pairs, keys);
        } else {
            for (int64_t j = 0; j < KEYS; j++) {
                const uint32_t *row = j < n_keys ? (const uint32_t *)(w->k + offset_of(w, table, kv_head, start + j)) : 0;
                for (int64_t p = 0; p < pairs; p++) keys[p][j] = row ? row[p] : 0;
            }
        }
        for (int64_t jp = 0; jp < KEYS / 2; jp++) {
            static const uint16_t missing[MAX_DIM];
            const uint16_t *a = 2 * jp < n_keys ? w->v + offset_of(w, table, kv_head, start + 2 * jp) : missing;
            const uint16_t *b = 2 * jp + 1 < n_keys ? w->v + offset_of(w, table, kv_head, start + 2 * jp + 1) : missing;
            for (int64_t d = 0; d < dim; d++) values[jp][d] = (uint32_t)a[d] | ((uint32_t)b[d] << 16);
        }
        const __m512i key_pos = _mm512_add_epi32(lane, _mm512_set1_epi32((int32_t)start));
        for (int64_t r = 0; r < rows; r += ROWS) {
            const int64_t n = rows - r < ROWS ? rows - r : ROWS;
            if (start > first_pos + (r + n - 1) / group) continue; /* the block is after all these tokens */
            row_kernels[n - 1](w, seq, kv_head, block_start, first_pos, r, start, key_pos, keys, values, acc,
                               running_max, running_sum);
        }
    }

    for (int64_t r = 0; r < rows; r++) {
        const int64_t token = r / group, head = kv_head * group + r % group;
        uint16_t *dst = w->out + ((w->query_starts[seq] + block_start + token) * w->num_q_heads + head) * dim;
        const float inv = running_sum[r] > 0.0f ? 1.0f / running_sum[r] : 0.0f;
        for (int64_t d = 0; d < dim; d++) dst[d] = float_to_bf16(acc[r][d] * inv);
    }
}
#endif

/* Returns 0, or -1 where this build or these sizes are not handled. query_starts[i]: seq i's first row of q;
   sinks: NULL, or float32 [num_q_heads], each head's sink logit (gpt-oss). */
int paged_prefill_attention(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache, uint16_t *out,
                            int64_t page_stride, int64_t slot_stride, int64_t head_stride, const int64_t *tables,
                            int64_t table_stride, const int64_t *seq_lens, const int64_t *query_starts,
                            const int64_t *query_lens, int64_t num_seqs, int64_t num_q_heads, int64_t num_kv_heads,
                            int64_t head_dim, int64_t page_size, int64_t window, float scale, const float *sinks,
                            int64_t num_threads) {
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
    if (head_dim % 32 != 0 || head_dim > MAX_DIM || num_kv_heads <= 0 || num_q_heads % num_kv_heads != 0 ||
        num_q_heads / num_kv_heads > MAX_GROUP)
        return -1;
    const Work w = {q, k_cache, v_cache, out, page_stride, slot_stride, head_stride, tables, table_stride, seq_lens,
                    query_starts, query_lens, num_q_heads, num_kv_heads, head_dim, page_size, window, scale, sinks};
    /* tasks: (sequence, KV head, block of 16 new tokens), longest (latest) blocks first */
    int64_t tasks = 0;
    for (int64_t s = 0; s < num_seqs; s++) tasks += (query_lens[s] + BLOCK - 1) / BLOCK * num_kv_heads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads) if (num_threads > 1 && tasks > 1)
    for (int64_t task = 0; task < tasks; task++) {
        int64_t t = task, s = 0;
        for (;; s++) {
            const int64_t here = (query_lens[s] + BLOCK - 1) / BLOCK * num_kv_heads;
            if (t < here) break;
            t -= here;
        }
        const int64_t blocks = (query_lens[s] + BLOCK - 1) / BLOCK;
        run_task(&w, s, t % num_kv_heads, (blocks - 1 - t / num_kv_heads) * BLOCK);
    }
    return 0;
#else
    (void)q, (void)k_cache, (void)v_cache, (void)out, (void)page_stride, (void)slot_stride, (void)head_stride;
    (void)tables, (void)table_stride, (void)seq_lens, (void)query_starts, (void)query_lens, (void)num_seqs;
    (void)num_q_heads, (void)num_kv_heads, (void)head_dim, (void)page_size, (void)window, (void)scale;
    (void)sinks, (void)num_threads;
    return -1;
#endif
}
