"""Argument checks shared by the modules: clear Python exceptions before the op
is called (TypeError for a wrong type or dtype, ValueError for a wrong value,
shape or device)."""
import math
import numbers

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def shape_str(t):
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def check_int(name, value, minimum=None):
    # A 0-d integer tensor is a length too: torch.jit.trace gives x.shape[i]
    # as one (the traced graph then holds the value it had when traced).
    if (isinstance(value, torch.Tensor) and value.dim() == 0 and
            not value.is_floating_point() and not value.is_complex() and
            value.dtype != torch.bool):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"posbias: {name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"posbias: {name} must be >= {minimum}, got {value}")
    return value


def check_float(name, value, allow_none=True, finite=True):
    """A Python real as float; finite=False when the core checks the value."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"posbias: {name} must be a float, got {type(value).__name__} {value!r}")
    value = float(value)
    if finite and not math.isfinite(value):
        raise ValueError(f"posbias: {name} must be finite, got {value}")
    return value


def check_tensor(name, t, dtypes=None, ndim=None, cpu=True):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"posbias: {name} must be a torch.Tensor, got {type(t).__name__}")
    if cpu and not t.is_cpu:  # is_cpu: a sixth of device.type's time per call
        raise ValueError(f"posbias: {name} is on {t.device}; the posbias ops run on the CPU "
                         f"(posbias is CPU-only: move it with .cpu())")
    if dtypes is not None and t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"posbias: {name} has dtype {str(t.dtype).replace('torch.', '')}; "
                        f"expected one of {allowed}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"posbias: {name} must have {ndim} dimensions, got shape "
                         f"{shape_str(t)}")
    return t


def check_slopes(name, slopes, heads=None):
    """A 1-D floating tensor of finite slopes (any float dtype; the ops read float32)."""
    check_tensor(name, slopes, ndim=1)
    if not slopes.is_floating_point():
        raise TypeError(f"posbias: {name} must be a floating tensor, got dtype "
                        f"{str(slopes.dtype).replace('torch.', '')}")
    if heads is not None and slopes.shape[0] != heads:
        raise ValueError(f"posbias: {name} has {slopes.shape[0]} entries, expected {heads} "
                         f"(one per head)")
    if slopes.numel() and not bool(torch.isfinite(slopes).all()):
        raise ValueError(f"posbias: {name} must be finite, got {slopes.tolist()}")
    return slopes
