/* block32_matmul.c's 8-bit path for CPUs with AVX2 but without AVX-512 (most laptops): included there only,
   after its Layout, KVALUES_U8, E2M1_U and qs_offset.

   The same computation as the AVX512-VNNI path, to the bit: x quantized per block of 32 to int8 (the same
   rounding), the same exact integer dot product u . xq per block and weight row, and the same two float
   multiply-adds per block in the same order. What differs is how the integer sum is formed, since AVX2 has no
   vpdpbusd: vpmaddubsw multiplies unsigned weight bytes by signed x bytes into int16 pairs and vpmaddwd adds
   the pairs into int32. The pairs must not saturate, so the 4- and 5-bit types (u <= 31) go in as they are,
   while Q8_0 and IQ4_NL go in as signed levels s = u - 128 (|s| * sign(x) per byte: 128 * 127 * 2 fits int16)
   and get 128 * sum(xq) added back, giving u . xq exactly. MXFP4's u (0 .. 24) goes in as it is, less
   12 * sum(xq), as on the VNNI path. A 256-bit register holds 8 weight rows, so each 16-row tile is two
   halves. */

#include "avx2_bytes.h"

#define MAX_ROWS 8     /* rows of x sharing one unpacked tile */

typedef struct {
    int8_t *xq;     /* [rows, k] */
    float *dx;      /* [rows, blocks] */
    float *sums;    /* [rows, blocks]: dx * the block's sum of xq */
    int32_t *total; /* [rows, blocks]: the block's sum of xq */
} Quantized;

/* 2^(e - 128) for 8 exponent bytes (e8m0_half's bits, 8 lanes). */
static inline __m256 e8m0_half8(const uint8_t *e) {
    const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)e));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(x, _mm256_set1_epi32(1)), 23);
    const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), x);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, tiny, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), x)));
}

static void quantize_rows(const uint16_t *x, int64_t x_stride, int64_t rows, int64_t k, Quantized *q, int64_t num_threads) {
    const int64_t blocks = k / QB;
    /* by rows over the threads, as kquant_avx2.h's */
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && rows > 1 && rows * k >= 65536)
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < blocks; b++) {
            const uint16_t *xb = x + r * x_stride + b * QB;
            /* divide, then round to nearest even and saturate: as the AVX-512 path does */
            const float dx = bf16_amax(xb, QB) / 127.0f;
            int8_t *xq = q->xq + r * k + b * QB;
            bf16_to_int8(xb, QB, dx, xq);
            int32_t total = 0;
            for (int i = 0; i < QB; i++) total += xq[i];
            q->dx[r * blocks + b] = dx;
            q->sums[r * blocks + b] = dx * (float)total;
            q->total[r * blocks + b] = total;
        }
    }
}

/* One block column of one half of a tile (8 weight rows, `t` the tile) against rows first .. first + rows - 1 of
   the quantized x: acc[r] lane i += output row 8 * half + i. */
static inline __attribute__((always_inline)) void block_half(const int type, const Layout l, const uint8_t *t, int64_t b,
                                                             int64_t blocks, const Quantized *q, int64_t k, int half,
                                                             int64_t first, int64_t rows, __m256 *acc) {
    const __m256i low4 = _mm256_set1_epi8(15), sixteen = _mm256_set1_epi8(16), ones = _mm256_set1_epi16(1);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)KVALUES_U8));
    const __m256i e2m1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)E2M1_U));
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    const int is_signed = type == TYPE_Q8_0 || type == TYPE_IQ4_NL;
    const uint8_t *qs = t + qs_offset(l) + 32 * half;
    const __m256 d = l.e8m0 ? e8m0_half8(t + 8 * half) : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + 16 * half)));
    __m256 c; /* w = d * u + c */
    if (l.has_min)
        c = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + 32 + 16 * half)));
    else
        c = _mm256_mul_ps(d, _mm256_set1_ps(type == TYPE_Q4_0 ? -8.0f : type == TYPE_Q5_0 ? -16.0f : -128.0f));
    __m256i u[8], sign[8]; /* u: values 4j .. 4j + 3 of the 8 rows; for the signed types |s| and s */
    if (type == TYPE_Q8_0) {
        for (int j = 0; j < 8; j++) sign[j] = _mm256_loadu_si256((const __m256i *)(qs + 64 * j));
    } else {
        for (int j = 0; j < 4; j++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 64 * j));
            u[j] = _mm256_and_si256(v, low4);
            u[j + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        }
        if (l.has_high) {
            const uint8_t *masks = t + 32 * (1 + l.has_min);
            for (int j = 0; j < 8; j++) {
                uint32_t bits;
                memcpy(&bits, masks + 8 * j + 4 * half, 4);
                u[j] = _mm256_add_epi8(u[j], _mm256_and_si256(bits_to_bytes(bits), sixteen));
            }
        }
        if (type == TYPE_IQ4_NL)
            for (int j = 0; j < 8; j++) sign[j] = _mm256_xor_si256(_mm256_shuffle_epi8(table, u[j]), flip);
        if (type == TYPE_MXFP4)
            for (int j = 0; j < 8; j++) u[j] = _mm256_shuffle_epi8(e2m1, u[j]);
    }
    if (is_signed)
        for (int j = 0; j < 8; j++) u[j] = _mm256_abs_epi8(sign[j]);
    /* dot_quads sums vpmaddubsw pairs in int16 before one vpmaddwd: |xq| <= 128, so a pair is at most
       2 * 15 * 128 = 3840 for the 4-bit types (eight fit in int16), 7936 for the 5-bit ones (four fit) and 6144
       for MXFP4 (four fit); the signed types' pairs reach 32,512 and go to int32 one at a time. The int32 sum is
       the same integer either way. */
    const int pairs = l.has_high || type == TYPE_MXFP4 ? 4 : 8;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t row = first + r;
        const int8_t *xq = q->xq + row * k + b * QB;
        const int32_t total = q->total[row * blocks + b];
        __m256i dot = is_signed ? _mm256_set1_epi32(128 * total) : _mm256_set1_epi32(type == TYPE_MXFP4 ? -12 * total : 0);
        if (is_signed) {
            for (int j = 0; j < 8; j++) {
                const __m256i xj = _mm256_sign_epi8(bcast4(xq + 4 * j), sign[j]);
                dot = _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(u[j], xj), ones));
                KEEP_IN_REGISTER(dot);
            }
        } else {
            dot = _mm256_add_epi32(dot, dot_quads(u, xq, 8, pairs));
        }
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(q->dx[row * blocks + b])), acc[r]);
        if (type != TYPE_MXFP4) acc[r] = _mm256_fmadd_ps(c, _mm256_set1_ps(q->sums[row * blocks + b]), acc[r]);
    }
}

/* One half (8 weight rows) of one group's tiles against rows first .. first + rows - 1 of the quantized x:
   acc[r] lane i += output row 8 * half + i. */
static inline __attribute__((always_inline)) void half_q8(const int type, const Layout l, const uint8_t *tiles,
                                                          int64_t blocks, const Quantized *q, int64_t k, int half,
                                                          int64_t first, int64_t rows, __m256 *acc) {
    const int64_t tile_bytes = (int64_t)GROUP * l.block_bytes;
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *t = tiles + b * tile_bytes;
        for (int64_t line = 0; line < tile_bytes; line += 64) _mm_prefetch((const char *)t + PREFETCH_BYTES + line, _MM_HINT_T0);
        block_half(type, l, t, b, blocks, q, k, half, first, rows, acc);
    }
}

/* One group's tiles (16 weight rows) against row `row` of x, a decode step's: both halves of each tile in one
   pass (acc[half] lane i += output row 8 * half + i), where half_q8 would pass over the group twice and read
   every 64-byte line again for its other half. Per output row the steps are half_q8's, so a row's result
   does not depend on how many rows came with it. */
static inline __attribute__((always_inline)) void group_one_q8(const int type, const Layout l, const uint8_t *tiles,
                                                               int64_t blocks, const Quantized *q, int64_t k,
                                                               int64_t row, __m256 *acc) {
    const int64_t tile_bytes = (int64_t)GROUP * l.block_bytes;
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *t = tiles + b * tile_bytes;
        for (int64_t line = 0; line < tile_bytes; line += 64) _mm_prefetch((const char *)t + PREFETCH_BYTES + line, _MM_HINT_T0);
        block_half(type, l, t, b, blocks, q, k, 0, row, 1, acc);
        block_half(type, l, t, b, blocks, q, k, 1, row, 1, acc + 1);
    }
}

static void group_one(int type, const uint8_t *tiles, int64_t blocks, const Quantized *q, int64_t k, int64_t row,
                      __m256 *acc) {
    switch (type) {
    case TYPE_Q4_0: group_one_q8(TYPE_Q4_0, (Layout){18, 0, 0, 0}, tiles, blocks, q, k, row, acc); break;
    case TYPE_Q4_1: group_one_q8(TYPE_Q4_1, (Layout){20, 1, 0, 0}, tiles, blocks, q, k, row, acc); break;
    case TYPE_Q5_0: group_one_q8(TYPE_Q5_0, (Layout){22, 0, 1, 0}, tiles, blocks, q, k, row, acc); break;
    case TYPE_Q5_1: group_one_q8(TYPE_Q5_1, (Layout){24, 1, 1, 0}, tiles, blocks, q, k, row, acc); break;
    case TYPE_Q8_0: group_one_q8(TYPE_Q8_0, (Layout){34, 0, 0, 0}, tiles, blocks, q, k, row, acc); break;
    case TYPE_MXFP4: group_one_q8(TYPE_MXFP4, (Layout){17, 0, 0, 1}, tiles, blocks, q, k, row, acc); break;
    default: group_one_q8(TYPE_IQ4_NL, (Layout){18, 0, 0, 0}, tiles, blocks, q, k, row, acc); break;
    }
}

static void half_any(int type, const uint8_t *tiles, int64_t blocks, const Quantized *q, int64_t k, int half,
                     int64_t first, int64_t rows, __m256 *acc) {
    switch (type) {
    case TYPE_Q4_0: half_q8(TYPE_Q4_0, (Layout){18, 0, 0, 0}, tiles, blocks, q, k, half, first, rows, acc); break;
    case TYPE_Q4_1: half_q8(TYPE_Q4_1, (Layout){20, 1, 0, 0}, tiles, blocks, q, k, half, first, rows, acc); break;
    case TYPE_Q5_0: half_q8(TYPE_Q5_0, (Layout){22, 0, 1, 0}, tiles, blocks, q, k, half, first, rows, acc); break;
    case TYPE_Q5_1: half_q8(TYPE_Q5_1, (Layout){24, 1, 1, 0}, tiles, blocks, q, k, half, first, rows, acc); break;
    case TYPE_Q8_0: half_q8(TYPE_Q8_0, (Layout){34, 0, 0, 0}, tiles, blocks, q, k, half, first, rows, acc); break;
    case TYPE_MXFP4: half_q8(TYPE_MXFP4, (Layout){17, 0, 0, 1}, tiles, blocks, q, k, half, first, rows, acc); break;
    default: half_q8(TYPE_IQ4_NL, (Layout){18, 0, 0, 0}, tiles, blocks, q, k, half, first, rows, acc); break;
    }
}

static int matmul_q8(int type, Layout l, const uint16_t *x, int64_t x_stride, const uint8_t *w, uint16_t *out,
                     int64_t out_stride, int64_t rows, int64_t n, int64_t k, int64_t num_threads) {
    const int64_t blocks = k / QB, groups = n / GROUP, group_bytes = blocks * GROUP * l.block_bytes;
    Quantized q = {malloc((size_t)(rows * k)), malloc(sizeof(float) * rows * blocks),
                   malloc(sizeof(float) * rows * blocks), malloc(sizeof(int32_t) * rows * blocks)};
    if (!q.xq || !q.dx || !q.sums || !q.total) {
        free(q.xq), free(q.dx), free(q.sums), free(q.total);
        return -1;
    }
    quantize_rows(x, x_stride, rows, k, &q, num_threads);
    const int64_t per_chunk = groups_per_chunk(groups, rows, MAX_ROWS, num_threads);
    const int64_t chunks = (groups + per_chunk - 1) / per_chunk;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && groups >= 4)
    for (int64_t chunk = 0; chunk < chunks; chunk++) {
        const int64_t end = (chunk + 1) * per_chunk < groups ? (chunk + 1) * per_chunk : groups;
        for (int64_t first = 0; first < rows; first += MAX_ROWS) {
            const int64_t tile = rows - first < MAX_ROWS ? rows - first : MAX_ROWS;
            for (int64_t g = chunk * per_chunk; g < end; g++) {
                if (tile == 1) { /* a decode step's row: both halves in one pass */
                    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
                    group_one(type, w + g * group_bytes, blocks, &q, k, first, acc);
                    store_bf16x16(out + first * out_stride + g * GROUP, acc);
                    continue;
                }
                for (int half = 0; half < 2; half++) {
                    __m256 acc[MAX_ROWS];
                    for (int64_t r = 0; r < tile; r++) acc[r] = _mm256_setzero_ps();
                    half_any(type, w + g * group_bytes, blocks, &q, k, half, first, tile, acc);
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
    free(q.xq), free(q.dx), free(q.sums), free(q.total);
    return 0;
}
