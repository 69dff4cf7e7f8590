--- @include "lib/base"
--- @include "lib/idle"
--- @include "lib/args"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/auth"
--- @include "lib/eligibility"
--- @include "lib/history"
-- device_health.lua: a device's health check, run by its host's daemon (deviceq.host.health).
-- A check goes through the same reservation as a task: `begin` takes the device only while it
-- holds no lease (reserved_by empty) and is not booked by a person, sets health=checking and
-- takes it out of the idle candidates (assign.lua refuses a checking device), so a check never
-- overlaps a task. `next` marks the device for a check after the task that holds it: it is
-- `checking` at once (accepted while a lease holds it), so when that task ends the device does
-- not go back among the idle candidates (the scheduler cannot take it first under a busy
-- queue); the host then calls `begin` once its run has ended. `end` records the result:
-- health healthy | unhealthy, health_checked_at (ms), health_output (the output's tail),
-- health_reason; a healthy device that is otherwise an idle candidate (idle, unreserved, not
-- quarantined, not held, not booked) goes back among the idle candidates; an unhealthy one
-- stays out (heartbeat, report, unquarantine and the end of a booking leave it out too) until
-- a later check passes. `clear`: the host no longer checks
-- this device (its daemon runs without a check for the driver type): the health fields go and
-- the device is a candidate again when otherwise idle.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token session action(begin | next | end | clear) device_id, and for end:
--          result(healthy | unhealthy) output(at most 4096 bytes) reason(at most 200 bytes,
--          no control characters; '' for healthy)
-- Keys     reads host:ID, config; reads/writes device:ID, device:ID:log, idle, idle:c:*, events, sched:wake
-- Returns  begin, next: the device's health before ('' when never checked); end: the health
--          recorded; clear: the health before
-- Errors   AUTH (unknown host / wrong token), SUPERSEDED (not the current session), INVALID
--          (bad arguments), NOT_FOUND (no device; end without a check in progress),
--          DEVICE_OWNED (the device belongs to another host), BUSY (begin, end: the device holds
--          a lease; begin, next: it is booked by a person; nothing is changed: try later)
local host_id, token, session = ARGV[1], ARGV[2], ARGV[3]
local hk, err = auth_host(host_id, token, session or '')
if not hk then return err end
local action, did = ARGV[4], ARGV[5]
if action ~= 'begin' and action ~= 'next' and action ~= 'end' and action ~= 'clear' then
  return fail('INVALID', 'action must be begin, next, end or clear')
end
if (action == 'end' and #ARGV ~= 8) or (action ~= 'end' and #ARGV ~= 5) then
  return fail('INVALID', 'bad argument count')
end
if not valid_id(did) then return fail('INVALID', 'malformed device id') end
local result, output, reason = ARGV[6], ARGV[7], ARGV[8]
if action == 'end' then
  if result ~= 'healthy' and result ~= 'unhealthy' then
    return fail('INVALID', 'result must be healthy or unhealthy')
  end
  if #output > 4096 then return fail('INVALID', 'output over 4096 bytes (send its tail)') end
  if #reason > 200 or reason:find('%c') then
    return fail('INVALID', 'reason must be at most 200 bytes without control characters')
  end
  if result == 'healthy' and reason ~= '' then
    return fail('INVALID', 'a healthy result takes no reason')
  end
end

local dk = k('device', did)
local d = redis.call('HMGET', dk, 'host_id', 'state', 'reserved_by', 'quarantined', 'held',
  'booked_until', 'health')
if not d[1] then return fail('NOT_FOUND', 'no device ' .. did) end
if d[1] ~= host_id then return fail('DEVICE_OWNED', 'device ' .. did .. ' belongs to another host') end
local before = d[7] or ''

if action == 'begin' then
  if d[3] and d[3] ~= '' then return fail('BUSY', 'device ' .. did .. ' is running task ' .. d[3]) end
  if d[6] and d[6] ~= '' then return fail('BUSY', 'device ' .. did .. ' is reserved for a person') end
  redis.call('HSET', dk, 'health', 'checking', 'health_started_at', now_str())
  idle_remove(did)
  emit('health_check_started', 'device', did, 'host', host_id, 'was', before)
  return before
end

if action == 'next' then
  if d[6] and d[6] ~= '' then return fail('BUSY', 'device ' .. did .. ' is reserved for a person') end
  if before ~= 'checking' then
    redis.call('HSET', dk, 'health', 'checking')
    idle_remove(did)
    emit('health_check_due', 'device', did, 'host', host_id, 'was', before, 'task', d[3] or '')
  end
  return before
end

-- back among the idle candidates when the rule allows (refresh_idle in lib/eligibility.lua)
local function maybe_idle()
  local _, added = refresh_idle(did, gate(did))
  if added then wake(k('sched', 'wake')) end
end

if action == 'clear' then
  if before ~= '' then
    redis.call('HDEL', dk, 'health', 'health_started_at', 'health_checked_at', 'health_output',
      'health_reason')
    maybe_idle()
    emit('device_health_cleared', 'device', did, 'host', host_id, 'was', before)
    device_log(did, {event = 'health', result = 'cleared'})
  end
  return before
end

-- end
if before ~= 'checking' then
  return fail('NOT_FOUND', 'no health check in progress on device ' .. did)
end
if d[3] and d[3] ~= '' then
  return fail('BUSY', 'device ' .. did .. ' is running task ' .. d[3] .. ': no check can have run')
end
if result == 'unhealthy' and reason == '' then reason = 'health check failed' end
redis.call('HSET', dk, 'health', result, 'health_checked_at', now_str(), 'health_output', output,
  'health_reason', reason)
device_log(did, {event = 'health', result = result, reason = reason})
if result == 'healthy' then
  maybe_idle()
  emit('device_healthy', 'device', did, 'host', host_id)
else
  idle_remove(did)
  emit('device_unhealthy', 'device', did, 'host', host_id, 'reason', reason)
end
return result
