"""Imports the compiled extension ``flash_kda._C``.

A CUDA build of the extension needs ``libcudart.so.13``. Its rpath points at the
``nvidia-cuda-runtime`` wheel that torch installs next to it
(``site-packages/nvidia/cu13/lib``); when the package lives elsewhere (e.g.
``pip install --target``) and the library is not on the system path either, it
is looked up on ``sys.path`` and preloaded, and as a last resort torch (which
preloads its CUDA libraries) is imported first.
"""
from __future__ import annotations

import ctypes
import importlib
import os
import sys

_CUDART_CANDIDATES = (
    os.path.join("nvidia", "cu13", "lib", "libcudart.so.13"),
    os.path.join("nvidia", "cuda_runtime", "lib", "libcudart.so.13"),
)


def _preload_cudart() -> bool:
    for entry in sys.path:
        for rel in _CUDART_CANDIDATES:
            path = os.path.join(entry or ".", rel)
            if os.path.isfile(path):
                try:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                    return True
                except OSError:
                    continue
    return False


def load_extension():
    try:
        return importlib.import_module("flash_kda._C")
    except ImportError as first:
        if "libcudart" not in str(first):
            raise
        if _preload_cudart():
            return importlib.import_module("flash_kda._C")
        try:
            import torch  # noqa: F401  (its import preloads the CUDA runtime it ships)
        except ImportError:
            pass
        try:
            return importlib.import_module("flash_kda._C")
        except ImportError:
            raise ImportError(
                f"flash_kda: the CUDA build of the extension could not load the CUDA runtime ({first}). "
                "Install torch with CUDA 13 (or nvidia-cuda-runtime), or put libcudart.so.13 on LD_LIBRARY_PATH."
            ) from first
