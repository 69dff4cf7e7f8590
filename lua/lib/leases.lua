--- @include "lib/base"
--- @include "lib/eligibility"
--- @include "lib/limits"
--- @include "lib/gates"
-- lib/leases.lua: the end of a lease: out of the lease index (and an unclaimed one out of its
-- host's inbox), out of the limits' counts (lib/limits), its device released (and held by a
-- cooldown gate: lib/gates).

-- end the active lease of task `id` (fields t): out of the lease index (and the index of
-- preemptible running tasks), off the host's inbox if it was not claimed yet
local function drop_lease(id, t)
  redis.call('ZREM', k('leases'), id)
  if (t.class or '') ~= '' then redis.call('ZREM', k('preemptible'), id) end
  limits_count(t.host_id, t.tenant, -1)
  if t.status == 'assigned' and t.host_id and t.host_id ~= '' then
    redis.call('LREM', k('host', t.host_id, 'inbox'), '0', id)
  end
end

-- release the device reserved by task id. hold = nil: back among the idle candidates when
-- the rule allows (refresh_idle); hold = 'suspect' (its lease expired) or 'refused' (its host
-- handed the assignment back): out of the candidates until its host's next heartbeat.
-- Returns the device's consecutive infrastructure failure count (nil when not reserved by id).
local RELEASE_READ = {'consecutive_failures', unpack(GATE_READ)}  -- (gate's, in one read)
local function release_device(device_id, id, hold)
  if not device_id or device_id == '' then return end
  local dk = k('device', device_id)
  local d = hfields(dk, RELEASE_READ)
  if d.reserved_by ~= id then return end
  d.reserved_by = ''
  if hold then
    redis.call('HSET', dk, 'reserved_by', '', 'lease_id', '', 'released_at', now_str(), 'held', hold,
      'held_at', now_str())
    d.held = hold
    -- the host's next heartbeat clears the mark (heartbeat.lua reads this set, not every device)
    local hid = redis.call('HGET', dk, 'host_id')
    if hid then redis.call('SADD', k('host', hid, 'held_devices'), device_id) end
  else
    redis.call('HSET', dk, 'reserved_by', '', 'lease_id', '', 'released_at', now_str())
  end
  -- a cooldown gate holds it from now on (lib/gates.lua; gate_eval.lua's `due` call ends it)
  local gates = gates_cached()
  if gates.cooldown then
    gate_check(device_id, gates)
    d.gated = redis.call('HGET', dk, 'gated')
  end
  refresh_idle(device_id, d)
  return tonumber(d.consecutive_failures or '0') or 0
end
