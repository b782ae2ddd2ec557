/* The quantized KV cache's writes: new keys and values rotated, quantized and stored in their slots
   (kv_quant_write). Attention over quantized pages is paged_decode.c's (paged_decode_quant, decode steps) and
   paged_prefill_quant.c's (prompts); see kernels/cpu/kv_quant.py. Block format and arithmetic: kv_quant.h.

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
