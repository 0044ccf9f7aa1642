"""Triton kernels Trident itself provides; graph passes launch them in place of ATen ops."""

from .copy import index_copy2_kernel, index_copy_kernel, strided_copy2_kernel, strided_copy_kernel

__all__ = ["index_copy2_kernel", "index_copy_kernel", "strided_copy2_kernel", "strided_copy_kernel"]
