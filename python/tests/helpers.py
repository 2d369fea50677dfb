"""Shared test helpers: off-heap host memory and a small store geometry."""

import ctypes
import mmap
import os
import random
import shutil
import tempfile

import tutti


class HostBuffer:
    """Anonymous mmap (page-aligned, off the Python heap): the Go side sees
    foreign memory it must not retain past the store's lifetime."""

    def __init__(self, nbytes):
        self.nbytes = nbytes
        self._mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._anchor = (ctypes.c_char * nbytes).from_buffer(self._mm)
        self.addr = ctypes.addressof(self._anchor)

    def view(self):
        return memoryview(self._mm)

    def fill_random(self, seed):
        self._mm[:] = random.Random(seed).randbytes(self.nbytes)

    def close(self):
        if self._mm is not None:
            del self._anchor
            self._mm.close()
            self._mm = None


SMALL = tutti.Geometry(layers=4, kv_heads=2, head_dim=64, dtype="fp16", planes=2, page_tokens=16, chunk_pages=1)
NUM_PAGES = 64
# Small staging: the tests move a few KiB at a time.
SMALL_IO = tutti.IOOptions(staging_bytes=4 << 20, staging_slot_bytes=1 << 20)


def small_geometry(**kw):
    d = dict(SMALL.__dict__)
    d.update(kw)
    return tutti.Geometry(**d)


class StoreFixture:
    """A CPU-path store in a temporary directory with host KV memory."""

    def __init__(self, geometry=SMALL, num_pages=NUM_PAGES, layout="per_layer", capacity_bytes=64 << 20, io=SMALL_IO,
                 **kw):
        self.dir = tempfile.mkdtemp(prefix="tutti-pytest-")
        self.geometry, self.num_pages, self.layout = geometry, num_pages, layout
        self.store = tutti.Store([self.dir], capacity_bytes, geometry, num_pages, layout=layout, path="cpu", io=io,
                                 **kw)
        n = geometry.tensor_bytes(layout, num_pages)
        count = geometry.layers if layout == "per_layer" else 1
        self.bufs = [HostBuffer(n) for _ in range(count)]

    def tensors(self):
        """layer name → RawTensor over the host buffers."""
        g = self.geometry
        shape = g.tensor_shape(self.layout, self.num_pages)
        if self.layout == "per_layer":
            return {f"model.layers.{i}.self_attn.attn": tutti.RawTensor.contiguous(b.addr, shape, g.dtype)
                    for i, b in enumerate(self.bufs)}
        t = tutti.RawTensor.contiguous(self.bufs[0].addr, shape, g.dtype)
        return {f"model.layers.{i}.self_attn.attn": t for i in range(g.layers)}

    def regions(self):
        return [(b.addr, b.nbytes) for b in self.bufs]

    def page_bytes(self, layer, plane, page):
        g = self.geometry
        off = g.page_offset(self.layout, self.num_pages, layer, plane, page)
        buf = self.bufs[layer] if self.layout == "per_layer" else self.bufs[0]
        return bytes(buf.view()[off: off + g.page_bytes_per_plane])

    def close(self):
        try:
            self.store.close()
        finally:
            for b in self.bufs:
                b.close()
            shutil.rmtree(self.dir, ignore_errors=True)


def library_path():
    return os.environ.get("TUTTI_LIB")
