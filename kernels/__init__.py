"""Attention, normalization, rotary and activation ops.

Model code calls the functions in `kernels.ops`; each op dispatches to the first candidate backend that
accepts its inputs (Triton kernels for CUDA tensors first, see `kernels.triton`), with the pure-torch twin
last.
This package never imports `engine`.
"""
