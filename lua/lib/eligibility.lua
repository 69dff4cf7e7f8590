--- @include "lib/base"
-- lib/eligibility.lua: THE rule deciding whether a device is an idle candidate, and the idle
-- index kept by it.

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
