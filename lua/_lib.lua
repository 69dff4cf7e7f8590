-- _lib.lua: helpers prepended to every deviceq script by deviceq/scripts.py (with the
-- pool-config DEFAULTS table generated from deviceq.config.PoolConfig).
-- KEYS[1] of every script is the pool prefix "dq:{POOL}:"; every other key is derived from it
-- and carries the same {POOL} hash tag, so all of a pool's keys live in one cluster slot.
-- Errors are raised as redis.error_reply("CODE message"); deviceq.errors maps CODE to a type.

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

local _maxlen
local function emit(kind, ...)
  if not _maxlen then _maxlen = I(cfg('event_maxlen')) end
  redis.call('XADD', k('events'), 'MAXLEN', '~', _maxlen, '*', 'type', kind, ...)
end

local function wake(list)
  redis.call('LPUSH', list, '1')
  redis.call('LTRIM', list, '0', '0')
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

-- move a task between status indexes; terminal sets are scored by finish time (expire.lua
-- trims them to the retention window) and a finished task's keys expire after `retention`
local TERMINAL = {done = true, failed = true, cancelled = true}
local _keep
local function index_status(id, old, new, seq)
  if old then redis.call('ZREM', k('status', old), id) end
  if TERMINAL[new] then
    if not _keep then _keep = I(cfg_ms('retention')) end
    local keep = _keep
    redis.call('ZADD', k('status', new), now_str(), id)
    redis.call('PEXPIRE', k('task', id), keep)
    redis.call('PEXPIRE', k('task', id, 'attempts'), keep)
    redis.call('PEXPIRE', k('task', id, 'goal'), keep)
  else
    redis.call('ZADD', k('status', new), seq, id)
  end
end

-- put a task into its constraint bucket (keeps its original submission order)
local function enqueue(id, sig, seq)
  redis.call('ZADD', k('queue', sig), seq, id)
  redis.call('ZADD', k('queues'), 'LT', seq, sig)
end

-- after tasks left bucket `sig`: drop it from the bucket index or fix its head score
local function fix_head(sig)
  local head = redis.call('ZRANGE', k('queue', sig), 0, 0, 'WITHSCORES')
  if #head == 0 then
    redis.call('ZREM', k('queues'), sig)
  else
    redis.call('ZADD', k('queues'), head[2], sig)
  end
end

-- take a task out of its bucket, keeping the bucket index's head score right
local function dequeue(id, sig)
  redis.call('ZREM', k('queue', sig), id)
  fix_head(sig)
end

-- a task hash as a flat field/value array, with a long goal (kept in task:ID:goal so that the
-- hash stays a compact listpack) put back in place
local function task_flat(id)
  local flat = redis.call('HGETALL', k('task', id))
  for i = 1, #flat, 2 do
    if flat[i] == 'goal' and flat[i + 1] == '' then
      flat[i + 1] = redis.call('GET', k('task', id, 'goal')) or ''
    end
  end
  return flat
end

-- release the device reserved by task id; back among idle candidates if it is idle and healthy
-- returns the device's consecutive failure count (nil when it was not reserved by id)
local function release_device(device_id, id)
  if not device_id or device_id == '' then return end
  local dk = k('device', device_id)
  local d = redis.call('HMGET', dk, 'reserved_by', 'state', 'quarantined', 'consecutive_failures')
  if d[1] ~= id then return end
  redis.call('HSET', dk, 'reserved_by', '', 'lease_id', '', 'released_at', now_str())
  if d[2] == 'idle' and d[3] ~= '1' then
    redis.call('ZADD', k('idle'), now_str(), device_id)
  end
  return tonumber(d[4] or '0')
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
  redis.call('LSET', ak, I(idx), cjson.encode(rec))
end
