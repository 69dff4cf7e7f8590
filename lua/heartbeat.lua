--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/auth"
--- @include "lib/liveness"
--- @include "lib/eligibility"
-- heartbeat.lua: a host reports itself alive and the full snapshot of its devices.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token session('' = no daemon session) n, then 5 fields per device:
--          device_id driver_type tags(csv, sorted) state(idle | busy | offline)
--          reason(why busy/offline, '' for idle; at most 200 bytes, no control characters).
--          Devices the host owned but left out become offline.
-- Keys     reads/writes host:ID, host:ID:devices, device:ID, devices, idle, caps, drivers,
--          qdrivers, devgen, events, sched:wake; reads config
-- Returns  {alive_devices, idle_assignable, draining(0|1, operator), stopping(0|1),
--          quarantined device ids (csv)}
-- Errors   AUTH (unknown host / wrong token), SUPERSEDED (not the current session),
--          INVALID (malformed device, state or reason), DEVICE_OWNED (a device id registered
--          by another host; nothing is changed).
-- A heartbeat proves the host alive after a lost lease: it clears the host's `suspect` flag
-- and its devices' `held` marks (of the absent ones too, which also leave a due or running
-- health check: they are offline). A device with an active reservation is never put among the
-- idle candidates, whatever the snapshot says; a quarantined or booked (reserved for a person,
-- device_reserve.lua) device neither, nor one under or failing a health check (device_health.lua).
local host_id, token, session = ARGV[1], ARGV[2], ARGV[3]
local hk, err = auth_host(host_id, token, session or '')
if not hk then return err end
local n = int_in(ARGV[4], 0, 10000)
if not n or #ARGV ~= 4 + n * 5 then return fail('INVALID', 'bad argument count') end
local STATES = {idle = true, busy = true, offline = true}
local listed, owners = {}, {}
for i = 0, n - 1 do
  local b = 5 + i * 5
  local did, state, reason = ARGV[b], ARGV[b + 3], ARGV[b + 4]
  if not valid_id(did) then return fail('INVALID', 'malformed device id') end
  if listed[did] then return fail('INVALID', 'device ' .. did .. ' is listed twice') end
  if not valid_id(ARGV[b + 1]) then return fail('INVALID', 'malformed driver_type for ' .. did) end
  if not valid_tags(ARGV[b + 2]) then return fail('INVALID', 'malformed tags for ' .. did) end
  if not STATES[state] then return fail('INVALID', 'device state must be idle, busy or offline') end
  if #reason > 200 or reason:find('%c') then
    return fail('INVALID', 'reason must be at most 200 bytes without control characters')
  end
  local owner = redis.call('HGET', k('device', did), 'host_id')
  owners[did] = owner
  if owner and owner ~= host_id then
    return fail('DEVICE_OWNED', 'device ' .. did .. ' belongs to another host')
  end
  listed[did] = true
end

local now = now_ms()
local now_s = now_str()
local was_alive = host_alive(hk)
local h = redis.call('HMGET', hk, 'suspect', 'draining', 'stopping')
redis.call('HSET', hk, 'last_heartbeat', now_s)
if h[1] and h[1] ~= '' then
  redis.call('HSET', hk, 'suspect', '')
  emit('host_alive', 'host', host_id, 'after', 'lost_lease')
end
local woke = not was_alive or (h[1] and h[1] ~= '')
local idle_count = 0
local attrs_changed = false
local quarantined = {}
local function count(hash, key, by)
  if redis.call('HINCRBY', k(hash), key, by) <= 0 then redis.call('HDEL', k(hash), key) end
end
for i = 0, n - 1 do
  local b = 5 + i * 5
  local did, driver, tags, state, reason = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  local dk = k('device', did)
  local d = redis.call('HMGET', dk, 'state', 'reserved_by', 'quarantined', 'driver_type', 'tags',
    'held', 'reason', 'booked_until', 'health')
  if not owners[did] then
    redis.call('SADD', k('devices'), did)
    redis.call('SADD', k('host', host_id, 'devices'), did)
    redis.call('HSET', dk, 'id', did, 'host_id', host_id, 'reserved_by', '', 'quarantined', '0',
      'consecutive_failures', '0', 'registered_at', now_s)
    d[3] = '0'
    emit('device_registered', 'device', did, 'host', host_id)
  end
  if d[3] == '1' then quarantined[#quarantined + 1] = did end
  local changed = d[4] ~= driver or d[5] ~= tags
  if changed then
    attrs_changed = true
    if d[4] then
      count('caps', d[4] .. '|' .. (d[5] or ''), -1)
    end
    count('caps', driver .. '|' .. tags, 1)
    if d[4] ~= driver then
      if d[4] then count('drivers', d[4], -1) end
      count('drivers', driver, 1)
      if d[3] == '1' then
        if d[4] then count('qdrivers', d[4], -1) end
        count('qdrivers', driver, 1)
      end
    end
  end
  if d[1] ~= state or changed or (d[7] or '') ~= reason then
    redis.call('HSET', dk, 'driver_type', driver, 'tags', tags, 'state', state, 'reason', reason,
      'updated_at', now_s)
    emit('device_state', 'device', did, 'host', host_id, 'state', state, 'reason', reason)
  end
  if d[6] and d[6] ~= '' then
    redis.call('HSET', dk, 'held', '')
    emit('device_unheld', 'device', did, 'host', host_id, 'was', d[6])
  end
  local cand, added = refresh_idle(did, {state = state, reserved_by = d[2], quarantined = d[3],
    held = '', booked_until = d[8], health = d[9]}, changed)
  -- new among idle candidates, or re-scored so the scheduler re-reads changed attributes
  if added or (cand and changed) then woke = true end
  if cand then idle_count = idle_count + 1 end
end
-- devices owned by this host but absent from the snapshot are offline, and leave every
-- transient state at once (held/suspect: nothing will come back to clear it; a health check
-- due or running: the host no longer checks it); a quarantine, a booking, an unhealthy result
-- and a lease (its expiry ends it) stay
for _, did in ipairs(redis.call('SMEMBERS', k('host', host_id, 'devices'))) do
  if not listed[did] then
    local dk = k('device', did)
    local d = redis.call('HMGET', dk, 'state', 'held', 'health')
    if d[1] ~= 'offline' then
      redis.call('HSET', dk, 'state', 'offline', 'reason', 'not in the host snapshot', 'updated_at', now_s)
      emit('device_state', 'device', did, 'host', host_id, 'state', 'offline')
    end
    if d[2] and d[2] ~= '' then
      redis.call('HSET', dk, 'held', '')
      emit('device_unheld', 'device', did, 'host', host_id, 'was', d[2])
    end
    if d[3] == 'checking' then
      redis.call('HDEL', dk, 'health', 'health_started_at')
      emit('device_health_cleared', 'device', did, 'host', host_id, 'was', 'checking')
    end
    redis.call('ZREM', k('idle'), did)
  end
end
if not was_alive then emit('host_alive', 'host', host_id) end
-- a device registered or its driver_type/tags changed: schedulers drop their attribute caches
if attrs_changed then redis.call('INCR', k('devgen')) end
if woke then wake(k('sched', 'wake')) end
return {n, idle_count, h[2] == '1' and 1 or 0, h[3] == '1' and 1 or 0, table.concat(quarantined, ',')}
