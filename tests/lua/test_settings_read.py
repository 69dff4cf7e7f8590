"""A script reads the pool settings it names in one ``HMGET`` (``lib/config.lua``, the list made
by ``deviceq.core.scripts.settings_read`` when the script is assembled), each once a call."""

from __future__ import annotations

import re

import redis

from deviceq.core.config import PoolConfig
from deviceq.core.scripts import SETTINGS_READ, assemble, names, settings_read, source

PROBE = """--- @include "lib/base"
--- @include "lib/config"
-- ARGV[1]: a setting read by a name the text does not spell out
local other = ARGV[1]
return {tostring(cfg('lease_ttl')), tostring(cfg_ms('claim_ttl')), cfg_text('retry_on'),
  tostring(cfg(other)), tostring(cfg('lease_ttl'))}
"""


def test_settings_read_lists_literal_known_names_once_sorted() -> None:
    text = "cfg('lease_ttl') cfg_ms( 'claim_ttl' ) cfg_text('retry_on') cfg('lease_ttl') cfg(x) cfg('nope')"
    assert settings_read(text, PoolConfig.model_fields) == ["claim_ttl", "lease_ttl", "retry_on"]


def test_every_script_lists_each_setting_it_names() -> None:
    call = re.compile(r"\bcfg(?:_ms|_text)?\(\s*'([a-z0-9_]+)'\s*\)")
    for name in names():
        text = source(name)
        assert SETTINGS_READ not in text, name
        named = sorted(set(call.findall(text)))
        if not named:
            continue
        assert set(named) <= set(PoolConfig.model_fields), (name, named)
        listed = ", ".join(f"'{s}'" for s in named)
        assert f"local names = {{{listed}}}" in text, name


def commands(r: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in r.info("commandstats").items()}


def test_one_hmget_for_the_named_settings_and_an_hget_for_any_other(private_redis) -> None:  # type: ignore[no-untyped-def]
    r = redis.Redis.from_url(private_redis.url, decode_responses=True)
    prefix = "dq:{settings}:"
    r.hset(prefix + "config", mapping={"lease_ttl": "42", "claim_ttl": "7", "retry_on": "timeout",
                                       "host_timeout": "99"})  # fmt: skip
    sha = r.script_load(assemble(PROBE))
    before = commands(r)
    got = r.evalsha(sha, 1, prefix, "host_timeout")
    after = commands(r)
    assert got == ["42", "7000", "timeout", "99", "42"]
    ran = {c: after.get(c, 0) - before.get(c, 0) for c in ("hmget", "hget")}
    assert ran == {"hmget": 1, "hget": 1}
    r.hdel(prefix + "config", "lease_ttl")  # not set: the default, read afresh by the next call
    got = r.evalsha(sha, 1, prefix, "host_timeout")
    assert got[0] == str(PoolConfig.model_fields["lease_ttl"].default).removesuffix(".0")
    r.close()
