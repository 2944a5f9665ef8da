"""A small reader and writer of the safetensors format (8-byte little-endian
header length, JSON header, raw little-endian data), enough for state dicts:
Debian has no python3-safetensors. posbias's C++ DynamicPositionBias::save and
::load use the same files."""
import json
import struct

import torch

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def load_file(path):
    """{name: tensor} from a safetensors file (tensors own their memory)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"posbias: {path}: not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError(f"posbias: {path}: header length {n} runs past the end of the file "
                         f"({len(blob)} bytes)")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"posbias: {path}: bad safetensors header: {e}") from None
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise ValueError(f"posbias: {path}: tensor {name}: unsupported dtype "
                             f"{info.get('dtype')!r}")
        begin, end = info["data_offsets"]
        shape = list(info["shape"])
        count = 1
        for s in shape:
            count *= s
        size = torch.empty(0, dtype=dtype).element_size()
        if not 0 <= begin <= end <= len(data) or end - begin != count * size:
            raise ValueError(f"posbias: {path}: tensor {name}: data offsets [{begin}, {end}) "
                             f"do not hold {shape} of {info['dtype']}")
        raw = bytearray(data[begin:end])
        t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(shape).clone()
    return out


def save_file(tensors, path):
    """Writes {name: tensor} as safetensors (contiguous, little-endian)."""
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype not in _NAMES:
            raise ValueError(f"posbias: save_file: tensor {name}: unsupported dtype {t.dtype}")
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)
