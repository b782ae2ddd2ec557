/* bfloat16 x [rows, k] times a GGUF K-quant weight [n, k] (transposed), read in its own block format: the
   weight is never expanded in memory, so a decode step reads the file's bytes and no more.

   Q4_K (144 bytes per 256 weights): d, dmin (float16); twelve bytes of 6-bit scale and min for eight
   sub-blocks of 32; 128 bytes of 4-bit q. Weight = d * scale[j] * q - dmin * min[j].
   Q5_K (176 bytes): as Q4_K with 32 bytes of fifth bits before the 4-bit q, q in 0..31.
   Q6_K (210 bytes per 256 weights): 128 bytes of low nibbles, 64 of high 2-bit pairs, sixteen int8 scales for
   sub-blocks of 16, d (float16). Weight = d * scale[j] * (q - 32), q in 0..63.

   With AVX512-VNNI, x is quantized to 8 bits and q . xq summed in int32 (see "The 8-bit path" below). A first
   version multiplied exact bfloat16 x with q made bfloat16 by a table lookup (AVX512-BF16 dot products): on a
   [8192, 2048] Q4_K weight and one row it took 0.92 ms against the 8-bit path's 0.44 (2.1x; 2.3x at 16
   rows), since unpacking nibbles to 16-bit words cost more than the products, so only the 8-bit path stayed.
   Elsewhere a plain C loop multiplies the weights, decoded to float32, with x as it is.

   Each output depends only on its row of x and its row of the weight, in an order fixed by k: a row's result
   is the same whatever rows come with it. Returns -1 for a type it does not know. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "bf16.h"
#include "f16.h"

enum { TYPE_Q4_K = 12, TYPE_Q5_K = 13, TYPE_Q6_K = 14 }; /* ggml's type numbers */
/* bytes per 256 values: one K-quant super-block (ggml's 32-value block types are block32_matmul.c's) */
enum { QK = 256, Q4K_BYTES = 144, Q5K_BYTES = 176, Q6K_BYTES = 210 };

#if !(defined(__AVX512VNNI__) && defined(__AVX512BW__)) /* the portable path's decoder */
/* Q4_K's 6-bit scale and min of sub-block j (0..7) from its twelve packed bytes. */
static inline void q4k_scale_min(const uint8_t *s, int j, int *scale, int *min) {
    if (j < 4) {
        *scale = s[j] & 63;
        *min = s[j + 4] & 63;
    } else {
        *scale = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* The 256 weights of one super-block, in float32 exactly as the twin computes them. */
static void decode_block(int type, const uint8_t *b, float *w) {
    if (type == TYPE_Q4_K || type == TYPE_Q5_K) {
        const float d = read_f16(b), dmin = read_f16(b + 2);
        const int five = type == TYPE_Q5_K;
        const uint8_t *q = b + (five ? 48 : 16), *qh = b + 16; /* Q5_K: bit j of qh[l] tops value l of sub-block j */
        for (int c = 0; c < 4; c++) {
            int sa, ma, sb, mb;
            q4k_scale_min(b + 4, 2 * c, &sa, &ma);
            q4k_scale_min(b + 4, 2 * c + 1, &sb, &mb);
            const float da = d * sa, mina = dmin * ma, db = d * sb, minb = dmin * mb;
            for (int l = 0; l < 32; l++) {
                const int ha = five ? ((qh[l] >> (2 * c)) & 1) << 4 : 0, hb = five ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0;
                w[64 * c + l] = da * ((q[32 * c + l] & 15) + ha) - mina;
                w[64 * c + 32 + l] = db * ((q[32 * c + l] >> 4) + hb) - minb;
            }
        }
    } else {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = read_f16(b + 208);
        /* half h, quarter t: values 128 h + 32 t + l, low 4 bits from ql (the nibble t / 2 of byte l, or of
           byte l + 32 for odd t), high 2 bits from bits 2 t of qh; one scale per 16 values */
        for (int h = 0; h < 2; h++) {
            for (int t = 0; t < 4; t++) {
                const uint8_t *lo = ql + 64 * h + (t & 1) * 32, *hi = qh + 32 * h;
                const int lo_shift = t >= 2 ? 4 : 0, hi_shift = 2 * t;
                for (int i = 0; i < 2; i++) {
                    const float scale = d * sc[8 * h + 2 * t + i];
                    for (int l = 16 * i; l < 16 * i + 16; l++) {
                        const int q = ((lo[l] >> lo_shift) & 15) | (((hi[l] >> hi_shift) & 3) << 4);
                        w[128 * h + 32 * t + l] = scale * (float)(q - 32);
                    }
                }
            }
        }
    }
}
#endif

static int block_bytes(int type) {
    return type == TYPE_Q4_K   ? Q4K_BYTES
           : type == TYPE_Q5_K ? Q5K_BYTES
           : type == TYPE_Q6_K ? Q6K_BYTES
                               : 0;
}

#define MAX_ROWS 16
#define W_CHUNK 32

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* The 8-bit path (CPUs with AVX512-VNNI): each row of x is quantized to int8 per 256 values (scale
   dx = max|x| / 127, xq = round(x / dx)), and q . xq is summed exactly in int32 by vpdpbusd, 64 products per
   instruction; unpacking q is two or three byte operations per 64 values. A sub-block's int32 sums become
   float once, times d * scale; Q4_K's min term and Q6_K's -32 use each sub-block's sum of dx * xq.
   kernels/torch_ref/gguf_blocks.py's linear_q8 is its twin. */

typedef struct {
    int8_t *xq;  /* [rows, k]: Q6_K in natural order; Q4_K/Q5_K per block in the order their nibbles unpack */
    float *dx;   /* [rows, blocks] */
    float *sums; /* [rows, blocks, 16]: dx * sum of xq per sub-block (Q4_K/Q5_K: 8 of 32, Q6_K: 16 of 16), Q6_K's x 32 */
} Quantized;

static void quantize_rows(int type, const uint16_t *x, int64_t x_stride, int64_t rows, int64_t k, Quantized *q) {
    const int64_t blocks = k / QK;
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
            int8_t xq[QK];
            for (int i = 0; i < QK; i += 16) {
                const __m512i rounded = dx > 0.0f ? _mm512_cvtps_epi32(_mm512_div_ps(_mm512_loadu_ps(v + i), _mm512_set1_ps(dx)))
                                                  : _mm512_setzero_si512(); /* round to nearest even */
                _mm_storeu_si128((__m128i *)(xq + i), _mm512_cvtsepi32_epi8(rounded));
            }
            float *sums = q->sums + (r * blocks + b) * 16;
            const int sub = type == TYPE_Q6_K ? 16 : 32;
            for (int j = 0; j < QK / sub; j++) {
                int32_t total = 0;
                for (int i = 0; i < sub; i++) total += xq[sub * j + i];
                sums[j] = dx * (float)total * (type == TYPE_Q6_K ? 32.0f : 1.0f);
            }
            int8_t *dst = q->xq + r * k + b * QK;
            if (type == TYPE_Q4_K || type == TYPE_Q5_K) { /* 64-byte groups: [0..31, 64..95], [32..63, 96..127], +128 */
                for (int p = 0; p < 2; p++) {
                    memcpy(dst + 128 * p, xq + 128 * p, 32);
                    memcpy(dst + 128 * p + 32, xq + 128 * p + 64, 32);
                    memcpy(dst + 128 * p + 64, xq + 128 * p + 32, 32);
                    memcpy(dst + 128 * p + 96, xq + 128 * p + 96, 32);
                }
            } else {
                memcpy(dst, xq, QK);
            }
            q->dx[r * blocks + b] = dx;
        }
    }
}

static inline __m512 dot_f(__m512i q, const int8_t *xq) {
    return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, _mm512_loadu_si512(xq)));
}

/* For rows first .. first + rows - 1 of x against super-block b, whose 256 unpacked q are v[0..3] (64 bytes each,
   in the order quantize_rows laid xq out) with per-lane scales scale[0..3]: acc += dx * sum of scale * (q . xq),
   minus += sub_scales * (the row's per-sub-block sums), over the `lanes` of sums the type has. */
static inline void add_rows(const __m512i *v, const __m512 *scale, __m512 sub_scales, __mmask16 lanes,
                            const Quantized *q, int64_t first, int64_t rows, int64_t k, int64_t blocks, int64_t b,
                            __m512 *acc, __m512 *minus) {
    for (int64_t r = 0; r < rows; r++) {
        const int8_t *xq = q->xq + (first + r) * k + b * QK;
        const __m512 t01 = _mm512_fmadd_ps(scale[1], dot_f(v[1], xq + 64), _mm512_mul_ps(scale[0], dot_f(v[0], xq)));
        const __m512 t23 =
            _mm512_fmadd_ps(scale[3], dot_f(v[3], xq + 192), _mm512_mul_ps(scale[2], dot_f(v[2], xq + 128)));
        const int64_t rb = (first + r) * blocks + b;
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(q->dx[rb]), _mm512_add_ps(t01, t23), acc[r]);
        minus[r] = _mm512_fmadd_ps(sub_scales, _mm512_maskz_loadu_ps(lanes, q->sums + rb * 16), minus[r]);
    }
}

/* Q4_K, or Q5_K (`five`): the same scales and nibbles, plus a fifth bit per value from 32 bytes of qh (bit j of
   byte l belongs to value l of sub-block j), shifted into place per 64-byte group. */
static void row_q45k_q8(const uint8_t *w, int64_t blocks, const Quantized *q, int64_t first, int64_t rows, int64_t k,
                        __m512 *acc, __m512 *minus, int five) {
    const __m512i low4 = _mm512_set1_epi8(15), one = _mm512_set1_epi8(1);
    const int bytes = five ? Q5K_BYTES : Q4K_BYTES, qs = five ? 48 : 16;
    /* sub-blocks of each unpacked group's two halves (0 and 2, 1 and 3, 4 and 6, 5 and 7): qh's bit to take */
    const __m512i shift[4] = {
        _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1),
        _mm512_inserti64x4(_mm512_set1_epi16(1), _mm256_set1_epi16(3), 1),
        _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1),
        _mm512_inserti64x4(_mm512_set1_epi16(5), _mm256_set1_epi16(7), 1),
    };
    const __m512i pick[4] = {
        _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0),
        _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
        _mm512_set_epi32(6, 6, 6, 6, 6, 6, 6, 6, 4, 4, 4, 4, 4, 4, 4, 4),
        _mm512_set_epi32(7, 7, 7, 7, 7, 7, 7, 7, 5, 5, 5, 5, 5, 5, 5, 5),
    };
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *blk = w + b * bytes;
        const float d = read_f16(blk), dmin = read_f16(blk + 2);
        uint32_t packed[3], unpacked[4];
        memcpy(packed, blk + 4, 12);
        unpacked[0] = packed[0] & 0x3f3f3f3fu;
        unpacked[1] = (packed[2] & 0x0f0f0f0fu) | (((packed[0] >> 6) & 0x03030303u) << 4);
        unpacked[2] = packed[1] & 0x3f3f3f3fu;
        unpacked[3] = ((packed[2] >> 4) & 0x0f0f0f0fu) | (((packed[1] >> 6) & 0x03030303u) << 4);
        const __m512 scales = _mm512_mul_ps(
            _mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)unpacked))));
        const __m512 mins = _mm512_maskz_mul_ps(
            0xff, _mm512_set1_ps(dmin),
            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(unpacked + 2)))));
        __m512 scale[4];
        for (int i = 0; i < 4; i++) scale[i] = _mm512_permutexvar_ps(pick[i], scales);
        const __m512i q0 = _mm512_loadu_si512(blk + qs), q1 = _mm512_loadu_si512(blk + qs + 64);
        __m512i nib[4] = {
            _mm512_and_si512(q0, low4),
            _mm512_and_si512(_mm512_srli_epi16(q0, 4), low4),
            _mm512_and_si512(q1, low4),
            _mm512_and_si512(_mm512_srli_epi16(q1, 4), low4),
        };
        if (five) { /* a 16-bit shift by s then & 1 takes bit s of each byte */
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)));
            for (int i = 0; i < 4; i++)
                nib[i] = _mm512_or_si512(
                    nib[i], _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift[i]), one), 4));
        }
        add_rows(nib, scale, mins, 0xff, q, first, rows, k, blocks, b, acc, minus);
    }
}

static void row_q6k_q8(const uint8_t *w, int64_t blocks, const Quantized *q, int64_t first, int64_t rows, int64_t k,
                       __m512 *acc, __m512 *minus) {
    const __m512i low4 = _mm512_set1_epi8(15), three = _mm512_set1_epi8(3);
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *blk = w + b * Q6K_BYTES;
        const float d = read_f16(blk + 208);
        const __m128i sc = _mm_loadu_si128((const __m128i *)(blk + 192));
        __m512 scale[4]; /* sub-blocks 4g .. 4g + 3, each over four lanes (16 values) */
        for (int g = 0; g < 4; g++) {
            const __m128i spread = _mm_shuffle_epi8(sc, _mm_set_epi8(4 * g + 3, 4 * g + 3, 4 * g + 3, 4 * g + 3, 4 * g + 2,
                                                                     4 * g + 2, 4 * g + 2, 4 * g + 2, 4 * g + 1, 4 * g + 1,
                                                                     4 * g + 1, 4 * g + 1, 4 * g, 4 * g, 4 * g, 4 * g));
            scale[g] = _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(spread)));
        }
        const __m512 scales16 = _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
        __m512i six[4];
        for (int h = 0; h < 2; h++) {
            const __m512i low = _mm512_loadu_si512(blk + 64 * h);
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
            const __m512i bits01 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
            const __m512i bits23 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_srli_epi16(qh, 4)), _mm256_srli_epi16(qh, 6), 1);
            six[2 * h] = _mm512_or_si512(_mm512_and_si512(low, low4), _mm512_slli_epi16(_mm512_and_si512(bits01, three), 4));
            six[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low, 4), low4),
                                             _mm512_slli_epi16(_mm512_and_si512(bits23, three), 4));
        }
        add_rows(six, scale, scales16, 0xffff, q, first, rows, k, blocks, b, acc, minus);
    }
}

static int matmul_q8(int type, const uint16_t *x, int64_t x_stride, const uint8_t *w, uint16_t *out,
                     int64_t out_stride, int64_t rows, int64_t n, int64_t k, int64_t num_threads) {
    const int bytes = block_bytes(type);
    const int64_t blocks = k / QK;
    Quantized q = {malloc((size_t)(rows * k)), malloc(sizeof(float) * rows * blocks),
                   malloc(sizeof(float) * rows * blocks * 16)};
    if (!q.xq || !q.dx || !q.sums) {
        free(q.xq), free(q.dx), free(q.sums);
        return -1;
    }
    quantize_rows(type, x, x_stride, rows, k, &q);
    /* Weight rows in chunks of W_CHUNK (a few tens of KB, kept in L2 while every tile of x passes over them),
       so each tile of quantized x is read once per chunk rather than once per weight row. */
    const int64_t chunks = (n + W_CHUNK - 1) / W_CHUNK;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && n >= 64)
    for (int64_t chunk = 0; chunk < chunks; chunk++) {
        const int64_t end = (chunk + 1) * W_CHUNK < n ? (chunk + 1) * W_CHUNK : n;
        for (int64_t first = 0; first < rows; first += MAX_ROWS) {
            const int64_t tile = rows - first < MAX_ROWS ? rows - first : MAX_ROWS;
            for (int64_t row = chunk * W_CHUNK; row < end; row++) {
                const uint8_t *wr = w + row * blocks * bytes;
                __m512 acc[MAX_ROWS], minus[MAX_ROWS];
                for (int64_t r = 0; r < tile; r++) acc[r] = minus[r] = _mm512_setzero_ps();
                if (type == TYPE_Q6_K)
                    row_q6k_q8(wr, blocks, &q, first, tile, k, acc, minus);
                else
                    row_q45k_q8(wr, blocks, &q, first, tile, k, acc, minus, type == TYPE_Q5_K);
                for (int64_t r = 0; r < tile; r++)
                    out[(first + r) * out_stride + row] =
                        float_to_bf16(_mm512_reduce_add_ps(acc[r]) - _mm512_reduce_add_ps(minus[r]));
            }
        }
    }
    free(q.xq), free(q.dx), free(q.sums);
    return 0;
}
#endif

/* Which path kquant_matmul takes here: 2 the 8-bit one (AVX512-VNNI), 0 the portable loop. The tests pick the
   twin to compare with by it. */
int kquant_path(void) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return 2;
#else
    return 0;
#endif
}

/* out [rows, n] (bf16, out_stride apart) = x [rows, k] (bf16, x_stride apart) @ w.T, w [n, k] in `type`'s
   blocks. On the 8-bit path rows of x go through in tiles of up to 16 that share each unpacked super-block. */
int kquant_matmul(int type, const uint16_t *x, int64_t x_stride, const uint8_t *w, uint16_t *out,
                  int64_t out_stride, int64_t rows, int64_t n, int64_t k, int64_t num_threads) {
    const int bytes = block_bytes(type);
    if (!bytes || k % QK || rows < 1) return -1;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return matmul_q8(type, x, x_stride, w, out, out_stride, rows, n, k, num_threads);
#else
    const int64_t blocks = k / QK;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && n >= 64)
    for (int64_t row = 0; row < n; row++) {
        float v[QK];
        float acc[rows];
        for (int64_t r = 0; r < rows; r++) acc[r] = 0.0f;
        for (int64_t b = 0; b < blocks; b++) {
            decode_block(type, w + (row * blocks + b) * bytes, v);
            for (int64_t r = 0; r < rows; r++) {
                const uint16_t *xb = x + r * x_stride + b * QK;
                float s = 0.0f;
                for (int i = 0; i < QK; i++) s += v[i] * bf16_to_float(xb[i]);
                acc[r] += s;
            }
        }
        for (int64_t r = 0; r < rows; r++) out[r * out_stride + row] = float_to_bf16(acc[r]);
    }
#endif
    return 0;
}
