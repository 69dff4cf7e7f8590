-- lib/base.lua: what every script uses: the pool's keys, error replies, the clock, integers
-- as strings for redis.call, named fields of a hash.
-- KEYS[1] of every script is the pool prefix "dq:{POOL}:"; every other key is derived from it
-- and carries the same {POOL} hash tag, so all of a pool's keys live in one cluster slot.
-- Errors are raised as redis.error_reply("CODE message"); deviceq.core.errors maps CODE to a type.
-- Every script checks all of its arguments before its first write.

local P = KEYS[1]

-- a pool key from 1-3 name parts (plain concatenation: no table per key)
local function k(a, b, c)
  if c then return P .. a .. ':' .. b .. ':' .. c end
  if b then return P .. a .. ':' .. b end
  return P .. a
end

local function fail(code, msg)
  return redis.error_reply(code .. ' ' .. msg)
end

local _now
local function now_ms()
  if not _now then
    local t = redis.call('TIME')
    _now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return _now
end

-- an integer as a string: numbers passed to redis.call are formatted with "%.17g" by Redis
-- 7.0 (a slow float printf per argument); hot paths pass strings instead
local function I(n)
  return string.format('%d', n)
end

local _now_s
local function now_str()
  if not _now_s then _now_s = I(now_ms()) end
  return _now_s
end

-- named fields of a hash: {name = value} (nil for missing ones)
local function hfields(key, names)
  local vals = redis.call('HMGET', key, unpack(names))
  local t = {}
  for i, n in ipairs(names) do t[n] = vals[i] end
  return t
end
