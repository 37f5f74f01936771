"""GGUF metadata and tensor directory, read once into plain Python values.

The engine reads the header only: key/value metadata (decoded to str, int, float, bool and lists)
and where each tensor lies; tensor data is then read with `pread` by the loader. `gguf.GGUFReader`
does the same job but keeps a numpy view per metadata string - about 160 MiB for SmolLM2's
49,152-token vocabulary and its merges, resident for as long as the reader lives - so the engine
parses the (small, versioned) header itself and uses the `gguf` package for its constants and
quantization formats. Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (v2, v3).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# GGUF value types -> struct format of one scalar
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
MAX_STRING = 1 << 24   # a metadata string longer than this is a corrupt file, not a template
MAX_ITEMS = 1 << 26


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]     # GGUF order: the row length (ne0) first
    tensor_type: Q
    data_offset: int           # from the start of the file
    n_bytes: int


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    version: int
    fields: dict[str, Any]
    tensors: list[TensorInfo]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    @classmethod
    def open(cls, path: str | Path) -> GGUFFile:
        path = Path(path)
        with path.open("rb") as f:
            size = path.stat().st_size
            return _parse(path, f, size)


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise GGUFFormatError("file ends inside its header")
    return data


def _scalar(f: BinaryIO, fmt: str) -> Any:
    return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]


def _string(f: BinaryIO) -> str:
    n = _scalar(f, "<Q")
    if n > MAX_STRING:
        raise GGUFFormatError(f"a metadata string claims {n} bytes")
    return _read(f, n).decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int) -> Any:
    if kind in SCALARS:
        return _scalar(f, SCALARS[kind])
    if kind == STRING:
        return _string(f)
    if kind == ARRAY:
        item, count = _scalar(f, "<I"), _scalar(f, "<Q")
        if count > MAX_ITEMS:
            raise GGUFFormatError(f"a metadata array claims {count} items")
        if item in SCALARS:  # one read for the whole array
            fmt = SCALARS[item]
            width = struct.calcsize(fmt)
            return list(struct.unpack(f"<{count}{fmt[1]}", _read(f, width * count)))
        return [_value(f, item) for _ in range(count)]
    raise GGUFFormatError(f"unknown metadata value type {kind}")


def _parse(path: Path, f: BinaryIO, size: int) -> GGUFFile:
    if _read(f, 4) != MAGIC:
        raise GGUFFormatError("not a GGUF file (bad magic)")
    version = _scalar(f, "<I")
    if version not in (2, 3):
        raise GGUFFormatError(f"GGUF version {version} is not supported (2, 3)")
    n_tensors, n_kv = _scalar(f, "<Q"), _scalar(f, "<Q")
    if n_tensors > MAX_ITEMS or n_kv > MAX_ITEMS:
        raise GGUFFormatError("implausible tensor or metadata count")
    fields: dict[str, Any] = {}
    for _ in range(n_kv):
        key = _string(f)
        fields[key] = _value(f, _scalar(f, "<I"))
    infos = []
    for _ in range(n_tensors):
        name = _string(f)
        n_dims = _scalar(f, "<I")
        if n_dims > 4:
            raise GGUFFormatError(f"tensor {name} has {n_dims} dimensions")
        shape = tuple(_scalar(f, "<Q") for _ in range(n_dims))
        kind, offset = _scalar(f, "<I"), _scalar(f, "<Q")
        infos.append((name, shape, kind, offset))
    alignment = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFFormatError(f"general.alignment {alignment} is not a power of two")
    start = -(-f.tell() // alignment) * alignment
    tensors = []
    for name, shape, kind, offset in infos:
        try:
            qtype = Q(kind)
        except ValueError:
            raise GGUFFormatError(f"tensor {name} has unknown type {kind}") from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        elements = 1
        for dim in shape:
            elements *= dim
        if shape and shape[0] % block:
            raise GGUFFormatError(f"tensor {name}: rows of {shape[0]} are not whole blocks")
        n_bytes = elements // block * type_size
        if start + offset + n_bytes > size:
            raise GGUFFormatError(f"tensor {name} lies past the end of the file")
        tensors.append(TensorInfo(name, shape, qtype, start + offset, n_bytes))
    return GGUFFile(path, version, fields, tensors)
