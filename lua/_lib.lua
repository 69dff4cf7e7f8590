-- _lib.lua: helpers prepended to every deviceq script by deviceq/core/scripts.py (after the
-- DEFAULTS and BOUNDS tables generated from deviceq.core.config.PoolConfig).
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

-- a pool setting: the stored value, or the default when missing or not a number, clamped to
-- its bounds (a raw HSET of garbage can never break a script half-way)
local _cfg
local function load_cfg()
  if not _cfg then
    _cfg = {}
    local flat = redis.call('HGETALL', k('config'))
    for i = 1, #flat, 2 do _cfg[flat[i]] = flat[i + 1] end
  end
  return _cfg
end
local function cfg(name)
  local v = tonumber(load_cfg()[name])
  if v == nil or v ~= v then v = DEFAULTS[name] end
  local b = BOUNDS[name]
  if b then
    if v < b[1] then v = b[1] elseif v > b[2] then v = b[2] end
  end
  return v
end

-- a duration setting (seconds in the config hash) in ms
local function cfg_ms(name)
  return math.floor(cfg(name) * 1000)
end

-- a text setting as stored ('' when unset; callers validate it and fall back to SDEFAULTS)
local function cfg_text(name)
  return load_cfg()[name] or ''
end

-- the last n bytes of s at most, never starting inside a UTF-8 sequence
local function tail(s, n)
  local i = #s - n + 1
  if i <= 1 then return s end
  while i <= #s do
    local b = s:byte(i)
    if b < 128 or b > 191 then break end
    i = i + 1
  end
  return s:sub(i)
end

-- retry policy (deviceq.core.config check_retry_on / check_retry_backoff are the same checks).
-- retry_on: 'none' or a csv of failure kinds -> a set, or nil when malformed
local RETRY_KINDS = {infrastructure = true, runner_error = true, timeout = true,
  runner_failed = true, lease_expired = true}
local function retry_kinds(csv)
  if csv == 'none' then return {} end
  if csv == '' or csv:find(',,', 1, true) or csv:sub(1, 1) == ',' or csv:sub(-1) == ',' then
    return nil
  end
  local set = {}
  for w in string.gmatch(csv, '[^,]+') do
    if not RETRY_KINDS[w] then return nil end
    set[w] = true
  end
  return set
end

-- retry_backoff: 'none' | 'fixed:S' | 'exponential:BASE:MAX' (seconds, at most 999999.999,
-- at most 3 decimals) -> base_ms, doubling(bool), max_ms; nil when malformed
local function secs_ms(s)
  if not s or not (s:match('^0$') or s:match('^[1-9]%d?%d?%d?%d?%d?$') or
    s:match('^0%.%d%d?%d?$') or s:match('^[1-9]%d?%d?%d?%d?%d?%.%d%d?%d?$')) then return nil end
  return math.floor(tonumber(s) * 1000 + 0.5)
end
local function parse_backoff(spec)
  if spec == 'none' then return 0, false, 0 end
  local f = spec:match('^fixed:([^:]+)$')
  if f then
    local v = secs_ms(f)
    if v then return v, false, v end
    return nil
  end
  local b, m = spec:match('^exponential:([^:]+):([^:]+)$')
  local bv, mv = secs_ms(b), secs_ms(m)
  if bv and mv then return bv, true, mv end
  return nil
end

-- the delay (ms) before retrying task t (fields of load_task) after it failed with `kind`, or
-- nil when it is not retried: no attempts left, or `kind` not in its retry_on (the task's own,
-- else the pool's). Returns also the number of attempts used.
local function retry_delay(t, kind)
  local used = (tonumber(t.attempt) or 0) - (tonumber(t.handbacks) or 0)
  if used >= (tonumber(t.max_attempts) or 1) then return nil, used end
  local on = retry_kinds(t.retry_on or '') or retry_kinds(cfg_text('retry_on'))
    or retry_kinds(SDEFAULTS.retry_on)
  if not on[kind] then return nil, used end
  local base, doubling, max = parse_backoff(t.retry_backoff or '')
  if not base then base, doubling, max = parse_backoff(cfg_text('retry_backoff')) end
  if not base then base, doubling, max = parse_backoff(SDEFAULTS.retry_backoff) end
  local d = base
  if doubling then
    d = math.min(max, base * 2 ^ math.min(math.max(used - 1, 0), 40))
    -- jitter: between half and all of it (the clock's microseconds: scripts get no RNG seed)
    local us = tonumber(redis.call('TIME')[2]) or 0
    d = d / 2 + (d / 2) * ((us % 1000) / 1000)
  end
  return math.floor(d), used
end

-- ids (task, device, host, lease, session, driver type, workflow): 1-128 of A-Z a-z 0-9 . _ -
-- starting with a letter or digit (Lua's $ anchors at the true end: no trailing newline)
local function valid_id(s)
  return type(s) == 'string' and #s >= 1 and #s <= 128 and s:match('^[A-Za-z0-9][A-Za-z0-9._-]*$') ~= nil
end

-- text that is valid UTF-8 (what every client decodes it as; no overlong forms, surrogates or
-- code points past U+10FFFF). Each well-formed sequence is replaced by an ASCII byte with
-- gsub (C speed, not a Lua loop per byte: a submit chunk may carry 1,000 goals of 16 KB); the
-- placeholder keeps neighbours apart, so no new sequence can form. Valid when no byte >= 128
-- is left.
local UTF8_SEQUENCES = {
  '[\194-\223][\128-\191]',
  '\224[\160-\191][\128-\191]', '[\225-\236\238\239][\128-\191][\128-\191]',
  '\237[\128-\159][\128-\191]',
  '\240[\144-\191][\128-\191][\128-\191]', '[\241-\243][\128-\191][\128-\191][\128-\191]',
  '\244[\128-\143][\128-\191][\128-\191]',
}
local function valid_utf8(s)
  if not s:find('[\128-\255]') then return true end
  for _, seq in ipairs(UTF8_SEQUENCES) do s = s:gsub(seq, '_') end
  return not s:find('[\128-\255]')
end

local function valid_tag(s)
  return #s >= 1 and #s <= 64 and s:match('^[A-Za-z0-9][A-Za-z0-9._=/+-]*$') ~= nil
end

-- a tag list as stored: '' or comma-separated valid tags, sorted, distinct, at most 32
local function valid_tags(csv)
  if type(csv) ~= 'string' then return false end
  if csv == '' then return true end
  local prev, n = nil, 0
  for t in string.gmatch(csv .. ',', '([^,]*),') do
    if not valid_tag(t) or (prev and t <= prev) then return false end
    prev, n = t, n + 1
  end
  return n <= 32
end

-- a whole number given as text, within [lo, hi]
local function int_in(s, lo, hi)
  if type(s) ~= 'string' or not s:match('^%-?%d+$') then return nil end
  local n = tonumber(s)
  if not n or n < lo or n > hi then return nil end
  return n
end

-- a decimal number given as text, within [lo, hi]
local function num_in(s, lo, hi)
  if type(s) ~= 'string' or not s:match('^%-?%d+%.?%d*$') and not s:match('^%-?%d*%.%d+$') then
    return nil
  end
  local n = tonumber(s)
  if not n or n ~= n or n < lo or n > hi then return nil end
  return n
end

local _maxlen
local function emit(kind, ...)
  if not _maxlen then _maxlen = I(cfg('event_maxlen')) end
  redis.call('XADD', k('events'), 'MAXLEN', '~', _maxlen, '*', 'type', kind, ...)
end

-- the event field naming the multi-device task of a part (none for any other task); pass it
-- last to emit: emit(kind, ..., gang_field(t))
local function gang_field(t)
  if t.gang and t.gang ~= '' then return 'gang', t.gang end
end

local function wake(list)
  redis.call('LPUSH', list, '1')
  redis.call('LTRIM', list, '0', '0')
end

-- tell a host's daemon to act now (cancel requested, quarantine changed, session fenced, host
-- removed): it blocks on this list between lease renewals; at most 16 pending messages
local function ctl(host_id, msg)
  if not host_id or host_id == '' then return end
  local key = k('host', host_id, 'ctl')
  redis.call('LPUSH', key, msg)
  redis.call('LTRIM', key, '0', '15')
  redis.call('PEXPIRE', key, '600000')
end

-- authenticate a host call: the host sends its token, Redis keeps only sha1(token), so reading
-- Redis never yields a usable credential. `session` must be the host's current session (''
-- only while no daemon session is active). Returns the host hash key, or nil and an error.
local function auth_host(host_id, token, session)
  if not valid_id(host_id) then return nil, fail('AUTH', 'malformed host id') end
  if type(token) ~= 'string' or #token < 16 or #token > 256 then
    return nil, fail('AUTH', 'wrong token for host ' .. host_id)
  end
  local hk = k('host', host_id)
  local h = redis.call('HMGET', hk, 'token_digest', 'session')
  if not h[1] then
    return nil, fail('AUTH', 'host ' .. host_id .. ' is not registered in this pool (removed?)')
  end
  if h[1] ~= 'sha1:' .. redis.sha1hex(token) then
    return nil, fail('AUTH', 'wrong token for host ' .. host_id .. ' (rotated?)')
  end
  if session == nil then return hk end
  if (h[2] or '') ~= session then
    if session == '' then
      return nil, fail('SUPERSEDED', 'host ' .. host_id .. ' has a daemon session; this call carries none')
    end
    return nil, fail('SUPERSEDED', 'session ' .. session .. ' of host ' .. host_id ..
      ' was superseded by a newer daemon (takeover, restart or token rotation)')
  end
  return hk
end

local function host_alive(hk)
  local hb = tonumber(redis.call('HGET', hk, 'last_heartbeat') or '0') or 0
  return hb > 0 and now_ms() - hb <= cfg_ms('host_timeout')
end

-- can the host take new work? true, or the reason it cannot: host_dead (no heartbeat within
-- host_timeout), host_suspect (one of its leases expired since its last heartbeat),
-- host_draining (operator drain or daemon shutting down)
local function host_placeable(hk)
  local h = redis.call('HMGET', hk, 'last_heartbeat', 'draining', 'stopping', 'suspect')
  local hb = tonumber(h[1] or '0') or 0
  if hb <= 0 or now_ms() - hb > cfg_ms('host_timeout') then return 'host_dead' end
  if h[2] == '1' or h[3] == '1' then return 'host_draining' end
  if h[4] and h[4] ~= '' then return 'host_suspect' end
  return true
end

local function set_of(csv)
  local s = {}
  if csv and csv ~= '' then
    for t in string.gmatch(csv, '[^,]+') do s[t] = true end
  end
  return s
end

-- THE constraint rule (deviceq.models.Constraints.matches mirrors it): a device satisfies a
-- task when the task names no driver type or the same one, and the device has every tag the
-- task requires. Returns true, or false and the reason.
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

-- the bucket id of a constraint signature and tenant (deviceq.models.Constraints.signature
-- mirrors it): a tenant's tasks have buckets of their own, so fair share sees every tenant
local function signature(driver, tags, prio, tenant)
  local raw = driver .. '|' .. tags .. '|' .. prio
  if tenant and tenant ~= '' then raw = raw .. '|' .. tenant end
  return string.sub(redis.sha1hex(raw), 1, 16)
end

-- move a task between status indexes; terminal sets are scored by finish time (expire.lua
-- trims them to the retention window) and a finished task's keys expire after `retention`
local TERMINAL = {done = true, failed = true, cancelled = true}
local _keep
local function index_status(id, old, new, seq)
  local part = seq == ''  -- a gang's part (gang_assign.lua): only its gang's task is indexed
  if old and not part then redis.call('ZREM', k('status', old), id) end
  if TERMINAL[new] then
    if not _keep then _keep = I(cfg_ms('retention')) end
    local keep = _keep
    if not part then redis.call('ZADD', k('status', new), now_str(), id) end
    redis.call('PEXPIRE', k('task', id), keep)
    -- the attempt history and a long goal (only these keys exist besides the hash)
    local h = redis.call('HMGET', k('task', id), 'attempt', 'goal', 'avoid_devices', 'queue_deadline',
      'eligible_at')
    if h[1] and h[1] ~= '0' then redis.call('PEXPIRE', k('task', id, 'attempts'), keep) end
    if h[2] == '' and not part then redis.call('PEXPIRE', k('task', id, 'goal'), keep) end
    if old == 'queued' and h[3] and h[3] ~= '' then redis.call('HDEL', k('avoid'), id) end
    if h[4] and h[4] ~= '' then redis.call('ZREM', k('deadlines'), id) end
    if old == 'queued' and h[5] and h[5] ~= '' then  -- ended while waiting for its retry
      redis.call('ZREM', k('retries'), id)
      redis.call('HDEL', k('task', id), 'eligible_at')
    end
  elseif not part then
    redis.call('ZADD', k('status', new), seq, id)
  end
end

-- put a task into its constraint bucket (keeps its original submission order); the bucket's
-- constraints (sig:SIG) exist exactly while the bucket is non-empty
local function enqueue(id, sig, seq, driver, tags, prio, tenant)
  if redis.call('ZADD', k('queue', sig), seq, id) == 1 and redis.call('ZCARD', k('queue', sig)) == 1 then
    redis.call('HSET', k('sig', sig), 'driver_type', driver or '', 'tags', tags or '', 'priority', prio or '0',
      'tenant', tenant or '')
  end
  redis.call('ZADD', k('queues'), 'LT', seq, sig)
end

-- after tasks left bucket `sig`: drop it (and its constraints) or fix its head score
local function fix_head(sig)
  local head = redis.call('ZRANGE', k('queue', sig), 0, 0, 'WITHSCORES')
  if #head == 0 then
    redis.call('ZREM', k('queues'), sig)
    redis.call('DEL', k('sig', sig))
  else
    redis.call('ZADD', k('queues'), head[2], sig)
  end
end

-- take a task out of its bucket, keeping the bucket index's head score right
local function dequeue(id, sig)
  redis.call('ZREM', k('queue', sig), id)
  fix_head(sig)
end

-- a multi-device (gang) task's roles, as submitted: NAME=DRIVER:TAGS entries joined by ';'
-- (first = the leader; DRIVER '' = any; TAGS a sorted csv) -> {{name, driver, tags}, ...}, or
-- nil and why. Each role runs on a device of its own, as part task ID.NAME (gang_assign.lua).
local function parse_roles(spec)
  local out, seen = {}, {}
  for entry in string.gmatch(spec, '[^;]+') do
    local name, driver, tags = entry:match('^([^=]*)=([^:]*):?(.*)$')
    if not name or not valid_id(name) or #name > 32 then return nil, 'malformed role name' end
    if seen[name] then return nil, 'role ' .. name .. ' given twice' end
    if driver ~= '' and not valid_id(driver) then return nil, 'malformed driver_type of role ' .. name end
    if not valid_tags(tags) then return nil, 'malformed tags of role ' .. name end
    seen[name] = true
    out[#out + 1] = {name = name, driver = driver, tags = tags}
  end
  if #out < 1 or #out > 8 or #out ~= select(2, spec:gsub(';', '')) + 1 then
    return nil, 'a task has 1-8 roles'
  end
  return out
end

-- where a queued task waits: a gang task (roles) in `gangs` by seq, any other in its bucket
local function to_queue(id, t)
  if (t.roles or '') ~= '' then
    redis.call('ZADD', k('gangs'), t.seq, id)
  else
    enqueue(id, t.sig, t.seq, t.driver_type, t.tags, t.priority, t.tenant)
  end
end
local function from_queue(id, t)
  if (t.roles or '') ~= '' then redis.call('ZREM', k('gangs'), id) else dequeue(id, t.sig) end
end

-- the scheduler's fence: nil when `fence` ('' = none, a manual dispatch) is the current
-- leader's epoch, else the error reply
local function check_fence(fence)
  if fence ~= '' and not fence:match('^%d+$') then return fail('INVALID', 'fence must be an epoch') end
  if fence ~= '' then
    local cur = redis.call('GET', k('leader'))
    if not cur or cur:match(':(%d+)$') ~= fence then
      return fail('FENCED', 'scheduler epoch ' .. fence .. ' is not the current leader')
    end
  end
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

-- named fields of a hash: {name = value} (nil for missing ones)
local function hfields(key, names)
  local vals = redis.call('HMGET', key, unpack(names))
  local t = {}
  for i, n in ipairs(names) do t[n] = vals[i] end
  return t
end

-- the task fields the lifecycle helpers below need
local TASK_FIELDS = {'status', 'lease_id', 'lease_expires_at', 'host_id', 'device_id', 'attempt',
  'max_attempts', 'handbacks', 'seq', 'sig', 'driver_type', 'tags', 'priority', 'queue_deadline',
  'cancel_requested', 'dispatched_at', 'session', 'avoid_devices', 'avoid_hosts', 'failure_kind',
  'result', 'error', 'assigned_at', 'submitted_at', 'retry_on', 'retry_backoff', 'eligible_at',
  'tenant', 'gang', 'roles'}

local function load_task(id)
  return hfields(k('task', id), TASK_FIELDS)
end

-- a task's whole hash in one read: its fields as a table and the flat array (HGETALL)
local function load_task_flat(id)
  local flat = redis.call('HGETALL', k('task', id))
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t, flat
end

-- set fields of a flat field/value array (in place, appending missing ones)
local function flat_set(flat, values)
  local pos = {}
  for i = 1, #flat, 2 do pos[flat[i]] = i end
  for name, v in pairs(values) do
    local i = pos[name]
    if i then flat[i + 1] = v else flat[#flat + 1] = name; flat[#flat + 1] = v end
  end
end

-- THE eligibility rule (deviceq.core.eligibility.device_blocker mirrors it; a test compares
-- the two over every combination of these fields): why a device with hash fields `d`
-- (GATE_FIELDS, read by gate()) is not an idle candidate, or nil when it is one. In precedence
-- order: quarantined, reserved (a lease holds it), booked (reserved for a person), suspect (a
-- lease on it expired) / held (its host handed an assignment back) until its host's next
-- heartbeat, checking / unhealthy (its host's health check), then its state busy | offline.
-- Host-level reasons (dead, draining, suspect) are host_placeable's.
local GATE_FIELDS = {'state', 'reserved_by', 'quarantined', 'held', 'booked_until', 'health'}
local function gate(did)
  return hfields(k('device', did), GATE_FIELDS)
end
local function device_blocker(d)
  if d.quarantined == '1' then return 'quarantined' end
  if (d.reserved_by or '') ~= '' then return 'reserved' end
  if (d.booked_until or '') ~= '' then return 'booked' end
  if (d.held or '') ~= '' then return d.held == 'suspect' and 'suspect' or 'held' end
  if d.health == 'checking' or d.health == 'unhealthy' then return d.health end
  if d.state ~= 'idle' then return d.state or 'offline' end
  return nil
end

-- (re)decide whether device `did` (gate fields `d`, as they are after this call's writes) is
-- among the idle candidates, by the rule: added (score: now, kept when already there unless
-- `rescore`) or removed. Returns true when it is a candidate, and whether it was newly added.
local function refresh_idle(did, d, rescore)
  if device_blocker(d) then
    redis.call('ZREM', k('idle'), did)
    return false, false
  end
  if rescore then
    return true, redis.call('ZADD', k('idle'), now_str(), did) == 1
  end
  return true, redis.call('ZADD', k('idle'), 'NX', now_str(), did) == 1
end

-- release the device reserved by task id. hold = nil: back among the idle candidates when
-- the rule allows (refresh_idle); hold = 'suspect' (its lease expired) or 'refused' (its host
-- handed the assignment back): out of the candidates until its host's next heartbeat.
-- Returns the device's consecutive infrastructure failure count (nil when not reserved by id).
local function release_device(device_id, id, hold)
  if not device_id or device_id == '' then return end
  local dk = k('device', device_id)
  local d = gate(device_id)
  if d.reserved_by ~= id then return end
  d.reserved_by = ''
  if hold then
    redis.call('HSET', dk, 'reserved_by', '', 'lease_id', '', 'released_at', now_str(), 'held', hold,
      'held_at', now_str())
    d.held = hold
  else
    redis.call('HSET', dk, 'reserved_by', '', 'lease_id', '', 'released_at', now_str())
  end
  refresh_idle(device_id, d)
  return tonumber(redis.call('HGET', dk, 'consecutive_failures') or '0') or 0
end

-- the assign errors (err:REASON) for the rule's reasons
local ASSIGN_ERR = {quarantined = 'device_quarantined', reserved = 'device_reserved',
  booked = 'device_booked', suspect = 'device_held', held = 'device_held',
  checking = 'device_checking', unhealthy = 'device_unhealthy'}

-- can device `did` take an assignment now? Returns its row (host_id state reserved_by
-- quarantined driver_type tags held booked_until health), or nil and the reason (assign.lua's
-- err: reasons: the rule's reasons as ASSIGN_ERR, device_not_idle, device_not_found, or the
-- host's). `hosts_ok` caches host_placeable per host for the call.
local function device_assignable(did, hosts_ok)
  local d = redis.call('HMGET', k('device', did), 'host_id', 'state', 'reserved_by', 'quarantined',
    'driver_type', 'tags', 'held', 'booked_until', 'health')
  if not d[1] then return nil, 'device_not_found' end
  local why = device_blocker({state = d[2], reserved_by = d[3], quarantined = d[4], held = d[7],
    booked_until = d[8], health = d[9]})
  if why then return nil, ASSIGN_ERR[why] or 'device_not_idle' end
  if hosts_ok[d[1]] == nil then hosts_ok[d[1]] = host_placeable(k('host', d[1])) end
  if hosts_ok[d[1]] ~= true then return nil, hosts_ok[d[1]] end
  return d
end

-- end a person's reservation (booking) of device `did`: the device hash fields booked_by
-- (note), booked_until (ms) and booked_at (ms) go, so does its `bookings` entry (zset by end),
-- and the device is back among the idle candidates when the rule allows. `kind` is the event:
-- device_released | reservation_expired.
-- Returns the device's host id, or nil when the device is not booked (or gone).
local function end_booking(did, kind)
  local dk = k('device', did)
  redis.call('ZREM', k('bookings'), did)
  local d = redis.call('HMGET', dk, 'host_id', 'booked_until', 'booked_by')
  if not d[1] or not d[2] or d[2] == '' then return nil end
  redis.call('HDEL', dk, 'booked_by', 'booked_until', 'booked_at')
  local g = gate(did)
  local _, added = refresh_idle(did, g)
  if added then wake(k('sched', 'wake')) end
  emit(kind, 'device', did, 'host', d[1], 'by', d[3] or '', 'until', d[2])
  return d[1]
end

-- forget device `did` (its hash, history, indexes and profile counts): host_remove.lua and
-- device_remove.lua, once no lease holds it. Returns its host id, or nil when it is unknown.
local function delete_device(did)
  local dk = k('device', did)
  local d = redis.call('HMGET', dk, 'host_id', 'driver_type', 'tags', 'quarantined')
  if not d[1] then return nil end
  local function count(hash, key, by)
    if redis.call('HINCRBY', k(hash), key, by) <= 0 then redis.call('HDEL', k(hash), key) end
  end
  if d[2] then
    count('caps', d[2] .. '|' .. (d[3] or ''), -1)
    count('drivers', d[2], -1)
    if d[4] == '1' then count('qdrivers', d[2], -1) end
  end
  redis.call('DEL', dk, k('device', did, 'history'), k('device', did, 'log'))
  redis.call('SREM', k('devices'), did)
  redis.call('SREM', k('host', d[1], 'devices'), did)
  redis.call('ZREM', k('idle'), did)
  redis.call('ZREM', k('bookings'), did)
  redis.call('HDEL', k('faults'), did)
  return d[1]
end

-- a device's recent attempts, newest first: device:ID:history holds the last DEVICE_RECENT
-- attempt ends on it as JSON {task, attempt, outcome, failure_kind, at (ms)} (LPUSH + LTRIM:
-- O(1) per call). `rec` is the closed attempt record of task `id`.
local DEVICE_RECENT = 20
local function device_history(did, id, rec)
  if not did or did == '' then return end
  local key = k('device', did, 'history')
  redis.call('LPUSH', key, cjson.encode({task = id, attempt = rec.attempt, outcome = rec.outcome,
    failure_kind = rec.failure_kind or cjson.null, at = rec.ended_at}))
  redis.call('LTRIM', key, '0', I(DEVICE_RECENT - 1))
end

-- a device's change log, newest first: device:ID:log holds its last DEVICE_RECENT quarantine,
-- health check and booking changes as JSON {event, at (ms), ...}: quarantined (reason, by),
-- unquarantined (by), health (result, reason), booked (by, until), booking_ended (event,
-- by). O(1) per call.
local function device_log(did, entry)
  if not did or did == '' then return end
  entry.at = now_ms()
  local key = k('device', did, 'log')
  redis.call('LPUSH', key, cjson.encode(entry))
  redis.call('LTRIM', key, '0', I(DEVICE_RECENT - 1))
end

-- close the current attempt record (list index attempt-1) with an outcome; the attempt's device
-- remembers it (device_history) unless `whole_gang` (a multi-device task's own record: its
-- parts' records are the ones on their devices)
local function close_attempt(id, attempt, outcome, extra, whole_gang)
  local ak = k('task', id, 'attempts')
  local idx = (tonumber(attempt) or 0) - 1
  if idx < 0 then return end
  local raw = redis.call('LINDEX', ak, idx)
  if not raw then return end
  local rec = cjson.decode(raw)
  rec.outcome = outcome
  rec.ended_at = now_ms()
  if extra then for key, v in pairs(extra) do rec[key] = v end end
  redis.call('LSET', ak, I(idx), cjson.encode(rec))
  if not whole_gang then device_history(rec.device_id, id, rec) end
end

-- append `item` to a csv list of at most 8 (oldest dropped), without duplicates
local function csv_add(csv, item)
  if not item or item == '' then return csv or '' end
  local out = {}
  for v in string.gmatch(csv or '', '[^,]+') do
    if v ~= item then out[#out + 1] = v end
  end
  out[#out + 1] = item
  while #out > 8 do table.remove(out, 1) end
  return table.concat(out, ',')
end

-- remember that task `id` (fields t) lost an attempt on a device and host: a retry prefers
-- others (anti-affinity, read by the scheduler from the `avoid` hash while the task is queued)
local function avoid(id, t, device_id, host_id)
  t.avoid_devices = csv_add(t.avoid_devices, device_id)
  t.avoid_hosts = csv_add(t.avoid_hosts, host_id)
  redis.call('HSET', k('task', id), 'avoid_devices', t.avoid_devices, 'avoid_hosts', t.avoid_hosts)
end

-- the task (fields t, status `old`) returns to `queued` at its original place in submission
-- order, without a lease; its queue deadline still applies. With delay_ms > 0 (a retry's
-- backoff) it waits in `retries` (by the time it becomes eligible, field eligible_at) instead
-- of its bucket: expire.lua moves it there when due.
local gang_end  -- (below) a gang's attempt ends with one of its parts
local function requeue(id, t, old, delay_ms)
  redis.call('HSET', k('task', id), 'status', 'queued', 'host_id', '', 'device_id', '', 'lease_id', '',
    'lease_expires_at', '', 'session', '', 'updated_at', now_str())
  if (t.gang or '') ~= '' then  -- a part: its whole gang is retried
    gang_end(t.gang, id, 'retry', nil, nil, delay_ms)
    return
  end
  if delay_ms and delay_ms > 0 then
    local at = I(now_ms() + delay_ms)
    redis.call('HSET', k('task', id), 'eligible_at', at)
    redis.call('ZADD', k('retries'), at, id)
  else
    to_queue(id, t)
  end
  index_status(id, old, 'queued', t.seq)
  if t.queue_deadline and t.queue_deadline ~= '' then
    redis.call('ZADD', k('deadlines'), t.queue_deadline, id)
  end
  if (t.avoid_devices or '') ~= '' or (t.avoid_hosts or '') ~= '' then
    redis.call('HSET', k('avoid'), id, (t.avoid_devices or '') .. '|' .. (t.avoid_hosts or ''))
  end
end

-- end a task (fields t, status `old`) as done | failed | cancelled; `field` (result or error)
-- gets `payload`
local function finish(id, t, old, status, kind, payload, extra_event)
  local field = status == 'done' and 'result' or 'error'
  redis.call('HSET', k('task', id), 'status', status, 'failure_kind', kind or '', field, payload or '',
    'finished_at', now_str(), 'updated_at', now_str(), 'lease_expires_at', '')
  index_status(id, old, status, t.seq)
  local extra = extra_event or {}
  if (t.gang or '') ~= '' then extra = {'gang', t.gang, unpack(extra)} end
  emit(status, 'task', id, 'lease', t.lease_id or '', 'host', t.host_id or '', 'device',
    t.device_id or '', 'attempt', t.attempt or '0', 'failure_kind', kind or '', unpack(extra))
  if (t.gang or '') ~= '' then gang_end(t.gang, id, status, kind, payload) end
end

-- end the active lease of task `id` (fields t): out of the lease index, off the host's inbox
-- if it was not claimed yet
local function drop_lease(id, t)
  redis.call('ZREM', k('leases'), id)
  if t.tenant and t.tenant ~= '' then  -- the devices a tenant holds (assign.lua counts up)
    if redis.call('HINCRBY', k('tenant_held'), t.tenant, -1) <= 0 then
      redis.call('HDEL', k('tenant_held'), t.tenant)
    end
  end
  if t.status == 'assigned' and t.host_id and t.host_id ~= '' then
    redis.call('LREM', k('host', t.host_id, 'inbox'), 0, id)
  end
end

-- a hand-back (the host refused the assignment, shut down, or a dead daemon's attempt was
-- recovered): the attempt is closed as released and does not use up an attempt; the device is
-- held until its host's next heartbeat unless `free_device`; past max_handbacks the task fails
-- as rejected (a bounded loop). A task whose cancel was requested ends cancelled instead.
-- Returns the new status.
local function hand_back(id, t, why, free_device)
  local old = t.status
  drop_lease(id, t)
  release_device(t.device_id, id, (not free_device) and 'refused' or nil)
  close_attempt(id, t.attempt, 'released', {error = why,
    dispatched_at = old == 'dispatched' and tonumber(t.dispatched_at) or nil})
  if t.cancel_requested == '1' then
    finish(id, t, old, 'cancelled', 'cancelled', 'cancel requested; ' .. why)
    return 'cancelled'
  end
  local n = redis.call('HINCRBY', k('task', id), 'handbacks', 1)
  local limit = cfg('max_handbacks')
  emit('released', 'task', id, 'lease', t.lease_id or '', 'host', t.host_id or '', 'device',
    t.device_id or '', 'attempt', t.attempt or '0', 'handbacks', I(n), 'reason', why, gang_field(t))
  if n > limit then
    finish(id, t, old, 'failed', 'rejected', 'handed back ' .. n .. ' times (max_handbacks ' ..
      limit .. '); last: ' .. why)
    return 'failed'
  end
  avoid(id, t, t.device_id, nil)
  requeue(id, t, old)
  return 'queued'
end

-- a gang's attempt ends (`outcome` done | failed | cancelled, or retry after delay_ms) because
-- its part `part_id` ended ('' = the gang task itself, e.g. cancelled): every other part still
-- holding a lease ends with it (lease dropped, device released, its host told at once), then
-- the gang task is finished or queued again in `gangs`. Nothing happens when the gang task
-- holds no attempt (already ended).
gang_end = function(gid, part_id, outcome, kind, payload, delay_ms)
  local g = load_task(gid)
  if g.status ~= 'assigned' and g.status ~= 'dispatched' then return end
  local why = part_id ~= '' and ('part ' .. part_id .. ' ended: ' .. outcome) or outcome
  local parts = redis.call('HGET', k('task', gid), 'parts') or ''
  for pid in string.gmatch(parts, '[^,]+') do
    local p = pid ~= part_id and load_task(pid) or {}
    if p.status == 'assigned' or p.status == 'dispatched' then
      -- (not drop_lease: an unclaimed part stays in its host's inbox, where claim drops it as
      -- stale; so a host's call never writes another host's inbox, only its control list)
      redis.call('ZREM', k('leases'), pid)
      release_device(p.device_id, pid, nil)
      close_attempt(pid, p.attempt, 'ended', {error = 'gang attempt ended (' .. why .. ')',
        dispatched_at = p.status == 'dispatched' and tonumber(p.dispatched_at) or nil})
      if outcome == 'retry' then
        redis.call('HSET', k('task', pid), 'status', 'queued', 'host_id', '', 'device_id', '',
          'lease_id', '', 'lease_expires_at', '', 'session', '', 'updated_at', now_str())
        emit('requeued', 'task', pid, 'attempt', p.attempt or '0', 'reason', why, 'gang', gid)
      else
        redis.call('HSET', k('task', pid), 'status', outcome, 'failure_kind', kind or '',
          'finished_at', now_str(), 'updated_at', now_str(), 'lease_expires_at', '')
        index_status(pid, p.status, outcome, '')
        emit(outcome, 'task', pid, 'lease', p.lease_id or '', 'host', p.host_id or '', 'device',
          p.device_id or '', 'attempt', p.attempt or '0', 'failure_kind', kind or '', 'gang', gid)
      end
      ctl(p.host_id, 'gang')
    end
  end
  wake(k('sched', 'wake'))
  if outcome == 'retry' then
    close_attempt(gid, g.attempt, 'ended', {error = why}, true)
    requeue(gid, g, g.status, delay_ms)
    emit('requeued', 'task', gid, 'attempt', g.attempt or '0', 'reason', why)
  else
    close_attempt(gid, g.attempt, outcome, {failure_kind = kind ~= '' and kind or nil}, true)
    finish(gid, g, g.status, outcome, kind, payload)
  end
end
