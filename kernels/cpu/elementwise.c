/* RMSNorm (with the residual add), rotary embedding and SiLU-and-multiply for bfloat16 tensors, one pass
   each; and the copy of a decode step's new keys and values into their cache slots.

   In torch each of these is four to eight small ops with a temporary tensor between each two; in a decode
   step of 16 rows the ops cost more in dispatch than in arithmetic, and on a prompt they read and write
   memory several times over. Each function rounds to bfloat16 where the torch twin's ops round, so the
   results match the twins to the bit, apart from the order of a row's float32 sum in RMSNorm and the exp
   in SiLU (a polynomial here, within 2e-7 relative).

   Rows are split among OpenMP threads; a row's elements are contiguous, rows are `stride` apart. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

/* out = weight * bf16(h * rsqrt(mean(h^2) + eps)), h = x (+ residual, rounded; written to residual_out). */
void rms_norm_bf16(const uint16_t *x, int64_t x_stride, const uint16_t *residual, int64_t residual_stride,
                   uint16_t *residual_out, const uint16_t *weight, uint16_t *out, int64_t rows, int64_t n, float eps,
                   int64_t num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && rows > 1)
    for (int64_t row = 0; row < rows; row++) {
        const uint16_t *xr = x + row * x_stride;
        float h[n];
        if (residual) {
            const uint16_t *rr = residual + row * residual_stride;
            uint16_t *ro = residual_out + row * n;
#pragma omp simd
            for (int64_t i = 0; i < n; i++) {
                ro[i] = float_to_bf16(bf16_to_float(xr[i]) + bf16_to_float(rr[i]));
                h[i] = bf16_to_float(ro[i]);
            }
        } else {
#pragma omp simd
            for (int64_t i = 0; i < n; i++) h[i] = bf16_to_float(xr[i]);
        }
        float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
        for (int64_t i = 0; i < n; i++) squares += h[i] * h[i];
        const float inv = 1.0f / sqrtf(squares / (float)n + eps);
        uint16_t *o = out + row * n;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) o[i] = float_to_bf16(bf16_to_float(weight[i]) * round_bf16(h[i] * inv));
    }
}

/* x [tokens, heads, head_dim] (token stride x_stride, heads contiguous) rotated in "rotate half" form by
   cos/sin [tokens, rot] into out [tokens, heads, head_dim] (contiguous); dims from rot on pass through. */
void rope_bf16(const uint16_t *x, int64_t x_stride, const uint16_t *cos, const uint16_t *sin, uint16_t *out,
               int64_t tokens, int64_t heads, int64_t head_dim, int64_t rot, int64_t num_threads) {
    const int64_t half = rot / 2;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && tokens > 1)
    for (int64_t t = 0; t < tokens; t++) {
        const uint16_t *c = cos + t * rot, *s = sin + t * rot;
        for (int64_t h = 0; h < heads; h++) {
            const uint16_t *xi = x + t * x_stride + h * head_dim;
            uint16_t *o = out + (t * heads + h) * head_dim;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                const float a = bf16_to_float(xi[i]), b = bf16_to_float(xi[i + half]);
                /* torch: x * cos and rotate_half(x) * sin each rounded, then their sum */
                o[i] = float_to_bf16(round_bf16(a * bf16_to_float(c[i])) + round_bf16(-b * bf16_to_float(s[i])));
                o[i + half] = float_to_bf16(round_bf16(b * bf16_to_float(c[i + half])) +
                                            round_bf16(a * bf16_to_float(s[i + half])));
            }
            for (int64_t i = rot; i < head_dim; i++) o[i] = xi[i];
        }
    }
}

/* x [rows, 2n] = [gate | up] (row stride x_stride) -> out [rows, n] = bf16(silu(gate)) * up, rounded. */
void silu_and_mul_bf16(const uint16_t *x, int64_t x_stride, uint16_t *out, int64_t rows, int64_t n,
                       int64_t num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && rows > 1)
    for (int64_t row = 0; row < rows; row++) {
        const uint16_t *restrict gate = x + row * x_stride, *restrict up = gate + n;
        uint16_t *restrict o = out + row * n;
        float silu[n];
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            const float g = bf16_to_float(gate[i]);
            silu[i] = g / (1.0f + exp_poly(-g));
        }
#pragma omp simd
        for (int64_t i = 0; i < n; i++) o[i] = float_to_bf16(round_bf16(silu[i]) * bf16_to_float(up[i]));
    }
}

/* cache[slot / page_size, slot % page_size, h, :] = src[i, h, :] for every new token i (slot = slots[i], the
   batch's slot mapping) and head h (byte strides; each head's row contiguous in both): a decode step's keys or
   values into their slots, where two index_put_ calls a layer would be a visible share of a small model's
   step. Returns -1, writing nothing, if a slot lies outside the cache. */
int write_slots(const uint8_t *src, int64_t src_row_stride, int64_t src_head_stride, uint8_t *cache,
                int64_t page_stride, int64_t slot_stride, int64_t head_stride, const int64_t *slots,
                int64_t num_pages, int64_t page_size, int64_t rows, int64_t heads, int64_t head_bytes) {
    for (int64_t i = 0; i < rows; i++)
        if (slots[i] < 0 || slots[i] >= num_pages * page_size) return -1;
    for (int64_t i = 0; i < rows; i++) {
        const int64_t page = slots[i] / page_size, offset = slots[i] % page_size;
        for (int64_t h = 0; h < heads; h++)
            memcpy(cache + page * page_stride + offset * slot_stride + h * head_stride,
                   src + i * src_row_stride + h * src_head_stride, (size_t)head_bytes);
    }
    return 0;
}
