"""Tandem's desktop window (PySide6 on qasync). Imports engine, never kernels."""
