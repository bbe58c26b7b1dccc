"""Minimal safetensors reader/writer (8-byte LE header length, JSON header, raw data).

Written here instead of using the `safetensors` package so the reference needs
nothing beyond Debian's python3-torch and python3-numpy.
"""
import json
import struct

import numpy as np
import torch

# safetensors dtype -> (numpy dtype used to decode the bytes, torch dtype produced).
# torch 1.13 has no uint16/uint32, so those widen to the next signed type.
_DECODE = {
    "F64": (np.dtype("<f8"), torch.float64),
    "F32": (np.dtype("<f4"), torch.float32),
    "F16": (np.dtype("<f2"), torch.float16),
    "BF16": (np.dtype("<u2"), torch.bfloat16),  # reinterpreted bit-for-bit below
    "I64": (np.dtype("<i8"), torch.int64),
    "I32": (np.dtype("<i4"), torch.int32),
    "I16": (np.dtype("<i2"), torch.int16),
    "I8": (np.dtype("i1"), torch.int8),
    "U8": (np.dtype("u1"), torch.uint8),
    "U16": (np.dtype("<u2"), torch.int32),
    "U32": (np.dtype("<u4"), torch.int64),
    "BOOL": (np.dtype("?"), torch.bool),
}

_ENCODE = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


class SafetensorsError(ValueError):
    pass


def load(path):
    """Return {name: torch.Tensor} for every tensor in the file (metadata skipped)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise SafetensorsError(f"{path}: file too short ({len(blob)} bytes)")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if 8 + header_len > len(blob):
        raise SafetensorsError(f"{path}: header length {header_len} exceeds file size {len(blob)}")
    try:
        header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: bad JSON header: {e}") from None
    data = memoryview(blob)[8 + header_len:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info.get("dtype")
        if dtype not in _DECODE:
            raise SafetensorsError(f"{path}: tensor {name!r} has unsupported dtype {dtype!r}")
        np_dtype, torch_dtype = _DECODE[dtype]
        shape = [int(s) for s in info["shape"]]
        begin, end = (int(v) for v in info["data_offsets"])
        count = int(np.prod(shape)) if shape else 1
        if not (0 <= begin <= end <= len(data)) or end - begin != count * np_dtype.itemsize:
            raise SafetensorsError(
                f"{path}: tensor {name!r} {dtype}{shape} has data_offsets [{begin}, {end}] "
                f"but needs {count * np_dtype.itemsize} bytes inside a {len(data)}-byte data section")
        arr = np.frombuffer(data[begin:end], dtype=np_dtype).reshape(shape).copy()
        if dtype == "BF16":
            t = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(arr.astype(np_dtype.newbyteorder("="), copy=False)).to(torch_dtype)
        out[name] = t
    return out


def save(path, tensors, metadata=None):
    """Write {name: tensor} in safetensors layout, names sorted, data contiguous."""
    header = {}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype not in _ENCODE:
            raise SafetensorsError(f"cannot save tensor {name!r} of dtype {t.dtype}")
        if t.dtype == torch.bfloat16:
            raw = t.view(torch.int16).numpy().astype("<i2").tobytes()
        else:
            arr = t.numpy()
            raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _ENCODE[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # Pad with spaces so the data section starts 8-byte aligned, as the format recommends.
    hbytes += b" " * ((8 - len(hbytes) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for c in chunks:
            f.write(c)
