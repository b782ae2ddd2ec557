/* kquant_matmul.c's 8-bit path for CPUs with AVX2 but without AVX-512 (most laptops): included there only,
   after its field offsets, KVALUES_U8 and qk_qs.

   The AVX512-VNNI path's computation: x quantized per 256 values to int8 (the same rounding) with the same
   sums of xq per sub-block and the same exact int32 sum per sub-block and weight row. For Q2_K, Q3_K and
   IQ4_XS the float multiplies and multiply-adds follow in the same order, so the outputs are the same to
   the bit; Q4_K, Q5_K and Q6_K scale their sub-blocks in int32 instead (see dot_quads_scaled), within
   rounding of the VNNI path's. The integer sums are formed otherwise, since AVX2 has no vpdpbusd: vpmaddubsw multiplies unsigned weight bytes by signed x bytes into
   int16 pairs and vpmaddwd adds the pairs into int32. The pairs must not saturate, so Q2_K to Q6_K (u <= 63)
   go in as they are, while IQ4_XS (its levels plus 128, up to 241) goes in as its signed levels s = u - 128
   (|s| * sign(x) per byte), whose sum s . xq is exactly the VNNI path's u . xq - 128 * sum(xq). A 256-bit
   register holds 8 weight rows, so each 16-row tile is two halves: rows 0-7 are the first 32 bytes of each
   64-byte quad, rows 8-15 the second (and the first 8 of its 16 scales). */

#include "avx2_bytes.h"

#define MAX_ROWS 8     /* rows of x sharing one unpacked tile */

typedef struct {
    int8_t *xq;  /* [rows, k] */
    float *dx;   /* [rows, blocks] */
    int32_t *xs; /* [rows, blocks, 16]: sum of xq per sub-block (8 of 32 or 16 of 16, as the type's scales) */
} Quantized;

static void quantize_rows(int type, const uint16_t *x, int64_t x_stride, int64_t rows, int64_t k, Quantized *q,
                          int64_t num_threads) {
    const int64_t blocks = k / QK;
    const int sub = sub_block(type);
    /* by rows over the threads: on one thread a prompt's quantization would leave the others waiting */
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && rows > 1 && rows * k >= 65536)
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < blocks; b++) {
            const uint16_t *xb = x + r * x_stride + b * QK;
            /* divide, then round to nearest even and saturate: as the AVX-512 path does */
            const float dx = bf16_amax(xb, QK) / 127.0f;
            int8_t *xq = q->xq + r * k + b * QK;
            bf16_to_int8(xb, QK, dx, xq);
            int32_t *xs = q->xs + (r * blocks + b) * 16;
            for (int j = 0; j < QK / sub; j++) {
                int32_t total = 0;
                for (int i = 0; i < sub; i++) total += xq[sub * j + i];
                xs[j] = total;
            }
            q->dx[r * blocks + b] = dx;
        }
    }
}

/* Byte `i` (0..3) of each 32-bit lane, as float. */
static inline __m256 lane_byte(__m256i v, int i) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 8 * i), _mm256_set1_epi32(0xff)));
}

/* The sums for Q4_K, Q5_K and Q6_K, unlike the VNNI path: each sub-block's int16 pairs meet its 6- or 8-bit
   scale in vpmaddwd (the scale in both int16 halves of the row's lane), so a super-block's scaled sums and its
   mins (or Q6_K's offsets) are exact int32, and each takes one float multiply-add per super-block where the
   VNNI path takes one per sub-block (as llama.cpp's AVX2 dot products do): AVX2 has no int8 dot product, so
   float steps per sub-block would cost more than the integer ones they save. The bounds: Q4_K/Q5_K |sum| <=
   8 sub-blocks * 32 * 31 * 128 * 63 = 64M, Q6_K <= 16 * 16 * 63 * 128 * 128 + 32 * 16 * 128 * 2048 < 2^31. */

/* vpshufb controls (added to byte i): byte i of each 32-bit lane into both int16 halves (X2), or bytes i and
   i + 1 into the low and high int16 (PAIR); 0x80 and up write zero. */
static inline __m256i lane_x2_control(int i) {
    return _mm256_add_epi8(_mm256_setr_epi8(0, -128, 0, -128, 4, -128, 4, -128, 8, -128, 8, -128, 12, -128, 12, -128,
                                            0, -128, 0, -128, 4, -128, 4, -128, 8, -128, 8, -128, 12, -128, 12, -128),
                           _mm256_set1_epi8((char)i));
}
static inline __m256i lane_pair_control(int i) {
    return _mm256_add_epi8(_mm256_setr_epi8(0, -128, 1, -128, 4, -128, 5, -128, 8, -128, 9, -128, 12, -128, 13, -128,
                                            0, -128, 1, -128, 4, -128, 5, -128, 8, -128, 9, -128, 12, -128, 13, -128),
                           _mm256_set1_epi8((char)i));
}

/* Unsigned byte i (0..3) of each 32-bit lane in both of its int16 halves. */
static inline __m256i lane_byte_x2(__m256i v, int i) { return _mm256_shuffle_epi8(v, lane_x2_control(i)); }

/* Unsigned bytes i and i + 1 (i = 0 or 2) of each 32-bit lane as its low and high int16. */
static inline __m256i lane_byte_pair(__m256i v, int i) { return _mm256_shuffle_epi8(v, lane_pair_control(i)); }

/* Signed int32 lanes a and b as int16 pairs (a low, b high); both fit int16. */
static inline __m256i int16_pair(__m256i a, __m256i b) {
    return _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(b, 16));
}

/* xs[0] and xs[1] (sub-block sums of xq, |xs| <= 32 * 128) as one int16 pair, in every lane. */
static inline __m256i xs_pair(const int32_t *xs) {
    return _mm256_set1_epi32((int32_t)(((uint32_t)xs[1] << 16) | (uint16_t)xs[0]));
}

/* A Q4_K/Q5_K half tile's 6-bit scales and mins: bytes j % 4 of scales[j / 4] and mins[j / 4] per row lane. */
static inline void q45k_scales(const uint8_t *t, int half, __m256i *scales, __m256i *mins) {
    const uint8_t *s = t + QKT_SCALES + 32 * half;
    const __m256i w0 = _mm256_loadu_si256((const __m256i *)s), w1 = _mm256_loadu_si256((const __m256i *)(s + 64)),
                  w2 = _mm256_loadu_si256((const __m256i *)(s + 128));
    const __m256i m6 = _mm256_set1_epi32(0x3f3f3f3f), m4 = _mm256_set1_epi32(0x0f0f0f0f), m2 = _mm256_set1_epi32(0x03030303);
    scales[0] = _mm256_and_si256(w0, m6);
    scales[1] = _mm256_or_si256(_mm256_and_si256(w2, m4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w0, 6), m2), 4));
    mins[0] = _mm256_and_si256(w1, m6);
    mins[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), m4),
                              _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w1, 6), m2), 4));
}

/* sum over the 8 sub-blocks of min_j * xs_j per row lane (exact: <= 8 * 63 * 4096). */
static inline __m256i q45k_min_sum(const __m256i *mins, const int32_t *xs) {
    __m256i sum = _mm256_madd_epi16(lane_byte_pair(mins[0], 0), xs_pair(xs));
    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(lane_byte_pair(mins[0], 2), xs_pair(xs + 2)));
    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(lane_byte_pair(mins[1], 0), xs_pair(xs + 4)));
    return _mm256_add_epi32(sum, _mm256_madd_epi16(lane_byte_pair(mins[1], 2), xs_pair(xs + 6)));
}

/* A Q4_K/Q5_K super-block's two float steps, the same in tile_q45k and tile_q45k_one: d * dx * sum of the scaled
   sub-block sums, less dmin * dx * sum of min * xs. */
static inline __m256 q45k_finish(__m256 acc, __m256i sum, __m256i min_sum, __m256 d, __m256 dmin, float dx) {
    const __m256 x = _mm256_set1_ps(dx);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, x), acc);
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(min_sum), _mm256_mul_ps(dmin, x), acc);
}

/* Q4_K or Q5_K (`five`): one half of a tile against rows first .. first + rows - 1 of x; acc[r] lane i +=
   output row 8 * half + i. */
static inline __attribute__((always_inline)) void tile_q45k(const int five, const uint8_t *t, int half, int64_t b,
                                                            int64_t blocks, const Quantized *q, int64_t k,
                                                            int64_t first, int64_t rows, __m256 *acc) {
    const __m256i low4 = _mm256_set1_epi8(15), sixteen = _mm256_set1_epi8(16);
    __m256i scales[2], mins[2], sums[MAX_ROWS];
    q45k_scales(t, half, scales, mins);
    const uint8_t *qs = t + qk_qs(five ? TYPE_Q5_K : TYPE_Q4_K) + 32 * half;
    for (int64_t r = 0; r < rows; r++) sums[r] = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) { /* sub-block j: the low (even j) or high (odd j) nibbles of chunk j / 2 */
        const int c = j / 2, high = j % 2;
        __m256i u[8];
        for (int quad = 0; quad < 8; quad++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 64 * (8 * c + quad)));
            u[quad] = _mm256_and_si256(high ? _mm256_srli_epi16(v, 4) : v, low4);
            if (five) {
                uint32_t bits; /* this half's 32 bits of the 64-bit mask */
                memcpy(&bits, t + QKT_MASKS + 8 * (16 * c + 8 * high + quad) + 4 * half, 4);
                u[quad] = _mm256_add_epi8(u[quad], _mm256_and_si256(bits_to_bytes(bits), sixteen));
            }
        }
        const __m256i scale = lane_byte_x2(scales[j / 4], j % 4);
        for (int64_t r = 0; r < rows; r++) {
            const int8_t *xq = q->xq + (first + r) * k + b * QK + 32 * j;
            sums[r] = _mm256_add_epi32(sums[r], dot_quads_scaled(u, xq, 8, five ? 4 : 8, scale)); /* u <= 31 or 15 */
        }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + QKT_D + 16 * half)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + QKT_DMIN + 16 * half)));
    for (int64_t r = 0; r < rows; r++) {
        const int64_t rb = (first + r) * blocks + b;
        acc[r] = q45k_finish(acc[r], sums[r], q45k_min_sum(mins, q->xs + rb * 16), d, dmin, q->dx[rb]);
    }
}

/* Q6_K sub-blocks j and j + 1's signed 8-bit scales for one half: each in both int16 halves (x2[0], x2[1]),
   and the two as one pair (j low, j + 1 high) for the offsets. */
static inline void q6k_scales(const uint8_t *t, int half, int j, __m256i *x2, __m256i *pair) {
    const __m256i a = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(t + Q6T_SCALES + 16 * j + 8 * half)));
    const __m256i b = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(t + Q6T_SCALES + 16 * (j + 1) + 8 * half)));
    x2[0] = int16_pair(a, a);
    x2[1] = int16_pair(b, b);
    *pair = int16_pair(a, b);
}

/* q - 32 for Q6_K: 32 * (scale_j * xs_j + scale_j+1 * xs_j+1) comes off each pair of sub-blocks in int32. */
static inline __m256i q6k_offset(__m256i pair, const int32_t *xs) {
    return _mm256_slli_epi32(_mm256_madd_epi16(pair, xs_pair(xs)), 5);
}

static inline __attribute__((always_inline)) void tile_q6k(const uint8_t *t, int half, int64_t b, int64_t blocks,
                                                           const Quantized *q, int64_t k, int64_t first,
                                                           int64_t rows, __m256 *acc) {
    const __m256i low4 = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3);
    __m256i sums[MAX_ROWS];
    for (int64_t r = 0; r < rows; r++) sums[r] = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        for (int s = 0; s < 4; s++) { /* values 128h + 32s + l: sub-blocks 8h + 2s and 8h + 2s + 1 */
            __m256i u[8];
            for (int quad = 0; quad < 8; quad++) {
                const __m256i low = _mm256_loadu_si256((const __m256i *)(t + Q6T_QL + 64 * (16 * h + 8 * (s & 1) + quad) + 32 * half));
                const __m256i high = _mm256_loadu_si256((const __m256i *)(t + Q6T_QH + 64 * (8 * h + quad) + 32 * half));
                const __m256i nibble = _mm256_and_si256(s >= 2 ? _mm256_srli_epi16(low, 4) : low, low4);
                u[quad] = _mm256_or_si256(nibble, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high, 2 * s), three), 4));
            }
            const int j = 8 * h + 2 * s;
            __m256i x2[2], pair;
            q6k_scales(t, half, j, x2, &pair);
            for (int64_t r = 0; r < rows; r++) {
                const int64_t row = first + r, rb = row * blocks + b;
                const int8_t *xq = q->xq + row * k + b * QK + 16 * j;
                /* u <= 63: two quads' int16 pairs at a time */
                const __m256i dot = _mm256_add_epi32(dot_quads_scaled(u, xq, 4, 2, x2[0]), dot_quads_scaled(u + 4, xq + 16, 4, 2, x2[1]));
                sums[r] = _mm256_add_epi32(sums[r], _mm256_sub_epi32(dot, q6k_offset(pair, q->xs + rb * 16 + j)));
            }
        }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + Q6T_D + 16 * half)));
    for (int64_t r = 0; r < rows; r++) {
        const __m256 dx = _mm256_set1_ps(q->dx[(first + r) * blocks + b]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), _mm256_mul_ps(d, dx), acc[r]);
    }
}

/* Q2_K or Q3_K (`three`), as tile_q45k. */
static inline __attribute__((always_inline)) void tile_q23k(const int three, const uint8_t *t, int half, int64_t b,
                                                            int64_t blocks, const Quantized *q, int64_t k,
                                                            int64_t first, int64_t rows, __m256 *acc) {
    const __m256i two_bits = _mm256_set1_epi8(3), one_bit = _mm256_set1_epi8(1);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + 16 * half))); /* Q2T_D == Q3T_D == 0 */
    __m256 dmin = _mm256_setzero_ps(), minus[MAX_ROWS];
    __m256i scales[4]; /* Q3_K: scale j is byte j % 4 of lane word j / 4 */
    if (three) {
        const uint8_t *sc = t + Q3T_SCALES + 32 * half;
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)sc), w1 = _mm256_loadu_si256((const __m256i *)(sc + 64)),
                      w2 = _mm256_loadu_si256((const __m256i *)(sc + 128));
        const __m256i m4 = _mm256_set1_epi32(0x0f0f0f0f), m2 = _mm256_set1_epi32(0x03030303);
        const __m256i low[4] = {_mm256_and_si256(w0, m4), _mm256_and_si256(w1, m4),
                                _mm256_and_si256(_mm256_srli_epi32(w0, 4), m4), _mm256_and_si256(_mm256_srli_epi32(w1, 4), m4)};
        for (int i = 0; i < 4; i++)
            scales[i] = _mm256_or_si256(low[i], _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w2, 2 * i), m2), 4));
    } else {
        dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + Q2T_DMIN + 16 * half)));
        for (int64_t r = 0; r < rows; r++) minus[r] = _mm256_setzero_ps();
    }
    const uint8_t *qs = t + (three ? Q3T_QS : Q2T_QS) + 32 * half;
    for (int h = 0; h < 2; h++) {
        for (int s = 0; s < 4; s++) {
            __m256i u[8];
            for (int quad = 0; quad < 8; quad++) {
                u[quad] = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(qs + 64 * (8 * h + quad))), 2 * s), two_bits);
                if (three) {
                    const __m256i hm = _mm256_loadu_si256((const __m256i *)(t + Q3T_HMASK + 64 * quad + 32 * half));
                    u[quad] = _mm256_or_si256(u[quad], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + s), one_bit), 2));
                }
            }
            for (int part = 0; part < 2; part++) { /* the VNNI path's `half`: which of the two sub-blocks */
                const int j = 8 * h + 2 * s + part;
                __m256 scale, min = _mm256_setzero_ps();
                if (three) {
                    scale = _mm256_mul_ps(d, _mm256_sub_ps(lane_byte(scales[j / 4], j % 4), _mm256_set1_ps(32.0f)));
                } else {
                    const __m256i sm = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(t + Q2T_SCALES + 16 * j + 8 * half)));
                    scale = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(sm, _mm256_set1_epi32(15))));
                    min = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_srli_epi32(sm, 4)));
                }
                for (int64_t r = 0; r < rows; r++) {
                    const int64_t row = first + r, rb = row * blocks + b;
                    __m256i dot = dot_quads(u + 4 * part, q->xq + row * k + b * QK + 16 * j, 4, 4); /* u <= 7 */
                    if (three) dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(4 * q->xs[rb * 16 + j])); /* q - 4 */
                    const __m256 dx = _mm256_set1_ps(q->dx[rb]);
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scale, dx), acc[r]);
                    if (!three) minus[r] = _mm256_fmadd_ps(min, _mm256_set1_ps(q->dx[rb] * (float)q->xs[rb * 16 + j]), minus[r]);
                }
            }
        }
    }
    if (!three)
        for (int64_t r = 0; r < rows; r++) acc[r] = _mm256_sub_ps(acc[r], minus[r]);
}

static inline __attribute__((always_inline)) void tile_iq4xs(const uint8_t *t, int half, int64_t b, int64_t blocks,
                                                             const Quantized *q, int64_t k, int64_t first,
                                                             int64_t rows, __m256 *acc) {
    const __m256i low4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    /* the signed levels (KVALUES_U8 - 128): vpmaddubsw would saturate on the unsigned ones (up to 241) */
    const __m256i table = _mm256_xor_si256(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)KVALUES_U8)),
                                           _mm256_set1_epi8((char)0x80));
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + IXT_D + 16 * half)));
    const __m256i high = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(t + IXT_SCALES_H + 16 * half)));
    const __m256i low = _mm256_loadu_si256((const __m256i *)(t + IXT_SCALES_L + 32 * half));
    for (int j = 0; j < 8; j++) {
        __m256i sign[8], u[8]; /* the levels s and |s| */
        for (int quad = 0; quad < 4; quad++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(t + IXT_QS + 64 * (4 * j + quad) + 32 * half));
            sign[quad] = _mm256_shuffle_epi8(table, _mm256_and_si256(v, low4));
            sign[quad + 4] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
        }
        for (int quad = 0; quad < 8; quad++) u[quad] = _mm256_abs_epi8(sign[quad]);
        const __m256i ls = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(low, 4 * j), _mm256_set1_epi32(15)),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(high, 2 * j), _mm256_set1_epi32(3)), 4));
        const __m256 scale = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32))));
        for (int64_t r = 0; r < rows; r++) {
            const int64_t row = first + r, rb = row * blocks + b;
            const int8_t *xq = q->xq + row * k + b * QK + 32 * j;
            /* s . xq: the VNNI path's u . xq less 128 * the sub-block's sum of xq (|s| <= 127; xq is -128, which
               vpsignb cannot negate, only where x held a NaN or an infinity) */
            __m256i dot = _mm256_setzero_si256();
            for (int quad = 0; quad < 8; quad++) {
                const __m256i signed_x = _mm256_sign_epi8(bcast4(xq + 4 * quad), sign[quad]);
                dot = _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(u[quad], signed_x), ones));
                KEEP_IN_REGISTER(dot);
            }
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scale, _mm256_set1_ps(q->dx[rb])), acc[r]);
        }
    }
}

#include "kquant_avx2_one.h"

/* One half (8 weight rows) of one group's tiles: acc[r] lane i += output row 8 * half + i. */
static void group_q8(int type, const uint8_t *tiles, int half, int64_t blocks, const Quantized *q, int64_t k,
                     int64_t first, int64_t rows, __m256 *acc) {
    const int64_t tile_bytes = (int64_t)GROUP * block_bytes(type);
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *t = tiles + b * tile_bytes;
        /* see PREFETCH_BYTES; prefetches past the end never fault */
        for (int64_t line = 0; line < tile_bytes; line += 64) _mm_prefetch((const char *)t + PREFETCH_BYTES + line, _MM_HINT_T0);
        switch (type) {
        case TYPE_Q2_K: tile_q23k(0, t, half, b, blocks, q, k, first, rows, acc); break;
        case TYPE_Q3_K: tile_q23k(1, t, half, b, blocks, q, k, first, rows, acc); break;
        case TYPE_Q4_K: tile_q45k(0, t, half, b, blocks, q, k, first, rows, acc); break;
        case TYPE_Q5_K: tile_q45k(1, t, half, b, blocks, q, k, first, rows, acc); break;
        case TYPE_Q6_K: tile_q6k(t, half, b, blocks, q, k, first, rows, acc); break;
        default: tile_iq4xs(t, half, b, blocks, q, k, first, rows, acc); break;
        }
    }
}

static int matmul_q8(int type, const uint16_t *x, int64_t x_stride, const uint8_t *w, uint16_t *out,
                     int64_t out_stride, int64_t rows, int64_t n, int64_t k, int64_t num_threads) {
    const int64_t blocks = k / QK, groups = n / GROUP, group_bytes = blocks * GROUP * block_bytes(type);
    Quantized q = {malloc((size_t)(rows * k)), malloc(sizeof(float) * rows * blocks),
                   malloc(sizeof(int32_t) * rows * blocks * 16)};
    if (!q.xq || !q.dx || !q.xs) {
        free(q.xq), free(q.dx), free(q.xs);
        return -1;
    }
    quantize_rows(type, x, x_stride, rows, k, &q, num_threads);
    /* single groups over the threads for a decode step, chunks of groups for prompts (chunks.h) */
    const int64_t per_chunk = groups_per_chunk(groups, rows, MAX_ROWS, num_threads);
    const int64_t chunks = (groups + per_chunk - 1) / per_chunk;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && groups >= 4)
    for (int64_t chunk = 0; chunk < chunks; chunk++) {
        const int64_t end = (chunk + 1) * per_chunk < groups ? (chunk + 1) * per_chunk : groups;
        for (int64_t first = 0; first < rows; first += MAX_ROWS) {
            const int64_t tile = rows - first < MAX_ROWS ? rows - first : MAX_ROWS;
            for (int64_t g = chunk * per_chunk; g < end; g++) {
                if (tile == 1 && one_pass(type)) { /* a decode step's row: both halves in one pass */
                    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
                    group_q8_one(type, w + g * group_bytes, blocks, &q, k, first, acc);
                    store_bf16x16(out + first * out_stride + g * GROUP, acc);
                    continue;
                }
                for (int half = 0; half < 2; half++) {
                    __m256 acc[MAX_ROWS];
                    for (int64_t r = 0; r < tile; r++) acc[r] = _mm256_setzero_ps();
                    group_q8(type, w + g * group_bytes, half, blocks, &q, k, first, tile, acc);
                    for (int64_t r = 0; r < tile; r++) {
                        float lanes[8];
                        _mm256_storeu_ps(lanes, acc[r]);
                        uint16_t *o = out + (first + r) * out_stride + g * GROUP + 8 * half;
                        for (int i = 0; i < 8; i++) o[i] = float_to_bf16(lanes[i]);
                    }
                }
            }
        }
    }
    free(q.xq), free(q.dx), free(q.xs);
    return 0;
}
