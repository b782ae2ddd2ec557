"""Pure-torch twins of every op: the CPU path and the reference the GPU kernels are tested against."""
