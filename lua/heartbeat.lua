-- heartbeat.lua: a host reports itself alive and the full snapshot of its devices.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token_digest n, then 4 fields per device: device_id driver_type tags(csv)
--          state (idle | busy | offline). Devices the host owned but left out become offline.
-- Returns  {alive_devices, idle_assignable, draining(0|1)}
-- Errors   AUTH (unknown host / wrong token), INVALID (malformed device or state),
--          DEVICE_OWNED (a device id registered by another host; nothing is changed).
-- A device with an active reservation is never put among the idle candidates, whatever the
-- snapshot says; a quarantined device neither.
local host_id, digest, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local hk, err = auth_host(host_id, digest)
if not hk then return err end
if not n or n < 0 or #ARGV ~= 3 + n * 4 then return fail('INVALID', 'bad argument count') end
local STATES = {idle = true, busy = true, offline = true}
local listed, owners = {}, {}
for i = 0, n - 1 do
  local b = 4 + i * 4
  local did, state = ARGV[b], ARGV[b + 3]
  if not valid_id(did) then return fail('INVALID', 'malformed device id') end
  if listed[did] then return fail('INVALID', 'device ' .. did .. ' is listed twice') end
  if not valid_id(ARGV[b + 1]) then return fail('INVALID', 'malformed driver_type for ' .. did) end
  if not STATES[state] then return fail('INVALID', 'device state must be idle, busy or offline') end
  local owner = redis.call('HGET', k('device', did), 'host_id')
  owners[did] = owner
  if owner and owner ~= host_id then
    return fail('DEVICE_OWNED', 'device ' .. did .. ' belongs to another host')
  end
  listed[did] = true
end

local now = now_ms()
local was_alive = host_alive(hk)
redis.call('HSET', hk, 'last_heartbeat', now)
local woke = not was_alive
local idle_count = 0
local attrs_changed = false
for i = 0, n - 1 do
  local b = 4 + i * 4
  local did, driver, tags, state = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local dk = k('device', did)
  local d = redis.call('HMGET', dk, 'state', 'reserved_by', 'quarantined', 'driver_type', 'tags')
  if not owners[did] then
    redis.call('SADD', k('devices'), did)
    redis.call('SADD', k('host', host_id, 'devices'), did)
    redis.call('HSET', dk, 'id', did, 'host_id', host_id, 'reserved_by', '', 'quarantined', '0',
      'consecutive_failures', 0, 'registered_at', now)
    emit('device_registered', 'device', did, 'host', host_id)
  end
  local changed = d[4] ~= driver or d[5] ~= tags
  if changed then
    attrs_changed = true
    if d[4] then
      local old = d[4] .. '|' .. (d[5] or '')
      if redis.call('HINCRBY', k('caps'), old, -1) <= 0 then redis.call('HDEL', k('caps'), old) end
    end
    redis.call('HINCRBY', k('caps'), driver .. '|' .. tags, 1)
  end
  if d[1] ~= state or d[4] ~= driver or d[5] ~= tags then
    redis.call('HSET', dk, 'driver_type', driver, 'tags', tags, 'state', state, 'updated_at', now)
    emit('device_state', 'device', did, 'host', host_id, 'state', state)
  end
  if state == 'idle' and (not d[2] or d[2] == '') and d[3] ~= '1' then
    -- new among idle candidates, or re-scored so the scheduler re-reads changed attributes
    if changed then
      redis.call('ZADD', k('idle'), now, did)
      woke = true
    elseif redis.call('ZADD', k('idle'), 'NX', now, did) == 1 then
      woke = true
    end
    idle_count = idle_count + 1
  else
    redis.call('ZREM', k('idle'), did)
  end
end
-- devices owned by this host but absent from the snapshot are offline
for _, did in ipairs(redis.call('SMEMBERS', k('host', host_id, 'devices'))) do
  if not listed[did] then
    local dk = k('device', did)
    if redis.call('HGET', dk, 'state') ~= 'offline' then
      redis.call('HSET', dk, 'state', 'offline', 'updated_at', now)
      emit('device_state', 'device', did, 'host', host_id, 'state', 'offline')
    end
    redis.call('ZREM', k('idle'), did)
  end
end
if not was_alive then emit('host_alive', 'host', host_id) end
-- a device registered or its driver_type/tags changed: schedulers drop their attribute caches
if attrs_changed then redis.call('INCR', k('devgen')) end
if woke then wake(k('sched', 'wake')) end
local draining = redis.call('HGET', hk, 'draining') == '1' and 1 or 0
return {n, idle_count, draining}
