--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/tasks"
--- @include "lib/removal"
--- @include "lib/handback"
--- @include "gen/statuses"
-- host_remove.lua: delete a host and its devices. Refused while any of its devices holds a
-- lease (drain it and let its work finish first), unless force: each such task is handed back
-- first (no attempt spent; it is queued again). A daemon still running for the host is told
-- at once (host:ID:ctl); its next call is refused and it exits.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id [force(0|1), default 0]
-- Keys     reads/writes device:ID:attrs, device:ID:attrs_at, device:ID:attrs_host, attr_names, host:ID, host:ID:devices, host:ID:inbox, host:ID:wake, host:ID:ctl,
--          host:ID:quarantined, host:ID:held_devices, host:ID:sync, host:ID:leftout,
--          device:ID, device:ID:history, device:ID:log, devices, idle, idle:c:*, bookings, faults, caps,
--          drivers, qdrivers, hosts, devgen, events; with force also task:ID, preemptible,
--          task:ID:attempts, task:ID:goal, task:ID:tests, leases, status:*, queue:SIG, sig:SIG, queues,
--          deadlines, avoid, retries, gangs, cooling, LIMIT_COUNTERS, sched:wake, host:ID:ctl; reads config, gates
-- Returns  {devices removed, tasks handed back}
-- Errors   NOT_FOUND (no host), BUSY (a device holds a lease and force is not given), INVALID
local host_id, force = ARGV[1], ARGV[2] or '0'
if not valid_id(host_id) or #ARGV > 2 then return fail('INVALID', 'malformed host id') end
if force ~= '0' and force ~= '1' then return fail('INVALID', 'force must be 0 or 1') end
local hk = k('host', host_id)
if redis.call('EXISTS', hk) == 0 then return fail('NOT_FOUND', 'no host ' .. host_id) end
local devs = redis.call('SMEMBERS', k('host', host_id, 'devices'))
local running = {}
for _, did in ipairs(devs) do
  local r = redis.call('HGET', k('device', did), 'reserved_by')
  if r and r ~= '' then
    if force ~= '1' then
      return fail('BUSY', 'device ' .. did .. ' of host ' .. host_id .. ' is running task ' .. r ..
        ' (force hands it back)')
    end
    running[#running + 1] = r
  end
end
local handed = 0
for _, tid in ipairs(running) do
  local t = load_task(tid)
  if LEASED[t.status] then
    hand_back(tid, t, 'host ' .. host_id .. ' removed', true)
    handed = handed + 1
  end
end
for _, did in ipairs(devs) do
  delete_device(did)
end
redis.call('DEL', hk, k('host', host_id, 'devices'), k('host', host_id, 'inbox'), k('host', host_id, 'wake'),
  k('host', host_id, 'quarantined'), k('host', host_id, 'held_devices'), k('host', host_id, 'sync'),
  k('host', host_id, 'leftout'))
redis.call('SREM', k('hosts'), host_id)
ctl(host_id, 'removed')
if #devs > 0 then redis.call('INCR', k('devgen')) end  -- schedulers drop cached attributes
if handed > 0 then wake(k('sched', 'wake')) end
emit('host_removed', 'host', host_id, 'handed_back', I(handed))
return {#devs, handed}
