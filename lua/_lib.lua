-- _lib.lua: helpers prepended to every deviceq script by deviceq/scripts.py (with the
-- pool-config DEFAULTS table generated from deviceq.config.PoolConfig).
-- KEYS[1] of every script is the pool prefix "dq:{POOL}:"; every other key is derived from it
-- and carries the same {POOL} hash tag, so all of a pool's keys live in one cluster slot.
-- Errors are raised as redis.error_reply("CODE message"); deviceq.errors maps CODE to a type.

local P = KEYS[1]

local function k(...)
  return P .. table.concat({...}, ':')
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

local _cfg
local function cfg(name)
  if not _cfg then
    _cfg = {}
    local flat = redis.call('HGETALL', k('config'))
    for i = 1, #flat, 2 do _cfg[flat[i]] = flat[i + 1] end
  end
  local v = _cfg[name]
  if v == nil or v == '' then v = DEFAULTS[name] end
  return tonumber(v)
end

-- a duration setting (seconds in the config hash) in ms
local function cfg_ms(name)
  return math.floor(cfg(name) * 1000)
end

local function valid_id(s)
  return type(s) == 'string' and #s >= 1 and #s <= 128 and s:match('^[A-Za-z0-9][A-Za-z0-9._-]*$') ~= nil
end

local function emit(kind, ...)
  redis.call('XADD', k('events'), 'MAXLEN', '~', cfg('event_maxlen'), '*', 'type', kind, ...)
end

local function wake(list)
  redis.call('LPUSH', list, '1')
  redis.call('LTRIM', list, 0, 0)
end

-- authenticate a host by the sha256 digest of its token; returns the host hash key or nil, err
local function auth_host(host_id, digest)
  if not valid_id(host_id) then return nil, fail('AUTH', 'unknown host or wrong token') end
  local hk = k('host', host_id)
  local stored = redis.call('HGET', hk, 'token_digest')
  if not stored or stored ~= digest then
    return nil, fail('AUTH', 'unknown host or wrong token')
  end
  return hk
end

local function host_alive(hk)
  local hb = tonumber(redis.call('HGET', hk, 'last_heartbeat') or '0')
  return hb > 0 and now_ms() - hb <= cfg_ms('host_timeout')
end

local function set_of(csv)
  local s = {}
  if csv and csv ~= '' then
    for t in string.gmatch(csv, '[^,]+') do s[t] = true end
  end
  return s
end

-- constraints of task hash fields vs device hash fields: true or false, reason
local function satisfies(t_driver, t_tags, d_driver, d_tags)
  if t_driver and t_driver ~= '' and t_driver ~= d_driver then
    return false, 'driver_type_mismatch'
  end
  local have = set_of(d_tags)
  for t in string.gmatch(t_tags or '', '[^,]+') do
    if not have[t] then return false, 'missing_tag:' .. t end
  end
  return true
end

-- move a task between status indexes; terminal sets are scored by finish time and trimmed
local TERMINAL = {done = true, failed = true, cancelled = true}
local function index_status(id, old, new, seq)
  if old then redis.call('ZREM', k('status', old), id) end
  if TERMINAL[new] then
    local now = now_ms()
    local keep = cfg_ms('retention')
    redis.call('ZADD', k('status', new), now, id)
    redis.call('ZREMRANGEBYSCORE', k('status', new), '-inf', now - keep)
    redis.call('PEXPIRE', k('task', id), keep)
    redis.call('PEXPIRE', k('task', id, 'attempts'), keep)
  else
    redis.call('ZADD', k('status', new), seq, id)
  end
end

-- put a task into its constraint bucket (keeps its original submission order)
local function enqueue(id, sig, seq)
  redis.call('ZADD', k('queue', sig), seq, id)
  redis.call('ZADD', k('queues'), 'LT', seq, sig)
end

-- take a task out of its bucket, keeping the bucket index's head score right
local function dequeue(id, sig)
  local qk = k('queue', sig)
  redis.call('ZREM', qk, id)
  local head = redis.call('ZRANGE', qk, 0, 0, 'WITHSCORES')
  if #head == 0 then
    redis.call('ZREM', k('queues'), sig)
  else
    redis.call('ZADD', k('queues'), head[2], sig)
  end
end

-- release the device reserved by task id; back among idle candidates if it is idle and healthy
local function release_device(device_id, id)
  if not device_id or device_id == '' then return end
  local dk = k('device', device_id)
  if redis.call('HGET', dk, 'reserved_by') ~= id then return end
  redis.call('HSET', dk, 'reserved_by', '', 'lease_id', '', 'released_at', now_ms())
  local d = redis.call('HMGET', dk, 'state', 'quarantined')
  if d[1] == 'idle' and d[2] ~= '1' then
    redis.call('ZADD', k('idle'), now_ms(), device_id)
  end
end

-- close the current attempt record (list index attempt-1) with an outcome
local function close_attempt(id, attempt, outcome, extra)
  local ak = k('task', id, 'attempts')
  local idx = tonumber(attempt) - 1
  local raw = redis.call('LINDEX', ak, idx)
  if not raw then return end
  local rec = cjson.decode(raw)
  rec.outcome = outcome
  rec.ended_at = now_ms()
  if extra then for key, v in pairs(extra) do rec[key] = v end end
  redis.call('LSET', ak, idx, cjson.encode(rec))
end
