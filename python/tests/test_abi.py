"""The C ABI itself: version, struct layout, NULL and bad-handle handling,
the thread-local error message, and chain derivation."""

import ctypes
import os
import re
import threading
import unittest

import tutti
from tutti import _lib

HEADER = os.path.join(os.path.dirname(__file__), "..", "..", "runtime", "capi", "tutti.h")


def header_struct_fields(name):
    with open(HEADER) as f:
        src = f.read()
    m = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name), src, re.S)
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    fields = []
    for decl in body.split(";"):
        decl = decl.strip()
        if decl:
            fields.append(re.findall(r"\w+", decl)[-1])
    return fields


def header_abi_version():
    with open(HEADER) as f:
        src = f.read()
    return tuple(int(re.search(r"#define TUTTI_ABI_%s (\d+)" % k, src).group(1)) for k in ("MAJOR", "MINOR"))


class VersionTest(unittest.TestCase):
    def test_library_version(self):
        # The library built from this tree is tutti.h's version (the Go side
        # checks its own against tutti.h), and this binding needs no later one.
        self.assertEqual(tutti.abi_version(), header_abi_version())
        self.assertEqual(_lib.ABI_MAJOR, header_abi_version()[0])
        self.assertLessEqual(_lib.ABI_MINOR_NEEDED, header_abi_version()[1])

    def test_check_version_refuses_other_major(self):
        with self.assertRaises(tutti.VersionMismatch) as cm:
            _lib.check_version(2 << 16, "libfake")
        self.assertIn("ABI 2.0", str(cm.exception))
        need = _lib.ABI_MINOR_NEEDED
        self.assertEqual(_lib.check_version(1 << 16 | need), (1, need))

    def test_check_version_refuses_older_minor(self):
        old = _lib.ABI_MINOR_NEEDED
        try:
            _lib.ABI_MINOR_NEEDED = 6
            with self.assertRaises(tutti.VersionMismatch):
                _lib.check_version(1 << 16 | 5)
        finally:
            _lib.ABI_MINOR_NEEDED = old

    def test_config_abi_major_mismatch(self):
        lib = _lib.lib()
        cfg = _lib.tutti_config(struct_size=ctypes.sizeof(_lib.tutti_config), abi_major=2)
        h = ctypes.c_uint64(99)
        rc = lib.tutti_open(ctypes.byref(cfg), ctypes.byref(h))
        self.assertEqual(rc, tutti.VersionMismatch.code)
        self.assertEqual(h.value, 0)
        self.assertIn("abi_major = 2", tutti.last_error())
        self.assertIn("ABI %d.%d" % tutti.abi_version(), tutti.last_error())

    def test_config_struct_too_small(self):
        lib = _lib.lib()
        cfg = _lib.tutti_config(struct_size=16, abi_major=1)
        h = ctypes.c_uint64()
        self.assertEqual(lib.tutti_open(ctypes.byref(cfg), ctypes.byref(h)), tutti.VersionMismatch.code)
        self.assertIn("struct_size = 16", tutti.last_error())

    def test_stats_struct_too_small(self):
        lib = _lib.lib()
        s = _lib.tutti_stats(struct_size=8)
        self.assertEqual(lib.tutti_get_stats(1, ctypes.byref(s)), tutti.VersionMismatch.code)

    def test_stats_json_arguments(self):
        lib = _lib.lib()
        n = ctypes.c_uint64(7)
        buf = ctypes.create_string_buffer(16)
        self.assertEqual(lib.tutti_get_stats_json(1, buf, 16, None), tutti.InvalidArgument.code)
        self.assertIn("out_len is NULL", tutti.last_error())
        self.assertEqual(lib.tutti_get_stats_json(1, None, 16, ctypes.byref(n)), tutti.InvalidArgument.code)
        self.assertEqual(n.value, 0)
        self.assertEqual(lib.tutti_get_stats_json(1, buf, 16, ctypes.byref(n)), tutti.BadHandle.code)


class LayoutTest(unittest.TestCase):
    """The ctypes mirrors match tutti.h field for field (and the Go side
    checks the sizes at compile time)."""

    def test_config_fields(self):
        self.assertEqual([f for f, _ in _lib.tutti_config._fields_], header_struct_fields("tutti_config"))
        self.assertEqual(ctypes.sizeof(_lib.tutti_config), 232)

    def test_stats_fields(self):
        self.assertEqual([f for f, _ in _lib.tutti_stats._fields_], header_struct_fields("tutti_stats"))
        self.assertEqual(ctypes.sizeof(_lib.tutti_stats), 176)

    def test_recovery_fields(self):
        self.assertEqual([f for f, _ in _lib.tutti_recovery._fields_], header_struct_fields("tutti_recovery"))

    def test_region_fields(self):
        self.assertEqual([f for f, _ in _lib.tutti_kv_region._fields_], header_struct_fields("tutti_kv_region"))

    def test_status_codes(self):
        with open(HEADER) as f:
            src = f.read()
        codes = {m.group(1): int(m.group(2)) for m in re.finditer(r"\b(TUTTI_(?:OK|ERR_\w+)) = (\d+)", src)}
        self.assertEqual(codes, {v: k for k, v in _lib._STATUS_NAMES.items()})
        for code, cls in _lib.ERRORS.items():
            self.assertEqual(cls.status, _lib._STATUS_NAMES[code])


class NullAndHandleTest(unittest.TestCase):
    def setUp(self):
        self.lib = _lib.lib()

    def assertStatus(self, rc, cls, fragment=None):
        self.assertEqual(rc, cls.code, f"got status {rc} ({_lib._STATUS_NAMES.get(rc)}): {tutti.last_error()}")
        if fragment:
            self.assertIn(fragment, tutti.last_error())

    def test_open_null(self):
        h = ctypes.c_uint64()
        self.assertStatus(self.lib.tutti_open(None, ctypes.byref(h)), tutti.InvalidArgument, "cfg is NULL")
        cfg = _lib.tutti_config(struct_size=ctypes.sizeof(_lib.tutti_config), abi_major=1)
        self.assertStatus(self.lib.tutti_open(ctypes.byref(cfg), None), tutti.InvalidArgument, "out_store is NULL")

    def test_open_null_dirs(self):
        cfg = _lib.tutti_config(struct_size=ctypes.sizeof(_lib.tutti_config), abi_major=1, num_dirs=2)
        h = ctypes.c_uint64()
        self.assertStatus(self.lib.tutti_open(ctypes.byref(cfg), ctypes.byref(h)), tutti.InvalidArgument, "dirs is NULL")
        cfg.num_dirs = 0
        self.assertStatus(self.lib.tutti_open(ctypes.byref(cfg), ctypes.byref(h)), tutti.InvalidArgument, "num_dirs = 0")
        arr = (ctypes.c_char_p * 2)(b"/tmp", None)
        cfg.dirs, cfg.num_dirs = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p)), 2
        self.assertStatus(self.lib.tutti_open(ctypes.byref(cfg), ctypes.byref(h)), tutti.InvalidArgument, "dirs[1] is NULL")

    def test_bad_handles(self):
        for h in (0, 1, 12345, (1 << 56) | (1 << 55), (2 << 56) | (1 << 55), 0xFFFFFFFFFFFFFFFF):
            self.assertStatus(self.lib.tutti_close(h), tutti.BadHandle)
            self.assertStatus(self.lib.tutti_wait_saves(h), tutti.BadHandle)
            self.assertStatus(self.lib.tutti_load_wait_layer(h, 0), tutti.BadHandle)
            self.assertStatus(self.lib.tutti_load_release(h), tutti.BadHandle)
            self.assertStatus(self.lib.tutti_save_wait_gathered(h), tutti.BadHandle)
            self.assertStatus(self.lib.tutti_save_release(h), tutti.BadHandle)
            out = ctypes.c_uint32()
            chain = (ctypes.c_uint64 * 1)(7)
            self.assertStatus(self.lib.tutti_lookup(h, chain, 1, ctypes.byref(out)), tutti.BadHandle)

    def test_last_error_truncates(self):
        self.lib.tutti_close(0)
        full = tutti.last_error()
        self.assertIn("tutti_close", full)
        n = self.lib.tutti_last_error(None, 0)
        self.assertEqual(n, len(full.encode()))
        buf = ctypes.create_string_buffer(8)
        self.assertEqual(self.lib.tutti_last_error(buf, 8), n)
        self.assertEqual(buf.value, full.encode()[:7])

    def test_last_error_is_per_thread(self):
        self.lib.tutti_close(0)
        mine = tutti.last_error()
        seen = []

        def other():
            h = ctypes.c_uint64()
            self.lib.tutti_open(None, ctypes.byref(h))
            seen.append(tutti.last_error())

        t = threading.Thread(target=other)
        t.start()
        t.join()
        self.assertIn("cfg is NULL", seen[0])
        self.assertEqual(tutti.last_error(), mine)

    def test_raises_typed_exception(self):
        with self.assertRaises(tutti.BadHandle) as cm:
            _lib.call("tutti_close", 0)
        self.assertEqual(cm.exception.op, "tutti_close")
        self.assertIsInstance(cm.exception, tutti.TuttiError)


class ChainTest(unittest.TestCase):
    def test_prefix_property(self):
        toks = list(range(1000, 1100))
        full = tutti.chain_from_tokens(toks, 16)
        self.assertEqual(len(full), 100 // 16)
        self.assertEqual(tutti.chain_from_tokens(toks[:48], 16), full[:3])
        self.assertEqual(tutti.chain_from_tokens(toks[:47], 16), full[:2])  # partial block: no id
        self.assertEqual(len(set(full)), len(full))

    def test_deterministic_and_seeded(self):
        toks = [5] * 64
        a = tutti.chain_from_tokens(toks, 16)
        self.assertEqual(a, tutti.chain_from_tokens(toks, 16))
        self.assertNotEqual(a, tutti.chain_from_tokens(toks, 16, seed=1))
        # Chained: equal blocks at different positions get different ids.
        self.assertEqual(len(set(a)), 4)

    def test_divergence(self):
        a = tutti.chain_from_tokens([1] * 32 + [2] * 16, 16)
        b = tutti.chain_from_tokens([1] * 32 + [3] * 16, 16)
        self.assertEqual(a[:2], b[:2])
        self.assertNotEqual(a[2], b[2])

    def test_buffer_too_small_and_nulls(self):
        lib = _lib.lib()
        toks = (ctypes.c_uint32 * 64)(*range(64))
        out = (ctypes.c_uint64 * 2)()
        n = ctypes.c_uint32()
        self.assertEqual(lib.tutti_chain_from_tokens(toks, 64, 16, 0, out, 2, ctypes.byref(n)), tutti.BufferTooSmall.code)
        self.assertEqual(n.value, 4)
        self.assertEqual(lib.tutti_chain_from_tokens(toks, 64, 0, 0, out, 2, ctypes.byref(n)), tutti.InvalidArgument.code)
        self.assertEqual(lib.tutti_chain_from_tokens(None, 64, 16, 0, out, 8, ctypes.byref(n)), tutti.InvalidArgument.code)
        self.assertEqual(lib.tutti_chain_from_tokens(toks, 64, 16, 0, None, 8, ctypes.byref(n)), tutti.InvalidArgument.code)
        self.assertEqual(lib.tutti_chain_from_tokens(toks, 64, 16, 0, out, 2, None), tutti.InvalidArgument.code)

    def test_rejects_bad_tokens(self):
        with self.assertRaises(ValueError):
            tutti.chain_from_tokens([-1] * 16, 16)


# An independent XXH64 (the published algorithm) to check that the library
# hashes exactly LE64(parent) ‖ LE32(tokens) under the seed, as prefix's doc
# comment specifies. Test-only: the binding itself always asks the library.
_M = (1 << 64) - 1
_P1, _P2, _P3, _P4, _P5 = (11400714785074694791, 14029467366897019727, 1609587929392839161,
                           9650029242287828579, 2870177450012600261)


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc, lane):
    return (_rotl((acc + lane * _P2) & _M, 31) * _P1) & _M


def _xxh64(b, seed):
    n, i = len(b), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M, (seed + _P2) & _M, seed, (seed - _P1) & _M]
        while n - i >= 32:
            for j in range(4):
                v[j] = _round(v[j], int.from_bytes(b[i + 8 * j: i + 8 * j + 8], "little"))
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
        for x in v:
            h = ((h ^ _round(0, x)) * _P1 + _P4) & _M
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    while n - i >= 8:
        h ^= _round(0, int.from_bytes(b[i:i + 8], "little"))
        h = (_rotl(h, 27) * _P1 + _P4) & _M
        i += 8
    if n - i >= 4:
        h ^= (int.from_bytes(b[i:i + 4], "little") * _P1) & _M
        h = (_rotl(h, 23) * _P2 + _P3) & _M
        i += 4
    while i < n:
        h ^= (b[i] * _P5) & _M
        h = (_rotl(h, 11) * _P1) & _M
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M
    h ^= h >> 29
    h = (h * _P3) & _M
    h ^= h >> 32
    return h


class ChainSpecTest(unittest.TestCase):
    def test_xxh64_reference_vectors(self):
        self.assertEqual(_xxh64(b"", 0), 0xEF46DB3751D8E999)
        self.assertEqual(_xxh64(b"a", 0), 0xD24EC4F1A98C6E5B)

    def test_matches_spec(self):
        for block, seed, count in ((16, 0, 80), (3, 7, 10), (1, 0xFFFFFFFFFFFFFFFF, 5), (512, 42, 1030)):
            toks = [(i * 2654435761) & 0xFFFFFFFF for i in range(count)]
            want, parent = [], 0
            for k in range(count // block):
                data = parent.to_bytes(8, "little") + b"".join(t.to_bytes(4, "little") for t in toks[k * block:(k + 1) * block])
                parent = _xxh64(data, seed)
                want.append(parent)
            self.assertEqual(tutti.chain_from_tokens(toks, block, seed), want, f"block={block} seed={seed}")


if __name__ == "__main__":
    unittest.main()
