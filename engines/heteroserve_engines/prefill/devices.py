"""A device string (`cuda`, `cuda:1`, `cpu`, `hpu`, `npu`) -> a torch device ready to use.

Gaudi (`hpu`) and Ascend (`npu`) register their device types with PyTorch when their plugin is
imported (`habana_frameworks.torch.core`, `torch_npu`); nothing else in the engine depends on the
device type.
"""

from __future__ import annotations

import importlib

import torch

PLUGINS = {"hpu": "habana_frameworks.torch.core", "npu": "torch_npu"}
# Default compute dtype: float32 where there is no fast half-precision path (CPU), the native
# half type elsewhere (Gaudi's matrix engines are bfloat16-first).
DEFAULT_DTYPES = {"cpu": torch.float32, "cuda": torch.float16, "hpu": torch.bfloat16,
                  "npu": torch.float16}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class DeviceError(RuntimeError):
    """The device string names no usable device here."""


def open_device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise DeviceError(f"--device {name!r} is not a torch device: {error}") from None
    plugin = PLUGINS.get(device.type)
    if plugin:
        try:
            importlib.import_module(plugin)
        except ImportError as error:
            raise DeviceError(f"--device {name}: the PyTorch plugin {plugin} is not installed "
                              f"({error})") from None
    if device.type != "cpu":
        backend = getattr(torch, device.type, None)
        if backend is None or not backend.is_available():
            raise DeviceError(f"--device {name}: no {device.type} device is available")
    try:
        torch.zeros(1, device=device)
    except RuntimeError as error:
        raise DeviceError(f"--device {name}: {error}") from None
    return device


def default_dtype(device: torch.device) -> torch.dtype:
    return DEFAULT_DTYPES.get(device.type, torch.float16)


def free_memory(device: torch.device) -> int | None:
    """Free bytes on the device, where its backend can tell (cuda, npu, hpu); None on CPU."""
    backend = getattr(torch, device.type, None)
    info = getattr(backend, "mem_get_info", None) if device.type != "cpu" else None
    if info is None:
        return None
    free, _total = info(device)
    return int(free)
