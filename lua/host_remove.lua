-- host_remove.lua: delete a host and its devices. Refused while any of its devices holds a
-- reservation (drain it and let its work finish first).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id
-- Returns  the number of devices removed with it
-- Errors   NOT_FOUND (no host), BUSY (a device is reserved), INVALID
local host_id = ARGV[1]
if not valid_id(host_id) then return fail('INVALID', 'malformed host id') end
local hk = k('host', host_id)
if redis.call('EXISTS', hk) == 0 then return fail('NOT_FOUND', 'no host ' .. host_id) end
local devs = redis.call('SMEMBERS', k('host', host_id, 'devices'))
for _, did in ipairs(devs) do
  local r = redis.call('HGET', k('device', did), 'reserved_by')
  if r and r ~= '' then
    return fail('BUSY', 'device ' .. did .. ' of host ' .. host_id .. ' is running task ' .. r)
  end
end
for _, did in ipairs(devs) do
  local d = redis.call('HMGET', k('device', did), 'driver_type', 'tags')
  if d[1] then
    local p = d[1] .. '|' .. (d[2] or '')
    if redis.call('HINCRBY', k('caps'), p, -1) <= 0 then redis.call('HDEL', k('caps'), p) end
  end
  redis.call('DEL', k('device', did))
  redis.call('SREM', k('devices'), did)
  redis.call('ZREM', k('idle'), did)
end
redis.call('DEL', hk, k('host', host_id, 'devices'), k('host', host_id, 'inbox'), k('host', host_id, 'wake'))
redis.call('SREM', k('hosts'), host_id)
if #devs > 0 then redis.call('INCR', k('devgen')) end  -- schedulers drop cached attributes
emit('host_removed', 'host', host_id)
return #devs
