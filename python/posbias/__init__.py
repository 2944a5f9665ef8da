"""posbias: positional biases for attention (ALiBi, Dynamic Position Bias, T5
buckets) and a fused CPU attention, as PyTorch modules and ops.

Drop-in replacements for zeta's modules::

    from posbias import AlibiPositionalBias, DynamicPositionBias, AlibiBias
    bias = AlibiPositionalBias(heads=4, total_heads=8)(10, 10)   # [8, 10, 10]

Install with ``python3 -m pip install --no-build-isolation .`` from the
repository (docs/python.md). Importing the package loads the op library
libposbias_torch_ops (from $POSBIAS_TORCH_OPS or beside this file), which
registers torch.ops.posbias.*. ``__version__`` is the op library's (the C++
library's, CMake's project version): one version for all three.
"""
import torch

from ._library import load as _load

library_path = _load()

from .alibi import (AlibiBias, AlibiPositionalBias, alibi_distance_table,  # noqa: E402
                    alibi_slopes, alibi_slopes_range)
from .attention import attention, attention_lse  # noqa: E402
from .batches import attention_varlen, attention_with_kvcache, empty  # noqa: E402
from .dpb import DynamicPositionBias, expand_distance_table  # noqa: E402
from .t5 import RelativePositionBias  # noqa: E402
from . import parallel, safetensors  # noqa: E402

__version__: str = torch.ops.posbias.version()

__all__ = [
    "AlibiBias", "AlibiPositionalBias", "DynamicPositionBias", "RelativePositionBias",
    "alibi_distance_table", "alibi_slopes", "alibi_slopes_range", "attention",
    "attention_lse", "attention_varlen", "attention_with_kvcache", "empty",
    "expand_distance_table",
    "parallel", "safetensors", "library_path",
    "__version__",
]
