"""A GGUF file's metadata and tensor table, parsed with `struct`; tensor data as views of one memory map.

gguf's own GGUFReader builds a numpy view for every value of every field, the vocabulary's 150k tokens
and 150k merges included: 12 s of a 1.5B Qwen's start on a 2-core Xeon, for arrays the engine never
reads (the tokenizer is rebuilt from the file by transformers). This reader walks past them. Layout:
https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (versions 2 and 3).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

# the vocabulary's arrays: walked past, not decoded
SKIPPED_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                  "tokenizer.ggml.scores")
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_PLAIN_DTYPES = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
                 GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
                 GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32}


@dataclass(frozen=True)
class GgufTensor:
    name: str
    shape: tuple[int, ...]                 # GGUF's order, fastest-moving dimension first (as gguf's reader)
    tensor_type: GGMLQuantizationType
    data: np.ndarray                       # plain types: values in torch order; blocks: uint8 rows of bytes
    offset: int = 0                        # of `data` in the file, in bytes


@dataclass(frozen=True)
class GgufFile:
    metadata: dict[str, Any]               # every key but SKIPPED_ARRAYS
    tensors: list[GgufTensor]


class _Cursor:
    def __init__(self, blob: np.ndarray) -> None:
        self.blob, self.pos = blob, 0

    def unpack(self, fmt: str) -> Any:
        values = struct.unpack_from(fmt, self.blob, self.pos)
        self.pos += struct.calcsize(fmt)
        return values[0] if len(values) == 1 else values

    def string(self) -> str:
        length = self.unpack("<Q")
        self.pos += length
        return bytes(self.blob[self.pos - length:self.pos]).decode("utf-8", errors="replace")

    def value(self, kind: int, skip: bool = False) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise ValueError(f"unknown metadata value type {kind}")
        element, count = self.unpack("<IQ")
        if element in _SCALARS:
            fmt = _SCALARS[element]
            values = struct.unpack_from(f"<{count}{fmt[1]}", self.blob, self.pos)
            self.pos += count * struct.calcsize(fmt)
            return None if skip else list(values)
        if skip and element == _STRING:        # strings are length-prefixed: nothing to do but walk them
            for _ in range(count):
                self.pos += 8 + struct.unpack_from("<Q", self.blob, self.pos)[0]
            return None
        return [self.value(element) for _ in range(count)]


def read_gguf_file(path: str) -> GgufFile:
    """Raises ValueError (not a GGUF, an unknown version or type) or struct.error (a truncated file)."""
    blob = np.memmap(path, mode="r", dtype=np.uint8)
    cur = _Cursor(blob)
    if bytes(blob[:4]) != b"GGUF":
        raise ValueError("not a GGUF file (no GGUF magic)")
    cur.pos = 4
    version, tensor_count, kv_count = cur.unpack("<IQQ")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (this reader knows 2 and 3)")
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cur.string()
        value = cur.value(cur.unpack("<I"), skip=key in SKIPPED_ARRAYS)
        if key not in SKIPPED_ARRAYS:
            metadata[key] = value
    table = []
    for _ in range(tensor_count):
        name = cur.string()
        dims = cur.unpack(f"<{cur.unpack('<I')}Q")
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        table.append((name, dims, GGMLQuantizationType(cur.unpack("<I")), cur.unpack("<Q")))
    alignment = int(metadata.get("general.alignment", 32))
    data_start = (cur.pos + alignment - 1) // alignment * alignment
    return GgufFile(metadata, [_tensor(blob, data_start, *entry) for entry in table])


def _tensor(blob: np.ndarray, data_start: int, name: str, dims: tuple[int, ...], qtype: GGMLQuantizationType,
            offset: int) -> GgufTensor:
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    start = data_start + offset
    if qtype in _PLAIN_DTYPES:
        dtype = np.dtype(_PLAIN_DTYPES[qtype])
        end = start + prod(dims) * dtype.itemsize
        shape = tuple(reversed(dims))
    else:
        dtype, row_bytes = np.dtype(np.uint8), dims[0] // block_elems * block_bytes
        end = start + prod(dims[1:]) * row_bytes
        shape = (*reversed(dims[1:]), row_bytes)
    if end > blob.size:
        raise ValueError(f"tensor {name} lies past the end of the file")
    return GgufTensor(name, dims, qtype, blob[start:end].view(dtype).reshape(shape), start)


def map_tensor(path: str, tensor: GgufTensor) -> np.ndarray:
    """tensor's data in a memory map of its own: its pages become resident as they are read, and stay
    clean file pages the kernel may drop (llama.cpp maps its whole file so). The reader's map is no use
    for that: once every other tensor has been copied out of it, its whole file is resident. Private
    (copy-on-write) so that torch takes it as writable; nothing writes it. The file must not be
    truncated while mapped (a read past its end is a SIGBUS), as with llama.cpp's map."""
    return np.memmap(path, mode="c", dtype=tensor.data.dtype, offset=tensor.offset, shape=tensor.data.shape)
