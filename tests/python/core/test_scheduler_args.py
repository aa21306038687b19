"""Arguments of the Scheduler / SchedulerConfig bindings: request ids are whole strings (an
embedded NUL used to truncate them), and bad ints, ids and salts raise errors naming the
argument instead of nanobind's signature dump or a bare std::bad_cast."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from pagedkv import Scheduler, SchedulerConfig


def small() -> Scheduler:
    return Scheduler(
        SchedulerConfig(num_blocks=16, block_size=4, max_num_seqs=4, max_num_batched_tokens=64)
    )


def test_request_ids_with_nul_are_kept_whole() -> None:
    s = small()
    s.add_request("x\x00y", [1, 2], 3)
    s.add_request("x\x00z", [1, 2], 3)  # was "request_id: 'x' is already in use"
    assert "x\x00y" in s and "x\x00z" in s and "x" not in s
    plan = s.schedule()
    assert plan.request_ids == ["x\x00y", "x\x00z"]
    s.update(plan, [5, 5])
    assert s.abort_request("x\x00y")  # was False: the request could never be aborted
    assert s.fork("x\x00z", "x\x00child", 6) is None
    assert "x\x00child" in s
    assert s.abort_request("x\x00z") and s.abort_request("x\x00child")
    assert not s.has_unfinished_requests()
    assert s.num_free_blocks == 16


def test_str_salts_differing_after_a_nul_do_not_share_the_prefix_cache() -> None:
    s = small()
    prompt = list(range(9))  # two full blocks of 4
    s.add_request("a", prompt, 1, cache_salt="tenant\x00a")
    plan = s.schedule()
    s.update(plan, [1])
    s.add_request("b", prompt, 1, cache_salt="tenant\x00b")
    s.schedule()
    assert s.prefix_cache_hit_tokens == 0  # was 8: "tenant\0b" hashed like "tenant\0a"


@pytest.mark.parametrize("salt", [0, -1, 2**63 - 1, 2**64 - 1, "abc", None, np.int64(7)])
def test_valid_salts(salt: Any) -> None:
    small().add_request("a", [1, 2, 3], 2, cache_salt=salt)


CONFIG = dict(num_blocks=16, block_size=4)

BAD: dict[str, tuple[Callable[[], Any], type, str]] = {
    "salt_float": (
        lambda: small().add_request("a", [1], 2, cache_salt=1.5),
        TypeError,
        "cache_salt must be None, an int or a str, got float",
    ),
    "salt_list": (
        lambda: small().add_request("a", [1], 2, cache_salt=[1]),
        TypeError,
        "cache_salt",
    ),
    "salt_too_big": (
        lambda: small().add_request("a", [1], 2, cache_salt=2**64),
        ValueError,
        "cache_salt must fit in 64 bits",
    ),
    "max_tokens_int32": (
        lambda: small().add_request("a", [1], 2**31),
        ValueError,
        "max_tokens = 2147483648 is out of range",
    ),
    "max_tokens_float": (
        lambda: small().add_request("a", [1], 2.5),
        TypeError,
        "max_tokens must be an integer, got float",
    ),
    "priority_int32": (
        lambda: small().add_request("a", [1], 2, priority=-(2**31) - 1),
        ValueError,
        "priority",
    ),
    "min_tokens_huge": (
        lambda: small().add_request("a", [1], 2, min_tokens=2**40),
        ValueError,
        "min_tokens",
    ),
    "request_id_bytes": (
        lambda: small().add_request(b"a", [1], 2),
        TypeError,
        "request_id must be a str, got bytes",
    ),
    "abort_int": (lambda: small().abort_request(5), TypeError, "request_id must be a str"),
    "fork_child_int": (lambda: small().fork("a", 3, 1), TypeError, "child_id must be a str"),
    "fork_token_huge": (lambda: small().fork("a", "b", 2**31), ValueError, "first_token"),
    "config_blocks_int32": (
        lambda: SchedulerConfig(num_blocks=2**31, block_size=4),
        ValueError,
        "num_blocks = 2147483648 is out of range",
    ),
    "config_blocks_float": (
        lambda: SchedulerConfig(num_blocks=10.0, block_size=4),
        TypeError,
        "num_blocks must be an integer",
    ),
    "config_max_model_len": (
        lambda: SchedulerConfig(max_model_len="8", **CONFIG),
        TypeError,
        "max_model_len must be an integer, got str",
    ),
    "config_seqs": (
        lambda: SchedulerConfig(max_num_seqs=2**32, **CONFIG),
        ValueError,
        "max_num_seqs",
    ),
    "max_tokens_none": (
        lambda: small().add_request("a", [1], None),
        TypeError,
        "max_tokens must be an integer, got NoneType",
    ),
    "request_id_none": (
        lambda: small().abort_request(None),
        TypeError,
        "request_id must be a str, got NoneType",
    ),
    "config_block_size_none": (
        lambda: SchedulerConfig(num_blocks=4, block_size=None),
        TypeError,
        "block_size must be an integer, got NoneType",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_arguments_name_themselves(case: str) -> None:
    call, exc, message = BAD[case]
    with pytest.raises(exc, match=message.replace("(", r"\(")):
        call()


def test_integer_like_values_are_accepted() -> None:
    c = SchedulerConfig(num_blocks=np.int32(16), block_size=np.int64(4), max_model_len=32)
    assert (c.num_blocks, c.block_size, c.max_model_len) == (16, 4, 32)
    s = Scheduler(c)
    s.add_request("a", [1, 2], np.int64(3), priority=np.int8(0), min_tokens=True)
    assert s.get_token_ids("a") == [1, 2]
