/* Shared by the GGUF block kernels: how far ahead of the tile being read to ask for the weight's bytes.

   A repacked tile's fields are read in an order the hardware prefetchers do not follow well (a Q6_K tile in
   three interleaved streams), so at DRAM sizes the kernels waited on memory. Measured on a [49152, 2048]
   weight (an output head, past the 32 MiB L3), one row, 2 threads (AMD EPYC): Q6_K 5.8 ms without software
   prefetch, 1.6 with the tile after next, 1.5 with 8 KiB ahead; Q4_K 1.76 -> 0.64 ms (8 KiB); Q4_0 and Q8_0
   about 0.8 and 2.0 ms with 2 or 8 KiB (a few percent apart, within the noise). */

#ifndef TANDEM_CPU_PREFETCH_H
#define TANDEM_CPU_PREFETCH_H

#define PREFETCH_BYTES 8192

#endif
