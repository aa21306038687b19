"""Every input of the prefix-cache block hash changes it: each token (the last one of an odd
count too), both 64-bit halves of the parent hash, the extra key and the token count.

Mutation testing: dropping the last token of an odd-length block, or the parent's low half,
passed test_block_allocator.py (its hash test uses one parent and changes inner tokens only).
A hash that ignores an input is not wrong (lookups compare tokens), but every block differing
only there then collides, and a collision is a lost prefix-cache hit.
"""

from __future__ import annotations

import random

from pagedkv._C import hash_block


def test_every_input_changes_the_hash() -> None:
    rng = random.Random(17)
    for n in (1, 2, 3, 5, 8, 16):
        toks = [rng.randrange(1 << 31) for _ in range(n)]
        parent = (rng.randrange(1 << 64), rng.randrange(1 << 64))
        h = hash_block(parent, toks, extra_key=7)
        for i in range(n):
            other = list(toks)
            other[i] ^= 1 << rng.randrange(31)
            assert hash_block(parent, other, extra_key=7) != h, (n, i)
        assert hash_block((parent[0] ^ 1, parent[1]), toks, extra_key=7) != h, n
        assert hash_block((parent[0], parent[1] ^ 1), toks, extra_key=7) != h, n
        assert hash_block(parent, toks, extra_key=8) != h, n
        assert hash_block(parent, toks + [0], extra_key=7) != h, n
        assert hash_block(parent, toks, extra_key=7) == h
