-- device_quarantine.lua: take a device out of (1) or put it back into (0) assignment.
-- Unquarantine also resets its consecutive failure count.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     device_id quarantined(1|0)
-- Returns  "quarantined" | "released"
-- Errors   NOT_FOUND (no device), INVALID
local did, flag = ARGV[1], ARGV[2]
if not valid_id(did) then return fail('INVALID', 'malformed device id') end
if flag ~= '1' and flag ~= '0' then return fail('INVALID', 'quarantined must be 1 or 0') end
local dk = k('device', did)
local d = redis.call('HMGET', dk, 'host_id', 'state', 'reserved_by', 'quarantined')
if not d[1] then return fail('NOT_FOUND', 'no device ' .. did) end
local now = now_ms()
if flag == '1' then
  redis.call('HSET', dk, 'quarantined', '1', 'quarantined_at', now)
  redis.call('ZREM', k('idle'), did)
  if d[4] ~= '1' then emit('device_quarantined', 'device', did, 'host', d[1], 'by', 'operator') end
  return 'quarantined'
end
redis.call('HSET', dk, 'quarantined', '0', 'consecutive_failures', 0)
if d[2] == 'idle' and (not d[3] or d[3] == '') then
  redis.call('ZADD', k('idle'), 'NX', now, did)
  wake(k('sched', 'wake'))
end
if d[4] == '1' then emit('device_unquarantined', 'device', did, 'host', d[1]) end
return 'released'
