/* The row functions of paged_rows.h for CPUs with AVX-512 (head sizes that are multiples of 16), and the
   decode task built from them: 16-token blocks, each key and value row read once for the whole GQA group and
   the group's scores summed 16 at a time. Included by paged_decode.c (its instances) and paged_prefill_quant.c
   (a quantized prompt's tiles, whose rows run these same functions on blocks dequantized once per tile), after
   paged_rows.h. */

#include <immintrin.h>

#define KEYS16 16 /* keys per block */

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

/* Where a row's state lives on this path (paged_rows.h's Row): query head g's dims 16c .. 16c + 15 at
   [g * chunks + c] of q and acc. */
typedef struct {
    __m512 *q, *acc;
    float *running_max, *running_sum;
} RowAvx512;

/* The row's queries (of q's row `row`), scaled, and its empty accumulators; a quantized cache's (`quant`) are
   rotated in. `group` and `chunks` (head_dim / 16) are constants where these functions are inlined into an
   instance, so the loops unroll and the accumulators stay in registers. */
static inline __attribute__((always_inline)) void row_start_avx512(const Work *w, int64_t row, int64_t kv_head,
                                                                   const RowAvx512 *r, const int64_t group,
                                                                   const int64_t chunks, const int quant) {
    float rotated[MAX_DIM];
    const __m512 scale = _mm512_set1_ps(w->scale);
    for (int64_t g = 0; g < group; g++) {
        const int64_t at = head_offset(w, row, kv_head, g);
        if (quant) load_rotated(w, at, rotated);
        for (int64_t c = 0; c < chunks; c++) {
            const __m512 x = quant ? _mm512_loadu_ps(rotated + 16 * c) : load16(w->q, at + 16 * c, w->dtype);
            r->q[g * chunks + c] = _mm512_mul_ps(x, scale);
            r->acc[g * chunks + c] = _mm512_setzero_ps();
        }
        softmax_start(w, kv_head, g, &r->running_max[g], &r->running_sum[g]);
    }
}

/* A block's keys for the row (key j at k_base + at[j], j < count): the group's scores, the softmax's weights
   to `weights`, the accumulators shrunk. */
static inline __attribute__((always_inline)) void row_keys_avx512(const RowAvx512 *r, float (*weights)[KEYS16],
                                                                  const void *k_base, const int64_t *at,
                                                                  int64_t count, const int64_t group,
                                                                  const int64_t chunks, const int dtype) {
    __m512 partial[MAX_GROUP][KEYS16];
    for (int64_t j = 0; j < KEYS16; j++) {
        __m512 sums[MAX_GROUP];
#pragma GCC unroll 16
        for (int64_t g = 0; g < group; g++) sums[g] = _mm512_setzero_ps();
        if (j < count) {
#pragma GCC unroll 16
            for (int64_t c = 0; c < chunks; c++) {
                const __m512 key = load16(k_base, at[j] + 16 * c, dtype);
#pragma GCC unroll 16
                for (int64_t g = 0; g < group; g++) sums[g] = _mm512_fmadd_ps(r->q[g * chunks + c], key, sums[g]);
            }
        }
#pragma GCC unroll 16
        for (int64_t g = 0; g < group; g++) partial[g][j] = sums[g];
    }
    for (int64_t g = 0; g < group; g++) {
        _mm512_storeu_ps(weights[g], sum_lanes16(partial[g]));
        const float shrink = softmax_block(weights[g], count, &r->running_max[g], &r->running_sum[g]);
        if (shrink != 1.0f) {
            const __m512 factor = _mm512_set1_ps(shrink);
#pragma GCC unroll 16
            for (int64_t c = 0; c < chunks; c++) r->acc[g * chunks + c] = _mm512_mul_ps(r->acc[g * chunks + c], factor);
        }
    }
}

/* The block's values (value j at v_base + at[j]) into the accumulators, in token order. */
static inline __attribute__((always_inline)) void row_values_avx512(const RowAvx512 *r, float (*weights)[KEYS16],
                                                                    const void *v_base, const int64_t *at,
                                                                    int64_t count, const int64_t group,
                                                                    const int64_t chunks, const int dtype) {
    for (int64_t j = 0; j < count; j++) {
#pragma GCC unroll 16
        for (int64_t c = 0; c < chunks; c++) {
            const __m512 value = load16(v_base, at[j] + 16 * c, dtype);
#pragma GCC unroll 16
            for (int64_t g = 0; g < group; g++)
                r->acc[g * chunks + c] = _mm512_fmadd_ps(_mm512_set1_ps(weights[g][j]), value, r->acc[g * chunks + c]);
        }
    }
}

static inline __attribute__((always_inline)) void row_finish_avx512(const Work *w, int64_t row, int64_t kv_head,
                                                                    const RowAvx512 *r, const int64_t group,
                                                                    const int64_t chunks, const int quant) {
    float out[MAX_DIM];
    for (int64_t g = 0; g < group; g++) {
        for (int64_t c = 0; c < chunks; c++) _mm512_storeu_ps(out + 16 * c, r->acc[g * chunks + c]);
        const float inv = r->running_sum[g] > 0.0f ? 1.0f / r->running_sum[g] : 0.0f;
        if (quant)
            store_rotated(w, head_offset(w, row, kv_head, g), out, inv);
        else
            store_row(w->out, head_offset(w, row, kv_head, g), w->dtype, w->head_dim, out, inv);
    }
}

/* One decode task, a (row, KV head). With `quant`, a quantized cache's blocks are dequantized into `scratch`
   first and read as float32 (see paged_rows.h). */
static inline __attribute__((always_inline)) void task_avx512(const Work *w, int64_t task, const int64_t group,
                                                              const int64_t chunks, const int quant) {
    const int64_t seq = task / w->num_kv_heads, kv_head = task % w->num_kv_heads;
    const int64_t length = w->seq_lens[seq];
    const int64_t *table = w->tables + seq * w->table_stride;
    const int dtype = quant ? 0 : w->dtype; /* of the rows the loops read */

    __m512 q[MAX_GROUP * MAX_DIM / 16], acc[MAX_GROUP * MAX_DIM / 16];
    float running_max[MAX_GROUP], running_sum[MAX_GROUP];
    const RowAvx512 r = {q, acc, running_max, running_sum};
    float weights[MAX_GROUP][KEYS16], scratch[KEYS16 * MAX_DIM];
    int64_t rows[KEYS16];
    row_start_avx512(w, seq, kv_head, &r, group, chunks, quant);
    for (int64_t start = row_first(w, length); start < length; start += KEYS16) {
        const int64_t count = length - start < KEYS16 ? length - start : KEYS16;
        int64_t offsets[KEYS16];
        block_offsets(w, table, kv_head, start, count, offsets);
        const void *k_base = w->k, *v_base = w->v;
        const int64_t *at = offsets;
        if (quant) {
            dequantize_rows(w, w->k, offsets, count, scratch);
            for (int64_t j = 0; j < count; j++) rows[j] = j * w->head_dim;
            k_base = v_base = scratch;
            at = rows;
        }
        row_keys_avx512(&r, weights, k_base, at, count, group, chunks, dtype);
        if (quant) dequantize_rows(w, w->v, offsets, count, scratch);
        row_values_avx512(&r, weights, v_base, at, count, group, chunks, dtype);
    }
    row_finish_avx512(w, seq, kv_head, &r, group, chunks, quant);
}
