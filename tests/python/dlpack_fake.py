"""A DLPack producer that claims an arbitrary device, for testing device checks on
a machine without a GPU. It exports a legacy DLManagedTensor capsule whose data
pointer is host memory that must never be read (the binding rejects the call
before touching any tensor memory), or null (null=True: no memory at all, so any
shape can be claimed)."""
from __future__ import annotations

import ctypes


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

DL_CPU = 1
DL_CUDA = 2
DL_VULKAN = 7
_CODES = {"bfloat16": (4, 16), "float32": (2, 32), "int64": (0, 64), "int32": (0, 32), "uint8": (1, 8)}


class FakeDeviceTensor:
    """Looks like a C-contiguous tensor of `shape`/`dtype` on (device_type, device_id);
    with null=True its data pointer is null."""

    def __init__(self, shape, dtype="bfloat16", device_type=DL_CUDA, device_id=0, null=False):
        self.shape = tuple(shape)
        self._code, self._bits = _CODES[dtype]
        self._device = (device_type, device_id)
        n = 1
        for d in self.shape:
            n *= d
        self._buf = None if null else ctypes.create_string_buffer(max(1, n * self._bits // 8) + 256)
        self._keep = []

    def __dlpack_device__(self):
        return self._device

    def __dlpack__(self, *args, **kwargs):
        nd = len(self.shape)
        shape = (ctypes.c_int64 * max(1, nd))(*self.shape)
        strides = (ctypes.c_int64 * max(1, nd))()
        acc = 1
        for i in reversed(range(nd)):
            strides[i] = acc
            acc *= self.shape[i]
        base = 0 if self._buf is None else ctypes.addressof(self._buf)
        mt = _DLManagedTensor()
        mt.dl_tensor = _DLTensor(ctypes.c_void_p(base + (-base) % 256), _DLDevice(*self._device), nd,
                                 _DLDataType(self._code, self._bits, 1), shape, strides, 0)
        mt.manager_ctx = None
        mt.deleter = ctypes.cast(None, _DELETER)
        self._keep.append((shape, strides, mt))
        return _capsule_new(ctypes.addressof(mt), b"dltensor", None)
