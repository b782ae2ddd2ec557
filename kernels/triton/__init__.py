"""Triton kernels for CUDA: `candidates` chooses them for `kernels.ops`; each other module is one kernel."""
