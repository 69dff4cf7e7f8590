--- @include "lib/base"
--- @include "lib/eligibility"
-- lib/leases.lua: the end of a lease: out of the lease index (and an unclaimed one out of its
-- host's inbox), out of its host's count, its device released.

-- a lease on a device of host `host_id` ended: one fewer in `host_held` (assign.lua and
-- gang_assign.lua count up; the max_tasks_per_host cap). A script that ends many leases in a
-- call may defer these counts (the two functions below: defer first, flush before it
-- returns): `host_held` is then written once per host, not once per lease.
local _held_later
local function held_defer()
  _held_later = {}
end
local function held_flush()
  for host_id, by in pairs(_held_later or {}) do
    if redis.call('HINCRBY', k('host_held'), host_id, I(by)) <= 0 then
      redis.call('HDEL', k('host_held'), host_id)
    end
  end
  _held_later = nil
end
local function host_lease_ended(host_id)
  if host_id and host_id ~= '' then
    if _held_later then
      _held_later[host_id] = (_held_later[host_id] or 0) - 1
    elseif redis.call('HINCRBY', k('host_held'), host_id, '-1') <= 0 then
      redis.call('HDEL', k('host_held'), host_id)
    end
  end
end

-- end the active lease of task `id` (fields t): out of the lease index, off the host's inbox
-- if it was not claimed yet
local function drop_lease(id, t)
  redis.call('ZREM', k('leases'), id)
  if t.tenant and t.tenant ~= '' then  -- the devices a tenant holds (assign.lua counts up)
    if redis.call('HINCRBY', k('tenant_held'), t.tenant, '-1') <= 0 then
      redis.call('HDEL', k('tenant_held'), t.tenant)
    end
  end
  host_lease_ended(t.host_id)
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
  refresh_idle(device_id, d)
  return tonumber(d.consecutive_failures or '0') or 0
end
