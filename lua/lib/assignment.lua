--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/idle"
--- @include "lib/events"
--- @include "lib/constraints"
--- @include "lib/where"
--- @include "lib/status"
--- @include "lib/placement"
--- @include "lib/limits"
-- lib/assignment.lua: one (task, device) pair checked and committed as an assignment: the rule
-- assign.lua applies to the scheduler's pairs and report.lua to a freed device's next-task hint.

-- a device held for the task that preempted its run (preempt.lua): true when it is held for
-- another task, still queued and waiting for it; a hold whose task left the queue (or is not
-- `queued`, the task asking) is dropped
local function drop_hold(uid, did)
  redis.call('HDEL', k('device', did), 'preempt_for')
  redis.call('ZREM', k('preempt', 'handover'), uid)
end
local function held_for(did, id, queued, known)
  local pf = known or redis.call('HGET', k('device', did), 'preempt_for')
  if not pf or pf == '' then return false end
  if pf == id then
    if not queued then drop_hold(pf, did) end
    return false
  end
  local h = redis.call('HMGET', k('task', pf), 'status', 'preempting')
  if h[1] == 'queued' and h[2] == did then return true end
  drop_hold(pf, did)
  return false
end

-- can task `id` be assigned to device `did` now? Returns {t = task row, d = device row}, or
-- nil and assign.lua's err: reason. `hosts_ok` caches each host's placeability for the call.
local function assignment_check(id, did, hosts_ok)
  if not valid_id(id) or not valid_id(did) then return nil, 'invalid_id' end
  local t = redis.call('HMGET', k('task', id), 'status', 'driver_type', 'tags', 'sig', 'attempt', 'seq',
    'submitted_at', 'avoid_devices', 'avoid_hosts', 'queue_deadline', 'tenant', 'roles', 'gang', 'pin',
    'class', 'preempting', 'where')
  if not t[1] then return nil, 'task_not_found' end
  if (t[12] or '') ~= '' or (t[13] or '') ~= '' then return nil, 'task_multi_device' end
  if t[1] ~= 'queued' then
    held_for(did, id, false)
    return nil, 'task_not_queued'
  end
  if (t[14] or '') ~= '' and t[14] ~= did then return nil, 'task_pinned' end
  local d, bad = device_assignable(did, hosts_ok)
  if not d then return nil, bad end
  if d[11] and held_for(did, id, true, d[11]) then return nil, 'device_preempted' end
  local ok, why = satisfies(t[2], t[3], d[5], d[6])
  if not ok then return nil, why end
  if (t[17] or '') ~= '' and where_fails(did, t[17]) then return nil, 'where_mismatch' end
  local capped = limits_refusal(d[1], t[11], 1)
  if capped then return nil, capped end
  return {t = t, d = d}
end

-- commit a checked pair (`v` from assignment_check): task queued -> assigned, attempt+1, a
-- lease of `claim_ms`, the device reserved, an `assigned` event. The caller files the task
-- in its host's inbox, fixes the head of its bucket (v.t[4]) and flushes the limits' counts.
-- `via`: what made it, when not the scheduler's commit (the event's field `via`). Returns the
-- lease id.
local function assignment_commit(id, did, v, now, claim_ms, via)
  local host_id = v.d[1]
  local attempt = tonumber(v.t[5]) + 1
  local attempt_s, now_s, expires_s = I(attempt), I(now), I(now + claim_ms)
  local lease = id .. '-a' .. attempt_s
  redis.call('ZREM', k('queue', v.t[4]), id)
  index_status(id, 'queued', 'assigned', v.t[6])
  redis.call('HSET', k('task', id), 'status', 'assigned', 'host_id', host_id, 'device_id', did,
    'attempt', attempt_s, 'lease_id', lease, 'lease_expires_at', expires_s, 'assigned_at',
    now_s, 'updated_at', now_s)
  if (v.t[8] or '') ~= '' or (v.t[9] or '') ~= '' then redis.call('HDEL', k('avoid'), id) end
  -- a queue deadline applies while queued only (requeue files it again)
  if v.t[10] and v.t[10] ~= '' then redis.call('ZREM', k('deadlines'), id) end
  redis.call('ZADD', k('leases'), expires_s, id)
  if (v.t[15] or '') ~= '' then redis.call('ZADD', k('preemptible'), now_s, id) end
  if (v.t[16] or '') ~= '' then  -- it preempted a run: its hold (on this device or another) ends
    if redis.call('HGET', k('device', v.t[16]), 'preempt_for') == id then
      redis.call('HDEL', k('device', v.t[16]), 'preempt_for')
    end
    redis.call('ZREM', k('preempt', 'handover'), id)
    redis.call('HSET', k('task', id), 'preempting', '')
  end
  limits_count(host_id, v.t[11], 1)
  redis.call('HSET', k('device', did), 'reserved_by', id, 'lease_id', lease, 'last_assigned_at',
    now_s)
  idle_remove(did, v.d[5], v.d[6])
  redis.call('RPUSH', k('task', id, 'attempts'), cjson.encode({attempt = attempt, lease_id = lease,
    host_id = host_id, device_id = did, assigned_at = now, outcome = 'active'}))
  if via then
    emit('assigned', 'task', id, 'lease', lease, 'host', host_id, 'device', did, 'attempt',
      attempt_s, 'sig', v.t[4], 'queued_ms', I(now - tonumber(v.t[7])), 'via', via)
  else
    emit('assigned', 'task', id, 'lease', lease, 'host', host_id, 'device', did, 'attempt',
      attempt_s, 'sig', v.t[4], 'queued_ms', I(now - tonumber(v.t[7])))
  end
  return lease
end
