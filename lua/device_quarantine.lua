-- device_quarantine.lua: take a device out of (1) or put it back into (0) assignment, by an
-- operator. Unquarantine also resets its consecutive failure count. The owning host's daemon
-- is told at once (host:ID:ctl).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     device_id quarantined(1|0)
-- Keys     reads/writes device:ID, idle, qdrivers, faults, host:ID:ctl, events, sched:wake; reads config
-- Returns  "quarantined" | "released"
-- Errors   NOT_FOUND (no device), INVALID
local did, flag = ARGV[1], ARGV[2]
if not valid_id(did) then return fail('INVALID', 'malformed device id') end
if (flag ~= '1' and flag ~= '0') or #ARGV ~= 2 then return fail('INVALID', 'quarantined must be 1 or 0') end
local dk = k('device', did)
local d = redis.call('HMGET', dk, 'host_id', 'state', 'reserved_by', 'quarantined', 'driver_type', 'held',
  'booked_until', 'health')
if not d[1] then return fail('NOT_FOUND', 'no device ' .. did) end
local function count(by)
  if redis.call('HINCRBY', k('qdrivers'), d[5] or '', by) <= 0 then redis.call('HDEL', k('qdrivers'), d[5] or '') end
end
if flag == '1' then
  if d[4] ~= '1' then
    redis.call('HSET', dk, 'quarantined', '1', 'quarantined_at', now_str(), 'quarantine_reason', 'operator')
    redis.call('ZREM', k('idle'), did)
    count(1)
    ctl(d[1], 'quarantine')
    emit('device_quarantined', 'device', did, 'host', d[1], 'by', 'operator')
  end
  return 'quarantined'
end
redis.call('HSET', dk, 'quarantined', '0', 'consecutive_failures', '0', 'attention', '', 'quarantine_reason', '')
redis.call('HDEL', k('faults'), did)
if d[4] == '1' then
  count(-1)
  ctl(d[1], 'quarantine')
  emit('device_unquarantined', 'device', did, 'host', d[1])
end
local _, added = refresh_idle(did, gate(did))
if added then wake(k('sched', 'wake')) end
return 'released'
