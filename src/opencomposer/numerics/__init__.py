"""Low-precision numerics (Composer 2 report, section 6.1), emulated bit for bit on CPU.

- ``formats``: FP8 E4M3 / E5M2, FP4 E2M1 (packed) and E8M0 codecs, round to nearest even.
- ``mx``: MXFP8 (OCP MX v1.0 blocks of 32, E8M0 scales; ``floor`` and ``rceil`` scale modes).
- ``nvfp4``: NVFP4 (E2M1 in blocks of 16, E4M3 block scales) with a per-tensor or per-token FP32
  scale, following Transformer Engine's reference arithmetic.
- ``division``: IEEE-exact versus approximate (reciprocal) division inside quantisers.
- ``qlinear``: autograd functions for linear layers and MoE expert matmuls: forward in NVFP4 or
  MXFP8, backward in MXFP8, straight-through for the rounding.
- ``convert``: switches a transformers MoE model (Qwen3-MoE, DeepSeek-V3) to those kernels.

The bits are the product: GPU kernels can later replace the fast paths behind the same API.
"""

from opencomposer.numerics.mx import MXTensor, dequantize_mx, quantize_mx
from opencomposer.numerics.nvfp4 import NVFP4Tensor, dequantize_nvfp4, quantize_nvfp4

__all__ = ["MXTensor", "NVFP4Tensor", "dequantize_mx", "dequantize_nvfp4", "quantize_mx", "quantize_nvfp4"]
