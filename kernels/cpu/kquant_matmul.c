/* bfloat16 x [rows, k] times a GGUF K-quant weight [n, k] (transposed): Q4_K and Q6_K (llama.cpp's Q4_K_M mix),
   Q2_K, Q3_K, Q5_K and IQ4_XS, in super-blocks of 256 values. k may be any multiple of 256, n any multiple of 16.

   The weight comes repacked 16 rows at a time ("x16", kernels/torch_ref/gguf_repack.py has the layout, the
   same size as the file's): per group of 16 rows and super-block column, each field of the 16 blocks
   interleaved, so one 64-byte load holds four values (a quad) of each of the 16 rows and each vector lane
   stands for one output row: no horizontal sums, and 16 rows' scales unpack with lane-wise operations.

   Q4_K (144 B): d, dmin (f16); 12 bytes of 6-bit scale and min for eight sub-blocks of 32; 128 B of nibbles
   (byte 32c + l: value 64c + l low, 64c + 32 + l high). w = d * scale[j] * q - dmin * min[j].
   Q5_K (176 B): as Q4_K with 32 B of fifth bits (bit j of byte l: value l of sub-block j), q in 0..31.
   Q6_K (210 B): 128 B of low nibbles, 64 B of high 2-bit pairs, 16 int8 scales for sub-blocks of 16, d.
   w = d * scale[j] * (q - 32), q in 0..63.
   Q2_K (84 B): 16 scale bytes (scale low nibble, min high), 64 B of 2-bit q (value 128h + 32s + l: bits 2s of
   byte 32h + l), d, dmin. w = d * scale[j] * q - dmin * min[j], sub-blocks of 16.
   Q3_K (110 B): 32 B of third bits (value 32j + l: bit j of byte l), 64 B of 2-bit q as Q2_K's, 12 bytes of
   sixteen 6-bit scales, d. w = d * (scale[j] - 32) * (q - 4), q = 2-bit q + 4 * third bit.
   IQ4_XS (136 B): d, 8 six-bit scales (2 high bits in a uint16, 4 low in nibbles), 16 B of nibbles per
   sub-block of 32 (low: values 0..15, high: 16..31). w = d * (scale[j] - 32) * KVALUES[q].
   Each is d' * (u - o) (+ a min) with u an unsigned byte, as vpdpbusd wants: o = 32 (Q6_K), 4 (Q3_K), 128
   (IQ4_XS, its levels plus 128), taken off as o times the sub-block's sum of xq.

   The 8-bit path (AVX512-VNNI, as llama.cpp does for these types): each row of x is quantized to int8 per 256
   values (dx = max|x| / 127, xq = round(x / dx), to nearest even); each vpdpbusd sums a quad of q times
   the quad of xq (broadcast) for 16 weight rows; a sub-block's int32 sums become float once, times
   d * scale * dx. Mins and offsets come in from each sub-block's sum of xq. Not bfloat16 x times q made
   bfloat16 (AVX512-BF16 dot products): unpacking nibbles to 16-bit words costs more than the products. The
   x16 layout (16 rows a tile) spares the horizontal sum per output that the file's own row-by-row layout
   needs. kernels/torch_ref/gguf_blocks.py's linear_q8 is its twin.
   CPUs with AVX2 but not AVX-512 (most laptops) take the same path in kquant_avx2.h, with the same integer
   sums; Q2_K, Q3_K and IQ4_XS also with the same float steps (outputs the same to the bit), while Q4_K, Q5_K
   and Q6_K scale sub-blocks in int32 there (outputs within rounding). Elsewhere a plain C loop multiplies the
   weights, decoded to float32, with x as it is (twin: linear).

   Each output depends only on its row of x and its row of the weight, in an order fixed by k: a row's result
   is the same whatever rows come with it. Returns -1 for a type or shape it does not take. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "bf16.h"
#include "f16.h"
#include "chunks.h"
#include "prefetch.h"

enum { TYPE_Q2_K = 10, TYPE_Q3_K = 11, TYPE_Q4_K = 12, TYPE_Q5_K = 13, TYPE_Q6_K = 14, TYPE_IQ4_XS = 23 }; /* ggml's */
enum { QK = 256, GROUP = 16 };

static int block_bytes(int type) {
    switch (type) {
    case TYPE_Q2_K: return 84;
    case TYPE_Q3_K: return 110;
    case TYPE_Q4_K: return 144;
    case TYPE_Q5_K: return 176;
    case TYPE_Q6_K: return 210;
    case TYPE_IQ4_XS: return 136;
    default: return 0;
    }
}

/* values per sub-block (one scale) */
static int sub_block(int type) { return type == TYPE_Q2_K || type == TYPE_Q3_K || type == TYPE_Q6_K ? 16 : 32; }

/* Where each field of a tile starts (see gguf_repack.py's LAYOUTS). */
enum {
    QKT_D = 0, QKT_DMIN = 32, QKT_SCALES = 64, QKT_MASKS = 256, /* Q4_K and Q5_K */
    Q6T_D = 0, Q6T_SCALES = 32, Q6T_QL = 288, Q6T_QH = 2336,
    Q2T_D = 0, Q2T_DMIN = 32, Q2T_SCALES = 64, Q2T_QS = 320,
    Q3T_D = 0, Q3T_SCALES = 32, Q3T_QS = 224, Q3T_HMASK = 1248,
    IXT_D = 0, IXT_SCALES_H = 32, IXT_SCALES_L = 64, IXT_QS = 128,
};

/* IQ4_XS's 16 levels (ggml's kvalues_iq4nl) plus 128, so they are unsigned bytes: 1 .. 241. */
static const uint8_t KVALUES_U8[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};
static inline int qk_qs(int type) { return type == TYPE_Q5_K ? 768 : 256; }

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)

#define MAX_ROWS 8     /* rows of x sharing one unpacked tile */

typedef struct {
    int8_t *xq;  /* [rows, k] */
    float *dx;   /* [rows, blocks] */
    int32_t *xs; /* [rows, blocks, 16]: sum of xq per sub-block (8 of 32 or 16 of 16, as the type's scales) */
} Quantized;

static void quantize_rows(int type, const uint16_t *x, int64_t x_stride, int64_t rows, int64_t k, Quantized *q) {
    const int64_t blocks = k / QK;
    const int sub = sub_block(type);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < blocks; b++) {
            const uint16_t *xb = x + r * x_stride + b * QK;
            float v[QK], amax = 0.0f;
            for (int i = 0; i < QK; i++) {
                v[i] = bf16_to_float(xb[i]);
                const float a = v[i] < 0 ? -v[i] : v[i];
                amax = a > amax ? a : amax;
            }
            const float dx = amax / 127.0f;
            int8_t *xq = q->xq + r * k + b * QK;
            for (int i = 0; i < QK; i += 16) {
                const __m512i rounded = dx > 0.0f ? _mm512_cvtps_epi32(_mm512_div_ps(_mm512_loadu_ps(v + i), _mm512_set1_ps(dx)))
                                                  : _mm512_setzero_si512(); /* round to nearest even */
                _mm_storeu_si128((__m128i *)(xq + i), _mm512_cvtsepi32_epi8(rounded));
            }
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

static inline __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* Byte `i` (0..3) of each 32-bit lane, as float. */
static inline __m512 lane_byte(__m512i v, int i) {
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, 8 * i), _mm512_set1_epi32(0xff)));
}

/* Q4_K or Q5_K (`five`): one tile against rows first .. first + rows - 1 of x; acc[r] lane i += output row i. */
static inline __attribute__((always_inline)) void tile_q45k(const int five, const uint8_t *t, int64_t b,
                                                            int64_t blocks, const Quantized *q, int64_t k,
                                                            int64_t first, int64_t rows, __m512 *acc) {
    const __m512i low4 = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(t + QKT_D)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(t + QKT_DMIN)));
    /* the 12 scale bytes of each row as three 32-bit lanes: 6-bit scales and mins of the eight sub-blocks */
    const __m512i w0 = _mm512_loadu_si512(t + QKT_SCALES), w1 = _mm512_loadu_si512(t + QKT_SCALES + 64),
                  w2 = _mm512_loadu_si512(t + QKT_SCALES + 128);
    const __m512i m6 = _mm512_set1_epi32(0x3f3f3f3f), m4 = _mm512_set1_epi32(0x0f0f0f0f), m2 = _mm512_set1_epi32(0x03030303);
    const __m512i scales[2] = {_mm512_and_si512(w0, m6),
                               _mm512_or_si512(_mm512_and_si512(w2, m4),
                                               _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w0, 6), m2), 4))};
    const __m512i mins[2] = {_mm512_and_si512(w1, m6),
                             _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w2, 4), m4),
                                             _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w1, 6), m2), 4))};
    const uint8_t *qs = t + qk_qs(five ? TYPE_Q5_K : TYPE_Q4_K);
    __m512 minus[MAX_ROWS];
    for (int64_t r = 0; r < rows; r++) minus[r] = _mm512_setzero_ps();
    for (int j = 0; j < 8; j++) { /* sub-block j: the low (even j) or high (odd j) nibbles of chunk j / 2 */
        const int c = j / 2, high = j % 2;
        __m512i u[8];
        for (int quad = 0; quad < 8; quad++) {
            const __m512i v = _mm512_loadu_si512(qs + 64 * (8 * c + quad));
            u[quad] = _mm512_and_si512(high ? _mm512_srli_epi16(v, 4) : v, low4);
            if (five) {
                __mmask64 bits;
                memcpy(&bits, t + QKT_MASKS + 8 * (16 * c + 8 * high + quad), 8);
                u[quad] = _mm512_mask_add_epi8(u[quad], bits, u[quad], sixteen);
            }
        }
        const __m512 scale = _mm512_mul_ps(d, lane_byte(scales[j / 4], j % 4));
        const __m512 min = _mm512_mul_ps(dmin, lane_byte(mins[j / 4], j % 4));
        for (int64_t r = 0; r < rows; r++) {
            const int64_t row = first + r, rb = row * blocks + b;
            const int8_t *xq = q->xq + row * k + b * QK + 32 * j;
            __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512(); /* two chains for latency */
            for (int quad = 0; quad < 8; quad += 2) {
                even = _mm512_dpbusd_epi32(even, u[quad], bcast4(xq + 4 * quad));
                odd = _mm512_dpbusd_epi32(odd, u[quad + 1], bcast4(xq + 4 * quad + 4));
            }
            const __m512 dx = _mm512_set1_ps(q->dx[rb]);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(even, odd)), _mm512_mul_ps(scale, dx), acc[r]);
            minus[r] = _mm512_fmadd_ps(min, _mm512_set1_ps(q->dx[rb] * (float)q->xs[rb * 16 + j]), minus[r]);
        }
    }
    for (int64_t r = 0; r < rows; r++) acc[r] = _mm512_sub_ps(acc[r], minus[r]);
}

static inline __attribute__((always_inline)) void tile_q6k(const uint8_t *t, int64_t b, int64_t blocks,
                                                           const Quantized *q, int64_t k, int64_t first,
                                                           int64_t rows, __m512 *acc) {
    const __m512i low4 = _mm512_set1_epi8(15), three = _mm512_set1_epi8(3);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(t + Q6T_D)));
    for (int h = 0; h < 2; h++) {
        for (int s = 0; s < 4; s++) { /* values 128h + 32s + l: sub-blocks 8h + 2s and 8h + 2s + 1 */
            __m512i u[8];
            for (int quad = 0; quad < 8; quad++) {
                const __m512i low = _mm512_loadu_si512(t + Q6T_QL + 64 * (16 * h + 8 * (s & 1) + quad));
                const __m512i high = _mm512_loadu_si512(t + Q6T_QH + 64 * (8 * h + quad));
                const __m512i nibble = _mm512_and_si512(s >= 2 ? _mm512_srli_epi16(low, 4) : low, low4);
                u[quad] = _mm512_or_si512(nibble, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(high, 2 * s), three), 4));
            }
            for (int half = 0; half < 2; half++) {
                const int j = 8 * h + 2 * s + half;
                const __m512 scale = _mm512_mul_ps(
                    d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(t + Q6T_SCALES + 16 * j)))));
                for (int64_t r = 0; r < rows; r++) {
                    const int64_t row = first + r, rb = row * blocks + b;
                    const int8_t *xq = q->xq + row * k + b * QK + 16 * j;
                    __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
                    even = _mm512_dpbusd_epi32(even, u[4 * half], bcast4(xq));
                    odd = _mm512_dpbusd_epi32(odd, u[4 * half + 1], bcast4(xq + 4));
                    even = _mm512_dpbusd_epi32(even, u[4 * half + 2], bcast4(xq + 8));
                    odd = _mm512_dpbusd_epi32(odd, u[4 * half + 3], bcast4(xq + 12));
                    /* q - 32: the sub-block's 32 * sum of xq comes off in int32 */
                    const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(even, odd), _mm512_set1_epi32(32 * q->xs[rb * 16 + j]));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale, _mm512_set1_ps(q->dx[rb])), acc[r]);
                }
            }
        }
    }
}

/* The int32 sums of n quads u[0 .. n - 1] times xq[0 .. 4n - 1] for 16 weight rows, in two chains for latency. */
static inline __m512i dot_quads(const __m512i *u, const int8_t *xq, int n) {
    __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
    for (int quad = 0; quad < n; quad += 2) {
        even = _mm512_dpbusd_epi32(even, u[quad], bcast4(xq + 4 * quad));
        odd = _mm512_dpbusd_epi32(odd, u[quad + 1], bcast4(xq + 4 * quad + 4));
    }
    return _mm512_add_epi32(even, odd);
}

/* Q2_K and Q3_K (`three`): the 2-bit q of value 128h + 32s + l is bits 2s of byte 32h + l, and Q3_K's third bit
   bit 4h + s of hmask byte l. Sub-blocks of 16: 8h + 2s and 8h + 2s + 1. */
static inline __attribute__((always_inline)) void tile_q23k(const int three, const uint8_t *t, int64_t b,
                                                            int64_t blocks, const Quantized *q, int64_t k,
                                                            int64_t first, int64_t rows, __m512 *acc) {
    const __m512i two_bits = _mm512_set1_epi8(3), one_bit = _mm512_set1_epi8(1);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)t)); /* Q2T_D == Q3T_D == 0 */
    __m512 dmin = _mm512_setzero_ps(), minus[MAX_ROWS];
    __m512i scales[4]; /* Q3_K: scale j is byte j % 4 of lane word j / 4 */
    if (three) {
        const __m512i w0 = _mm512_loadu_si512(t + Q3T_SCALES), w1 = _mm512_loadu_si512(t + Q3T_SCALES + 64),
                      w2 = _mm512_loadu_si512(t + Q3T_SCALES + 128);
        const __m512i m4 = _mm512_set1_epi32(0x0f0f0f0f), m2 = _mm512_set1_epi32(0x03030303);
        const __m512i low[4] = {_mm512_and_si512(w0, m4), _mm512_and_si512(w1, m4),
                                _mm512_and_si512(_mm512_srli_epi32(w0, 4), m4), _mm512_and_si512(_mm512_srli_epi32(w1, 4), m4)};
        for (int i = 0; i < 4; i++)
            scales[i] = _mm512_or_si512(low[i], _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w2, 2 * i), m2), 4));
    } else {
        dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(t + Q2T_DMIN)));
        for (int64_t r = 0; r < rows; r++) minus[r] = _mm512_setzero_ps();
    }
    const uint8_t *qs = t + (three ? Q3T_QS : Q2T_QS);
    for (int h = 0; h < 2; h++) {
        for (int s = 0; s < 4; s++) {
            __m512i u[8];
            for (int quad = 0; quad < 8; quad++) {
                u[quad] = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(qs + 64 * (8 * h + quad)), 2 * s), two_bits);
                if (three) {
                    const __m512i hm = _mm512_loadu_si512(t + Q3T_HMASK + 64 * quad);
                    u[quad] = _mm512_or_si512(u[quad], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hm, 4 * h + s), one_bit), 2));
                }
            }
            for (int half = 0; half < 2; half++) {
                const int j = 8 * h + 2 * s + half;
                __m512 scale, min = _mm512_setzero_ps();
                if (three) {
                    scale = _mm512_mul_ps(d, _mm512_sub_ps(lane_byte(scales[j / 4], j % 4), _mm512_set1_ps(32.0f)));
                } else {
                    const __m512i sm = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(t + Q2T_SCALES + 16 * j)));
                    scale = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(sm, _mm512_set1_epi32(15))));
                    min = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_srli_epi32(sm, 4)));
                }
                for (int64_t r = 0; r < rows; r++) {
                    const int64_t row = first + r, rb = row * blocks + b;
                    __m512i dot = dot_quads(u + 4 * half, q->xq + row * k + b * QK + 16 * j, 4);
                    if (three) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(4 * q->xs[rb * 16 + j])); /* q - 4 */
                    const __m512 dx = _mm512_set1_ps(q->dx[rb]);
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale, dx), acc[r]);
                    if (!three) minus[r] = _mm512_fmadd_ps(min, _mm512_set1_ps(q->dx[rb] * (float)q->xs[rb * 16 + j]), minus[r]);
                }
            }
        }
    }
    if (!three)
        for (int64_t r = 0; r < rows; r++) acc[r] = _mm512_sub_ps(acc[r], minus[r]);
}

static inline __attribute__((always_inline)) void tile_iq4xs(const uint8_t *t, int64_t b, int64_t blocks,
                                                             const Quantized *q, int64_t k, int64_t first,
                                                             int64_t rows, __m512 *acc) {
    const __m512i low4 = _mm512_set1_epi8(15);
    const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)KVALUES_U8));
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(t + IXT_D)));
    const __m512i high = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(t + IXT_SCALES_H)));
    const __m512i low = _mm512_loadu_si512(t + IXT_SCALES_L);
    for (int j = 0; j < 8; j++) {
        __m512i u[8];
        for (int quad = 0; quad < 4; quad++) {
            const __m512i v = _mm512_loadu_si512(t + IXT_QS + 64 * (4 * j + quad));
            u[quad] = _mm512_shuffle_epi8(table, _mm512_and_si512(v, low4));
            u[quad + 4] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
        }
        const __m512i ls = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(low, 4 * j), _mm512_set1_epi32(15)),
                                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(high, 2 * j), _mm512_set1_epi32(3)), 4));
        const __m512 scale = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(ls, _mm512_set1_epi32(32))));
        for (int64_t r = 0; r < rows; r++) {
            const int64_t row = first + r, rb = row * blocks + b;
            /* the levels came in plus 128: 128 * the sub-block's sum of xq comes off in int32 */
            const __m512i dot = _mm512_sub_epi32(dot_quads(u, q->xq + row * k + b * QK + 32 * j, 8),
                                                 _mm512_set1_epi32(128 * q->xs[rb * 16 + j]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale, _mm512_set1_ps(q->dx[rb])), acc[r]);
        }
    }
}

static void group_q8(int type, const uint8_t *tiles, int64_t blocks, const Quantized *q, int64_t k, int64_t first,
                     int64_t rows, __m512 *acc) {
    const int64_t tile_bytes = (int64_t)GROUP * block_bytes(type);
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *t = tiles + b * tile_bytes;
        /* see PREFETCH_BYTES; prefetches past the end never fault */
        for (int64_t line = 0; line < tile_bytes; line += 64) _mm_prefetch((const char *)t + PREFETCH_BYTES + line, _MM_HINT_T0);
        switch (type) {
        case TYPE_Q2_K: tile_q23k(0, t, b, blocks, q, k, first, rows, acc); break;
        case TYPE_Q3_K: tile_q23k(1, t, b, blocks, q, k, first, rows, acc); break;
        case TYPE_Q4_K: tile_q45k(0, t, b, blocks, q, k, first, rows, acc); break;
        case TYPE_Q5_K: tile_q45k(1, t, b, blocks, q, k, first, rows, acc); break;
        case TYPE_Q6_K: tile_q6k(t, b, blocks, q, k, first, rows, acc); break;
        default: tile_iq4xs(t, b, blocks, q, k, first, rows, acc); break;
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
    quantize_rows(type, x, x_stride, rows, k, &q);
    /* single groups over the threads for a decode step, chunks of groups for prompts (chunks.h) */
    const int64_t per_chunk = groups_per_chunk(groups, rows, MAX_ROWS, num_threads);
    const int64_t chunks = (groups + per_chunk - 1) / per_chunk;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && groups >= 4)
    for (int64_t chunk = 0; chunk < chunks; chunk++) {
        const int64_t end = (chunk + 1) * per_chunk < groups ? (chunk + 1) * per_chunk : groups;
        for (int64_t first = 0; first < rows; first += MAX_ROWS) {
            const int64_t tile = rows - first < MAX_ROWS ? rows - first : MAX_ROWS;
            for (int64_t g = chunk * per_chunk; g < end; g++) {
                __m512 acc[MAX_ROWS];
                for (int64_t r = 0; r < tile; r++) acc[r] = _mm512_setzero_ps();
                group_q8(type, w + g * group_bytes, blocks, &q, k, first, tile, acc);
                for (int64_t r = 0; r < tile; r++) {
                    float lanes[GROUP];
                    _mm512_storeu_ps(lanes, acc[r]);
                    uint16_t *o = out + (first + r) * out_stride + g * GROUP;
                    for (int i = 0; i < GROUP; i++) o[i] = float_to_bf16(lanes[i]);
                }
            }
        }
    }
    free(q.xq), free(q.dx), free(q.xs);
    return 0;
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kquant_avx2.h"
#else

/* Q4_K's 6-bit scale and min of sub-block j (0..7) from a row's twelve packed bytes. */
static inline void q4k_scale_min(const uint8_t *s, int j, int *scale, int *min) {
    if (j < 4) {
        *scale = s[j] & 63;
        *min = s[j + 4] & 63;
    } else {
        *scale = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Byte l (0..31) of row i in a field of quads starting at `field`. */
static inline int quad_byte(const uint8_t *field, int i, int l) { return field[64 * (l / 4) + 4 * i + l % 4]; }

/* Row i's 256 values of a tile, in float32 as ggml dequantizes them. */
static void tile_row(int type, const uint8_t *t, int i, float *w) {
    if (type == TYPE_Q2_K || type == TYPE_Q3_K) {
        const int three = type == TYPE_Q3_K;
        const float d = read_f16(t + 2 * i);
        int scales[16];
        if (three) { /* the twelve bytes as three words, unpacked as ggml does */
            uint32_t a[3];
            for (int word = 0; word < 3; word++) memcpy(a + word, t + Q3T_SCALES + 64 * word + 4 * i, 4);
            const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
            const uint32_t unpacked[4] = {(a[0] & m4) | ((a[2] & m2) << 4), (a[1] & m4) | (((a[2] >> 2) & m2) << 4),
                                          ((a[0] >> 4) & m4) | (((a[2] >> 4) & m2) << 4),
                                          ((a[1] >> 4) & m4) | (((a[2] >> 6) & m2) << 4)};
            for (int j = 0; j < 16; j++) scales[j] = (int)((unpacked[j / 4] >> (8 * (j % 4))) & 0xff) - 32;
        } else {
            for (int j = 0; j < 16; j++) scales[j] = t[Q2T_SCALES + 16 * j + i];
        }
        const float dmin = three ? 0.0f : read_f16(t + Q2T_DMIN + 2 * i);
        for (int v = 0; v < QK; v++) {
            const int h = v / 128, s = (v % 128) / 32, l = v % 32, j = v / 16;
            int q = (quad_byte(t + (three ? Q3T_QS : Q2T_QS) + 512 * h, i, l) >> (2 * s)) & 3;
            if (three) {
                q += 4 * ((quad_byte(t + Q3T_HMASK, i, l) >> (4 * h + s)) & 1) - 4;
                w[v] = d * (float)scales[j] * (float)q;
            } else {
                w[v] = d * (float)(scales[j] & 15) * (float)q - dmin * (float)(scales[j] >> 4);
            }
        }
        return;
    }
    if (type == TYPE_IQ4_XS) {
        const float d = read_f16(t + IXT_D + 2 * i);
        const int high = t[IXT_SCALES_H + 2 * i] | t[IXT_SCALES_H + 2 * i + 1] << 8;
        uint32_t low;
        memcpy(&low, t + IXT_SCALES_L + 4 * i, 4);
        for (int v = 0; v < QK; v++) {
            const int j = v / 32, l = v % 16, byte = quad_byte(t + IXT_QS + 256 * j, i, l);
            const int scale = (int)(((low >> (4 * j)) & 15) | (((high >> (2 * j)) & 3) << 4)) - 32;
            w[v] = d * (float)scale * (float)((int)KVALUES_U8[(v % 32) < 16 ? byte & 15 : byte >> 4] - 128);
        }
        return;
    }
    if (type == TYPE_Q6_K) {
        const float d = read_f16(t + Q6T_D + 2 * i);
        for (int v = 0; v < QK; v++) {
            const int h = v / 128, s = (v % 128) / 32, l = v % 32;
            const int low = t[Q6T_QL + 64 * (16 * h + 8 * (s & 1) + l / 4) + 4 * i + l % 4];
            const int high = t[Q6T_QH + 64 * (8 * h + l / 4) + 4 * i + l % 4];
            const int q6 = ((s >= 2 ? low >> 4 : low) & 15) | (((high >> (2 * s)) & 3) << 4);
            w[v] = d * (float)(int8_t)t[Q6T_SCALES + 16 * (v / 16) + i] * (float)(q6 - 32);
        }
        return;
    }
    uint8_t packed[12];
    for (int word = 0; word < 3; word++) memcpy(packed + 4 * word, t + QKT_SCALES + 64 * word + 4 * i, 4);
    const float d = read_f16(t + QKT_D + 2 * i), dmin = read_f16(t + QKT_DMIN + 2 * i);
    const uint8_t *qs = t + qk_qs(type);
    for (int v = 0; v < QK; v++) {
        const int c = v / 64, high = (v % 64) / 32, l = v % 32, j = 2 * c + high;
        const int byte = qs[64 * (8 * c + l / 4) + 4 * i + l % 4];
        int q = high ? byte >> 4 : byte & 15;
        if (type == TYPE_Q5_K) {
            uint64_t bits;
            memcpy(&bits, t + QKT_MASKS + 8 * (16 * c + 8 * high + l / 4), 8);
            q |= (int)((bits >> (4 * i + l % 4)) & 1) << 4;
        }
        int scale, min;
        q4k_scale_min(packed, j, &scale, &min);
        w[v] = d * (float)scale * (float)q - dmin * (float)min;
    }
}
#endif

/* Which path kquant_matmul takes here: 2 the 8-bit one (AVX512-VNNI), 1 the 8-bit one on AVX2, 0 the
   portable loop. The tests pick the twin to compare with by it. */
int kquant_path(void) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return 2;
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    return 1;
#else
    return 0;
#endif
}

/* out [rows, n] (bf16, out_stride apart) = x [rows, k] (bf16, x_stride apart) @ w.T, w [n, k] as x16 tiles of
   `type`. */
int kquant_matmul(int type, const uint16_t *x, int64_t x_stride, const uint8_t *w, uint16_t *out,
                  int64_t out_stride, int64_t rows, int64_t n, int64_t k, int64_t num_threads) {
    if (!block_bytes(type) || k % QK || k < QK || n % GROUP || n < GROUP || rows < 1) return -1;
#if (defined(__AVX512VNNI__) && defined(__AVX512BW__)) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
    return matmul_q8(type, x, x_stride, w, out, out_stride, rows, n, k, num_threads);
#else
    const int64_t blocks = k / QK, groups = n / GROUP, tile_bytes = (int64_t)GROUP * block_bytes(type);
    int failed = 0;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && groups >= 4)
    for (int64_t g = 0; g < groups; g++) {
        float *acc = calloc((size_t)(rows * GROUP), sizeof(float)), *w32 = malloc(sizeof(float) * QK); /* [rows, 16] */
        if (!acc || !w32) {
            failed = 1; /* a benign race: every writer stores 1 */
            free(acc), free(w32);
            continue;
        }
        for (int64_t b = 0; b < blocks; b++) {
            const uint8_t *t = w + (g * blocks + b) * tile_bytes;
            for (int i = 0; i < GROUP; i++) {
                tile_row(type, t, i, w32);
                for (int64_t r = 0; r < rows; r++) {
                    const uint16_t *xb = x + r * x_stride + b * QK;
                    float s = 0.0f;
                    for (int v = 0; v < QK; v++) s += w32[v] * bf16_to_float(xb[v]);
                    acc[r * GROUP + i] += s;
                }
            }
        }
        for (int64_t r = 0; r < rows; r++)
            for (int i = 0; i < GROUP; i++) out[r * out_stride + g * GROUP + i] = float_to_bf16(acc[r * GROUP + i]);
        free(acc), free(w32);
    }
    return failed ? -1 : 0;
#endif
}
