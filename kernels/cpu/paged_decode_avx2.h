/* The row functions of paged_rows.h for CPUs with AVX2 and FMA but no AVX-512 (most laptops):
   paged_decode_avx512.h's plan in 8 float lanes, float32 throughout, and the decode task built from them.
   Included by paged_decode.c (its instances) and paged_prefill_quant.c (a quantized prompt's tiles, whose rows
   run these same functions on blocks dequantized once per tile), after paged_rows.h.

   A row's arithmetic depends on its own query, length and window only: blocks start at its first visible key,
   the dot-product chains and the lane sums have a fixed order, and nothing is shared with other rows or
   threads. So a token gets the same bits alone, in a 512-row prompt, or beside other sequences. (Over a
   bfloat16 cache rows stay apart: sharing a prompt's keys between its rows would save loads and the widening
   below, not the multiply-adds, which are most of the time. A quantized block costs about as much to
   dequantize as one row's multiply-adds over it, so there a prompt's rows share it.)

   Where the time went, and why the loops look as they do (Zen 3, 9 query heads over 3 KV heads, dim 64):
   - AVX2 has 16 registers. Accumulators that spill turn each multiply-add chain into a store and a reload,
     so at_once keeps 8 to 12 chains live, and the softmax's shrink is applied to the accumulators in
     memory (the group's broadcast factors, held across the value loop, spilled them).
   - 64-key blocks: the softmax (lane sums, exp8) costs about a third of the multiply-adds per key, and
     with 16-key blocks its latency was exposed every 16 keys; 128 gained nothing more.
   - bfloat16 rows are widened 16 at a time by interleaving with zeros (one operation per 8 values, not a
     zero-extend and a shift), which leaves dims 0-3 and 8-11 in one vector and 4-7 and 12-15 in the
     other. The query and the accumulators use the same order, so dot products need no reordering;
     store_avx2 puts the dims back. A head size that is an odd number of 8s widens its last 8 the plain way.
   - float32 rows (a quantized cache's, dequantized): GCC folded each key's load into every multiply-add of the
     group as a memory operand, and the loops waited on loads; in_register keeps one load per row slice. */

#include <immintrin.h>

#define TOKENS 64 /* per softmax block: up to 8 vectors of scores (16 left the softmax's latency exposed) */

/* Dims 8c .. 8c + 7 of the row at `offset` (in the order above for bf16 pairs), as floats. */
static inline __m256 load8(const void *base, int64_t offset, int64_t c, int64_t chunks, int dtype) {
    if (dtype == 0) return _mm256_loadu_ps((const float *)base + offset + 8 * c);
    const uint16_t *row = (const uint16_t *)base + offset;
    if (c < (chunks & ~(int64_t)1)) {
        const __m256i pair = _mm256_loadu_si256((const __m256i *)(row + 16 * (c >> 1))), zero = _mm256_setzero_si256();
        return _mm256_castsi256_ps(c & 1 ? _mm256_unpackhi_epi16(zero, pair) : _mm256_unpacklo_epi16(zero, pair));
    }
    const __m128i half = _mm_loadu_si128((const __m128i *)(row + 8 * c));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

/* r[j] = the sum of the 8 lanes of a[j], by a transpose-and-add tree (sum_lanes16's, one level less). */
static inline __m256 sum_lanes8(const __m256 *a) {
    __m256 pairs[4], quads[2];
    for (int i = 0; i < 4; i++)
        pairs[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 2; i++) {
        const __m256d lo = _mm256_castps_pd(pairs[2 * i]), hi = _mm256_castps_pd(pairs[2 * i + 1]);
        quads[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(lo, hi)), _mm256_castpd_ps(_mm256_unpackhi_pd(lo, hi)));
    }
    /* quads[i]: per 128-bit half, that half's sums of a[4i] .. a[4i + 3] */
    return _mm256_add_ps(_mm256_permute2f128_ps(quads[0], quads[1], 0x20), _mm256_permute2f128_ps(quads[0], quads[1], 0x31));
}

/* exp_poly in 8 lanes, operation for operation (no fused multiply-adds, as the scalar one is compiled under
   -std=c11), so each lane equals exp_poly of it to the bit. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 shifter = _mm256_set1_ps(12582912.0f);
    const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), shifter), shifter);
    const __m256 r = _mm256_add_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f))),
                                   _mm256_mul_ps(n, _mm256_set1_ps(2.12194440e-4f)));
    __m256 p = _mm256_set1_ps(EXP_P0);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(EXP_P1));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(EXP_P2));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(EXP_P3));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(EXP_P4));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(EXP_P5));
    p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.0f));
    const __m256i whole = _mm256_cvttps_epi32(n), half = _mm256_srai_epi32(whole, 1), bias = _mm256_set1_epi32(127);
    const __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
    const __m256 b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(whole, half), bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, a), b);
}

static inline float max_lanes8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

static inline float add_lanes8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* softmax_block on a block's raw scores (lanes from `count` on are ignored): the weights, zero past
   `count`, go to `weights`; returns the factor the earlier accumulation must shrink by. Not inlined, as
   store_avx2: inlined into the instances below, they make the bfloat16 instances slower. */
static __attribute__((noinline)) float softmax_avx2(const __m256 *scores, int64_t count, float *running_max,
                                                    float *running_sum, float *weights) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int64_t vectors = (count + 7) / 8;
    __m256 valid[TOKENS / 8], top = _mm256_set1_ps(-INFINITY);
    for (int b = 0; b < vectors; b++) {
        valid[b] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)count - 8 * b), lane));
        top = _mm256_max_ps(top, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), scores[b], valid[b]));
    }
    const float block_max = max_lanes8(top);
    const float new_max = block_max > *running_max ? block_max : *running_max;
    const float shrink = *running_max == -INFINITY ? 0.0f : exp_poly(*running_max - new_max);
    __m256 sum = _mm256_setzero_ps();
    for (int b = 0; b < vectors; b++) {
        const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(scores[b], _mm256_set1_ps(new_max))), valid[b]);
        _mm256_storeu_ps(weights + 8 * b, e);
        sum = _mm256_add_ps(sum, e);
    }
    *running_sum = *running_sum * shrink + add_lanes8(sum);
    *running_max = new_max;
    return shrink;
}

/* The accumulator row in the dims' own order, then store_row's scaling and rounding. */
static __attribute__((noinline)) void store_avx2(const Work *w, int64_t offset, const __m256 *acc, int64_t chunks,
                                                 int dtype, float inv) {
    float row[MAX_DIM];
    for (int64_t c = 0; c < chunks; c++) {
        if (dtype == 1 && c < (chunks & ~(int64_t)1)) {
            const __m256 v = (c & 1) ? _mm256_permute2f128_ps(acc[c - 1], acc[c], 0x31)
                                     : _mm256_permute2f128_ps(acc[c], acc[c + 1], 0x20);
            _mm256_storeu_ps(row + 8 * c, v);
        } else {
            _mm256_storeu_ps(row + 8 * c, acc[c]);
        }
    }
    store_row(w->out, offset, dtype, w->head_dim, row, inv);
}

/* How many keys' dot products (per step of the score loop), and how many 8-dim slices of the accumulators (per
   pass over a block's values), are worked on at once: the same count serves both, enough independent chains
   of fused multiply-adds (8 to 12 with the group's query heads) to hide their latency, few enough to stay in
   AVX2's 16 registers. It changes no chain, only how many run side by side. */
static inline int64_t at_once(int64_t group) { return group == 1 ? 8 : group == 2 ? 4 : group <= 4 ? 2 : 1; }

/* Where a row's state lives on this path (paged_rows.h's Row): query head g's dims 8c .. 8c + 7 at
   [g * chunks + c] of q and acc. */
typedef struct {
    __m256 *q, *acc;
    float *running_max, *running_sum;
} RowAvx2;

/* The row's queries (of q's row `row`), scaled, and its empty accumulators. A quantized cache's (`quant`) are
   rotated in. `group`, `chunks` (head_dim / 8) and `dtype` are constants where the functions below are inlined
   into an instance, so their loops unroll. */
static inline __attribute__((always_inline)) void row_start_avx2(const Work *w, int64_t row, int64_t kv_head,
                                                                 const RowAvx2 *r, const int64_t group,
                                                                 const int64_t chunks, const int dtype,
                                                                 const int quant) {
    float rotated[MAX_DIM];
    const __m256 scale = _mm256_set1_ps(w->scale);
    for (int64_t g = 0; g < group; g++) {
        const int64_t at = head_offset(w, row, kv_head, g);
        if (quant) load_rotated(w, at, rotated);
        for (int64_t c = 0; c < chunks; c++) {
            const __m256 x = quant ? _mm256_loadu_ps(rotated + 8 * c) : load8(w->q, at, c, chunks, dtype);
            r->q[g * chunks + c] = _mm256_mul_ps(x, scale);
            r->acc[g * chunks + c] = _mm256_setzero_ps();
        }
        softmax_start(w, kv_head, g, &r->running_max[g], &r->running_sum[g]);
    }
}

/* x kept in a register: GCC otherwise folds a row read once and used by the group's multiply-adds into each of
   them as a memory operand, a load per use, which left the float32 loops waiting on loads. No value changes. */
static inline __m256 in_register(__m256 x) {
    __asm__("" : "+x"(x));
    return x;
}

/* Scores of the block's keys j_from .. j_to - 1 for the row (j_from a multiple of 8, j_to at most the block's
   count): per query head and key one chain of fused multiply-adds over the dims, its 8 lanes summed by
   sum_lanes8 once 8 keys are done, into scores[g][j / 8]. Key j is the row at k_base + at[j]; `at` has TOKENS
   entries, those past the count repeating the last key, which a last step past j_to reads; their lanes (and
   those no step reached) hold values the softmax masks. */
static inline __attribute__((always_inline)) void row_dots_avx2(const RowAvx2 *r, __m256 (*scores)[TOKENS / 8],
                                                                const void *k_base, const int64_t *at,
                                                                int64_t j_from, int64_t j_to, const int64_t group,
                                                                const int64_t chunks, const int dtype) {
    const int64_t keys = at_once(group);
    __m256 partial[MAX_GROUP][8];
    for (int64_t g = 0; g < group; g++)
        for (int64_t j = 0; j < 8; j++) partial[g][j] = _mm256_setzero_ps();
    for (int64_t j8 = j_from; j8 < j_to; j8 += 8) {
        for (int64_t j0 = j8; j0 < j8 + 8 && j0 < j_to; j0 += keys) {
            __m256 sums[8][MAX_GROUP];
#pragma GCC unroll 8
            for (int64_t t = 0; t < keys; t++)
#pragma GCC unroll 16
                for (int64_t g = 0; g < group; g++) sums[t][g] = _mm256_setzero_ps();
#pragma GCC unroll 32
            for (int64_t c = 0; c < chunks; c++) {
#pragma GCC unroll 8
                for (int64_t t = 0; t < keys; t++) {
                    const __m256 key = in_register(load8(k_base, at[j0 + t], c, chunks, dtype));
#pragma GCC unroll 16
                    for (int64_t g = 0; g < group; g++)
                        sums[t][g] = _mm256_fmadd_ps(r->q[g * chunks + c], key, sums[t][g]);
                }
            }
#pragma GCC unroll 8
            for (int64_t t = 0; t < keys; t++)
#pragma GCC unroll 16
                for (int64_t g = 0; g < group; g++) partial[g][j0 - j8 + t] = sums[t][g];
        }
        for (int64_t g = 0; g < group; g++) scores[g][j8 / 8] = sum_lanes8(partial[g]);
    }
}

/* The online softmax of the block's `count` scores for each query head: the weights to `weights`, the
   accumulators shrunk. */
static inline __attribute__((always_inline)) void row_softmax_avx2(const RowAvx2 *r, __m256 (*scores)[TOKENS / 8],
                                                                   float (*weights)[TOKENS], int64_t count,
                                                                   const int64_t group, const int64_t chunks) {
    for (int64_t g = 0; g < group; g++) {
        const float shrink = softmax_avx2(scores[g], count, &r->running_max[g], &r->running_sum[g], weights[g]);
        /* here rather than as the accumulators are loaded below, where the group's factors took registers */
        const __m256 factor = _mm256_set1_ps(shrink);
#pragma GCC unroll 32
        for (int64_t c = 0; c < chunks; c++) r->acc[g * chunks + c] = _mm256_mul_ps(r->acc[g * chunks + c], factor);
    }
}

/* The block's values (value j at v_base + at[j]) into the accumulators' 8-dim slices c_from .. c_to - 1, each
   slice fed in token order. */
static inline __attribute__((always_inline)) void row_values_avx2(const RowAvx2 *r, float (*weights)[TOKENS],
                                                                  const void *v_base, const int64_t *at,
                                                                  int64_t count, const int64_t c_from,
                                                                  const int64_t c_to, const int64_t group,
                                                                  const int64_t chunks, const int dtype) {
    const int64_t slices = at_once(group);
#pragma GCC unroll 32
    for (int64_t c0 = c_from; c0 < c_to; c0 += slices) {
        const int64_t width = c_to - c0 < slices ? c_to - c0 : slices;
        __m256 sums[8][MAX_GROUP];
#pragma GCC unroll 8
        for (int64_t s = 0; s < width; s++)
#pragma GCC unroll 16
            for (int64_t g = 0; g < group; g++) sums[s][g] = r->acc[g * chunks + c0 + s];
        for (int64_t j = 0; j < count; j++) {
#pragma GCC unroll 8
            for (int64_t s = 0; s < width; s++) {
                const __m256 value = in_register(load8(v_base, at[j], c0 + s, chunks, dtype));
#pragma GCC unroll 16
                for (int64_t g = 0; g < group; g++)
                    sums[s][g] = _mm256_fmadd_ps(_mm256_broadcast_ss(&weights[g][j]), value, sums[s][g]);
            }
        }
#pragma GCC unroll 8
        for (int64_t s = 0; s < width; s++)
#pragma GCC unroll 16
            for (int64_t g = 0; g < group; g++) r->acc[g * chunks + c0 + s] = sums[s][g];
    }
}

/* The row's output: accumulators over their sums, rotated back for a quantized cache, rounded to out's type. */
static inline __attribute__((always_inline)) void row_finish_avx2(const Work *w, int64_t row, int64_t kv_head,
                                                                  const RowAvx2 *r, const int64_t group,
                                                                  const int64_t chunks, const int dtype,
                                                                  const int quant) {
    for (int64_t g = 0; g < group; g++) {
        const float inv = r->running_sum[g] > 0.0f ? 1.0f / r->running_sum[g] : 0.0f;
        const int64_t at = head_offset(w, row, kv_head, g);
        if (quant) {
            float out[MAX_DIM];
            for (int64_t c = 0; c < chunks; c++) _mm256_storeu_ps(out + 8 * c, r->acc[g * chunks + c]);
            store_rotated(w, at, out, inv);
        } else {
            store_avx2(w, at, r->acc + g * chunks, chunks, dtype, inv);
        }
    }
}

/* One decode task, a (row, KV head), in TOKENS-token blocks: each key and value row is read once for the whole
   GQA group. The float32 instances serve quantized caches too (`quant`, one branch a block, which measured
   free): the block's keys and then its values are dequantized into `scratch` (64 rows: 16 KiB at head_dim 64,
   in L1) and read from there as float32 rows; q is rotated in and the output rotated back (see paged_rows.h). */
static inline __attribute__((always_inline)) void task_avx2(const Work *w, int64_t task, const int64_t group,
                                                            const int64_t chunks, const int dtype) {
    const int quant = dtype == 0 && w->bits != 0;
    const int64_t seq = task / w->num_kv_heads, kv_head = task % w->num_kv_heads;
    const int64_t length = w->seq_lens[seq];
    const int64_t *table = w->tables + seq * w->table_stride;

    __m256 q[MAX_GROUP * MAX_DIM / 8], acc[MAX_GROUP * MAX_DIM / 8], scores[MAX_GROUP][TOKENS / 8];
    float running_max[MAX_GROUP], running_sum[MAX_GROUP];
    const RowAvx2 r = {q, acc, running_max, running_sum};
    float weights[MAX_GROUP][TOKENS] __attribute__((aligned(32)));
    float scratch[TOKENS * MAX_DIM] __attribute__((aligned(32)));
    int64_t rows[TOKENS];
    row_start_avx2(w, seq, kv_head, &r, group, chunks, dtype, quant);

    for (int64_t start = row_first(w, length); start < length; start += TOKENS) {
        const int64_t count = length - start < TOKENS ? length - start : TOKENS;
        int64_t offsets[TOKENS];
        block_offsets(w, table, kv_head, start, count, offsets);
        for (int64_t j = count; j < TOKENS; j++) offsets[j] = offsets[count - 1];
        const void *k_base = w->k, *v_base = w->v;
        const int64_t *at = offsets;
        if (quant) {
            dequantize_rows(w, w->k, offsets, count, scratch);
            for (int64_t j = 0; j < TOKENS; j++) rows[j] = (j < count ? j : count - 1) * w->head_dim;
            k_base = v_base = scratch;
            at = rows;
        }
        row_dots_avx2(&r, scores, k_base, at, 0, count, group, chunks, dtype);
        row_softmax_avx2(&r, scores, weights, count, group, chunks);
        if (quant) dequantize_rows(w, w->v, offsets, count, scratch);
        row_values_avx2(&r, weights, v_base, at, count, 0, chunks, group, chunks, dtype);
    }
    row_finish_avx2(w, seq, kv_head, &r, group, chunks, dtype, quant);
}
