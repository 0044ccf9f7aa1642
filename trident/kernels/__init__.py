"""Triton kernels Trident itself provides; graph passes launch them in place of ATen ops."""

from .copy import cache_write_kernel, index_copy2_kernel, index_copy_kernel, strided_copy2_kernel, strided_copy_kernel

__all__ = ["cache_write_kernel", "index_copy2_kernel", "index_copy_kernel", "strided_copy2_kernel", "strided_copy_kernel"]
