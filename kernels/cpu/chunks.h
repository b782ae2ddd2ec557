/* Shared by the GGUF block kernels: how many groups of 16 weight rows make a chunk, the unit their threads
   share out (schedule(static)).

   A decode step's tile of x takes single groups. More rows take chunks of up to CHUNK_GROUPS groups, so that
   each tile of x is read once per chunk rather than once per group while the chunk's weights sit in L2. But a
   static schedule over few chunks leaves a thread waiting: the starter's [192, 576] projections made 3
   chunks of 4 groups for 2 threads, its [576, 576] ones 9. So a chunk halves until each thread has 8. */

#ifndef TANDEM_CPU_CHUNKS_H
#define TANDEM_CPU_CHUNKS_H

#include <stdint.h>

#define CHUNK_GROUPS 4 /* the most groups of 16 weight rows in a chunk */

/* `tile_rows`: the rows of x a kernel's tile holds (a decode step's x fits one). */
static inline int64_t groups_per_chunk(int64_t groups, int64_t rows, int64_t tile_rows, int64_t num_threads) {
    if (rows <= tile_rows) return 1;
    int64_t per = CHUNK_GROUPS;
    while (per > 1 && groups < 8 * num_threads * per) per /= 2;
    return per;
}

#endif
