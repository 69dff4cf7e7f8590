--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "gen/statuses"
--- @include "lib/queue"
--- @include "lib/tasks"
--- @include "lib/attempts"
--- @include "lib/leases"
--- @include "lib/outcomes"
-- cancel.lua: cancel a task. queued: cancelled at once. assigned (no runner started yet):
-- cancelled at once, reservation released, inbox entry dropped. dispatched: flagged
-- (cancel_requested=1) and its host told at once (host:ID:ctl); the host stops the runner and
-- reports `cancelled`, or expiry ends it. A multi-device task that holds devices is cancelled
-- at once: every part's lease ends, its devices are released and its hosts told (their
-- renewal then finds the lease lost and stops the runner).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     task_id reason(at most 500 bytes) [by: who cancels it, an id ('' or absent = not
--          recorded); carried as `by` by the cancel_requested / cancelled event]
-- Keys     reads/writes task:ID, task:ID:attempts, task:ID:goal, task:ID:tests, queue:SIG, sig:SIG, queues, deadlines,
--          avoid, leases, host:ID:inbox, host:ID:ctl, device:ID, idle, idle:c:*, status:*, retries,
--          LIMIT_COUNTERS, preemptible, gangs, cooling, task:ID.ROLE, device:ID:history, events, sched:wake; reads
--          config, gates
-- Returns  "cancelled" | "requested" | "already:STATUS" (terminal already: nothing changed)
-- Errors   NOT_FOUND (no such task), INVALID (malformed id or reason).
local id, reason, by = ARGV[1], ARGV[2], ARGV[3] or ''
if not valid_id(id) then return fail('INVALID', 'malformed task id') end
if (#ARGV ~= 2 and #ARGV ~= 3) or #reason > 500 then return fail('INVALID', 'reason must be at most 500 bytes') end
local who = actor_fields(by)
if not who then return fail('INVALID', 'malformed actor (by)') end
local t = load_task(id)
if not t.status then return fail('NOT_FOUND', 'no task ' .. id) end
if TERMINAL[t.status] then return 'already:' .. t.status end
if (t.gang or '') ~= '' then
  return fail('INVALID', 'task ' .. id .. ' is a part of multi-device task ' .. t.gang .. ': cancel that')
end
if (t.roles or '') ~= '' and t.status ~= 'queued' then  -- a gang: every part ends now
  gang_end(id, '', 'cancelled', 'cancelled', reason, nil, who)
  return 'cancelled'
end
if t.status == 'dispatched' then
  if t.cancel_requested ~= '1' then
    redis.call('HSET', k('task', id), 'cancel_requested', '1', 'updated_at', now_str())
    emit('cancel_requested', 'task', id, 'lease', t.lease_id, 'host', t.host_id, 'device', t.device_id,
      unpack(who))
    ctl(t.host_id, 'cancel')
  end
  return 'requested'
end
if t.status == 'queued' then
  from_queue(id, t)
  redis.call('ZREM', k('deadlines'), id)
else -- assigned: nothing runs yet
  drop_lease(id, t)
  release_device(t.device_id, id, nil)
  close_attempt(id, t.attempt, 'cancelled', {failure_kind = 'cancelled'})
  wake(k('sched', 'wake'))
end
finish(id, t, t.status, 'cancelled', 'cancelled', reason, who)
return 'cancelled'
