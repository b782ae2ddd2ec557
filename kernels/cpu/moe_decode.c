/* The experts of a mixture-of-experts MLP over a few token rows (a decode step), in two calls around the
   activation, as engine/models/moe.py's SparseMoE.forward computes them:

     moe_gate_up   the (row, expert) pairs sorted by expert (rows ascending within each, as the module's stable
                   argsort), their x rows gathered, and each routed expert's [gate | up] projection over its rows,
                   plus the expert's bias where it has one
     (the activation: elementwise over the pairs' rows, bound apart)
     moe_down      each routed expert's down projection over its rows (plus bias), each pair's output times its
                   routing weight, and a row's pairs summed in ascending expert order

   The projections are the block kernels themselves (kquant_matmul.c, block32_matmul.c), called through the
   function pointers the binding passes, so their code lives in one place and a routed expert's slice of the
   packed blocks is read exactly as the module's ops.linear_blocks reads it. Their rows are independent of each
   other, so grouping a step's pairs by expert gives each pair the bits the module's own grouping gives.

   Every value is rounded to bfloat16 where torch rounds it in the module: each kernel's output, the bias sum,
   the weighted output, and each addition of the sum (one rounding per addition, in the route's order).

   A projection is `parts` runs of blocks side by side on the output dimension (gate and up in two types, say),
   each described by five int64: the kernel's address, its type number, the blocks' address, the weight rows one
   expert has in it, and the bytes one expert takes. Returns -1 when a kernel declines. */

#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"

typedef int (*matmul_fn)(int type, const uint16_t *x, int64_t x_stride, const uint8_t *w, uint16_t *out,
                         int64_t out_stride, int64_t rows, int64_t n, int64_t k, int64_t num_threads);

enum { PART_FN, PART_TYPE, PART_BLOCKS, PART_ROWS, PART_BYTES, PART_FIELDS };

/* order[i]: the i-th pair (row * top_k + slot) by ascending expert, rows ascending within an expert. */
static void sort_pairs(const int64_t *ids, int64_t pairs, int64_t *order) {
    for (int64_t p = 0; p < pairs; p++) {
        int64_t i = p;
        while (i > 0 && ids[order[i - 1]] > ids[p]) {
            order[i] = order[i - 1];
            i--;
        }
        order[i] = p;
    }
}

/* out[first .. first + count) = x rows @ expert's weight.T (+ bias[expert]) over every part. */
static int project(const int64_t *parts, int64_t num_parts, int64_t expert, const uint16_t *x, int64_t k,
                   const uint16_t *bias, uint16_t *out, int64_t n, int64_t count, int64_t threads) {
    int64_t column = 0;
    for (int64_t p = 0; p < num_parts; p++) {
        const int64_t *part = parts + p * PART_FIELDS;
        const matmul_fn fn = (matmul_fn)(intptr_t)part[PART_FN];
        const uint8_t *w = (const uint8_t *)(intptr_t)part[PART_BLOCKS] + expert * part[PART_BYTES];
        if (fn((int)part[PART_TYPE], x, k, w, out + column, n, count, part[PART_ROWS], k, threads)) return -1;
        column += part[PART_ROWS];
    }
    if (bias) {
        const uint16_t *b = bias + expert * n;
        for (int64_t r = 0; r < count; r++)
            for (int64_t j = 0; j < n; j++)
                out[r * n + j] = float_to_bf16(bf16_to_float(out[r * n + j]) + bf16_to_float(b[j]));
    }
    return 0;
}

/* Runs over the sorted pairs: calls project once per routed expert on its contiguous rows of x. */
static int each_expert(const int64_t *ids, const int64_t *order, int64_t pairs, const int64_t *parts,
                       int64_t num_parts, const uint16_t *x, int64_t k, const uint16_t *bias, uint16_t *out,
                       int64_t n, int64_t threads) {
    for (int64_t start = 0, end; start < pairs; start = end) {
        const int64_t expert = ids[order[start]];
        for (end = start + 1; end < pairs && ids[order[end]] == expert;) end++;
        if (project(parts, num_parts, expert, x + start * k, k, bias, out + start * n, n, end - start, threads))
            return -1;
    }
    return 0;
}

/* x [rows, k] (rows x_stride apart), ids [rows, top_k] int64 (the route's experts): fills order [rows * top_k],
   gathered [rows * top_k, k] (scratch) and out [rows * top_k, n], the pairs' [gate | up] rows in that order. */
int moe_gate_up(const uint16_t *x, int64_t x_stride, const int64_t *ids, int64_t rows, int64_t top_k,
                const int64_t *parts, int64_t num_parts, const uint16_t *bias, int64_t *order, uint16_t *gathered,
                uint16_t *out, int64_t n, int64_t k, int64_t threads) {
    const int64_t pairs = rows * top_k;
    sort_pairs(ids, pairs, order);
    for (int64_t i = 0; i < pairs; i++) {
        const uint16_t *src = x + order[i] / top_k * x_stride;
        for (int64_t j = 0; j < k; j++) gathered[i * k + j] = src[j];
    }
    return each_expert(ids, order, pairs, parts, num_parts, gathered, k, bias, out, n, threads);
}

/* act [rows * top_k, k] (the activated pairs, in moe_gate_up's order), weights [rows, top_k] bfloat16: out
   [rows, n] (rows out_stride apart), each row the sum of its pairs' weighted down projections; down [rows *
   top_k, n] is scratch. */
int moe_down(const uint16_t *act, const int64_t *ids, const uint16_t *weights, const int64_t *order, int64_t rows,
             int64_t top_k, const int64_t *parts, int64_t num_parts, const uint16_t *bias, uint16_t *down,
             uint16_t *out, int64_t out_stride, int64_t n, int64_t k, int64_t threads) {
    const int64_t pairs = rows * top_k;
    if (each_expert(ids, order, pairs, parts, num_parts, act, k, bias, down, n, threads)) return -1;
    int64_t *position = malloc(sizeof(int64_t) * pairs);  // pair -> its row of down
    if (!position) return -1;
    for (int64_t i = 0; i < pairs; i++) position[order[i]] = i;
    for (int64_t r = 0; r < rows; r++) {
        uint16_t *o = out + r * out_stride;
        for (int64_t slot = 0; slot < top_k; slot++) {
            const float w = bf16_to_float(weights[r * top_k + slot]);
            const uint16_t *d = down + position[r * top_k + slot] * n;
            for (int64_t j = 0; j < n; j++) {
                const float weighted = round_bf16(bf16_to_float(d[j]) * w);
                o[j] = float_to_bf16(slot ? bf16_to_float(o[j]) + weighted : weighted);
            }
        }
    }
    free(position);
    return 0;
}
