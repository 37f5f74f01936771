"""heteroserve's CPU decode kernels: the compiled `_kernels` module behind a typed API."""

from ._kernels import (
    Model,
    Pool,
    available_variants,
    dequantize,
    matmul,
    quantize,
    read_bandwidth,
    sample,
    selected_variant,
)

__all__ = ["Model", "Pool", "available_variants", "dequantize", "matmul", "quantize",
           "read_bandwidth", "sample", "selected_variant"]
