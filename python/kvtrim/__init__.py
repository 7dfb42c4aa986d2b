"""kvtrim: keep an inference engine's KV cache in kvtrimd, from Python.

libkvtrim (the C client of the kvtrim daemon) in Python's idiom:

    import kvtrim
    with kvtrim.Daemon(pool_size="256M") as d, \\
         kvtrim.Client(runtime_dir=d.runtime_dir, n_layers=2, n_heads=4,
                       n_kv_heads=2, head_dim=8, d_model=32,
                       policy="streaming:sinks=4,tokens=64") as c, \\
         c.open_seq() as s:
        k, v = s.kv(layer=0, head=0, k=0)   # numpy views of the page rows
        ...
        s.sync(1, "prefill")
        print(c.stats()["kv_bytes"])

Errors are exceptions: kvtrim.Error, and one subclass per code of
libkvtrim's error list (kvtrim.EINVAL, kvtrim.ENOSEQ, ...), made here from
the C list itself; each carries .code, .name and .text (the daemon's or
libkvtrim's reason).  Argument errors are also ValueError, a lost daemon
also ConnectionError, a timeout also TimeoutError.

Memory: page, staging and table views are numpy arrays over the shared
memory itself (zero copy; torch tensors with .torch(), kvtrim.as_torch or
torch.from_dlpack), valid until the next sync of their sequence, as in the
C API.  They keep the client's mappings alive: close() disconnects once no
view (nor tensor taken through DLPack) is left.  On a cuda tenant they are
DeviceArrays (__cuda_array_interface__ and DLPack).

kvtrim.Daemon starts a private kvtrimd (the one this package carries) on a
temporary runtime directory, for notebooks and tests; Client connects to
any kvtrimd, the systemd service's included (runtime_dir None: the C
library's default, $KVTRIM_RUNTIME_DIR then $XDG_RUNTIME_DIR/kvtrim).
"""
import os

import numpy as np

from . import _kvtrim
from ._daemon import Daemon, daemon_path

__all__ = ["Client", "Seq", "Daemon", "Error", "daemon_path", "as_torch",
           "DTYPES", "PREFILL", "DECODE"]

# -------------------------------------------------------------- errors


class Error(Exception):
    """A libkvtrim error: .code (negative KVT_E* value), .name ("EINVAL")
    and .text (the reason)."""

    def __init__(self, code, name, text):
        super().__init__(code, name, text)
        self.code, self.name, self.text = code, name, text

    def __str__(self):
        return f"{self.name}: {self.text}"


# Python's own exception each kind of error also is, so that `except
# ValueError` works on bad arguments.  Codes not named here are Error only.
_ALSO = {
    "EINVAL": ValueError, "ENOSEQ": ValueError, "EHEADROOM": ValueError,
    "EGEOMETRY": ValueError, "EPOLICY": ValueError, "ETOOLONG": ValueError,
    "ETOOBIG": ValueError, "ECONN": ConnectionError,
    "ETIMEDOUT": TimeoutError, "ENOMEM": MemoryError,
    "EPERM": PermissionError, "ENOTSUP": NotImplementedError,
}
_by_code = {}
for _code, _name, _text in _kvtrim.errors():
    _bases = (Error,) + ((_ALSO[_name],) if _name in _ALSO else ())
    _cls = type(_name, _bases, {"__doc__": f"KVT_{_name}: {_text}",
                                "__module__": __name__})
    globals()[_name] = _cls
    __all__.append(_name)
    _by_code[_code] = _cls
_kvtrim._set_errors(Error, _by_code)
del _code, _name, _text, _bases, _cls

# -------------------------------------------------------------- constants

DTYPES = {"f32": 0, "f16": 1, "bf16": 2}
_NP_DTYPE = {0: np.float32, 1: np.float16, 2: np.uint16}  # bf16: raw bits
PREFILL, DECODE = _kvtrim.PHASE_PREFILL, _kvtrim.PHASE_DECODE
_PHASES = {"prefill": PREFILL, "decode": DECODE, PREFILL: PREFILL,
           DECODE: DECODE}
_INPUTS = {"x": _kvtrim.INPUT_X, "q": _kvtrim.INPUT_Q,
           "lse": _kvtrim.INPUT_LSE, "kv": _kvtrim.INPUT_KV}



def as_torch(a, bf16=None):
    """A torch tensor over the same memory as numpy array a (zero copy);
    bf16=True (or a view of a bf16 tenant's page) reinterprets uint16 bits
    as torch.bfloat16."""
    import torch
    t = torch.from_numpy(a)
    if bf16 or (bf16 is None and getattr(a, "_kvtrim_bf16", False)):
        t = t.view(torch.bfloat16)
    return t


def _dlpack_terms(device, dl_device, copy, max_version, readonly):
    """The DLPack request terms every export of kvtrim memory on device
    refuses (BufferError): another device, a copy, a read-only array
    asked for the unversioned struct, which cannot say so.  Returns
    whether the versioned struct (DLPack 1.0) was asked for."""
    if dl_device is not None and tuple(dl_device) != tuple(device):
        raise BufferError(f"kvtrim memory is on {tuple(device)}, not "
                          f"{tuple(dl_device)}")
    if copy:
        raise BufferError("kvtrim exports its memory only in place "
                          "(copy=True: copy after the import)")
    versioned = max_version is not None and tuple(max_version)[0] >= 1
    if readonly and not versioned:
        raise BufferError("read-only memory exports only as DLPack 1.0 "
                          "(max_version=(1, 0)), which can say so")
    return versioned


class _View(np.ndarray):
    """numpy view of kvtrim memory; keeps the Region (and so the client's
    mappings) alive; .torch() gives the torch tensor over it, and so does
    torch.from_dlpack(view), zero copy (numpy's __dlpack__)."""

    def torch(self):
        import torch
        t = torch.from_numpy(np.asarray(self))
        return t.view(torch.bfloat16) if getattr(self, "_kvtrim_bf16",
                                                 False) else t

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None,
                   copy=None):
        """numpy's export, which keeps this view (and so the client's
        mappings) alive while the consumer holds the tensor; a read-only
        view (the table, a list's page ids) exports only as DLPack 1.0,
        whose read-only flag torch does not keep: do not write through
        such a tensor.  The pages and K/V rows of a bf16 tenant, which
        numpy holds as uint16 bits, export as bfloat16 (kDLBfloat, as
        .torch() gives them), on the host (kDLCPU), with no stream (stream
        other than None, dl_device other than (kDLCPU, 0) or copy=True
        raise BufferError).  Slices of a view are plain numpy to DLPack
        (uint16 for bf16)."""
        c = getattr(self, "_kvtrim_c", None)
        if not getattr(self, "_kvtrim_bf16", False) or c is None:
            kw = {k: v for k, v in (("stream", stream),
                                    ("max_version", max_version),
                                    ("dl_device", dl_device),
                                    ("copy", copy)) if v is not None}
            return super().__dlpack__(**kw)
        if stream is not None:
            raise BufferError("host memory has no stream (stream=None)")
        versioned = _dlpack_terms((1, 0), dl_device, copy, max_version,
                                  not self.flags.writeable)
        return c.dlpack(self, self.ctypes.data, self.shape,
                        tuple(n // self.itemsize for n in self.strides), 4, 16,
                        not self.flags.writeable, versioned)


class DeviceArray:
    """Device memory of a cuda tenant (a page, a K/V row, a staging row,
    the device copy of the table): the host cannot read it; CUDA
    consumers take it zero-copy through __cuda_array_interface__
    (version 3: torch.as_tensor(a, device="cuda"), CuPy, Numba) or DLPack
    (torch.from_dlpack(a), cupy.from_dlpack, jax.dlpack), .torch() gives
    the tensor.  Valid while its client is open; a tensor taken through
    DLPack keeps the client's mappings alive past close() as a host view
    does.  bf16 memory is described as uint16 bits to
    __cuda_array_interface__ (.torch() reinterprets it as torch.bfloat16)
    and as bfloat16 to DLPack.  The interface names the client's stream
    (set_stream) when one is set, so a consumer orders its reads after the
    engine's work on it; __dlpack__ checks the consumer's stream is that
    one instead."""

    def __init__(self, client, addr, dtype, shape, writable, bf16=False):
        self._client = client
        self.ptr = int(addr)
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(n) for n in shape)
        self.readonly = not writable
        self._bf16 = bf16

    @property
    def nbytes(self):
        return int(np.prod(self.shape)) * self.dtype.itemsize

    @property
    def __cuda_array_interface__(self):
        d = {"shape": self.shape, "typestr": self.dtype.str,
             "data": (self.ptr, self.readonly), "strides": None,
             "version": 3}
        if self._client._stream:
            d["stream"] = self._client._stream
        return d

    def __dlpack_device__(self):
        """(kDLCUDA, 0): the pages are imported on device 0 of this
        process, the one libkvtrim opens its CUDA context on."""
        return (_kvtrim.DL_CUDA, _kvtrim.DL_DEVICE_ID)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None,
                   copy=None):
        """A DLPack capsule over this memory (zero copy): the classic
        "dltensor" (DLManagedTensor), or "dltensor_versioned"
        (DLManagedTensorVersioned 1.0, the read-only flag set on read-only
        memory) when max_version is (1, 0) or later, as torch.from_dlpack
        asks.  Read-only memory (the device table) is refused in the
        classic struct, which cannot say read-only (BufferError).  The
        tensor keeps this array and the client's mappings alive until the
        consumer frees it.

        Streams: libkvtrim's memory is ready on the client's stream
        (set_stream; the legacy default stream when none was set) once
        kvt_sync or kvt_wait returned: that stream waits for the daemon's
        compaction, the host does not.  This package has no CUDA runtime to
        make another stream wait, so stream (the consumer's, as DLPack
        defines it: None or 1 the legacy default stream, 2 the per-thread
        one, else a cudaStream_t; -1 no ordering wanted) must be the
        client's stream, or -1 when the consumer orders it itself;
        another one raises BufferError (set_stream() to the consumer's
        stream first, or synchronize and pass -1).  0 is not a DLPack
        stream on CUDA (ValueError).  dl_device other than
        __dlpack_device__() and copy=True raise BufferError: there is no
        copy here (copy in the consumer after the import)."""
        if stream == 0:
            raise ValueError("stream 0 is ambiguous in DLPack: pass 1 for "
                             "the legacy default stream, 2 for the "
                             "per-thread one, or -1")
        mine = self._client._stream
        if stream != -1 and not (stream in (None, 1) and mine == 0 or
                                 stream == mine != 0):
            where = f"stream {mine:#x}" if mine else "the legacy default"
            raise BufferError(
                f"kvtrim memory is ordered on the client's stream ({where})"
                f", not on the consumer's ({stream}): set_stream() to the "
                f"consumer's stream, or synchronize and pass stream=-1")
        versioned = _dlpack_terms(self.__dlpack_device__(), dl_device, copy,
                                  max_version, self.readonly)
        if self._bf16:
            code, bits = 4, 16                        # kDLBfloat
        elif self.dtype.kind in "fui":                # kDLFloat, UInt, Int
            code = {"f": 2, "u": 1, "i": 0}[self.dtype.kind]
            bits = 8 * self.dtype.itemsize
        else:
            raise BufferError(f"no DLPack type for {self.dtype}")
        return self._client._c.dlpack(self, self.ptr, self.shape, None, code,
                                      bits, self.readonly, versioned)

    def torch(self):
        import torch
        t = torch.as_tensor(self, device="cuda")
        return t.view(torch.bfloat16) if self._bf16 else t

    def __repr__(self):
        return (f"<kvtrim.DeviceArray {self.dtype}{list(self.shape)} at "
                f"{self.ptr:#x}{' read-only' if self.readonly else ''}>")


def _view(region, dtype, shape, bf16=False):
    a = np.frombuffer(region, dtype=dtype).reshape(shape).view(_View)
    a._kvtrim_bf16 = bf16
    return a


def _u32(v, what):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{what} must be an int, not {type(v).__name__}")
    if not 0 <= int(v) < 2 ** 32:
        raise ValueError(f"{what} {v} out of range")
    return int(v)


def _f32_array(a, what, shape):
    """(address, keepalive) of a C-contiguous float32 numpy array or torch
    tensor of the given shape; TypeError / ValueError otherwise."""
    mod = type(a).__module__
    if mod.startswith("torch"):
        import torch
        if a.dtype != torch.float32:
            raise TypeError(f"{what} must be float32, not {a.dtype}")
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"{what} has shape {tuple(a.shape)}, "
                             f"expected {tuple(shape)}")
        if not a.is_contiguous():
            raise ValueError(f"{what} must be contiguous")
        return a.data_ptr(), a
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{what} must be a numpy array or a torch tensor")
    if a.dtype != np.float32:
        raise TypeError(f"{what} must be float32, not {a.dtype}")
    if a.shape != tuple(shape):
        raise ValueError(f"{what} has shape {a.shape}, expected "
                         f"{tuple(shape)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous")
    return a.ctypes.data, a


_TORCH_OF = {0: "float32", 1: "float16", 2: "bfloat16"}


def _kv_src(a, c, what):
    """(address, (head_stride, tok_stride) in elements, n) of a K or V
    source [n_kv_heads][n][head_dim] whose rows are contiguous."""
    dt = DTYPES[c.dtype]
    if type(a).__module__.startswith("torch"):
        if str(a.dtype) != "torch." + _TORCH_OF[dt]:
            raise TypeError(f"{what} must be torch.{_TORCH_OF[dt]} (the "
                            f"tenant's dtype), not {a.dtype}")
        shape, strides, addr = tuple(a.shape), tuple(a.stride()), \
            a.data_ptr()
    elif isinstance(a, np.ndarray):
        if a.dtype != _NP_DTYPE[dt]:
            raise TypeError(f"{what} must be {np.dtype(_NP_DTYPE[dt])} "
                            f"(the tenant's dtype), not {a.dtype}")
        shape = a.shape
        strides = tuple(s // a.itemsize for s in a.strides)
        addr = a.ctypes.data
    else:
        raise TypeError(f"{what} must be a numpy array or a torch tensor")
    if len(shape) != 3 or shape[0] != c.n_kv_heads or \
            shape[2] != c.head_dim:
        raise ValueError(f"{what} has shape {shape}, expected "
                         f"({c.n_kv_heads}, n, {c.head_dim})")
    if shape[1] and strides[2] != 1:
        raise ValueError(f"{what}'s rows must be contiguous")
    hs, ts = strides[0], strides[1]
    # a stride along a dimension of size 1 is never used: normalise it,
    # so that k and v compare equal whenever their rows sit alike
    if shape[1] == 1:
        ts = max(hs * shape[0], shape[2])
    if shape[0] == 1:
        hs = max(ts * shape[1], shape[2])
    return addr, (hs, ts), int(shape[1])


# -------------------------------------------------------------- client


class Client:
    """One tenant of kvtrimd (kvt_connect); a context manager that
    disconnects on exit.  Geometry and registration as struct kvt_config
    (include/kvtrim.h): zero fields take the daemon's defaults; dtype is
    "f32", "f16" or "bf16"."""

    def __init__(self, *, n_layers, n_heads, n_kv_heads, head_dim, d_model,
                 dtype="f32", runtime_dir=None, tenant=None, page_tokens=0,
                 max_seqs=0, max_tokens=0, headroom=0, stage_tokens=0,
                 policy=None, quota_bytes=0, timeout_ms=0):
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: one of {sorted(DTYPES)}")
        for k, v in (("n_layers", n_layers), ("n_heads", n_heads),
                     ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
                     ("d_model", d_model), ("page_tokens", page_tokens),
                     ("max_seqs", max_seqs), ("max_tokens", max_tokens),
                     ("headroom", headroom), ("stage_tokens", stage_tokens)):
            _u32(v, k)
        if runtime_dir is not None:
            runtime_dir = os.fspath(runtime_dir)
        self._stream = 0
        self._c = _kvtrim.Client(
            runtime_dir, tenant, n_layers, n_heads, n_kv_heads, head_dim,
            d_model, DTYPES[dtype], page_tokens, max_seqs, max_tokens,
            headroom, stage_tokens, policy, int(quota_bytes),
            int(timeout_ms))
        cfg = self._c.config()
        self.config = cfg
        self.dtype = dtype
        self.n_layers, self.n_heads = cfg["n_layers"], cfg["n_heads"]
        self.n_kv_heads, self.head_dim = cfg["n_kv_heads"], cfg["head_dim"]
        self.d_model, self.page_tokens = cfg["d_model"], cfg["page_tokens"]
        self.page_bytes = (2 * self.page_tokens * self.head_dim *
                           _kvtrim.dtype_size(DTYPES[dtype]))
        self._seqs = {}

    # -- session
    def close(self):
        """Disconnects: every sequence closes and its pages return to the
        pool (once no view of this client's memory is alive)."""
        self._c.close()

    @property
    def closed(self):
        return self._c.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def last_error(self):
        return self._c.last_error()

    @property
    def policy_inputs(self):
        """What the policy reads: a set of "x", "q", "lse", "kv"."""
        bits = self._c.policy_inputs()
        return {k for k, b in _INPUTS.items() if bits & b}

    @property
    def memory_kind(self):
        return "cuda" if self._c.memory_kind() == _kvtrim.MEMORY_CUDA \
            else "host"

    # -- sequences
    def open_seq(self):
        """A new sequence (kvt_seq_open), a context manager that closes
        it."""
        s = Seq(self, self._c.seq_open())
        return s

    def sync(self, items):
        """Commits several sequences' appends in one sync (kvt_sync):
        items are (seq, n_new) or (seq, n_new, phase) or (seq, n_new,
        phase, layer_lo, layer_hi); phase "prefill" (default) or
        "decode"."""
        self._c.sync(self._items(items))

    def sync_async(self, items):
        """kvt_sync_async: a ticket for wait()."""
        return self._c.sync_async(self._items(items))

    def wait(self, ticket):
        self._c.wait(_u32(ticket, "ticket"))

    def _items(self, items):
        out = []
        for it in items:
            if not isinstance(it, (tuple, list)) or not 2 <= len(it) <= 5:
                raise TypeError("a sync item is (seq, n_new[, phase"
                                "[, layer_lo, layer_hi]])")
            seq = it[0].id if isinstance(it[0], Seq) else it[0]
            phase = it[2] if len(it) > 2 else "prefill"
            if phase not in _PHASES:
                raise ValueError(f"phase {phase!r}: 'prefill' or 'decode'")
            lo = it[3] if len(it) > 3 else 0
            hi = it[4] if len(it) > 4 else 0
            out.append((int(seq), _u32(it[1], "n_new"), _PHASES[phase],
                        _u32(lo, "layer_lo"), _u32(hi, "layer_hi")))
        return out

    def attend(self, items):
        """kvt_attend: many attentions in one call, items of (seq, layer,
        q) or (seq, layer, q, scale); returns [(out, lse)] in order.
        Every item is checked before any is computed."""
        calls, res = [], []
        for it in items:
            if not isinstance(it, (tuple, list)) or len(it) not in (3, 4):
                raise TypeError("an attend item is (seq, layer, q[, scale])")
            seq = it[0] if isinstance(it[0], Seq) else Seq(self, it[0])
            call, out, lse = seq._attend_item(
                it[1], it[2], None, None, it[3] if len(it) > 3 else None)
            calls.append(call)
            res.append((out, lse))
        self._c.attend(calls)
        return res

    def last_sync(self):
        return self._c.last_sync()

    def stats(self):
        """The daemon's accounting of this tenant (kvt_stats) as a dict,
        with kv_bytes = pages_used x page bytes added."""
        s = self._c.stats()
        s["kv_bytes"] = s["pages_used"] * self.page_bytes
        return s

    # -- memory
    def page(self, page_id):
        """Page page_id as a writable numpy array [2][page_tokens]
        [head_dim] (K rows, then V rows) in the tenant's dtype (bf16 as
        uint16 bits; .torch() gives torch.bfloat16)."""
        addr = self._c.page_ptr(_u32(page_id, "page id"))
        return self._mem(addr, _NP_DTYPE[DTYPES[self.dtype]],
                         (2, self.page_tokens, self.head_dim), True,
                         self.dtype == "bf16")

    def table(self):
        """kvt_table_view as a dict, with "records": a read-only numpy
        uint32 array [max_seqs][n_layers][n_kv_heads][list_stride / 4]
        over the table's records (host tenants): record words are len,
        n_pages, epoch (two words), then page ids."""
        v = self._c.table_view()
        v["records"] = self._mem(v["table"] + v["records_offset"], np.uint32,
                                 (v["max_seqs"], v["n_layers"],
                                  v["n_kv_heads"], v["list_stride"] // 4),
                                 False)
        return v

    def memcpy(self, dst, src, nbytes=None):
        """kvt_memcpy between numpy arrays, DeviceArrays (or addresses,
        with nbytes)."""
        def addr(a):
            if isinstance(a, np.ndarray):
                if not a.flags.c_contiguous:
                    raise ValueError("arrays must be C-contiguous")
                return a.ctypes.data, a.nbytes
            if isinstance(a, DeviceArray):
                return a.ptr, a.nbytes
            if isinstance(a, int):
                return a, None
            raise TypeError("numpy arrays, DeviceArrays or integer "
                            "addresses")
        d, dn = addr(dst)
        s, sn = addr(src)
        n = nbytes if nbytes is not None else min(x for x in (dn, sn)
                                                  if x is not None)
        if dn is not None and n > dn or sn is not None and n > sn:
            raise ValueError(f"{n} bytes do not fit")
        self._c.memcpy(d, s, int(n))

    def buffer(self, nbytes):
        """kvt_buffer_alloc: a zero-filled buffer in the pages' memory
        kind; on a host tenant a writable numpy uint8 array whose memory
        returns at buffer_free(array) or disconnect; on a cuda tenant a
        DeviceArray."""
        a = self._c.buffer_alloc(int(nbytes))
        return self._mem(a, np.uint8, (int(nbytes),), True)

    def buffer_free(self, arr):
        self._c.buffer_free(arr.ptr if isinstance(arr, DeviceArray)
                            else arr.ctypes.data)

    def set_stream(self, stream):
        """Cuda tenants: the CUDA stream (an int address, or a
        torch.cuda.Stream) the engine writes and attends on."""
        s = getattr(stream, "cuda_stream", stream)
        self._c.set_stream(int(s or 0))
        self._stream = int(s or 0)

    def _mem(self, addr, dtype, shape, writable, bf16=False):
        """The tenant's memory at addr: a numpy view over host memory, a
        DeviceArray on a cuda tenant."""
        if self.memory_kind == "cuda":
            return DeviceArray(self, addr, dtype, shape, writable, bf16)
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        a = _view(self._c.region(addr, n, writable), dtype, shape, bf16)
        a._kvtrim_c = self._c  # bf16 views build their DLPack capsule
        if not writable:
            a.flags.writeable = False
        return a

    def __repr__(self):
        cfg = getattr(self, "config", None)
        if cfg is None:
            return "<kvtrim.Client (not connected)>"
        return (f"<kvtrim.Client tenant={cfg['tenant']!r} "
                f"policy={cfg['policy']!r}"
                f"{' closed' if self.closed else ''}>")


class Seq:
    """One sequence of a Client (kvt_seq); a context manager that closes
    it.  .id is the C id (int)."""

    def __init__(self, client, seq_id):
        self.client, self.id = client, seq_id

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.client.closed:
            try:
                self.close()
            except Error:
                if exc[0] is None:
                    raise
        return False

    def close(self):
        self.client._c.seq_close(self.id)

    def fork(self):
        """A new sequence holding a copy of this one as its last sync left
        it (kvt_seq_fork): the same entries, positions and policy state;
        then the two go on apart.  A context manager that closes it."""
        return Seq(self.client, self.client._c.seq_fork(self.id))

    def query(self):
        return self.client._c.seq_query(self.id)

    def headroom(self, entries):
        self.client._c.seq_headroom(self.id, _u32(entries, "entries"))

    def reserve(self, entries):
        """kvt_seq_reserve: room for `entries` new entries now (an empty
        sync carries the headroom when it must grow); call it with nothing
        appended since the last sync."""
        self.client._c.seq_reserve(self.id, _u32(entries, "entries"))

    def list(self, layer, head):
        """(len, n_pages, epoch, pages): pages a read-only numpy uint32
        array of the page ids, over the shared host table (on a cuda
        tenant too: kvt_list_get reads the host copy)."""
        c = self.client
        ln, np_, ep, addr = c._c.list_get(self.id, _u32(layer, "layer"),
                                          _u32(head, "head"))
        pages = np.zeros(0, np.uint32)
        if np_:
            pages = _view(c._c.region(addr, 4 * np_, False, True), np.uint32,
                          (np_,))
            pages.flags.writeable = False
        return ln, np_, ep, pages

    def kv(self, layer, head, k):
        """Writable numpy views (K row, V row), head_dim elements each, of
        entry len + k of the list (kvt_kv_ptr)."""
        c = self.client
        ka, va = c._c.kv_ptr(self.id, _u32(layer, "layer"),
                             _u32(head, "head"), _u32(k, "k"))
        dt = _NP_DTYPE[DTYPES[c.dtype]]
        bf = c.dtype == "bf16"
        return (c._mem(ka, dt, (c.head_dim,), True, bf),
                c._mem(va, dt, (c.head_dim,), True, bf))

    def _stage(self, which, layer, pos, shape):
        c = self.client
        a = c._c.stage_ptr(which, self.id, _u32(layer, "layer"),
                           _u32(pos, "pos"))
        if not a:
            return None
        return c._mem(a, np.float32, shape, True)

    def stage_x(self, layer, pos):
        """Writable float32 [d_model] staging row of position pos, or None
        when the policy does not read x (kvt_stage_x)."""
        return self._stage(0, layer, pos, (self.client.d_model,))

    def stage_q(self, layer, pos):
        """float32 [n_heads][head_dim] or None (kvt_stage_q)."""
        c = self.client
        return self._stage(1, layer, pos, (c.n_heads, c.head_dim))

    def stage_lse(self, layer, pos):
        """float32 [n_heads] or None (kvt_stage_lse)."""
        return self._stage(2, layer, pos, (self.client.n_heads,))

    def write_kv(self, layer, k, v, k0=0):
        """kvt_write_kv: K and V of n new tokens into entries len + k0 ..
        of every KV head's list of the layer, from numpy arrays or torch
        tensors [n_kv_heads][n][head_dim] (transformers' per-sequence
        layout) in the tenant's dtype (bf16 as torch.bfloat16 or uint16);
        any strides whose rows are contiguous work (a slice key[b] of a
        [batch][heads][n][head_dim] tensor included)."""
        c = self.client
        ka, kst, n = _kv_src(k, c, "k")
        va, vst, nv = _kv_src(v, c, "v")
        if kst != vst or n != nv:
            raise ValueError("k and v must have the same shape and strides")
        c._c.write_kv(self.id, _u32(layer, "layer"), _u32(k0, "k0"), n,
                      ka, va, kst[1], kst[0])

    def stage(self, layer, pos0, x=None, q=None, lse=None):
        """kvt_stage: scorer inputs of positions pos0 .. pos0 + n - 1:
        x [n][d_model], q [n][n_heads][head_dim], lse [n][n_heads], float32
        numpy or torch, C-contiguous; only what the policy reads is
        copied (the others may be None)."""
        c = self.client
        n = None
        addrs = []
        for a, what, tail in ((x, "x", (c.d_model,)),
                              (q, "q", (c.n_heads, c.head_dim)),
                              (lse, "lse", (c.n_heads,))):
            if a is None:
                addrs.append(0)
                continue
            m = int(a.shape[0]) if len(a.shape) else 0
            if n is None:
                n = m
            addrs.append(_f32_array(a, what, (n,) + tail)[0])
        if n is None:
            return
        c._c.stage(self.id, _u32(layer, "layer"), _u32(pos0, "pos0"), n,
                   *addrs)

    def sync(self, n_new, phase="prefill", layers=None):
        """Commits n_new appended entries of every list (of layers
        range(lo, hi) when layers=(lo, hi)) and lets the policy evict."""
        lo, hi = layers if layers else (0, 0)
        self.client.sync([(self, n_new, phase, lo, hi)])

    def attention(self, layer, q, out=None, lse=None, scale=None):
        """kvt_attention for the n new tokens of q [n][n_heads][head_dim]
        (float32, numpy or torch, C-contiguous): returns (out, lse), out
        [n][n_heads][head_dim] and lse [n][n_heads], allocated like q
        when not given; scale the softmax's (None: head_dim ** -0.5)."""
        item, out, lse = self._attend_item(layer, q, out, lse, scale)
        self.client._c.attend([item])
        return out, lse

    def _attend_item(self, layer, q, out, lse, scale):
        c = self.client
        n = int(q.shape[0]) if hasattr(q, "shape") and len(q.shape) else 0
        qs = (n, c.n_heads, c.head_dim)
        qa, _ = _f32_array(q, "q", qs)
        if out is None:
            out = q.new_empty(qs) if hasattr(q, "new_empty") else \
                np.empty(qs, np.float32)
        if lse is None:
            lse = q.new_empty((n, c.n_heads)) if hasattr(q, "new_empty") \
                else np.empty((n, c.n_heads), np.float32)
        oa, _ = _f32_array(out, "out", qs)
        la, _ = _f32_array(lse, "lse", (n, c.n_heads))
        if scale is not None and not (float(scale) > 0):
            raise ValueError(f"scale {scale} must be positive")
        return ((self.id, _u32(layer, "layer"), n,
                 float(scale or 0.0), qa, oa, la), out, lse)

    def __int__(self):
        return self.id

    def __repr__(self):
        return f"<kvtrim.Seq {self.id:#x}>"
