"""tutti.keys: a block's key from its tokens and its extras, pinned by known
vectors (keys outlive processes and releases) and recomputed from the
rule's specification; what cannot be keyed is refused."""

import hashlib
import struct
import unittest

import tutti
from tutti import keys

IDENTITY = "test/model|revision=|block_size=16"


class KeyRuleTest(unittest.TestCase):
    def test_known_vectors(self):
        """Keys outlive processes and releases: they never change."""
        seed = keys.seed_of(IDENTITY)
        self.assertEqual(seed, 0xA83B657C196791EA)
        plain = keys.chain_keys(list(range(40)), 16, seed)
        self.assertEqual(plain, [0x969E8451B0F71541, 0x2EF64936A9053C01])
        self.assertEqual(plain, tutti.chain_from_tokens(list(range(40)), 16, seed))  # Go's ChainFromTokens, pinned in Go
        lora = keys.chain_keys(list(range(40)), 16, seed, [None, keys.encode_extras(("lora-a",))])
        self.assertEqual(lora, [0x969E8451B0F71541, 0x71879673DFC873BD])

    def test_rule_from_its_specification(self):
        seed = int.from_bytes(hashlib.blake2b(b"tutti-chain-v1\0" + IDENTITY.encode(), digest_size=8).digest(), "little")
        self.assertEqual(keys.seed_of(IDENTITY), seed)
        e = keys.encode_extras((("img", 3), "salt", b"\x01"))
        self.assertEqual(e, b"l\x03\x00\x00\x00" b"l\x02\x00\x00\x00s\x03\x00\x00\x00img" b"i\x01\x00\x00\x003"
                            b"s\x04\x00\x00\x00salt" b"b\x01\x00\x00\x00\x01")
        mask = struct.unpack("<16I", hashlib.shake_128(b"tutti-extras\0" + e).digest(64))
        toks = list(range(32))
        words = toks[:16] + [t ^ (m | 0x80000000) for t, m in zip(toks[16:], mask)]
        self.assertEqual(keys.chain_keys(toks, 16, seed, [None, e]), tutti.chain_from_tokens(words, 16, seed))

    def test_unkeyable(self):
        for bad in ((object(),), ("x", 1.5), [[[[[[[[[["deep"]]]]]]]]]]):
            with self.assertRaises(keys.Unkeyable):
                keys.encode_extras(bad)
        with self.assertRaises(keys.Unkeyable):
            keys.chain_keys([1 << 31] + [0] * 15, 16, 0)


if __name__ == "__main__":
    unittest.main()
