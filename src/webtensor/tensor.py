"""Tensor: an n-d array that lives on a Device; its ops run there.

On every device a tensor is a strided view (shape, strides and offset, in elements) of its
device's storage: a flat numpy array on the CPU reference, GPU buffers (`WgpuStorage`) on WebGPU.
Views are computed here, once, so both devices accept and refuse exactly the same indexing:
reshape of a contiguous view, transpose / permute and basic slicing (ints, slices with positive
steps, Ellipsis) are free views; anything else (fancy indexing, boolean masks, None) is refused.
A WebGPU tensor over the binding limit is stored in row chunks; its views address the chunks'
concatenation, and a view inside one chunk is that chunk's (`WgpuStorage.narrow`).
Moving data in and out goes through the device's backend.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, cast

from . import dtypes as dt
from .device import Device, device_spec
from .errors import DeviceMismatchError, DTypeError, ShapeError, WebtensorError


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    return _strides_of(shape if type(shape) is tuple else tuple(shape))


@functools.lru_cache(maxsize=1024)
def _strides_of(shape: tuple[int, ...]) -> tuple[int, ...]:
    """(Cached: a pure function of the shape, asked for several times by every op; Python ints out
    whatever ints come in, since equal shapes of numpy and Python ints share a cache entry.)"""
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= int(n)
    return tuple(reversed(strides))


class Tensor:
    __slots__ = ("device", "shape", "dtype", "_storage", "_strides", "_offset", "__weakref__")

    def __init__(self, device: Device, shape: tuple[int, ...], dtype: dt.DType, *, storage: Any,
                 strides: tuple[int, ...] | None = None, offset: int = 0):
        self.device, self.shape, self.dtype = device, tuple(map(int, shape)), dtype
        self._storage, self._offset = storage, offset
        self._strides = contiguous_strides(self.shape) if strides is None else tuple(strides)

    # -- basic facts ----------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        """Element strides."""
        return self._strides

    def is_contiguous(self) -> bool:
        return self._strides == contiguous_strides(self.shape) or self.size <= 1

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape}, dtype={self.dtype.name}, device={self.device.describe()!r})"

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self) -> Any:
        """Like a numpy array: the sub-tensors along the first axis (a 0-d tensor is not iterable)."""
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    # -- moving data ----------------------------------------------------------------------------
    def numpy(self) -> Any:
        """A numpy array with this tensor's values (a readback on WebGPU: submits pending work; a
        copy on the CPU device too, so writing to it never changes the tensor)."""
        return self.device.backend.to_numpy(self)

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def tobytes(self) -> bytes:
        """Raw little-endian bytes, C order. Needs no numpy on WebGPU (the browser path)."""
        return self.device.backend.to_bytes(self)

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def item(self) -> Any:
        if self.size != 1:
            raise ShapeError(f"item() needs a tensor of one element, got shape {self.shape}")
        return self.numpy().reshape(()).item()

    def to(self, target: Device | dt.DType | str | None = None, dtype: dt.DType | str | None = None, *,
           device: Device | str | None = None) -> Tensor:
        """Like torch's `.to`: a device (`Device`, or a name: "cpu", "wgpu", "lavapipe") copies the
        tensor there, a dtype (`webtensor.float16`, "float16") casts it, and both may be given
        (`t.to("cpu", "float16")`, `t.to(device=..., dtype=...)`). A string is read as a device
        name when it is one, else as a dtype name; anything else is a DTypeError naming both.
        Returns `self` when nothing changes."""
        if target is not None:
            if isinstance(target, Device) or (isinstance(target, str) and _is_device_name(target)):
                if device is not None:
                    raise TypeError("to(): the device was given twice (positionally and as device=)")
                device = target
            elif dtype is not None:
                raise TypeError(f"to(): {target!r} is not a device, and a dtype was also given")
            else:
                dtype = target
        t = self
        if dtype is not None:
            from . import ops

            t = ops.cast(t, dt.as_dtype(dtype))
        if device is not None:
            dev = Device.parse(device)
            if not dev.same_as(t.device):
                t = tensor(t.numpy(), device=dev)
        return t

    # -- truth, comparisons, Python numbers ------------------------------------------------------
    def __bool__(self) -> bool:
        """The value of a one-element tensor (a readback on WebGPU); any other size is ambiguous, as in
        numpy and torch: ShapeError."""
        if self.size != 1:
            raise ShapeError(f"the truth value of a tensor of shape {self.shape} ({self.size} elements) is "
                             "ambiguous; read it with .numpy() and use .any() or .all()")
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __eq__(self, other: object) -> bool:
        raise _no_compare("==")

    def __ne__(self, other: object) -> bool:
        raise _no_compare("!=")

    def __lt__(self, other: object) -> bool:
        raise _no_compare("<")

    def __le__(self, other: object) -> bool:
        raise _no_compare("<=")

    def __gt__(self, other: object) -> bool:
        raise _no_compare(">")

    def __ge__(self, other: object) -> bool:
        raise _no_compare(">=")

    __hash__ = object.__hash__  # (identity, as torch's: a tensor may key a dict or sit in a set)

    # -- views ----------------------------------------------------------------------------------
    def reshape(self, *shape: int | Sequence[int]) -> Tensor:
        dims = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else shape
        new = tuple(map(int, _resolve_shape(cast(tuple[int, ...], dims), self.size, self.shape)))
        t = self if self.is_contiguous() else self.contiguous()
        return t._view(new, contiguous_strides(new), t._offset)

    view = reshape

    def transpose(self, a: int = -2, b: int = -1) -> Tensor:
        if self.ndim < 2:
            raise ShapeError(f"transpose needs at least 2 dims, got shape {self.shape}")
        a, b = a % self.ndim, b % self.ndim
        perm = list(range(self.ndim))
        perm[a], perm[b] = perm[b], perm[a]
        return self.permute(*perm)

    def permute(self, *perm: int) -> Tensor:
        if sorted(perm) != list(range(self.ndim)):
            raise ShapeError(f"permute{perm} is not a permutation of the dims of shape {self.shape}")
        shape = tuple(self.shape[p] for p in perm)
        strides = tuple(self._strides[p] for p in perm)
        return self._view(shape, strides, self._offset)

    @property
    def T(self) -> Tensor:
        if self.ndim != 2:
            raise ShapeError(f".T needs a 2-d tensor, got shape {self.shape}")
        return self.transpose(0, 1)

    def __getitem__(self, index: Any) -> Tensor:
        """Basic indexing: ints and slices (positive steps), Ellipsis; a view on every device."""
        if type(index) is slice and index.step is None and self.shape:
            # rows a:b (what every row-wise op's block takes): _slice_view's result for this case
            start, stop, _ = index.indices(self.shape[0])
            count = max(0, stop - start)
            offset = self._offset + start * self._strides[0] if count else self._offset
            return self._view((count, *self.shape[1:]), self._strides, offset)
        shape, strides, offset = _slice_view(self.shape, self._strides, self._offset, index)
        return self._view(shape, strides, offset)

    def _view(self, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Tensor:
        """A view of this tensor's storage. Over a row-chunked storage (WebGPU, over the binding
        limit) a view whose elements all lie in one chunk gets that chunk alone (`narrow`), so every
        op can read it; a view across chunks keeps the chunks (the ops that loop over them read it)."""
        st = self._storage
        if len(st.chunks) > 1 and all(shape):
            last = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
            st, offset = st.narrow(offset, last)
        # (Tensor.__init__ without its conversions: every caller passes tuples of Python ints)
        t = _new_tensor(Tensor)
        t.device, t.shape, t.dtype, t._storage = self.device, shape, self.dtype, st
        t._strides, t._offset = strides, offset
        return t

    def contiguous(self) -> Tensor:
        if self.is_contiguous():
            return self
        from . import ops

        return ops.copy(self)

    # -- operators ------------------------------------------------------------------------------
    def __add__(self, o: Any) -> Tensor:
        from . import ops
        return ops.add(self, o)

    def __radd__(self, o: Any) -> Tensor:
        from . import ops
        return ops.add(o, self)

    def __sub__(self, o: Any) -> Tensor:
        from . import ops
        return ops.sub(self, o)

    def __rsub__(self, o: Any) -> Tensor:
        from . import ops
        return ops.sub(o, self)

    def __mul__(self, o: Any) -> Tensor:
        from . import ops
        return ops.mul(self, o)

    def __rmul__(self, o: Any) -> Tensor:
        from . import ops
        return ops.mul(o, self)

    def __truediv__(self, o: Any) -> Tensor:
        from . import ops
        return ops.div(self, o)

    def __matmul__(self, o: Any) -> Tensor:
        from . import ops
        return ops.matmul(self, o)


def _no_compare(op: str) -> TypeError:
    return TypeError(f"Tensor {op} is not supported: webtensor has no elementwise comparisons (no bool dtype); "
                     f"compare on the host (a.numpy() {op} b.numpy()), or test identity with `is`")


def _is_device_name(s: str) -> bool:
    try:
        device_spec(s)
    except WebtensorError:
        return False
    return True


def _resolve_shape(shape: tuple[int, ...], size: int, old: tuple[int, ...]) -> tuple[int, ...]:
    if -1 in shape:
        if shape.count(-1) > 1:
            raise ShapeError(f"reshape {old} -> {shape}: only one dim may be -1")
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or size % known:
            raise ShapeError(f"cannot reshape {old} ({size} elements) into {shape}")
        shape = tuple(size // known if s == -1 else s for s in shape)
    if math.prod(shape) != size or min(shape, default=0) < 0:
        raise ShapeError(f"cannot reshape {old} ({size} elements) into {shape}")
    return shape


_new_tensor = object.__new__


def _slice_view(shape: tuple[int, ...], strides: tuple[int, ...], offset: int,
                index: Any) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    if not isinstance(index, tuple):
        index = (index,)
    if Ellipsis in index:
        if index.count(Ellipsis) > 1:
            raise ShapeError("an index can only have one Ellipsis")
        i = index.index(Ellipsis)
        fill = len(shape) - (len(index) - 1)
        index = index[:i] + (slice(None),) * fill + index[i + 1:]
    if len(index) > len(shape):
        raise ShapeError(f"too many indices ({len(index)}) for shape {shape}")
    new_shape, new_strides = [], []
    for d, ix in enumerate(index):  # (the dims after the index's are kept whole: appended below)
        n, s = shape[d], strides[d]
        if isinstance(ix, slice):
            start, stop, step = ix.indices(n)
            if step <= 0:
                raise ShapeError(f"slices need a positive step, got {ix}")
            count = max(0, (stop - start + step - 1) // step)
            offset += start * s if count else 0
            new_shape.append(count)
            new_strides.append(s * step)
        elif (isinstance(ix, int) or hasattr(ix, "__index__")) and not isinstance(ix, bool):
            i = ix.__index__()
            if not -n <= i < n:
                raise ShapeError(f"index {i} is out of range for dim {d} of size {n} (shape {shape})")
            offset += (i % n) * s
        else:
            raise ShapeError(f"unsupported index {ix!r} ({type(ix).__name__}): tensors take ints, slices "
                             "and Ellipsis (no fancy or boolean indexing, on every device)")
    k = len(index)
    return (*new_shape, *shape[k:]), (*new_strides, *strides[k:]), offset


def tensor(data: Any, device: Device | str | None = None, dtype: Any = None) -> Tensor:
    """Make a tensor from a numpy array, nested lists, a scalar, or a Tensor, on `device` (default CPU).
    Where numpy is missing (the browser), scalars, nested lists, `array.array` and Tensors still work
    on WebGPU; raw bytes go through `from_buffer`."""
    dev = Device.cpu() if device is None else Device.parse(device)
    try:
        import numpy as np
    except ImportError:
        return _tensor_without_numpy(data, dev, dtype)
    if isinstance(data, Tensor):
        data = data.numpy()
    try:
        arr = np.asarray(data)
    except ValueError as e:  # ragged nested lists
        raise ShapeError(f"tensor(): cannot make a rectangular array from the data: {e}") from e
    given = arr if isinstance(data, np.ndarray) else None  # memory the caller holds (others are copies)
    if dtype is not None:
        arr = arr.astype(dt.as_dtype(dtype).name)
    elif arr.dtype == np.float64:
        arr = arr.astype(np.float32)
    elif arr.dtype in (np.int64, np.uint32, np.int16, np.int8, np.uint8, np.bool_):
        if arr.size and (arr.max() > 2**31 - 1 or arr.min() < -(2**31)):
            raise DTypeError("integer values do not fit int32")
        arr = arr.astype(np.int32)
    d = dt.as_dtype(arr.dtype)
    if not arr.flags.c_contiguous:  # (np.ascontiguousarray would turn a 0-d array into 1-d)
        arr = arr.copy(order="C")
    if not arr.size:
        return dev.backend.empty(dev, arr.shape, d)
    owned = given is None or not np.may_share_memory(arr, given)
    return dev.backend.from_numpy(dev, arr, owned)


def empty(shape: Sequence[int], dtype: Any = "float32", device: Device | str | None = None) -> Tensor:
    """An uninitialised tensor (its values are whatever its memory held)."""
    dev = Device.cpu() if device is None else Device.parse(device)
    return dev.backend.empty(dev, _check_shape(shape), dt.as_dtype(dtype))


def zeros(shape: Sequence[int], dtype: Any = "float32", device: Device | str | None = None) -> Tensor:
    """A tensor of zeros."""
    dev = Device.cpu() if device is None else Device.parse(device)
    return dev.backend.zeros(dev, _check_shape(shape), dt.as_dtype(dtype))


def _check_shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise ShapeError(f"a shape is a sequence of ints, got {shape!r}") from None
    if any(isinstance(s, bool) or not hasattr(s, "__index__") or s.__index__() < 0 for s in dims):
        raise ShapeError(f"a shape is a sequence of ints >= 0, got {shape!r}")
    return tuple(s.__index__() for s in dims)


def from_buffer(data: Any, shape: Sequence[int], dtype: Any = "float32",
                device: Device | str | None = None) -> Tensor:
    """A tensor from raw little-endian, C-ordered bytes (bytes, bytearray, memoryview, array.array,
    an mmap...), without numpy on WebGPU: the bytes are uploaded as they are. On the CPU device the
    bytes are copied into a numpy array."""
    dev = Device.cpu() if device is None else Device.parse(device)
    d = dt.as_dtype(dtype)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ShapeError(f"from_buffer: negative dim in shape {shape}")
    mv = memoryview(data)
    if not mv.c_contiguous:
        raise ShapeError("from_buffer: the buffer must be C-contiguous")
    mv = mv.cast("B") if (mv.format != "B" or mv.ndim != 1) else mv
    want = math.prod(shape) * d.itemsize
    if mv.nbytes != want:
        raise ShapeError(f"from_buffer: {mv.nbytes} bytes given for shape {shape} {d.name} ({want} bytes)")
    return dev.backend.from_bytes(dev, shape, d, mv) if want else dev.backend.empty(dev, shape, d)


Tensor.from_buffer = staticmethod(from_buffer)  # type: ignore[attr-defined]


def _tensor_without_numpy(data: Any, dev: Device, dtype: Any) -> Tensor:
    """`tensor()` where numpy cannot be imported: scalars, nested lists/tuples, array.array, Tensors."""
    import array
    import struct

    if isinstance(data, Tensor):
        t = from_buffer(data.tobytes(), data.shape, data.dtype, dev)
        return t if dtype is None else t.to(dt.as_dtype(dtype))
    if isinstance(data, array.array):
        shape: tuple[int, ...] = (len(data),)
        flat: list[Any] = data.tolist()
        default = dt.float32 if data.typecode in "fd" else dt.int32
    elif isinstance(data, bytes | bytearray | memoryview):
        raise TypeError("tensor(): raw bytes have no shape or dtype; "
                        "use webtensor.Tensor.from_buffer(data, shape, dtype, device)")
    else:
        shape, flat = _flatten(data)
        default = dt.float32 if any(isinstance(v, float) for v in flat) else dt.int32
    d = default if dtype is None else dt.as_dtype(dtype)
    if d is dt.int32:
        if any(isinstance(v, float) and not v.is_integer() for v in flat):
            flat = [int(v) for v in flat]
        if any(not -(2**31) <= int(v) <= 2**31 - 1 for v in flat):
            raise DTypeError("integer values do not fit int32")
        flat = [int(v) for v in flat]
    else:
        flat = [float(v) for v in flat]
    return from_buffer(struct.pack(f"<{len(flat)}{d.struct_code}", *flat), shape, d, dev)


def _flatten(data: Any) -> tuple[tuple[int, ...], list[Any]]:
    """Shape and row-major values of a scalar or of (nested, rectangular) lists / tuples."""
    if isinstance(data, bool | int | float):
        return (), [data]
    if not isinstance(data, list | tuple):
        raise TypeError(f"tensor(): cannot make a tensor from {type(data).__name__} without numpy")
    if not data:
        return (0,), []
    parts = [_flatten(x) for x in data]
    inner = parts[0][0]
    if any(p[0] != inner for p in parts):
        raise ShapeError("tensor(): nested lists are ragged (rows of different shapes)")
    return (len(data), *inner), [v for _, vals in parts for v in vals]


def check_same_device(op: str, *ts: Tensor) -> Device:
    dev = ts[0].device
    for t in ts[1:]:
        if not t.device.same_as(dev):
            raise DeviceMismatchError(
                f"{op}: tensors are on different devices: {dev.describe()} and {t.device.describe()}"
                + (" (two distinct WebGPU devices)" if dev.kind == t.device.kind else "")
                + "; move one with .to(device)"
            )
    return dev
