--- @include "lib/base"
--- @include "lib/config"
--- @include "lib/events"
--- @include "lib/leases"
--- @include "lib/attempts"
--- @include "lib/affinity"
--- @include "lib/outcomes"
-- lib/handback.lua: a hand-back (an attempt returned unspent).

-- a hand-back (the host refused the assignment, shut down, or a dead daemon's attempt was
-- recovered): the attempt is closed as released and does not use up an attempt; the device is
-- held until its host's next heartbeat unless `free_device`; past max_handbacks the task fails
-- as rejected (a bounded loop). A task whose cancel was requested ends cancelled instead.
-- Returns the new status.
local function hand_back(id, t, why, free_device)
  local old = t.status
  drop_lease(id, t)
  release_device(t.device_id, id, (not free_device) and 'refused' or nil)
  close_attempt(id, t.attempt, 'released', {error = why,
    dispatched_at = old == 'dispatched' and tonumber(t.dispatched_at) or nil})
  if t.cancel_requested == '1' then
    finish(id, t, old, 'cancelled', 'cancelled', 'cancel requested; ' .. why)
    return 'cancelled'
  end
  local n = redis.call('HINCRBY', k('task', id), 'handbacks', 1)
  local limit = cfg('max_handbacks')
  emit('released', 'task', id, 'lease', t.lease_id or '', 'host', t.host_id or '', 'device',
    t.device_id or '', 'attempt', t.attempt or '0', 'handbacks', I(n), 'reason', why, gang_field(t))
  if n > limit then
    finish(id, t, old, 'failed', 'rejected', 'handed back ' .. n .. ' times (max_handbacks ' ..
      limit .. '); last: ' .. why)
    return 'failed'
  end
  avoid(id, t, t.device_id, nil)
  requeue(id, t, old)
  return 'queued'
end
