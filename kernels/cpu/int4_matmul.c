/* bfloat16 x [rows, k] times a 4-bit weight [n, k] (transposed), for up to a hundred-odd rows: decode steps.

   torch's CPU int4 kernel is a loop of matrix-vector products: it unpacks and scales the whole weight again
   for every row of x, so 16 rows cost 16 times one row. Here the weight's nibbles are unpacked once per tile
   of up to 12 rows and turned into bfloat16 integers 0..15 by a table lookup, and AVX512-BF16 dot products
   (two columns per instruction) accumulate x . q for each group of columns in float32. The group's scale
   and zero are applied once per group:

       sum over the group of x[c] * ((q[c] - 8) * s + z)  =  s * (x . q)  +  (z - 8 s) * sum(x)

   Weight layout: torch's _convert_weight_to_int4pack_for_cpu on an AVX-512 CPU, rows in blocks of 64: byte
   (b, c, i) of [n / 64, k, 32] holds row 64 b + i of column c in its low nibble and row 64 b + 32 + i in its
   high nibble (kernels/torch_ref/quant.py checks this layout per shape before calling here). Scales and
   zeros: [k / group, n, 2] bfloat16. A second weight (`low`, an 8-bit weight split into two 4-bit planes)
   is summed in float32 before the one rounding of the output.

   Only built with AVX512-BF16 (int4_matmul returns -1 elsewhere, and torch's kernel is used). */

#include <stdint.h>
#include <string.h>

#include "bf16.h"

#define MAX_TILE 12

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>

typedef struct {
    const uint16_t *x;
    int64_t x_stride;
    const uint8_t *packed[2];
    const uint16_t *scales[2];
    int64_t planes, rows, n, k, group;
    float *sums; /* [rows, k / group]: each row's sum of x over each group */
} Problem;

/* The 16 output rows `base` .. base + 15 and base + 32 .. base + 47 of one 64-row block (base is 0 or 16)
   for rows first .. first + tile - 1 of x, added into acc [tile][32] (float32). */
static inline __attribute__((always_inline)) void tile_half(const Problem *p, int64_t block, int64_t base,
                                                            int64_t first, const int64_t tile, float *acc) {
    /* nibble value v (in the index's low 4 bits; bit 4 is the neighbour nibble's and is ignored) -> bf16(v) */
    const __m512i table = _mm512_set_epi16(0x4170, 0x4160, 0x4150, 0x4140, 0x4130, 0x4120, 0x4110, 0x4100,
                                           0x40e0, 0x40c0, 0x40a0, 0x4080, 0x4040, 0x4000, 0x3f80, 0x0000,
                                           0x4170, 0x4160, 0x4150, 0x4140, 0x4130, 0x4120, 0x4110, 0x4100,
                                           0x40e0, 0x40c0, 0x40a0, 0x4080, 0x4040, 0x4000, 0x3f80, 0x0000);
    /* words (i, column c) and (i, column c + 1) side by side, for the 16 rows `base` .. base + 15 */
    __m512i pairs;
    {
        uint16_t order[32];
        for (int i = 0; i < 16; i++) {
            order[2 * i] = (uint16_t)(base + i);
            order[2 * i + 1] = (uint16_t)(32 + base + i);
        }
        pairs = _mm512_loadu_si512(order);
    }
    const int64_t groups = p->k / p->group;
    for (int64_t plane = 0; plane < p->planes; plane++) {
        const uint8_t *bytes = p->packed[plane] + block * p->k * 32;
        const uint16_t *scales = p->scales[plane];
        for (int64_t g = 0; g < groups; g++) {
            __m512 low[MAX_TILE], high[MAX_TILE];
#pragma GCC unroll 12
            for (int64_t m = 0; m < tile; m++) low[m] = high[m] = _mm512_setzero_ps();
            for (int64_t c = g * p->group; c < (g + 1) * p->group; c += 2) {
                const __m512i a = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(bytes + c * 32)));
                const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(bytes + (c + 1) * 32)));
                const __m512i both = _mm512_permutex2var_epi16(a, pairs, b);
                const __m512bh w_low = (__m512bh)_mm512_permutexvar_epi16(both, table);
                const __m512bh w_high = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(both, 4), table);
#pragma GCC unroll 12
                for (int64_t m = 0; m < tile; m++) {
                    int32_t x2;
                    memcpy(&x2, p->x + (first + m) * p->x_stride + c, sizeof x2);
                    const __m512bh xs = (__m512bh)_mm512_set1_epi32(x2);
                    low[m] = _mm512_dpbf16_ps(low[m], w_low, xs);
                    high[m] = _mm512_dpbf16_ps(high[m], w_high, xs);
                }
            }
            /* scale and zero of the 16 + 16 rows: (s, z) bf16 pairs as 32-bit lanes */
            const uint16_t *sz = scales + (g * p->n + block * 64) * 2;
            const __m512i pair_low = _mm512_loadu_si512(sz + 2 * base);
            const __m512i pair_high = _mm512_loadu_si512(sz + 2 * (32 + base));
            const __m512 s_low = _mm512_castsi512_ps(_mm512_slli_epi32(pair_low, 16));
            const __m512 s_high = _mm512_castsi512_ps(_mm512_slli_epi32(pair_high, 16));
            const __m512i upper = _mm512_set1_epi32((int32_t)0xffff0000u);
            const __m512 eight = _mm512_set1_ps(8.0f);
            const __m512 z_low = _mm512_fnmadd_ps(eight, s_low, _mm512_castsi512_ps(_mm512_and_si512(pair_low, upper)));
            const __m512 z_high = _mm512_fnmadd_ps(eight, s_high, _mm512_castsi512_ps(_mm512_and_si512(pair_high, upper)));
#pragma GCC unroll 12
            for (int64_t m = 0; m < tile; m++) {
                const __m512 sum = _mm512_set1_ps(p->sums[(first + m) * groups + g]);
                float *row = acc + m * 32;
                __m512 r0 = _mm512_loadu_ps(row), r1 = _mm512_loadu_ps(row + 16);
                r0 = _mm512_fmadd_ps(s_low, low[m], _mm512_fmadd_ps(z_low, sum, r0));
                r1 = _mm512_fmadd_ps(s_high, high[m], _mm512_fmadd_ps(z_high, sum, r1));
                _mm512_storeu_ps(row, r0);
                _mm512_storeu_ps(row + 16, r1);
            }
        }
    }
}

#define TILE(T) \
    static void tile_##T(const Problem *p, int64_t block, int64_t base, int64_t first, float *acc) { \
        tile_half(p, block, base, first, T, acc);                                                   \
    }
TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6) TILE(7) TILE(8) TILE(9) TILE(10) TILE(11) TILE(12)
static void (*const tiles[MAX_TILE])(const Problem *, int64_t, int64_t, int64_t, float *) = {
    tile_1, tile_2, tile_3, tile_4, tile_5, tile_6, tile_7, tile_8, tile_9, tile_10, tile_11, tile_12};

static void run_task(const Problem *p, int64_t task, uint16_t *out, int64_t out_stride) {
    const int64_t block = task / 2, base = (task % 2) * 16;
    float acc[MAX_TILE * 32];
    for (int64_t first = 0; first < p->rows; first += MAX_TILE) {
        const int64_t tile = p->rows - first < MAX_TILE ? p->rows - first : MAX_TILE;
        memset(acc, 0, sizeof acc);
        tiles[tile - 1](p, block, base, first, acc);
        for (int64_t m = 0; m < tile; m++) {
            uint16_t *dst = out + (first + m) * out_stride + block * 64;
            for (int64_t i = 0; i < 16; i++) {
                dst[base + i] = float_to_bf16(acc[m * 32 + i]);
                dst[32 + base + i] = float_to_bf16(acc[m * 32 + 16 + i]);
            }
        }
    }
}
#endif

/* out [rows, n] (row stride out_stride) = x [rows, k] (row stride x_stride) @ (W + W_low).T, all bfloat16;
   packed_low / scales_low may be NULL. Returns 0, or -1 where this build or these sizes are not handled. */
int int4_matmul(const uint16_t *x, int64_t x_stride, const uint8_t *packed, const uint16_t *scales,
                const uint8_t *packed_low, const uint16_t *scales_low, uint16_t *out, int64_t out_stride, int64_t rows,
                int64_t n, int64_t k, int64_t group, int64_t num_threads) {
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
    if (rows <= 0 || n % 64 != 0 || group % 2 != 0 || k % group != 0) return -1;
    const int64_t groups = k / group;
    float sums[rows * groups]; /* each row's sum of x over each group (the caller sends under 128 rows) */
    for (int64_t m = 0; m < rows; m++)
        for (int64_t g = 0; g < groups; g++) {
            float total = 0.0f;
            for (int64_t c = g * group; c < (g + 1) * group; c++) total += bf16_to_float(x[m * x_stride + c]);
            sums[m * groups + g] = total;
        }
    const Problem p = {x, x_stride, {packed, packed_low}, {scales, scales_low}, packed_low ? 2 : 1, rows, n, k,
                       group, sums};
    const int64_t tasks = n / 64 * 2;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (int64_t task = 0; task < tasks; task++) run_task(&p, task, out, out_stride);
    return 0;
#else
    (void)x, (void)x_stride, (void)packed, (void)scales, (void)packed_low, (void)scales_low, (void)out;
    (void)out_stride, (void)rows, (void)n, (void)k, (void)group, (void)num_threads;
    return -1;
#endif
}
