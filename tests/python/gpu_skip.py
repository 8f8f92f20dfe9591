"""The skip condition shared by the GPU test files: a CUDA device and a flash_kda
build whose CUDA backend can run on it (the reason says which is missing)."""
from __future__ import annotations

import pytest
import torch

import flash_kda


def skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    ok, why = flash_kda.cuda_status()
    if not ok:
        return f"flash_kda CUDA backend unavailable: {why}"
    return None


requires_cuda_backend = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
