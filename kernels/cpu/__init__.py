"""CPU kernels in C for what torch does slowly on a CPU, compiled on first use (see `build`).

Each declines (None) inputs it does not handle, and is skipped when no C compiler is available, so the torch
twins stay the fallback.
"""
