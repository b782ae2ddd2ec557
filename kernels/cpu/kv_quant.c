/* The quantized KV cache's writes and reads outside attention: new keys and values rotated, quantized and
   stored in their slots (kv_quant_write), and pages dequantized into float32 (kv_quant_dequantize_pages, for
   prompts, which attend over float32 copies of the pages they read; see kernels/cpu/kv_quant.py). The
   attention over quantized pages is paged_decode.c's (paged_decode_quant). Block format and arithmetic:
   kv_quant.h.

   Caches are addressed by byte strides (on the CPU a permuted view of head-major memory); each head's row of
   blocks is contiguous. Work is split among OpenMP threads when there is enough of it (a prompt's rows). */

#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "kv_quant.h"

/* The head row of `head_dim` values at src (float32 if dtype is 0, bfloat16 if 1) -> its blocks at dst. */
static void quantize_row(const void *src, int dtype, int64_t head_dim, int bits, uint8_t *dst) {
#if defined(__AVX2__) && defined(__FMA__)
    for (int64_t b = 0; b < head_dim / KVQ_GROUP; b++) {
        __m256 v[4];
        for (int i = 0; i < 4; i++) {
            const int64_t at = b * KVQ_GROUP + 8 * i;
            if (dtype == 1) {
                const __m128i half = _mm_loadu_si128((const __m128i *)((const uint16_t *)src + at));
                v[i] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
            } else {
                v[i] = _mm256_loadu_ps((const float *)src + at);
            }
        }
        kvq_rotate_avx2(v);
        kvq_quantize_avx2(v, bits, dst + b * kvq_block_bytes(bits));
    }
#else
    float block[KVQ_GROUP];
    for (int64_t b = 0; b < head_dim / KVQ_GROUP; b++) {
        if (dtype == 1) {
            const uint16_t *from = (const uint16_t *)src + b * KVQ_GROUP;
            for (int i = 0; i < KVQ_GROUP; i++) block[i] = bf16_to_float(from[i]);
        } else {
            memcpy(block, (const float *)src + b * KVQ_GROUP, sizeof block);
        }
        kvq_rotate(block);
        kvq_quantize(block, bits, dst + b * kvq_block_bytes(bits));
    }
#endif
}

/* cache[slot / page_size, slot % page_size, h] = the blocks of rotate(src[i, h]) for each new token i (slot =
   slots[i]) and head h, for keys (k) and values (v) alike. Sources are [rows, heads, head_dim] of `dtype`
   with element strides per row and head (head_dim contiguous); caches share their byte strides. Returns -1,
   writing nothing, if a slot lies outside the cache or the arguments are outside what this handles. */
int kv_quant_write(const void *k, int64_t k_row_stride, int64_t k_head_stride, const void *v, int64_t v_row_stride,
                   int64_t v_head_stride, int dtype, uint8_t *k_cache, uint8_t *v_cache, int64_t page_stride,
                   int64_t slot_stride, int64_t head_stride, const int64_t *slots, int64_t num_pages,
                   int64_t page_size, int64_t rows, int64_t heads, int64_t head_dim, int bits, int64_t num_threads) {
    if ((bits != 4 && bits != 6 && bits != 8) || (dtype != 0 && dtype != 1) || head_dim % KVQ_GROUP) return -1;
    for (int64_t i = 0; i < rows; i++)
        if (slots[i] < 0 || slots[i] >= num_pages * page_size) return -1;
    const int64_t size = dtype == 1 ? 2 : 4, tasks = 2 * rows * heads;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && tasks >= 256)
    for (int64_t task = 0; task < tasks; task++) {
        const int is_v = (int)(task & 1);
        const int64_t i = task / 2 / heads, h = task / 2 % heads;
        const uint8_t *src = is_v ? (const uint8_t *)v + (i * v_row_stride + h * v_head_stride) * size
                                  : (const uint8_t *)k + (i * k_row_stride + h * k_head_stride) * size;
        const int64_t at = slots[i] / page_size * page_stride + slots[i] % page_size * slot_stride + h * head_stride;
        quantize_row(src, dtype, head_dim, bits, (is_v ? v_cache : k_cache) + at);
    }
    return 0;
}

/* Pages ids[0..n) of a quantized cache (byte strides) -> out, float32 [n, heads, page_size, head_dim]
   (contiguous): the rotated values, exactly as kv_quant.dequantize gives them. Returns -1 for bad bits. */
int kv_quant_dequantize_pages(const uint8_t *cache, int64_t page_stride, int64_t slot_stride, int64_t head_stride,
                              const int64_t *ids, int64_t n, int64_t page_size, int64_t heads, int64_t head_dim,
                              int bits, float *out, int64_t num_threads) {
    if ((bits != 4 && bits != 6 && bits != 8) || head_dim % KVQ_GROUP) return -1;
    const int64_t tasks = n * heads;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && tasks > 1)
    for (int64_t task = 0; task < tasks; task++) {
        int64_t slots[page_size];
        for (int64_t slot = 0; slot < page_size; slot++) slots[slot] = slot * slot_stride;
        const uint8_t *page = cache + ids[task / heads] * page_stride + task % heads * head_stride;
        kvq_dequantize_rows(page, slots, page_size, bits, head_dim, out + task * page_size * head_dim);
    }
    return 0;
}

/* dst[i] = the rotation of block i (32 values) of src (float32 if dtype is 0, bfloat16 if 1), as float32, for
   n blocks one after another: the query rotated in and the output rotated back around a prompt's float32
   attention (the same butterflies as the twin's rotate and the decode kernel's, so the same bits; in torch
   the five stages cost a prompt more than a tenth of its attention). Returns -1 for a bad dtype. */
int kv_quant_rotate(const void *src, int dtype, float *dst, int64_t n, int64_t num_threads) {
    if (dtype != 0 && dtype != 1) return -1;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && n >= 1024)
    for (int64_t i = 0; i < n; i++) {
        float *block = dst + i * KVQ_GROUP;
        if (dtype == 1) {
            const uint16_t *from = (const uint16_t *)src + i * KVQ_GROUP;
            for (int j = 0; j < KVQ_GROUP; j++) block[j] = bf16_to_float(from[j]);
        } else {
            memcpy(block, (const float *)src + i * KVQ_GROUP, KVQ_GROUP * sizeof(float));
        }
        kvq_rotate(block);
    }
    return 0;
}
