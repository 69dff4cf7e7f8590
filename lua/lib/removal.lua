--- @include "lib/base"
--- @include "lib/idle"
-- lib/removal.lua: forgetting a device (host_remove.lua, device_remove.lua).

-- forget device `did` (its hash, history, attributes, indexes and profile counts): host_remove.lua and
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
  for _, name in ipairs(redis.call('HKEYS', k('device', did, 'attrs'))) do  -- (at most 32)
    if redis.call('HINCRBY', k('attr_names'), name, -1) <= 0 then redis.call('HDEL', k('attr_names'), name) end
  end
  redis.call('DEL', dk, k('device', did, 'history'), k('device', did, 'log'), k('device', did, 'attrs'),
    k('device', did, 'attrs_at'), k('device', did, 'attrs_host'))
  redis.call('SREM', k('devices'), did)
  redis.call('SREM', k('host', d[1], 'devices'), did)
  redis.call('SREM', k('host', d[1], 'quarantined'), did)
  -- the host's next heartbeat is a full snapshot: a device it still has registers again
  redis.call('HDEL', k('host', d[1]), 'hb_ver')
  idle_remove(did, d[2] or '', d[3] or '')
  redis.call('ZREM', k('bookings'), did)
  redis.call('HDEL', k('faults'), did)
  return d[1]
end
