"""The kvtrim package against a real kvtrimd (kvtrim.Daemon starts the one
the package carries): every call of the C API reached, errors as their
exception classes with the daemon's text, numpy views aliasing the shared
pages, refusals that change nothing.  Expected values come from hand
arithmetic or a naive float64 attention written here."""
import contextlib
import ctypes
import os
import signal
import sys

import numpy as np
import pytest

import kvtrim

GEO = dict(n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_model=32)


@pytest.fixture(scope="module")
def daemon():
    with kvtrim.Daemon(pool_size="64M") as d:
        yield d


def client(daemon, **kw):
    args = dict(GEO, runtime_dir=daemon.runtime_dir, page_tokens=4,
                headroom=4)
    args.update(kw)
    return kvtrim.Client(**args)


def fill(s, c, n, base, layers=None):
    """Writes entries len .. len+n-1 of every list: K row = value,
    V row = -value, value = base + k (+ 100 * layer + 10 * head)."""
    for layer in range(c.n_layers) if layers is None else layers:
        for h in range(c.n_kv_heads):
            for k in range(n):
                K, V = s.kv(layer, h, k)
                K[:] = base + k + 100 * layer + 10 * h
                V[:] = -(base + k + 100 * layer + 10 * h)


def kept_values(c, s, layer, h):
    ln, _, _, pages = s.list(layer, h)
    out = []
    for i in range(ln):
        pg = c.page(int(pages[i // c.page_tokens]))
        out.append(float(pg[0, i % c.page_tokens, 0]))
    return sorted(out)


def test_errors_are_generated_from_the_c_list():
    # every code of libkvtrim's list has its class, named as the C name
    names = {n for _, n, _ in kvtrim._kvtrim.errors()}
    assert {"EINVAL", "ENOSEQ", "ECONN", "EQUOTA", "ENOTSUP"} <= names
    for code, name, text in kvtrim._kvtrim.errors():
        cls = getattr(kvtrim, name)
        assert issubclass(cls, kvtrim.Error)
        assert text in cls.__doc__
    assert issubclass(kvtrim.EINVAL, ValueError)
    assert issubclass(kvtrim.ECONN, ConnectionError)
    assert issubclass(kvtrim.ETIMEDOUT, TimeoutError)


def test_streaming_keeps_sinks_and_recent_and_stats(daemon):
    # streaming sinks=2 tokens=8: after 20 entries the kept positions are
    # 0, 1 and 14..19 (hand rule: pos < 2 or pos >= n - 6)
    with client(daemon, policy="streaming:sinks=2,tokens=8") as c, \
            c.open_seq() as s:
        assert c.policy_inputs == set()
        for step in range(5):
            fill(s, c, 4, 4 * step)
            s.sync(4)
        assert kept_values(c, s, 0, 0) == [0, 1] + list(range(14, 20))
        assert kept_values(c, s, 1, 1) == [110, 111] + \
            list(range(124, 130))
        st = c.stats()
        assert st["entries_appended"] == 20 * 2 * 2
        assert st["entries_kept"] == 8 * 2 * 2
        assert st["kv_bytes"] == st["pages_used"] * c.page_bytes
        assert c.last_sync()["budget"] == 8
        q = s.query()
        assert q["seen_min"] == q["seen_max"] == 20
        assert q["len_min"] == q["len_max"] == 8
        # a fork holds the same entries; then each goes its own way
        with s.fork() as f:
            assert kept_values(c, f, 1, 1) == kept_values(c, s, 1, 1)
            assert f.query()["syncs"] == 0
            fill(f, c, 4, 20)
            f.sync(4)
            assert kept_values(c, f, 0, 0) == [0, 1] + list(range(18, 24))
            assert kept_values(c, s, 0, 0) == [0, 1] + list(range(14, 20))
        assert c.stats()["entries_kept"] == 8 * 2 * 2
        s2 = c.open_seq()
        s2.close()
        with pytest.raises(kvtrim.ENOSEQ):
            s2.fork()


def test_numpy_views_alias_the_pages(daemon):
    with client(daemon) as c, c.open_seq() as s:
        fill(s, c, 3, 1)
        s.sync(3)
        ln, n_pages, epoch, pages = s.list(0, 1)
        assert ln == 3 and n_pages >= 1 and not pages.flags.writeable
        pg = c.page(int(pages[0]))
        assert pg.shape == (2, 4, 8) and pg.dtype == np.float32
        # a write through numpy is what kvt_memcpy reads back
        pg[0, 2, :] = np.arange(8, dtype=np.float32)
        back = np.zeros(2 * 4 * 8, np.float32)
        c.memcpy(back, pg)
        assert np.array_equal(back.reshape(2, 4, 8)[0, 2], np.arange(8))
        # ... and kvt_memcpy's write is seen through numpy
        src = np.full(8, 7.5, np.float32)
        c.memcpy(pg[1, 0], src)
        assert np.all(pg[1, 0] == 7.5)
        # the torch view is the same memory
        t = pg.torch()
        t[0, 0, 0] = 42.0
        assert pg[0, 0, 0] == 42.0
        # the table records: len and n_pages of (slot, layer 0, head 1)
        tv = c.table()
        rec, slot = c._c.list_record(s.id, 0, 1)
        recs = tv["records"]
        assert recs[slot, 0, 1, 0] == 3 and recs[slot, 0, 1, 1] == n_pages
        assert list(recs[slot, 0, 1, 4:4 + n_pages]) == list(pages)


def test_bf16_and_f16_pages(daemon):
    for dt, npdt in (("f16", np.float16), ("bf16", np.uint16)):
        with client(daemon, dtype=dt) as c, c.open_seq() as s:
            K, V = s.kv(0, 0, 0)
            assert K.dtype == npdt and K.shape == (8,)
            if dt == "bf16":
                import torch
                kt = K.torch()
                assert kt.dtype == torch.bfloat16
                kt[:] = 1.5           # bf16 1.5 = 0x3fc0
                assert K[0] == 0x3fc0
            else:
                K[:] = 1.5
                assert K.view(np.uint16)[0] == 0x3e00


def naive_attention(keys, vals, q, scale):
    """float64: keys/vals [len][hd], q [G][hd] -> out [G][hd], lse [G]."""
    lg = (q.astype(np.float64) @ keys.astype(np.float64).T) * scale
    m = lg.max(axis=1, keepdims=True)
    p = np.exp(lg - m)
    z = p.sum(axis=1, keepdims=True)
    return (p / z) @ vals.astype(np.float64), (m + np.log(z))[:, 0]


def test_attention_matches_a_float64_loop(daemon):
    rng = np.random.default_rng(3)
    with client(daemon) as c, c.open_seq() as s:
        K = rng.standard_normal((2, 2, 7, 8)).astype(np.float32)
        V = rng.standard_normal((2, 2, 7, 8)).astype(np.float32)
        for n0, n in ((0, 4), (4, 3)):
            for layer in range(2):
                for h in range(2):
                    for k in range(n):
                        kr, vr = s.kv(layer, h, k)
                        kr[:], vr[:] = K[layer, h, n0 + k], V[layer, h, n0 + k]
            q = rng.standard_normal((n, 4, 8)).astype(np.float32)
            out, lse = s.attention(1, q)
            for t in range(n):
                for h in range(2):
                    e_out, e_lse = naive_attention(
                        K[1, h, :n0 + t + 1], V[1, h, :n0 + t + 1],
                        q[t, 2 * h:2 * h + 2], 1 / np.sqrt(8))
                    assert np.allclose(out[t, 2 * h:2 * h + 2], e_out,
                                       atol=1e-5)
                    assert np.allclose(lse[t, 2 * h:2 * h + 2], e_lse,
                                       atol=1e-5)
            s.sync(n)
        # kvt_attend: two items in one call, one with an engine's scale
        fill(s, c, 2, 50)
        q2 = rng.standard_normal((2, 4, 8)).astype(np.float32)
        (o1, l1), (o2, l2) = c.attend([(s, 0, q2, 0.2), (s, 1, q2)])
        o3, l3 = s.attention(1, q2)
        assert np.array_equal(o2, o3) and np.array_equal(l2, l3)
        for t in range(2):
            K0 = np.concatenate([K[0, 0], np.full((t + 1, 8), 50.0 + np.arange(t + 1)[:, None])])
            V0 = np.concatenate([V[0, 0], -np.full((t + 1, 8), 50.0 + np.arange(t + 1)[:, None])])
            e_out, e_lse = naive_attention(K0, V0, q2[t, 0:2], 0.2)
            assert np.allclose(o1[t, 0:2], e_out, atol=1e-4)
            assert np.allclose(l1[t, 0:2], e_lse, atol=1e-4)
        with pytest.raises(ValueError):
            s.attention(0, q2, scale=-1.0)
        # on torch tensors too
        import torch
        qt = torch.from_numpy(q)
        ot, lt = s.attention(1, qt[:0].contiguous())
        assert ot.shape == (0, 4, 8)


def test_staging_rows_and_refused_syncs(daemon):
    # h2o reads q, lse (and the keys) at every sync: their rows exist,
    # x's does not
    with client(daemon, policy="h2o:tokens=8", stage_tokens=8) as c, \
            c.open_seq() as s:
        assert c.policy_inputs == {"q", "lse", "kv"}
        assert s.stage_x(0, 0) is None
        q = s.stage_q(0, 0)
        assert q.shape == (4, 8) and q.dtype == np.float32
        assert s.stage_lse(0, 0).shape == (4,)
        fill(s, c, 2, 0)
        # rows never staged: refused with the daemon's text, nothing
        # changes (the same sync goes through once they are staged)
        with pytest.raises(kvtrim.EINVAL) as e:
            s.sync(2)
        assert "stage" in e.value.text or "staged" in e.value.text
        assert s.query()["syncs"] == 0
        for layer in range(2):
            for pos in range(2):
                s.stage_q(layer, pos)[:] = 0.0
                s.stage_lse(layer, pos)[:] = np.log(pos + 1)
        s.sync(2)
        assert s.query()["syncs"] == 1
        # a NaN staged is refused as well, naming the input
        fill(s, c, 1, 2)
        for layer in range(2):
            s.stage_q(layer, 2)[:] = 0.0
            s.stage_lse(layer, 2)[:] = np.log(3)
        s.stage_lse(1, 2)[0] = np.nan
        with pytest.raises(kvtrim.EINVAL):
            s.sync(1)
        assert s.query()["syncs"] == 1


def test_garbage_arguments_raise_and_change_nothing(daemon):
    with client(daemon) as c, c.open_seq() as s:
        fill(s, c, 2, 0)
        s.sync(2)
        before = (s.query(), c.stats()["entries_appended"])
        with pytest.raises(TypeError):
            s.attention(0, np.zeros((1, 4, 8), np.float64))
        with pytest.raises(ValueError):
            s.attention(0, np.zeros((1, 3, 8), np.float32))
        with pytest.raises(ValueError):
            s.attention(0, np.zeros((1, 4, 8), np.float32),
                        out=np.zeros((2, 4, 8), np.float32))
        with pytest.raises(TypeError):
            s.kv("0", 0, 0)
        with pytest.raises(ValueError):
            s.kv(0, 0, -1)
        with pytest.raises(ValueError):     # EINVAL: layer out of range
            s.kv(7, 0, 0)
        with pytest.raises(kvtrim.EHEADROOM):
            s.kv(0, 0, 4)
        with pytest.raises(ValueError):
            s.sync(1, phase="later")
        with pytest.raises(TypeError):
            c.sync([s])
        # a foreign sequence (another client's id): ENOSEQ, a ValueError
        with client(daemon) as other, other.open_seq() as t:
            with pytest.raises(kvtrim.ENOSEQ) as e:
                c.sync([(t.id, 1)])
            assert isinstance(e.value, ValueError) and e.value.text
            with pytest.raises(kvtrim.ENOSEQ):
                c._c.seq_close(t.id)
            assert t.query()["syncs"] == 0
        with pytest.raises(kvtrim.EINVAL):
            c.page(10 ** 9)
        with pytest.raises(ValueError):
            kvtrim.Client(dtype="f64", runtime_dir=daemon.runtime_dir,
                          **GEO)
        assert (s.query(), c.stats()["entries_appended"]) == before


def test_registration_refusals_carry_the_daemons_text(daemon):
    with pytest.raises(kvtrim.EGEOMETRY) as e:
        client(daemon, n_heads=3)
    assert "n_heads" in e.value.text
    with pytest.raises(kvtrim.EPOLICY) as e:
        client(daemon, policy="nosuchpolicy")
    assert "nosuchpolicy" in e.value.text
    with pytest.raises(kvtrim.EINVAL):
        client(daemon, tenant="9starts-with-a-digit")
    with pytest.raises(kvtrim.EQUOTA):
        client(daemon, quota_bytes=1 << 40)
    with pytest.raises(kvtrim.ECONN):
        kvtrim.Client(runtime_dir="/nonexistent/kvtrim", **GEO)


def test_closed_client_raises_and_views_keep_memory_mapped(daemon):
    c = client(daemon)
    s = c.open_seq()
    K, V = s.kv(0, 0, 0)
    K[:] = 3.0
    c.close()
    assert c.closed
    for call in (c.stats, c.open_seq, lambda: s.sync(1), s.query,
                 lambda: s.kv(0, 0, 0), c.table, c.last_sync):
        with pytest.raises(kvtrim.ECONN):
            call()
    # the view outlives close(): its memory is still mapped
    assert K[0] == 3.0
    del K, V
    c.close()  # twice is fine


def test_async_sync_headroom_buffers_and_context_managers(daemon):
    with client(daemon, headroom=8) as c:
        with c.open_seq() as s:
            s.headroom(2)                 # takes effect at the next sync
            fill(s, c, 8, 0)
            t = c.sync_async([(s, 8, "prefill")])
            with pytest.raises(kvtrim.EBUSY):
                s.sync(0)
            c.wait(t)
            with pytest.raises(kvtrim.EINVAL):
                c.wait(t)                 # waited for already
            with pytest.raises(kvtrim.EHEADROOM):
                s.kv(0, 0, 2)
            with pytest.raises(kvtrim.EHEADROOM):
                s.headroom(9)
            s.reserve(5)                  # grows now, by an empty sync
            K, V = s.kv(0, 0, 4)
            with pytest.raises(kvtrim.EHEADROOM):
                s.kv(0, 0, 5)
            b = c.buffer(64)
            assert b.nbytes == 64 and not b.any()
            c.buffer_free(b)
            with pytest.raises(kvtrim.EINVAL):
                c.buffer_free(b)
            sid = s.id
        # the with block closed it
        with pytest.raises(kvtrim.ENOSEQ):
            c._c.seq_query(sid)
        assert c.stats()["sequences"] == 0
        c.set_stream(0)                   # a no-op on a host tenant
        assert c.memory_kind == "host"


def test_daemon_helper_stops_cleanly():
    d = kvtrim.Daemon(pool_size="16M")
    rt = d.runtime_dir
    assert d.running and os.path.exists(os.path.join(rt, "ctl.ipc"))
    assert d.stop() == 0                  # SIGTERM: drains, exits 0
    assert not os.path.exists(rt) and d.stop() is None


def test_lost_daemon_gives_econn():
    d = kvtrim.Daemon(pool_size="16M")
    c = kvtrim.Client(runtime_dir=d.runtime_dir, **GEO)
    s = c.open_seq()
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    with pytest.raises(kvtrim.ECONN):
        for _ in range(50):
            s.query()
    c.close()
    d.stop()


@contextlib.contextmanager
def emulated_cuda_daemon():
    """kvtrimd --backend cuda on the CUDA emulator (no GPU here), this
    process's libkvtrim loading the emulator too; skips without it."""
    emu = os.path.abspath("build/lib/emu/libkvtrim-cuda.so")
    if not os.path.exists(emu):
        pytest.skip("no CUDA emulator build (build/lib/emu/libkvtrim-cuda.so)")
    os.environ["KVTRIM_CUDA_EMU"] = "1"
    os.environ["KVTRIM_CUDA_LIB"] = emu
    try:
        with kvtrim.Daemon(pool_size="64M", backend="cuda") as d:
            yield d
    finally:
        del os.environ["KVTRIM_CUDA_EMU"], os.environ["KVTRIM_CUDA_LIB"]


def test_cuda_tenant_memory_is_device_arrays():
    # kvtrimd --backend cuda on the CUDA emulator (no GPU here): pages,
    # K/V rows, staging rows, buffers and the device table come back as
    # DeviceArrays whose __cuda_array_interface__ names the very addresses
    # libkvtrim gives (kvt_page_ptr and the others), with shape, element
    # type and read-only as documented; bytes copied in with kvt_memcpy
    # read back unchanged.  A consumer on a real GPU (torch.as_tensor(a,
    # device="cuda")) is exercised by make gpu-check.
    with emulated_cuda_daemon() as d:
        with client(d, policy="h2o:tokens=8", stage_tokens=4) as c, \
                c.open_seq() as s:
            assert c.memory_kind == "cuda"
            ln, np_, _, pages = s.list(0, 1)
            pid = int(pages[0])
            pg = c.page(pid)
            assert isinstance(pg, kvtrim.DeviceArray)
            cai = pg.__cuda_array_interface__
            assert cai["data"] == (c._c.page_ptr(pid), False)
            assert cai["shape"] == (2, 4, 8) and cai["typestr"] == "<f4"
            assert cai["version"] == 3 and "stream" not in cai
            host = np.arange(64, dtype=np.float32)
            back = np.zeros(64, np.float32)
            c.memcpy(pg, host)
            c.memcpy(back, pg)
            assert np.array_equal(back, host)
            K, V = s.kv(0, 1, 0)
            assert isinstance(K, kvtrim.DeviceArray) and K.shape == (8,)
            assert K.ptr == c._c.kv_ptr(s.id, 0, 1, 0)[0]
            q = s.stage_q(0, 0)
            assert isinstance(q, kvtrim.DeviceArray)
            assert q.shape == (4, 8) and q.dtype == np.float32
            t = c.table()["records"]
            assert isinstance(t, kvtrim.DeviceArray) and t.readonly
            assert t.__cuda_array_interface__["data"][1] is True
            b = c.buffer(256)
            assert isinstance(b, kvtrim.DeviceArray) and b.nbytes == 256
            c.buffer_free(b)


# DLPack's structs, written here from dlpack.h (v1.0) apart from the C
# code of the package, so a layout mistake there shows up as wrong fields.
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice),
                ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


DL_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", DL_DELETER)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", DL_DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = ctypes.c_void_p
_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_rename = ctypes.pythonapi.PyCapsule_SetName
_capsule_rename.restype = ctypes.c_int
_capsule_rename.argtypes = [ctypes.py_object, ctypes.c_char_p]
# PyCapsule_SetName keeps the pointer, not a copy: these bytes must outlive
# the capsules renamed to them.
USED, USED_VERSIONED = b"used_dltensor", b"used_dltensor_versioned"


def dl_open(cap, versioned=False, keep=True):
    """The managed tensor inside a DLPack capsule; keep: it holds the
    capsule, whose destructor would free the tensor under it."""
    name = b"dltensor_versioned" if versioned else b"dltensor"
    addr = _capsule_ptr(cap, name)
    assert addr
    m = (DLManagedTensorVersioned if versioned
         else DLManagedTensor).from_address(addr)
    if keep:
        m.capsule = cap
    return m


def dl_check(t, a, code, bits):
    """DLTensor t describes DeviceArray a: libkvtrim's own address on
    (kDLCUDA, 0), a's shape, the element type, compact row-major."""
    assert t.data == a.ptr and t.byte_offset == 0
    assert (t.device.device_type, t.device.device_id) == (2, 0)
    assert a.__dlpack_device__() == (2, 0)
    assert t.ndim == len(a.shape)
    assert tuple(t.shape[i] for i in range(t.ndim)) == a.shape
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (code, bits, 1)
    if t.strides:
        compact = [int(np.prod(a.shape[i + 1:])) for i in range(t.ndim)]
        assert [t.strides[i] for i in range(t.ndim)] == compact


def test_device_arrays_export_dlpack():
    # DeviceArray.__dlpack__ on the emulated cuda backend, the capsule read
    # with ctypes: the tensor is libkvtrim's memory (kvt_page_ptr's address,
    # device (kDLCUDA, 0)) with the array's shape and DLPack's type codes
    # (float 2, uint 1, bfloat 4); an unconsumed capsule gives its
    # references back when dropped; a consumed one is freed by the
    # consumer's deleter call alone, and keeps the client's memory mapped
    # past close() until then.  torch.from_dlpack itself needs a GPU
    # (torch asks CUDA for the current stream).
    assert ctypes.sizeof(DLTensor) == 48
    assert ctypes.sizeof(DLManagedTensor) == 64
    assert ctypes.sizeof(DLManagedTensorVersioned) == 80
    with emulated_cuda_daemon() as d:
        for dt, code, bits in (("f32", 2, 32), ("f16", 2, 16),
                               ("bf16", 4, 16)):
            with client(d, dtype=dt) as c, c.open_seq() as s:
                pid = int(s.list(0, 0)[3][0])
                pg = c.page(pid)
                assert pg.ptr == c._c.page_ptr(pid)
                # (counted outside the asserts, whose rewriting by pytest
                # holds c._c while it calls)
                cc = c._c
                refs, crefs = sys.getrefcount(pg), sys.getrefcount(cc)
                cap = pg.__dlpack__()
                now = sys.getrefcount(pg), sys.getrefcount(cc)
                assert now == (refs + 1, crefs + 1)
                m = dl_open(cap, keep=False)
                dl_check(m.dl_tensor, pg, code, bits)
                del m, cap                  # dropped unconsumed
                now = sys.getrefcount(pg), sys.getrefcount(cc)
                assert now == (refs, crefs)
                del cc
                K, _ = s.kv(0, 1, 0)
                v = dl_open(K.__dlpack__(max_version=(1, 0)), True)
                dl_check(v.dl_tensor, K, code, bits)
        with client(d, policy="h2o:tokens=8", stage_tokens=4) as c, \
                c.open_seq() as s:
            q = s.stage_q(0, 0)
            m = dl_open(q.__dlpack__(stream=1))
            dl_check(m.dl_tensor, q, 2, 32)
            b = c.buffer(256)
            dl_check(dl_open(b.__dlpack__()).dl_tensor, b, 1, 8)
            c.buffer_free(b)
            # the device table is read-only: only DLPack 1.0 can say so
            t = c.table()["records"]
            with pytest.raises(BufferError):
                t.__dlpack__()
            v = dl_open(t.__dlpack__(max_version=(1, 1)), True)
            assert (v.major, v.minor, v.flags) == (1, 0, 1)
            dl_check(v.dl_tensor, t, 1, 32)
            pg = c.page(int(s.list(0, 0)[3][0]))
            v = dl_open(pg.__dlpack__(max_version=(1, 0)), True)
            assert v.flags == 0
            # streams: the memory is ready on the client's stream
            with pytest.raises(ValueError):
                pg.__dlpack__(stream=0)
            with pytest.raises(BufferError):
                pg.__dlpack__(stream=0x1234)
            pg.__dlpack__(stream=-1)
            c.set_stream(0x1234)            # stored only; reset below
            try:
                pg.__dlpack__(stream=0x1234)
                with pytest.raises(BufferError):
                    pg.__dlpack__(stream=1)
            finally:
                c.set_stream(0)
            with pytest.raises(BufferError):
                pg.__dlpack__(dl_device=(1, 0))
            pg.__dlpack__(dl_device=(2, 0), copy=False)
            with pytest.raises(BufferError):
                pg.__dlpack__(copy=True)

        # a consumer takes the capsule over (renames it, as torch does) and
        # frees the tensor later through its deleter
        c = client(d)
        pid = int(c.open_seq().list(0, 0)[3][0])
        pg = c.page(pid)
        src = np.arange(64, dtype=np.float32)
        c.memcpy(pg, src)
        for versioned, used in ((False, USED), (True, USED_VERSIONED)):
            refs = sys.getrefcount(pg)
            cap = pg.__dlpack__(max_version=(1, 0) if versioned else None)
            m = dl_open(cap, versioned, keep=False)
            assert _capsule_rename(cap, used) == 0
            del cap                         # consumed: not freed here
            assert sys.getrefcount(pg) == refs + 1
            if versioned:
                break
            m.deleter(ctypes.addressof(m))
            assert sys.getrefcount(pg) == refs
        # the client closes while the consumer holds the tensor: it stays
        # connected underneath (a bad address is kvt_buffer_free's EINVAL,
        # not ECONN), its memory mapped (the emulator's device memory is
        # host memory)
        c.close()
        with pytest.raises(kvtrim.ECONN):
            c.page(pid)
        with pytest.raises(kvtrim.EINVAL):
            c._c.buffer_free(1)
        assert ctypes.string_at(m.dl_tensor.data, 256) == src.tobytes()
        m.deleter(ctypes.addressof(m))      # the consumer lets go
        assert sys.getrefcount(pg) == refs
        with pytest.raises(kvtrim.ECONN):
            c._c.buffer_free(1)             # now disconnected



def test_host_views_export_dlpack_zero_copy(daemon):
    # torch.from_dlpack of a host view aliases the page (a write through
    # torch is what kvt_memcpy reads back) and keeps the client's mappings
    # alive past close() as the view does; a bf16 tenant's page and K row
    # come as torch.bfloat16 over the same bytes (numpy alone says uint16);
    # a read-only view (the table) is refused the classic struct, which
    # cannot say read-only.
    torch = pytest.importorskip("torch", reason="torch is not installed")
    c = client(daemon)
    s = c.open_seq()
    fill(s, c, 2, 1)
    s.sync(2)
    pid = int(s.list(0, 1)[3][0])
    pg = c.page(pid)
    t = torch.from_dlpack(pg)
    assert t.data_ptr() == c._c.page_ptr(pid) and tuple(t.shape) == pg.shape
    t[1, 3, :] = torch.arange(8, dtype=torch.float32)
    back = np.zeros((2, 4, 8), np.float32)
    c.memcpy(back, pg)
    assert np.array_equal(back[1, 3], np.arange(8))
    assert pg[1, 3, 7] == 7.0
    recs = c.table()["records"]
    with pytest.raises(BufferError):
        recs.__dlpack__()
    tr = torch.from_dlpack(recs)            # DLPack 1.0, flagged read-only
    assert tr.data_ptr() == recs.ctypes.data
    del pg, recs, tr
    c.close()
    assert t[1, 3, 5] == 5.0 and t[0, 0, 0] == 11.0   # still mapped
    del t

    with client(daemon, dtype="bf16") as c, c.open_seq() as s:
        K, _ = s.kv(0, 0, 0)
        k = torch.from_dlpack(K)
        assert k.dtype == torch.bfloat16 and k.data_ptr() == K.ctypes.data
        k[:] = torch.arange(8, dtype=torch.bfloat16) + 0.5
        assert np.array_equal(K, (torch.arange(8, dtype=torch.bfloat16) +
                                  0.5).view(torch.int16).numpy()
                              .view(np.uint16))
        pg = c.page(int(s.list(0, 0)[3][0]))
        p = torch.from_dlpack(pg)
        assert p.dtype == torch.bfloat16 and p.data_ptr() == pg.ctypes.data
        assert p.shape == pg.shape and p.stride() == (32, 8, 1)
        del k, p
