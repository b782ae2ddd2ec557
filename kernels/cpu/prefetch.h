/* Shared by the GGUF block kernels: how far ahead of the tile being read to ask for the weight's bytes.

   A repacked tile's fields are read in an order the hardware prefetchers do not follow well (a Q6_K tile in
   three interleaved streams), so at DRAM sizes (an output head past the L3) the kernels would wait on memory.
   8 KiB ahead is far enough for every type's tile; more gains nothing. */

#ifndef TANDEM_CPU_PREFETCH_H
#define TANDEM_CPU_PREFETCH_H

#define PREFETCH_BYTES 8192

#endif
