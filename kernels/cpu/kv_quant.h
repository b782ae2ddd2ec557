/* The quantized KV cache's blocks (kernels/torch_ref/kv_quant.py defines the format) in C, shared by the write
   kernel (kv_quant.c) and the attention over quantized pages (paged_decode.c, paged_prefill_quant.c).

   A block is 32 values rotated by the normalized Hadamard transform: a float16 scale (2 bytes), then 32 codes
   of 4, 6 or 8 bits. Everything here reproduces the twin's float32 operations one for one (its butterflies
   in its order, then one multiply; the scale from the first value of largest magnitude, rounded to float16
   to nearest even; x * (1 / scale) rounded half to even), so codes equal the twin's to the bit. Dequantized
   values (code - 2^(bits-1)) * scale are exact in float32 (8 bits times float16's 11), so any way of
   computing them gives the same floats. */

#ifndef TANDEM_CPU_KV_QUANT_H
#define TANDEM_CPU_KV_QUANT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "f16.h"

#define KVQ_GROUP 32
#define KVQ_NORM 0.17677669529663687f /* 1 / sqrt(32), as float32: what the twin's multiply uses */

static inline int64_t kvq_block_bytes(int bits) { return 2 + KVQ_GROUP * bits / 8; }

/* x[0..32) rotated in place: five stages of butterflies (pairs h apart within runs of 2h), then the norm. */
static inline void kvq_rotate(float *x) {
    for (int h = 1; h < KVQ_GROUP; h *= 2)
        for (int p = 0; p < KVQ_GROUP; p += 2 * h)
            for (int r = 0; r < h; r++) {
                const float a = x[p + r], b = x[p + h + r];
                x[p + r] = a + b;
                x[p + h + r] = a - b;
            }
    for (int i = 0; i < KVQ_GROUP; i++) x[i] *= KVQ_NORM;
}

/* float -> IEEE half, round to nearest even (subnormals, overflow to infinity), as torch's Tensor.half(). */
static inline uint16_t kvq_float_to_f16(float f) {
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    /* FP16 library's fp16_ieee_from_fp32_value (torch's c10::Half uses it): the float adds do the rounding */
    uint32_t w, bits;
    memcpy(&w, &f, sizeof w);
    const uint32_t shl1_w = w + w, sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    const uint32_t bias_bits = (bias >> 1) + 0x07800000u;
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f, bias_f;
    memcpy(&bias_f, &bias_bits, sizeof bias_f);
    base = bias_f + base;
    memcpy(&bits, &base, sizeof bits);
    const uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
#endif
}

/* The scale's float16 bits and the multiplier for a block whose value of largest magnitude is `largest`. */
static inline uint16_t kvq_scale(float largest, int bits, float *inverse) {
    const uint16_t half = kvq_float_to_f16(largest / (float)-(1 << (bits - 1)));
    const float scale = read_f16((const uint8_t *)&half);
    *inverse = scale == 0.0f ? 0.0f : 1.0f / scale;
    return half;
}

/* The scale and 32 codes (0 .. 2^bits - 1) -> the block's bytes at dst (layouts in kv_quant.py's docstring). */
static inline void kvq_pack(uint16_t half, const uint8_t *codes, int bits, uint8_t *dst) {
    dst[0] = (uint8_t)(half & 255);
    dst[1] = (uint8_t)(half >> 8);
    uint8_t *payload = dst + 2;
    if (bits == 8) {
        memcpy(payload, codes, KVQ_GROUP);
        return;
    }
    for (int i = 0; i < 16; i++) payload[i] = (uint8_t)((codes[i] & 15) | (codes[i + 16] & 15) << 4);
    if (bits == 6)
        for (int j = 0; j < 8; j++)
            payload[16 + j] = (uint8_t)((codes[j] >> 4) | (codes[j + 8] >> 4) << 2 | (codes[j + 16] >> 4) << 4 |
                                        (codes[j + 24] >> 4) << 6);
}

/* A rotated block x[0..32) -> its bytes at dst. */
static inline void kvq_quantize(const float *x, int bits, uint8_t *dst) {
    const int top = 1 << (bits - 1);
    int largest = 0;
    for (int i = 1; i < KVQ_GROUP; i++)
        if (fabsf(x[i]) > fabsf(x[largest])) largest = i; /* the first of ties, as torch's argmax */
    float inverse;
    const uint16_t half = kvq_scale(x[largest], bits, &inverse);
    uint8_t codes[KVQ_GROUP];
    for (int i = 0; i < KVQ_GROUP; i++) {
        float c = nearbyintf(x[i] * inverse);
        c = c < (float)-top ? (float)-top : c > (float)(top - 1) ? (float)(top - 1) : c;
        codes[i] = (uint8_t)((int)c + top);
    }
    kvq_pack(half, codes, bits, dst);
}

/* A block's bytes -> its 32 (rotated) values, the plain way. */
static inline void kvq_dequantize_block(const uint8_t *src, int bits, float *dst) {
    const float scale = read_f16(src);
    const uint8_t *payload = src + 2;
    const int top = 1 << (bits - 1);
    for (int i = 0; i < KVQ_GROUP; i++) {
        int code = payload[i];
        if (bits != 8) {
            code = i < 16 ? payload[i] & 15 : payload[i - 16] >> 4;
            if (bits == 6) code |= ((payload[16 + (i & 7)] >> (2 * (i >> 3))) & 3) << 4;
        }
        dst[i] = (float)(code - top) * scale;
    }
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* 8 codes (int32 lanes) -> (code - top) * scale: code * scale + (-top * scale), both products exact, so the
   fused multiply-add rounds nothing. */
static inline void kvq_store8(float *dst, __m256i codes, __m256 scale, __m256 bias) {
    _mm256_storeu_ps(dst, _mm256_fmadd_ps(_mm256_cvtepi32_ps(codes), scale, bias));
}

/* One butterfly stage within each 128-bit or 256-bit run: `swapped` holds each lane's partner, and the lanes
   in `upper` (the second of each pair) take partner - self, the others self + partner. */
#define KVQ_STAGE(v, swapped, upper) \
    _mm256_blend_ps(_mm256_add_ps(v, swapped), _mm256_sub_ps(swapped, v), upper)

/* kvq_rotate of a block in 4 vectors: the same pairs added and subtracted (stages 1, 2 and 4 within a vector,
   8 and 16 across them), so each value is the same float. */
static inline void kvq_rotate_avx2(__m256 *v) {
    for (int i = 0; i < 4; i++) {
        v[i] = KVQ_STAGE(v[i], _mm256_permute_ps(v[i], 0xB1), 0xAA);
        v[i] = KVQ_STAGE(v[i], _mm256_permute_ps(v[i], 0x4E), 0xCC);
        v[i] = KVQ_STAGE(v[i], _mm256_permute2f128_ps(v[i], v[i], 0x01), 0xF0);
    }
    for (int h = 1; h <= 2; h *= 2)
        for (int i = 0; i < 4; i++)
            if (!(i & h)) {
                const __m256 a = v[i], b = v[i + h];
                v[i] = _mm256_add_ps(a, b);
                v[i + h] = _mm256_sub_ps(a, b);
            }
    for (int i = 0; i < 4; i++) v[i] = _mm256_mul_ps(v[i], _mm256_set1_ps(KVQ_NORM));
}

/* kvq_quantize of a rotated block in 4 vectors. */
static inline void kvq_quantize_avx2(const __m256 *v, int bits, uint8_t *dst) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 top_abs = _mm256_andnot_ps(sign, v[0]);
    for (int i = 1; i < 4; i++) top_abs = _mm256_max_ps(top_abs, _mm256_andnot_ps(sign, v[i]));
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(top_abs), _mm256_extractf128_ps(top_abs, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float most = _mm_cvtss_f32(m);
    float x[KVQ_GROUP];
    for (int i = 0; i < 4; i++) _mm256_storeu_ps(x + 8 * i, v[i]);
    int largest = 0;
    while (largest < KVQ_GROUP - 1 && fabsf(x[largest]) != most) largest++; /* the first of ties */
    float inverse;
    const uint16_t half = kvq_scale(x[largest], bits, &inverse);
    const int top = 1 << (bits - 1);
    const __m256 low = _mm256_set1_ps((float)-top), high = _mm256_set1_ps((float)(top - 1));
    int32_t codes32[KVQ_GROUP];
    for (int i = 0; i < 4; i++) {
        const __m256 c = _mm256_round_ps(_mm256_mul_ps(v[i], _mm256_set1_ps(inverse)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i whole = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(c, low), high));
        _mm256_storeu_si256((__m256i *)(codes32 + 8 * i), _mm256_add_epi32(whole, _mm256_set1_epi32(top)));
    }
    uint8_t codes[KVQ_GROUP];
    for (int i = 0; i < KVQ_GROUP; i++) codes[i] = (uint8_t)codes32[i];
    kvq_pack(half, codes, bits, dst);
}

/* kvq_dequantize_block in 8 lanes; `bits` is a constant where it is inlined. */
static inline __attribute__((always_inline)) void kvq_dequantize_block_avx2(const uint8_t *src, const int bits,
                                                                            float *dst) {
    uint16_t half;
    memcpy(&half, src, 2);
    const __m256 scale = _mm256_cvtph_ps(_mm_set1_epi16((short)half));
    const __m256 bias = _mm256_mul_ps(scale, _mm256_set1_ps((float)-(1 << (bits - 1))));
    const uint8_t *payload = src + 2;
    if (bits == 8) {
        for (int c = 0; c < 4; c++)
            kvq_store8(dst + 8 * c, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(payload + 8 * c))), scale,
                       bias);
        return;
    }
    /* bytes 0-7 hold codes 0-7 (low nibbles) and 16-23 (high), bytes 8-15 codes 8-15 and 24-31 */
    const __m256i low4 = _mm256_set1_epi32(15), high2 = _mm256_set1_epi32(0x30);
    const __m256i first = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)payload));
    const __m256i second = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(payload + 8)));
    __m256i codes[4] = {_mm256_and_si256(first, low4), _mm256_and_si256(second, low4), _mm256_srli_epi32(first, 4),
                        _mm256_srli_epi32(second, 4)};
    if (bits == 6) { /* byte j of the tops: bits 2c, 2c + 1 are code j + 8c's bits 4, 5 */
        const __m256i tops = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(payload + 16)));
        codes[0] = _mm256_or_si256(codes[0], _mm256_and_si256(_mm256_slli_epi32(tops, 4), high2));
        codes[1] = _mm256_or_si256(codes[1], _mm256_and_si256(_mm256_slli_epi32(tops, 2), high2));
        codes[2] = _mm256_or_si256(codes[2], _mm256_and_si256(tops, high2));
        codes[3] = _mm256_or_si256(codes[3], _mm256_and_si256(_mm256_srli_epi32(tops, 2), high2));
    }
    for (int c = 0; c < 4; c++) kvq_store8(dst + 8 * c, codes[c], scale, bias);
}

static inline __attribute__((always_inline)) void kvq_rows_avx2(const uint8_t *base, const int64_t *offsets,
                                                                int64_t count, const int bits, const int64_t blocks,
                                                                float *dst) {
    for (int64_t j = 0; j < count; j++, dst += blocks * KVQ_GROUP)
        for (int64_t b = 0; b < blocks; b++)
            kvq_dequantize_block_avx2(base + offsets[j] + b * kvq_block_bytes(bits), bits, dst + b * KVQ_GROUP);
}
#endif

/* Head rows base + offsets[0..count) of head_dim values each -> dst, one after another. */
static inline void kvq_dequantize_rows(const uint8_t *base, const int64_t *offsets, int64_t count, int bits,
                                       int64_t head_dim, float *dst) {
#if defined(__AVX2__) && defined(__FMA__)
    /* each format and the common head sizes (64, 128) with constants, so the loops unroll */
#define KVQ_ROWS(BITS)                                                                      \
    do {                                                                                    \
        if (head_dim == 64)                                                                 \
            kvq_rows_avx2(base, offsets, count, BITS, 2, dst);                              \
        else if (head_dim == 128)                                                           \
            kvq_rows_avx2(base, offsets, count, BITS, 4, dst);                              \
        else                                                                                \
            kvq_rows_avx2(base, offsets, count, BITS, head_dim / KVQ_GROUP, dst);           \
    } while (0)
    if (bits == 4)
        KVQ_ROWS(4);
    else if (bits == 6)
        KVQ_ROWS(6);
    else
        KVQ_ROWS(8);
#undef KVQ_ROWS
#else
    for (int64_t j = 0; j < count; j++)
        for (int64_t b = 0; b < head_dim / KVQ_GROUP; b++)
            kvq_dequantize_block(base + offsets[j] + b * kvq_block_bytes(bits), bits,
                                 dst + j * head_dim + b * KVQ_GROUP);
#endif
}

#endif
