--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/liveness"
--- @include "lib/tasks"
--- @include "lib/removal"
--- @include "lib/handback"
--- @include "gen/statuses"
-- device_remove.lua: delete one device (retired, replaced, or a ghost its host no longer
-- reports), by an operator. Refused while a lease holds it (a task is assigned to it or runs
-- on it) and while its live host still reports it (it would be registered again at the
-- host's next heartbeat: take it out of the host's device list first), unless force: a task
-- holding it is handed back first (no attempt spent; it is queued again) and its host is told
-- at once (host:ID:ctl), so the run is stopped.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     device_id force(0|1)
-- Keys     reads/writes device:ID:attrs, device:ID:attrs_at, device:ID:attrs_host, attr_names, device:ID, device:ID:history, device:ID:log, devices, host:ID:devices,
--          host:ID:quarantined, host:ID:held_devices,
--          idle, idle:c:*, bookings, faults, caps, drivers, qdrivers, devgen, events, host:ID:ctl; with
--          force also task:ID, task:ID:attempts, task:ID:goal, task:ID:tests, leases, preemptible, host:ID:inbox,
--          status:*, queue:SIG, sig:SIG, queues, deadlines, avoid, retries, gangs,
--          LIMIT_COUNTERS, cooling, sched:wake; reads host:ID, config, gates
-- Returns  {host_id, task id handed back ('' when none), reported(1: its live host still
--          reports it)}
-- Errors   NOT_FOUND (no device), BUSY (a lease holds it, or its live host reports it, and
--          force is not given), INVALID
local did, force = ARGV[1], ARGV[2]
if not valid_id(did) then return fail('INVALID', 'malformed device id') end
if (force ~= '0' and force ~= '1') or #ARGV ~= 2 then return fail('INVALID', 'force must be 0 or 1') end
local dk = k('device', did)
local d = redis.call('HMGET', dk, 'host_id', 'reserved_by', 'state')
if not d[1] then return fail('NOT_FOUND', 'no device ' .. did) end
local tid = d[2] or ''
local reported = d[3] ~= 'offline' and host_alive(k('host', d[1]))
if force ~= '1' then
  if tid ~= '' then
    return fail('BUSY', 'device ' .. did .. ' is running task ' .. tid .. ' (force hands it back)')
  end
  if reported then
    return fail('BUSY', 'device ' .. did .. ' is still reported by its live host ' .. d[1] ..
      ': take it out of the host\'s device list first (force removes it now; the host registers' ..
      ' it again at its next heartbeat)')
  end
end
local handed = ''
if tid ~= '' then
  local t = load_task(tid)
  if LEASED[t.status] and t.device_id == did then
    hand_back(tid, t, 'device ' .. did .. ' removed', true)
    handed = tid
    wake(k('sched', 'wake'))
  end
end
delete_device(did)
redis.call('INCR', k('devgen'))  -- schedulers drop cached attributes
ctl(d[1], 'device_removed')
emit('device_removed', 'device', did, 'host', d[1], 'handed_back', handed)
return {d[1], handed, reported and 1 or 0}
