--- @include "lib/base"
--- @include "lib/idle"
-- lib/eligibility.lua: THE rule deciding whether a device is an idle candidate, and the idle
-- index kept by it.

-- THE eligibility rule (deviceq.core.eligibility.device_blocker mirrors it; a test compares
-- the two over every combination of these fields): why a device with hash fields `d`
-- (GATE_FIELDS, read by gate()) is not an idle candidate, or nil when it is one. In precedence
-- order: quarantined, reserved (a lease holds it), booked (reserved for a person), suspect (a
-- lease on it expired) / held (its host handed an assignment back) until its host's next
-- heartbeat, checking / unhealthy (its host's health check), gated (a gate holds it: `deviceq
-- gate`, lib/gates.lua), then its state busy | offline.
-- Host-level reasons (dead, draining, suspect) are host_placeable's.
local GATE_FIELDS = {'state', 'reserved_by', 'quarantined', 'held', 'booked_until', 'health', 'gated'}
-- the gate fields and the device's class (driver_type, tags: its idle set, lib/idle.lua)
local GATE_READ = {'state', 'reserved_by', 'quarantined', 'held', 'booked_until', 'health',
  'gated', 'driver_type', 'tags'}
local function gate(did)
  return hfields(k('device', did), GATE_READ)
end
local function device_blocker(d)
  if d.quarantined == '1' then return 'quarantined' end
  if (d.reserved_by or '') ~= '' then return 'reserved' end
  if (d.booked_until or '') ~= '' then return 'booked' end
  if (d.held or '') ~= '' then return d.held == 'suspect' and 'suspect' or 'held' end
  if d.health == 'checking' or d.health == 'unhealthy' then return d.health end
  if (d.gated or '') ~= '' then return 'gated' end
  if d.state ~= 'idle' then return d.state or 'offline' end
  return nil
end

-- (re)decide whether device `did` (gate fields `d`, as they are after this call's writes, with
-- its driver_type and tags: gate() reads them; when absent they are read from its hash) is
-- among the idle candidates, by the rule: added (score: now, kept when already there unless
-- `rescore`) or removed (lib/idle.lua keeps its class's idle set in step). Returns true when
-- it is a candidate, and whether it was newly added.
local function refresh_idle(did, d, rescore)
  if device_blocker(d) then
    idle_remove(did, d.driver_type, d.tags)
    return false, false
  end
  local driver, tags = d.driver_type, d.tags
  if not driver or not tags then
    local a = redis.call('HMGET', k('device', did), 'driver_type', 'tags')
    driver, tags = a[1], a[2]
  end
  return true, idle_add(did, driver, tags, not rescore)
end
