--- @include "lib/base"
-- lib/idle.lua: THE two writes of the idle index: the `idle` zset and, in step with it, one
-- zset per device class `idle:c:CLASS` (CLASS: the first 12 hex digits of the sha1 of the
-- device's profile DRIVER|TAGS, as counted in `caps`; deviceq.core.keys.class_id computes the
-- same), same members, same scores. No script ZADDs or ZREMs `idle` but through these two.

local _classes = {}
-- the idle set of the class of profile driver|tags
local function idle_class_key(driver, tags)
  local profile = (driver or '') .. '|' .. (tags or '')
  local key = _classes[profile]
  if not key then
    key = k('idle:c', string.sub(redis.sha1hex(profile), 1, 12))
    _classes[profile] = key
  end
  return key
end

-- device `did` (of driver type `driver`, tags csv `tags`) becomes or stays idle, scored now;
-- `nx`: keep its score when it is there already. Returns whether it was newly added.
local function idle_add(did, driver, tags, nx)
  local ck = idle_class_key(driver, tags)
  if nx then
    redis.call('ZADD', ck, 'NX', now_str(), did)
    return redis.call('ZADD', k('idle'), 'NX', now_str(), did) == 1
  end
  redis.call('ZADD', ck, now_str(), did)
  return redis.call('ZADD', k('idle'), now_str(), did) == 1
end

-- device `did` leaves the idle index. Its class is that of `driver` and `tags` when both are
-- given, else read from its hash (only when it was idle). Returns whether it was there.
local function idle_remove(did, driver, tags)
  if redis.call('ZREM', k('idle'), did) == 0 then return false end
  if not driver or not tags then
    local d = redis.call('HMGET', k('device', did), 'driver_type', 'tags')
    driver, tags = d[1], d[2]
  end
  redis.call('ZREM', idle_class_key(driver, tags), did)
  return true
end
