/* Causal attention of prompts over a quantized KV cache (kv_quant.h's blocks of 32 rotated values), each query
   row to the bit what the decode kernel (paged_decode.c's paged_decode_quant) gives that token alone.

   Why tiles: a prompt's row i reads the keys up to its own position, and the decode kernel dequantizes each
   block of them into a float32 scratch before its multiply-adds, which costs about as much as the
   multiply-adds themselves; a prompt run as one decode row per token would pay that for every row. Here a
   task is a tile of TILE consecutive rows of one sequence for one KV head, and each step of it dequantizes
   the keys the tile's rows read next once, runs every row's scores and softmax on them, then dequantizes the
   values into the same scratch and runs every row's values: the decode kernel's own row functions
   (paged_rows.h and its vector forms), each row keeping its own online softmax. The quantized bytes are read
   once per tile instead of once per row, and a block (16 KiB of float32 rows at head_dim 64) stays in L1
   while the tile's rows read it.

   Why the bits match: a row's blocks are the decode's for its length (from its first visible key, row_first,
   in steps of the path's block size, the last one cut at its length), the functions run on them are the
   decode's, and dequantized values are exact floats however they are computed (kv_quant.h). Rows' lengths
   differ by one, so the last block differs per row; under a sliding window their first keys differ too (by up
   to TILE - 1), so a step reads up to a block and TILE - 1 keys, and each row takes its own block from them:

       keys     0              64             128
       row 0    [0 .............)[64 .......)        no window: blocks from 0, the last cut at its length
       row 1    [0 .............)[64 ........)
       row 0        [f .............)[f + 64 ..)     window: blocks from f = length - window
       row 1         [f + 1 .........)[f + 65 ...)

   q is [rows, num_q_heads, head_dim] (float32 or bfloat16, unrotated), sequence s's rows at query_starts[s]
   onward, query_lens[s] of them, its tokens the last of its seq_lens[s]; out is like q. Tasks (sequence, KV
   head, tile) go to OpenMP threads as they come, each sequence's last (longest) tiles first; a thread
   allocates its workspace (the tile's rows, the dequantized block, the rows' scores and weights) once per
   call. A tile of 16 rows measured best on Zen 3 (8 dequantizes twice as often; 32 leaves L1). */

#include <stdint.h>
#include <stdlib.h>

#include "paged_rows.h"

#define TILE 16       /* query rows per task */
#define MOST_KEYS 64  /* the largest block of any path (paged_decode_avx2.h's TOKENS) */
#define SCRATCH_ROWS (MOST_KEYS + TILE)

/* A task: rows row .. row + rows - 1 of q, whose tokens see length .. length + rows - 1 keys of `table`. */
typedef struct {
    int64_t kv_head, row, rows, length;
    const int64_t *table;
} Tile;

/* A thread's workspace: the rows' queries and accumulators (2 * group * head_dim floats a row, one row after
   another), maxima and sums; a step's keys, then its values, as float32 rows (both at once on the portable
   path); and the rows' scores and weights between a step's keys and its values. */
typedef struct {
    float states[TILE * 2 * MAX_GROUP * MAX_DIM] __attribute__((aligned(64)));
    float scratch[2 * SCRATCH_ROWS * MAX_DIM] __attribute__((aligned(64)));
    float scores[TILE * MAX_GROUP * MOST_KEYS] __attribute__((aligned(64)));
    float weights[TILE][MAX_GROUP][MOST_KEYS] __attribute__((aligned(64)));
    float running[TILE][2][MAX_GROUP];
} Space;

/* Step `step` of a tile in blocks of `block` keys: row r's block is keys row_first + step * block onward, cut at
   its length. Returns how many keys the tile reads in this step, from *lo on (0 once every row is done); row r
   takes count[r] of them (0 when it is done) from begin[r] keys after *lo. */
static int64_t tile_step(const Work *w, const Tile *t, int64_t step, int64_t block, int64_t *lo, int64_t *begin,
                         int64_t *count) {
    int64_t low = INT64_MAX, high = 0;
    for (int64_t r = 0; r < t->rows; r++) {
        const int64_t length = t->length + r, start = row_first(w, length) + step * block;
        const int64_t end = start + block < length ? start + block : length;
        count[r] = start < length ? end - start : 0;
        begin[r] = start;
        if (count[r]) {
            low = start < low ? start : low;
            high = end > high ? end : high;
        }
    }
    if (high == 0) return 0;
    for (int64_t r = 0; r < t->rows; r++) begin[r] -= low;
    *lo = low;
    return high - low;
}

/* The portable path's tile: a step's keys and values side by side in the scratch (its blocks are half the
   vector paths', so both fit). */
static void tile_generic(const Work *w, const Tile *t, Space *s) {
    const int64_t dim = w->head_dim, group = w->num_q_heads / w->num_kv_heads;
    float *keys = s->scratch, *values = s->scratch + SCRATCH_ROWS * MAX_DIM;
    Row rows[TILE];
    for (int64_t r = 0; r < t->rows; r++) {
        float *state = s->states + r * 2 * group * dim;
        rows[r] = (Row){state, state + group * dim, s->running[r][0], s->running[r][1]};
        row_start(w, t->row + r, t->kv_head, &rows[r]);
    }
    int64_t lo, n, begin[TILE], count[TILE], offsets[BLOCK + TILE];
    for (int64_t step = 0; (n = tile_step(w, t, step, BLOCK, &lo, begin, count)) > 0; step++) {
        block_offsets(w, t->table, t->kv_head, lo, n, offsets);
        dequantize_rows(w, w->k, offsets, n, keys);
        dequantize_rows(w, w->v, offsets, n, values);
        for (int64_t r = 0; r < t->rows; r++)
            if (count[r]) row_block(w, &rows[r], keys + begin[r] * dim, values + begin[r] * dim, count[r]);
    }
    for (int64_t r = 0; r < t->rows; r++) row_finish(w, t->row + r, t->kv_head, &rows[r]);
}

#if defined(__AVX512F__)
#include "paged_decode_avx512.h"

/* tile_generic with paged_decode_avx512.h's rows, in two phases a step (as the decode kernel, which reads a
   block's keys and then its values through one scratch): every row's scores and softmax over the keys, then
   every row's values. `group` and `chunks` (head_dim / 16) are constants in the instances below. */
static inline __attribute__((always_inline)) void tile_avx512(const Work *w, const Tile *t, Space *s,
                                                              const int64_t group, const int64_t chunks) {
    RowAvx512 rows[TILE];
    for (int64_t r = 0; r < t->rows; r++) {
        __m512 *state = (__m512 *)s->states + r * 2 * group * chunks;
        rows[r] = (RowAvx512){state, state + group * chunks, s->running[r][0], s->running[r][1]};
        row_start_avx512(w, t->row + r, t->kv_head, &rows[r], group, chunks, 1);
    }
    float (*weights)[MAX_GROUP][KEYS16] = (float (*)[MAX_GROUP][KEYS16])s->weights;
    int64_t lo, n, begin[TILE], count[TILE], at[TILE][KEYS16], offsets[KEYS16 + TILE];
    for (int64_t step = 0; (n = tile_step(w, t, step, KEYS16, &lo, begin, count)) > 0; step++) {
        block_offsets(w, t->table, t->kv_head, lo, n, offsets);
        for (int64_t r = 0; r < t->rows; r++)
            for (int64_t j = 0; j < count[r]; j++) at[r][j] = (begin[r] + j) * w->head_dim;
        dequantize_rows(w, w->k, offsets, n, s->scratch);
        for (int64_t r = 0; r < t->rows; r++)
            if (count[r]) row_keys_avx512(&rows[r], weights[r], s->scratch, at[r], count[r], group, chunks, 0);
        dequantize_rows(w, w->v, offsets, n, s->scratch);
        for (int64_t r = 0; r < t->rows; r++)
            if (count[r]) row_values_avx512(&rows[r], weights[r], s->scratch, at[r], count[r], group, chunks, 0);
    }
    for (int64_t r = 0; r < t->rows; r++) row_finish_avx512(w, t->row + r, t->kv_head, &rows[r], group, chunks, 1);
}

#define INSTANCE(G, C) \
    static void tile_g##G##_c##C(const Work *w, const Tile *t, Space *s) { tile_avx512(w, t, s, G, C); }
#define EACH_GROUP(C) INSTANCE(1, C) INSTANCE(2, C) INSTANCE(3, C) INSTANCE(4, C) INSTANCE(5, C) INSTANCE(6, C) \
    INSTANCE(7, C) INSTANCE(8, C)
#define ROW(C) {tile_g1_c##C, tile_g2_c##C, tile_g3_c##C, tile_g4_c##C, tile_g5_c##C, tile_g6_c##C, tile_g7_c##C, \
                tile_g8_c##C}
EACH_GROUP(4)
EACH_GROUP(8)
static void (*const tiles[2][8])(const Work *, const Tile *, Space *) = {ROW(4), ROW(8)};

static void run_tile_vector(const Work *w, const Tile *t, Space *s) {
    const int64_t group = w->num_q_heads / w->num_kv_heads, chunks = w->head_dim / 16;
    if ((chunks == 4 || chunks == 8) && group <= 8)
        tiles[chunks / 8][group - 1](w, t, s);
    else
        tile_avx512(w, t, s, group, chunks);
}
#define VECTOR_DIMS 16
#elif defined(__AVX2__) && defined(__FMA__)
#include "paged_decode_avx2.h"

/* tile_avx512's plan with paged_decode_avx2.h's rows (the float32 instances' arithmetic, as the decode kernel runs
   for a quantized cache). A 64-key block of float32 rows is 16 KiB at head_dim 64, so each phase reads its
   rows from L1; at larger head sizes the phases go in parts of at most 16 KiB, keys by key and values by dim
   (each row's arithmetic is the same: its chains are per key, or per dim). `group` and `chunks` (head_dim / 8)
   are constants in the instances below. */
static inline __attribute__((always_inline)) void tile_avx2(const Work *w, const Tile *t, Space *s,
                                                            const int64_t group, const int64_t chunks) {
    const int64_t dim = w->head_dim, keys_a_part = dim <= 64 ? TOKENS : (4096 / dim) & ~(int64_t)7;
    RowAvx2 rows[TILE];
    for (int64_t r = 0; r < t->rows; r++) {
        __m256 *state = (__m256 *)s->states + r * 2 * group * chunks;
        rows[r] = (RowAvx2){state, state + group * chunks, s->running[r][0], s->running[r][1]};
        row_start_avx2(w, t->row + r, t->kv_head, &rows[r], group, chunks, 0, 1);
    }
    __m256 (*scores)[MAX_GROUP][TOKENS / 8] = (__m256 (*)[MAX_GROUP][TOKENS / 8])s->scores;
    int64_t lo, n, begin[TILE], count[TILE], offsets[TOKENS + TILE];
    int64_t at[TILE][TOKENS], at_begin[TILE] = {0}, at_count[TILE] = {0};
    for (int64_t step = 0; (n = tile_step(w, t, step, TOKENS, &lo, begin, count)) > 0; step++) {
        block_offsets(w, t->table, t->kv_head, lo, n, offsets);
        for (int64_t r = 0; r < t->rows; r++) {
            if (count[r] == 0 || (count[r] == at_count[r] && begin[r] == at_begin[r])) continue; /* as last step */
            at_begin[r] = begin[r];
            at_count[r] = count[r];
            /* past count[r], the row's last key again, as the decode kernel's scratch rows */
            for (int64_t j = 0; j < TOKENS; j++) at[r][j] = (begin[r] + (j < count[r] ? j : count[r] - 1)) * dim;
        }
        dequantize_rows(w, w->k, offsets, n, s->scratch);
        for (int64_t j = 0; j < TOKENS; j += keys_a_part)
            for (int64_t r = 0; r < t->rows; r++)
                if (j < count[r])
                    row_dots_avx2(&rows[r], scores[r], s->scratch, at[r], j,
                                  j + keys_a_part < count[r] ? j + keys_a_part : count[r], group, chunks, 0);
        for (int64_t r = 0; r < t->rows; r++)
            if (count[r]) row_softmax_avx2(&rows[r], scores[r], s->weights[r], count[r], group, chunks);
        dequantize_rows(w, w->v, offsets, n, s->scratch);
        for (int64_t c = 0; c < chunks; c += 8)
            for (int64_t r = 0; r < t->rows; r++)
                if (count[r])
                    row_values_avx2(&rows[r], s->weights[r], s->scratch, at[r], count[r], c,
                                    c + 8 < chunks ? c + 8 : chunks, group, chunks, 0);
    }
    for (int64_t r = 0; r < t->rows; r++) row_finish_avx2(w, t->row + r, t->kv_head, &rows[r], group, chunks, 0, 1);
}

#define INSTANCE(G, C) \
    static void tile_g##G##_c##C(const Work *w, const Tile *t, Space *s) { tile_avx2(w, t, s, G, C); }
#define EACH_GROUP(C) INSTANCE(1, C) INSTANCE(2, C) INSTANCE(3, C) INSTANCE(4, C) INSTANCE(5, C) INSTANCE(6, C) \
    INSTANCE(7, C) INSTANCE(8, C)
#define ROW(C) {tile_g1_c##C, tile_g2_c##C, tile_g3_c##C, tile_g4_c##C, tile_g5_c##C, tile_g6_c##C, tile_g7_c##C, \
                tile_g8_c##C}
EACH_GROUP(8)
EACH_GROUP(16)
static void (*const tiles[2][8])(const Work *, const Tile *, Space *) = {ROW(8), ROW(16)};

static void run_tile_vector(const Work *w, const Tile *t, Space *s) {
    const int64_t group = w->num_q_heads / w->num_kv_heads, chunks = w->head_dim / 8;
    if ((chunks == 8 || chunks == 16) && group <= 8)
        tiles[chunks / 16][group - 1](w, t, s);
    else
        tile_avx2(w, t, s, group, chunks);
}
#define VECTOR_DIMS 8
#endif

/* The path the decode kernel's run_task takes for these head sizes. */
static void run_tile(const Work *w, const Tile *t, Space *s) {
#ifdef VECTOR_DIMS
    if (w->head_dim % VECTOR_DIMS == 0) {
        run_tile_vector(w, t, s);
        return;
    }
#endif
    tile_generic(w, t, s);
}

/* Whether every page a sequence's rows read lies in the cache (a bad table is the caller's error to report). */
static int pages_valid(const Work *w, const int64_t *table, int64_t first_length, int64_t length,
                       int64_t num_pages) {
    for (int64_t page = row_first(w, first_length) / w->page_size; page <= (length - 1) / w->page_size; page++)
        if (table[page] < 0 || table[page] >= num_pages) return 0;
    return 1;
}

/* Returns 0, or -1 for arguments outside what the kernel handles (nothing written then), or when a thread's
   workspace cannot be allocated. Arguments as paged_decode_quant's, with each sequence's query rows. */
int paged_prefill_quant(const void *q, const void *k_cache, const void *v_cache, void *out, int64_t page_stride,
                        int64_t slot_stride, int64_t head_stride, const int64_t *tables, int64_t table_stride,
                        const int64_t *seq_lens, const int64_t *query_starts, const int64_t *query_lens,
                        int64_t num_seqs, int64_t num_pages, int64_t num_q_heads, int64_t num_kv_heads,
                        int64_t head_dim, int64_t page_size, int64_t window, float scale, const float *sinks,
                        int dtype, int bits, int64_t num_threads) {
    if (head_dim > MAX_DIM || head_dim % KVQ_GROUP || num_kv_heads <= 0 || num_q_heads % num_kv_heads != 0 ||
        num_q_heads / num_kv_heads > MAX_GROUP || (dtype != 0 && dtype != 1) || (bits != 4 && bits != 6 && bits != 8) ||
        page_size <= 0 || num_seqs < 0)
        return -1;
    const Work base = {q, k_cache, v_cache, out, page_stride, slot_stride, head_stride, tables, table_stride,
                       seq_lens, num_q_heads, num_kv_heads, head_dim, page_size, window, scale, dtype, bits, sinks};
    int64_t *firsts = malloc((size_t)(num_seqs + 1) * sizeof(int64_t)); /* sequence s's first task */
    if (firsts == NULL) return -1;
    firsts[0] = 0;
    for (int64_t s = 0; s < num_seqs; s++) {
        const int64_t n = query_lens[s], length = seq_lens[s];
        if (n < 0 || n > length ||
            (n && !pages_valid(&base, tables + s * table_stride, length - n + 1, length, num_pages))) {
            free(firsts);
            return -1;
        }
        firsts[s + 1] = firsts[s] + (n + TILE - 1) / TILE * num_kv_heads;
    }
    const int64_t num_tasks = firsts[num_seqs];
    int failed = 0;
#pragma omp parallel num_threads(num_threads) if (num_threads > 1 && num_tasks > 1)
    {
        Space *space = aligned_alloc(64, sizeof(Space));
        /* Tasks differ in length (a tile's rows see its position's keys), so threads take them as they come. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < num_tasks; task++) {
            if (space == NULL) {
#pragma omp atomic write
                failed = 1;
                continue;
            }
            int64_t s = 0;
            while (firsts[s + 1] <= task) s++;
            const int64_t local = task - firsts[s], num_tiles = (firsts[s + 1] - firsts[s]) / num_kv_heads;
            const int64_t tile = num_tiles - 1 - local / num_kv_heads; /* the longest first */
            const int64_t rows = query_lens[s] - tile * TILE < TILE ? query_lens[s] - tile * TILE : TILE;
            const Tile t = {local % num_kv_heads, query_starts[s] + tile * TILE, rows,
                            seq_lens[s] - query_lens[s] + 1 + tile * TILE, tables + s * table_stride};
            run_tile(&base, &t, space);
        }
        free(space);
    }
    free(firsts);
    return failed ? -1 : 0;
}
