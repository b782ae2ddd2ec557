/* Shared by the AVX2 8-bit block kernels (block32_avx2.h, kquant_avx2.h): byte moves AVX2 lacks an
   instruction for, x's quantization to int8, the int16-then-int32 sums of quads, and the store of a 16-row
   group's sums. Each kernel is compiled as its own library, so they meet here rather than in one .c. */

#ifndef TANDEM_CPU_AVX2_BYTES_H
#define TANDEM_CPU_AVX2_BYTES_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

/* Four int8 values, broadcast to every 32-bit lane. */
static inline __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Holds the vector variable v in a register at this point. GCC reassociates a chain of integer vector adds
   (legal, they wrap) into a tree that makes every vpmaddubsw product first and adds them after: with 16 ymm
   registers the products spill to the stack and are added from there. Passing each partial sum through here keeps
   the chain as written, in registers. The int32 chains of the signed types (block32_avx2.h's Q8_0 and IQ4_NL,
   kquant_avx2.h's IQ4_XS) take it too. */
#define KEEP_IN_REGISTER(v) __asm__("" : "+x"(v))

/* 32 mask bits -> 32 bytes, 0xFF where the bit is set (byte i <- bit i): vpmovm2b without AVX-512. */
static inline __m256i bits_to_bytes(uint32_t bits) {
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int32_t)bits),
        _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
    const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL); /* byte j: every bit but j */
    return _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
}

/* The largest magnitude of n bf16 values (n a multiple of 8): exact, whatever the order; a NaN is passed over,
   as the scalar `a > amax ? a : amax` does (vmaxps returns its second operand when either is NaN). */
static inline float bf16_amax(const uint16_t *x, int n) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
        const __m256i bits = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i))), 16);
        amax = _mm256_max_ps(_mm256_and_ps(_mm256_castsi256_ps(bits), magnitude), amax);
    }
    float lanes[8], best = 0.0f;
    _mm256_storeu_ps(lanes, amax);
    for (int i = 0; i < 8; i++) best = lanes[i] > best ? lanes[i] : best;
    return best;
}

/* n bf16 values (n a multiple of 32) divided by dx, rounded to nearest even and saturated to int8, into q (all
   zeros when dx is 0): the scalar clamp of each int32 to [-128, 127], in two saturating packs. */
static inline void bf16_to_int8(const uint16_t *x, int n, float dx, int8_t *q) {
    if (!(dx > 0.0f)) {
        memset(q, 0, (size_t)n);
        return;
    }
    const __m256 d = _mm256_set1_ps(dx);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* the packs interleave 128-bit halves */
    for (int i = 0; i < n; i += 32) {
        __m256i r[4];
        for (int j = 0; j < 4; j++) {
            const __m256i bits = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i + 8 * j))), 16);
            r[j] = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_castsi256_ps(bits), d));
        }
        const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
        _mm256_storeu_si256((__m256i *)(q + i), _mm256_permutevar8x32_epi32(bytes, order));
    }
}

/* The int32 sums of n quads u[0 .. n - 1] times xq[0 .. 4n - 1] for 8 weight rows, each int16 pair multiplied
   by `scale` (int16, both halves of a lane alike) in vpmaddwd. vpmaddubsw's int16 pairs are exact while
   u <= 128 (2 * 128 * 128 fits); `per` quads' pairs are added in int16 before vpmaddwd, where the caller's u
   keeps per * 2 * 128 * max u within int16. */
static inline __attribute__((always_inline)) __m256i dot_quads_scaled(const __m256i *u, const int8_t *xq, int n,
                                                                      int per, __m256i scale) {
    __m256i dot = _mm256_setzero_si256();
    for (int quad = 0; quad < n; quad += per) {
        __m256i pairs = _mm256_maddubs_epi16(u[quad], bcast4(xq + 4 * quad));
        for (int i = 1; i < per; i++) {
            pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(u[quad + i], bcast4(xq + 4 * (quad + i))));
            KEEP_IN_REGISTER(pairs);
        }
        dot = _mm256_add_epi32(dot, _mm256_madd_epi16(pairs, scale));
    }
    return dot;
}

/* The unscaled sums: what the VNNI paths' vpdpbusd chains sum (block32_avx2.h's unsigned types, kquant_avx2.h's
   Q2_K and Q3_K). */
static inline __attribute__((always_inline)) __m256i dot_quads(const __m256i *u, const int8_t *xq, int n, int per) {
    return dot_quads_scaled(u, xq, n, per, _mm256_set1_epi16(1));
}

/* A 16-row group's float32 sums for one row of x (acc[0] rows 0-7, acc[1] rows 8-15) rounded to bf16 into o. */
static inline void store_bf16x16(uint16_t *o, const __m256 *acc) {
    float lanes[16];
    _mm256_storeu_ps(lanes, acc[0]);
    _mm256_storeu_ps(lanes + 8, acc[1]);
    for (int i = 0; i < 16; i++) o[i] = float_to_bf16(lanes[i]);
}

#endif
