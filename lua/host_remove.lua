-- host_remove.lua: delete a host and its devices. Refused while any of its devices holds a
-- reservation (drain it and let its work finish first). A daemon still running for the host
-- is told at once (host:ID:ctl); its next call is refused and it exits.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id
-- Keys     reads/writes host:ID, host:ID:devices, host:ID:inbox, host:ID:wake, host:ID:ctl,
--          device:ID, devices, idle, bookings, caps, drivers, qdrivers, hosts, devgen, events; reads config
-- Returns  the number of devices removed with it
-- Errors   NOT_FOUND (no host), BUSY (a device is reserved), INVALID
local host_id = ARGV[1]
if not valid_id(host_id) or #ARGV ~= 1 then return fail('INVALID', 'malformed host id') end
local hk = k('host', host_id)
if redis.call('EXISTS', hk) == 0 then return fail('NOT_FOUND', 'no host ' .. host_id) end
local devs = redis.call('SMEMBERS', k('host', host_id, 'devices'))
for _, did in ipairs(devs) do
  local r = redis.call('HGET', k('device', did), 'reserved_by')
  if r and r ~= '' then
    return fail('BUSY', 'device ' .. did .. ' of host ' .. host_id .. ' is running task ' .. r)
  end
end
local function count(hash, key, by)
  if redis.call('HINCRBY', k(hash), key, by) <= 0 then redis.call('HDEL', k(hash), key) end
end
for _, did in ipairs(devs) do
  local d = redis.call('HMGET', k('device', did), 'driver_type', 'tags', 'quarantined')
  if d[1] then
    count('caps', d[1] .. '|' .. (d[2] or ''), -1)
    count('drivers', d[1], -1)
    if d[3] == '1' then count('qdrivers', d[1], -1) end
  end
  redis.call('DEL', k('device', did))
  redis.call('SREM', k('devices'), did)
  redis.call('ZREM', k('idle'), did)
  redis.call('ZREM', k('bookings'), did)
end
redis.call('DEL', hk, k('host', host_id, 'devices'), k('host', host_id, 'inbox'), k('host', host_id, 'wake'))
redis.call('SREM', k('hosts'), host_id)
ctl(host_id, 'removed')
if #devs > 0 then redis.call('INCR', k('devgen')) end  -- schedulers drop cached attributes
emit('host_removed', 'host', host_id)
return #devs
