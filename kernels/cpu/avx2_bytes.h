/* Shared by the AVX2 8-bit block kernels (block32_avx2.h, kquant_avx2.h): byte moves AVX2 lacks an
   instruction for. Each kernel is compiled as its own library, so they meet here rather than in one .c. */

#ifndef TANDEM_CPU_AVX2_BYTES_H
#define TANDEM_CPU_AVX2_BYTES_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* Four int8 values, broadcast to every 32-bit lane. */
static inline __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* 32 mask bits -> 32 bytes, 0xFF where the bit is set (byte i <- bit i): vpmovm2b without AVX-512. */
static inline __m256i bits_to_bytes(uint32_t bits) {
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int32_t)bits),
        _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
    const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL); /* byte j: every bit but j */
    return _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
}

#endif
