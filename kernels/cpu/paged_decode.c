/* Attention over a paged KV cache on the CPU, fused in one pass: one query row per row of `tables`/`seq_lens`
   (a decode step's sequences, or a prompt's tokens, each seeing the keys up to its own length).

   torch has no fused CPU kernel for this; in plain torch each layer's decode attention with 16 sequences is
   about twenty small ops, and the batched bf16 matmuls at their heart run far below memory speed because
   every (sequence, page, head) product is a tiny [group, dim] x [dim, page] matrix. Here each (sequence, KV
   head) task streams its keys and values once, in token blocks, with an online softmax (as in
   flash-decoding), all in float32; the query heads sharing that KV head (the GQA group) are served by the
   same pass over memory. The row's block loops are paged_rows.h's (shared with paged_prefill_quant.c).

   Element types: 0 = float32, 1 = bfloat16. q is [num_seqs, num_q_heads, head_dim] and out the same, both
   contiguous and of the cache's type. The cache is addressed through strides (in elements; head_dim is the
   unit-stride axis), so both the plain [pages, slots, heads, dim] layout and the CPU's head-major memory
   work. Tasks are shared among OpenMP threads (torch's own pool, see kernels/cpu/build.py).

   What runs: with AVX-512, head sizes that are multiples of 16 take paged_decode_avx512.h's vector path; with
   AVX2 and FMA but no AVX-512 (most laptops), multiples of 8 take paged_decode_avx2.h's (the same plan in 8
   lanes); the rest the portable one, which the compiler vectorizes. On AVX2 CPUs this kernel serves every
   attention call over a float cache, prompts included, so that path matters: a prompt arrives as one query
   row per token, and the AVX2 path must beat the torch twin there too. A row's arithmetic never depends on
   the other rows.

   Quantized caches (paged_decode_quant; blocks of 32 rotated values, kv_quant.h): each task loop has a
   `quant` form that dequantizes a block's keys, then its values, into a float32 scratch and runs the float32
   block math on it unchanged, with the query rotated in and the output rotated back. So a row reads the
   quantized bytes from memory (about a quarter of bfloat16's at 4 bits) and its result is, to the bit, the
   float32 kernel's on the dequantized pages with the rotated query, the output rotated back and rounded to
   q's type. A prompt over a quantized cache takes paged_prefill_quant.c, whose rows run the same functions. */

#include <stdint.h>

#include "paged_rows.h"

static void run_task_generic(const Work *w, int64_t task) {
    const int64_t seq = task / w->num_kv_heads, kv_head = task % w->num_kv_heads;
    const int64_t length = w->seq_lens[seq], dim = w->head_dim;
    const int64_t *table = w->tables + seq * w->table_stride;

    float q[MAX_GROUP * MAX_DIM], acc[MAX_GROUP * MAX_DIM], running_max[MAX_GROUP], running_sum[MAX_GROUP];
    const Row r = {q, acc, running_max, running_sum};
    float keys[BLOCK * MAX_DIM], values[BLOCK * MAX_DIM];
    row_start(w, seq, kv_head, &r);
    for (int64_t start = row_first(w, length); start < length; start += BLOCK) {
        const int64_t count = length - start < BLOCK ? length - start : BLOCK;
        int64_t offsets[BLOCK];
        block_offsets(w, table, kv_head, start, count, offsets);
        if (w->bits) {
            dequantize_rows(w, w->k, offsets, count, keys);
            dequantize_rows(w, w->v, offsets, count, values);
        } else {
            for (int64_t j = 0; j < count; j++) {
                load_row(w->k, offsets[j], w->dtype, dim, keys + j * dim);
                load_row(w->v, offsets[j], w->dtype, dim, values + j * dim);
            }
        }
        row_block(w, &r, keys, values, count);
    }
    row_finish(w, seq, kv_head, &r);
}

#if defined(__AVX512F__)
#include "paged_decode_avx512.h"

/* Instances for the common head sizes (64, 128) and GQA groups (1 to 8), float and quantized caches (Q 0 or
   1); others take the general ones. */
#define INSTANCE(Q, G, C) \
    static void task_q##Q##_g##G##_c##C(const Work *w, int64_t task) { task_avx512(w, task, G, C, Q); }
#define INSTANCES(Q, C) INSTANCE(Q, 1, C) INSTANCE(Q, 2, C) INSTANCE(Q, 3, C) INSTANCE(Q, 4, C) INSTANCE(Q, 5, C) \
    INSTANCE(Q, 6, C) INSTANCE(Q, 7, C) INSTANCE(Q, 8, C)
#define ROW(Q, C) {task_q##Q##_g1_c##C, task_q##Q##_g2_c##C, task_q##Q##_g3_c##C, task_q##Q##_g4_c##C, \
                   task_q##Q##_g5_c##C, task_q##Q##_g6_c##C, task_q##Q##_g7_c##C, task_q##Q##_g8_c##C}
INSTANCES(0, 4)
INSTANCES(0, 8)
INSTANCES(1, 4)
INSTANCES(1, 8)
static void (*const instances[2][2][8])(const Work *, int64_t) = {{ROW(0, 4), ROW(0, 8)}, {ROW(1, 4), ROW(1, 8)}};

static void run_task_avx512(const Work *w, int64_t task) {
    const int64_t group = w->num_q_heads / w->num_kv_heads, chunks = w->head_dim / 16;
    if ((chunks == 4 || chunks == 8) && group <= 8)
        instances[w->bits != 0][chunks / 8][group - 1](w, task);
    else if (w->bits)
        task_avx512(w, task, group, chunks, 1);
    else
        task_avx512(w, task, group, chunks, 0);
}
#elif defined(__AVX2__) && defined(__FMA__)
#include "paged_decode_avx2.h"

/* Instances for head sizes 64 and 128, GQA groups 1 to 8, both element types; others take the general one.
   Built in two parts (kernels/cpu/build.py's PARTS), part T makes element type T's (0 float32, 1 bfloat16)
   and its general one, and hands them to the other part through its table. */
typedef void (*Task)(const Work *, int64_t);
typedef struct {
    Task sized[2][8]; /* [head size 64 or 128][group - 1] */
    Task any;
} Tasks;
#ifdef TANDEM_PART
#define TABLE_LINKAGE __attribute__((visibility("hidden")))
#else
#define TABLE_LINKAGE static
#endif
#define INSTANCE(T, G, C) \
    static void task_t##T##_g##G##_c##C(const Work *w, int64_t task) { task_avx2(w, task, G, C, T); }
#define EACH_GROUP(T, C) INSTANCE(T, 1, C) INSTANCE(T, 2, C) INSTANCE(T, 3, C) INSTANCE(T, 4, C) INSTANCE(T, 5, C) \
    INSTANCE(T, 6, C) INSTANCE(T, 7, C) INSTANCE(T, 8, C)
#define ROW(T, C) {task_t##T##_g1_c##C, task_t##T##_g2_c##C, task_t##T##_g3_c##C, task_t##T##_g4_c##C, \
                   task_t##T##_g5_c##C, task_t##T##_g6_c##C, task_t##T##_g7_c##C, task_t##T##_g8_c##C}
#define ELEMENT_TYPE(T)                                                                                            \
    EACH_GROUP(T, 8)                                                                                               \
    EACH_GROUP(T, 16)                                                                                              \
    static void task_t##T##_any(const Work *w, int64_t task) {                                                     \
        task_avx2(w, task, w->num_q_heads / w->num_kv_heads, w->head_dim / 8, T);                                 \
    }                                                                                                              \
    TABLE_LINKAGE const Tasks tasks_t##T = {{ROW(T, 8), ROW(T, 16)}, task_t##T##_any};
#if !defined(TANDEM_PART) || TANDEM_PART == 0
ELEMENT_TYPE(0)
#else
extern TABLE_LINKAGE const Tasks tasks_t0;
#endif
#if !defined(TANDEM_PART) || TANDEM_PART == 1
ELEMENT_TYPE(1)
#else
extern TABLE_LINKAGE const Tasks tasks_t1;
#endif

static void run_task_avx2(const Work *w, int64_t task) {
    const int64_t group = w->num_q_heads / w->num_kv_heads, chunks = w->head_dim / 8;
    const Tasks *tasks = w->dtype == 1 && !w->bits ? &tasks_t1 : &tasks_t0; /* float32 math for quantized caches */
    if ((chunks == 8 || chunks == 16) && group <= 8)
        tasks->sized[chunks / 16][group - 1](w, task);
    else
        tasks->any(w, task);
}
#endif

static void run_task(const Work *w, int64_t task) {
#if defined(__AVX512F__)
    if (w->head_dim % 16 == 0) {
        run_task_avx512(w, task);
        return;
    }
#elif defined(__AVX2__) && defined(__FMA__)
    if (w->head_dim % 8 == 0) {
        run_task_avx2(w, task);
        return;
    }
#endif
    run_task_generic(w, task);
}

#if !defined(TANDEM_PART) || TANDEM_PART == 0 /* part 1 makes the bfloat16 AVX2 instances only */
static void run_tasks(const Work *base, int64_t num_seqs, int64_t num_threads) {
    const int64_t num_tasks = num_seqs * base->num_kv_heads;
    /* Tasks differ in length (sequences do), so threads take them as they come. */
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads) if (num_threads > 1 && num_tasks > 1)
    for (int64_t task = 0; task < num_tasks; task++) run_task(base, task);
}

/* Returns 0, or -1 for arguments outside what the kernel handles (the caller checks them first). `sinks`: NULL, or
   float32 [num_q_heads], each head's sink logit (paged_rows.h's softmax_start). */
int paged_decode_attention(const void *q, const void *k_cache, const void *v_cache, void *out, int64_t page_stride,
                           int64_t slot_stride, int64_t head_stride, const int64_t *tables, int64_t table_stride,
                           const int64_t *seq_lens, int64_t num_seqs, int64_t num_q_heads, int64_t num_kv_heads,
                           int64_t head_dim, int64_t page_size, int64_t window, float scale, const float *sinks,
                           int dtype, int64_t num_threads) {
    if (head_dim > MAX_DIM || num_kv_heads <= 0 || num_q_heads % num_kv_heads != 0 ||
        num_q_heads / num_kv_heads > MAX_GROUP || (dtype != 0 && dtype != 1))
        return -1;
    const Work base = {q, k_cache, v_cache, out, page_stride, slot_stride, head_stride, tables, table_stride,
                       seq_lens, num_q_heads, num_kv_heads, head_dim, page_size, window, scale, dtype, 0, sinks};
    run_tasks(&base, num_seqs, num_threads);
    return 0;
}

/* paged_decode_attention over a quantized cache of `bits` (8, 6 or 4) bits: strides in bytes, head_dim a
   multiple of 32, q and out float32 (dtype 0) or bfloat16 (1) in their own (unrotated) basis. */
int paged_decode_quant(const void *q, const void *k_cache, const void *v_cache, void *out, int64_t page_stride,
                       int64_t slot_stride, int64_t head_stride, const int64_t *tables, int64_t table_stride,
                       const int64_t *seq_lens, int64_t num_seqs, int64_t num_q_heads, int64_t num_kv_heads,
                       int64_t head_dim, int64_t page_size, int64_t window, float scale, const float *sinks,
                       int dtype, int bits, int64_t num_threads) {
    if (head_dim > MAX_DIM || head_dim % KVQ_GROUP || num_kv_heads <= 0 || num_q_heads % num_kv_heads != 0 ||
        num_q_heads / num_kv_heads > MAX_GROUP || (dtype != 0 && dtype != 1) || (bits != 4 && bits != 6 && bits != 8))
        return -1;
    const Work base = {q, k_cache, v_cache, out, page_stride, slot_stride, head_stride, tables, table_stride,
                       seq_lens, num_q_heads, num_kv_heads, head_dim, page_size, window, scale, dtype, bits, sinks};
    run_tasks(&base, num_seqs, num_threads);
    return 0;
}
#endif
