/* Shared by the CPU kernels: bfloat16 <-> float32, and an exp the compiler can vectorize. */

#ifndef TANDEM_CPU_BF16_H
#define TANDEM_CPU_BF16_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even, as torch does; NaN stays NaN. */
static inline uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* bfloat16 rounding of a float, kept as a float */
static inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

/* Cephes' expf coefficients: exp(r) for |r| <= ln2 / 2, relative error about 2e-7. */
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

/* exp(x) for any float x (libm's expf is a call per element; this is arithmetic the compiler vectorizes):
   x = n ln2 + r, exp(r) by the polynomial, 2^n from exponent bits (as two factors, since 2^128 is no float).
   Inputs are clamped to [-87, 88]. */
static inline float exp_poly(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    /* n = round(x / ln2): adding and removing 1.5 * 2^23 rounds to an integer, and unlike floorf it vectorizes */
    const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = EXP_P0;
    p = p * r + EXP_P1;
    p = p * r + EXP_P2;
    p = p * r + EXP_P3;
    p = p * r + EXP_P4;
    p = p * r + EXP_P5;
    p = p * r * r + r + 1.0f;
    const int32_t whole = (int32_t)n, half = whole >> 1;
    const int32_t bits_a = (half + 127) << 23, bits_b = (whole - half + 127) << 23;
    float a, b;
    memcpy(&a, &bits_a, sizeof a);
    memcpy(&b, &bits_b, sizeof b);
    return p * a * b;
}

#endif
