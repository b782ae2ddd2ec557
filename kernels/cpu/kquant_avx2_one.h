/* kquant_avx2.h's tiles for one row of x (a decode step), both halves of a 16-row tile in one pass: included
   there only, after tile_q45k and tile_q6k, whose float steps these repeat lane for lane.

   With one row of x, kquant_avx2.h's loop over halves passed over a group's tiles twice (rows 0-7, then 8-15:
   each 64-byte line holds 32 bytes of each half, so the second pass re-read every line from L2) and
   broadcast each quad of x twice. Here both halves' quads meet the same broadcast of x while their line is
   in L1. Per output row the arithmetic is the two-pass path's: the same exact integer sums, then the same
   float multiplies and multiply-adds in the same order, so a row's result does not depend on how many rows
   of x came with it (tests/kernels/cpu/test_blocks.py: each row as if alone). */

/* Q4_K or Q5_K (`five`): acc[half] lane i += output row 8 * half + i, for row `row` of x. */
static inline __attribute__((always_inline)) void tile_q45k_one(const int five, const uint8_t *t, int64_t b,
                                                                int64_t blocks, const Quantized *q, int64_t k,
                                                                int64_t row, __m256 *acc) {
    const __m256i low4 = _mm256_set1_epi8(15), sixteen = _mm256_set1_epi8(16);
    const int64_t rb = row * blocks + b;
    const int8_t *xq = q->xq + row * k + b * QK;
    const uint8_t *qs = t + qk_qs(five ? TYPE_Q5_K : TYPE_Q4_K);
    /* each sub-block's scale for both halves, made once per super-block and kept in L1: made in the loop
       below, the compiler kept them (or what makes them) live in registers and spilled the sums instead */
    __m256i scale[2][8], min_sum[2];
    for (int half = 0; half < 2; half++) {
        __m256i scales[2], mins[2];
        q45k_scales(t, half, scales, mins);
        for (int j = 0; j < 8; j++) scale[half][j] = lane_byte_x2(scales[j / 4], j % 4);
        min_sum[half] = q45k_min_sum(mins, q->xs + rb * 16);
    }
    __m256i sums[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int j = 0; j < 8; j++) { /* sub-block j: the low (even j) or high (odd j) nibbles of chunk j / 2 */
        const int c = j / 2, high = j % 2;
        __m256i pairs[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int quad = 0; quad < 8; quad++) {
            const __m256i xb = bcast4(xq + 32 * j + 4 * quad);
            for (int half = 0; half < 2; half++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 64 * (8 * c + quad) + 32 * half));
                __m256i u = _mm256_and_si256(high ? _mm256_srli_epi16(v, 4) : v, low4);
                if (five) {
                    uint32_t bits; /* this half's 32 bits of the 64-bit mask */
                    memcpy(&bits, t + QKT_MASKS + 8 * (16 * c + 8 * high + quad) + 4 * half, 4);
                    u = _mm256_add_epi8(u, _mm256_and_si256(bits_to_bytes(bits), sixteen));
                }
                pairs[half] = _mm256_add_epi16(pairs[half], _mm256_maddubs_epi16(u, xb));
            }
            if (quad % (five ? 4 : 8) == (five ? 3 : 7)) { /* as dot_quads_scaled: u <= 31 or 15 keeps int16 exact */
                for (int half = 0; half < 2; half++) {
                    sums[half] = _mm256_add_epi32(sums[half], _mm256_madd_epi16(pairs[half], scale[half][j]));
                    pairs[half] = _mm256_setzero_si256();
                }
            }
        }
    }
    for (int half = 0; half < 2; half++) {
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + QKT_D + 16 * half)));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + QKT_DMIN + 16 * half)));
        acc[half] = q45k_finish(acc[half], sums[half], min_sum[half], d, dmin, q->dx[rb]);
    }
}

static inline __attribute__((always_inline)) void tile_q6k_one(const uint8_t *t, int64_t b, int64_t blocks,
                                                               const Quantized *q, int64_t k, int64_t row, __m256 *acc) {
    const __m256i low4 = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3);
    const int64_t rb = row * blocks + b;
    const int8_t *xq = q->xq + row * k + b * QK;
    /* the 16 sub-blocks' scales for both halves and each half's q - 32 offsets (one int32 sum), made once per
       super-block, as tile_q45k_one's scales (integer sums, so the result is the same to the bit) */
    __m256i scale[2][16], offset[2];
    for (int half = 0; half < 2; half++) {
        offset[half] = _mm256_setzero_si256();
        for (int j = 0; j < 16; j += 2) {
            __m256i x2[2], pair;
            q6k_scales(t, half, j, x2, &pair);
            scale[half][j] = x2[0], scale[half][j + 1] = x2[1];
            offset[half] = _mm256_add_epi32(offset[half], q6k_offset(pair, q->xs + rb * 16 + j));
        }
    }
    __m256i sums[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int h = 0; h < 2; h++) {
        for (int s = 0; s < 4; s++) { /* values 128h + 32s + l: sub-blocks 8h + 2s and 8h + 2s + 1 */
            const int j = 8 * h + 2 * s;
            for (int part = 0; part < 2; part++) {
                for (int two = 0; two < 2; two++) { /* as dot_quads_scaled(.., 4, 2): two quads' int16 pairs, u <= 63 */
                    __m256i pairs[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
                    for (int i = 0; i < 2; i++) {
                        const int quad = 4 * part + 2 * two + i;
                        const __m256i xb = bcast4(xq + 16 * (j + part) + 4 * (2 * two + i));
                        for (int half = 0; half < 2; half++) {
                            const __m256i low = _mm256_loadu_si256((const __m256i *)(t + Q6T_QL + 64 * (16 * h + 8 * (s & 1) + quad) + 32 * half));
                            const __m256i hi = _mm256_loadu_si256((const __m256i *)(t + Q6T_QH + 64 * (8 * h + quad) + 32 * half));
                            const __m256i nibble = _mm256_and_si256(s >= 2 ? _mm256_srli_epi16(low, 4) : low, low4);
                            const __m256i u = _mm256_or_si256(nibble, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 2 * s), three), 4));
                            pairs[half] = _mm256_add_epi16(pairs[half], _mm256_maddubs_epi16(u, xb));
                        }
                    }
                    for (int half = 0; half < 2; half++)
                        sums[half] = _mm256_add_epi32(sums[half], _mm256_madd_epi16(pairs[half], scale[half][j + part]));
                }
            }
        }
    }
    const __m256 dx = _mm256_set1_ps(q->dx[rb]);
    for (int half = 0; half < 2; half++) {
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + Q6T_D + 16 * half)));
        acc[half] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sums[half], offset[half])), _mm256_mul_ps(d, dx), acc[half]);
    }
}

/* Whether group_q8_one takes `type`; the others keep kquant_avx2.h's two passes. */
static inline int one_pass(int type) { return type == TYPE_Q4_K || type == TYPE_Q5_K || type == TYPE_Q6_K; }

/* One group's tiles (16 weight rows) against row `row` of x: acc[half] lane i += output row 8 * half + i. */
static void group_q8_one(int type, const uint8_t *tiles, int64_t blocks, const Quantized *q, int64_t k, int64_t row,
                         __m256 *acc) {
    const int64_t tile_bytes = (int64_t)GROUP * block_bytes(type);
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *t = tiles + b * tile_bytes;
        for (int64_t line = 0; line < tile_bytes; line += 64) _mm_prefetch((const char *)t + PREFETCH_BYTES + line, _MM_HINT_T0);
        switch (type) {
        case TYPE_Q4_K: tile_q45k_one(0, t, b, blocks, q, k, row, acc); break;
        case TYPE_Q5_K: tile_q45k_one(1, t, b, blocks, q, k, row, acc); break;
        default: tile_q6k_one(t, b, blocks, q, k, row, acc); break;
        }
    }
}
