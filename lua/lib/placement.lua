--- @include "lib/base"
--- @include "lib/eligibility"
--- @include "lib/liveness"
--- @include "gen/assign_refusals"
-- lib/placement.lua: whether a device can take an assignment now (assign.lua, gang_assign.lua).

-- can device `did` take an assignment now? Returns its row (host_id state reserved_by
-- quarantined driver_type tags held booked_until health gated preempt_for), or nil and the
-- reason (assign.lua's err: reasons: the rule's reasons as ASSIGN_ERR, device_not_idle,
-- device_not_found, or the host's). `hosts_ok` caches host_placeable per host for the call.
local function device_assignable(did, hosts_ok)
  local d = redis.call('HMGET', k('device', did), 'host_id', 'state', 'reserved_by', 'quarantined',
    'driver_type', 'tags', 'held', 'booked_until', 'health', 'gated', 'preempt_for')
  if not d[1] then return nil, 'device_not_found' end
  local why = device_blocker({state = d[2], reserved_by = d[3], quarantined = d[4], held = d[7],
    booked_until = d[8], health = d[9], gated = d[10]})
  if why then return nil, ASSIGN_ERR[why] or 'device_not_idle' end
  if hosts_ok[d[1]] == nil then hosts_ok[d[1]] = host_placeable(k('host', d[1])) end
  if hosts_ok[d[1]] ~= true then return nil, hosts_ok[d[1]] end
  return d
end
