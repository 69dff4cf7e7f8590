--- @include "lib/base"
--- @include "lib/idle"
--- @include "lib/args"
--- @include "lib/text"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/eligibility"
--- @include "lib/history"
-- device_quarantine.lua: take a device out of (1) or put it back into (0) assignment, by an
-- operator. Unquarantine also resets its consecutive failure count (of a quarantined device). The owning host's daemon
-- is told at once (host:ID:ctl). The reason (default "operator") is stored as the device's
-- quarantine_reason and carried by the device_quarantined event; both changes are written to
-- the device's change log (device:ID:log).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     device_id quarantined(1|0) [reason: at most 200 bytes of UTF-8, no control
--          characters; '' or absent = "operator"] [by: who, an id; '' or absent = "operator";
--          the events' and the change log's `by`]
-- Keys     reads/writes device:ID, device:ID:log, idle, idle:c:*, qdrivers, faults, host:ID:ctl,
--          host:ID:quarantined, events, sched:wake; reads config
-- Returns  "quarantined" | "released" | "not_quarantined" (unquarantine of a device that is not
--          quarantined: nothing changed, its failure count included)
-- Errors   NOT_FOUND (no device), INVALID
local did, flag, reason, by = ARGV[1], ARGV[2], ARGV[3] or '', ARGV[4] or ''
if not valid_id(did) then return fail('INVALID', 'malformed device id') end
if (flag ~= '1' and flag ~= '0') or #ARGV < 2 or #ARGV > 4 then
  return fail('INVALID', 'quarantined must be 1 or 0')
end
if #reason > 200 or reason:find('%c') or not valid_utf8(reason) then
  return fail('INVALID', 'reason must be at most 200 bytes of text without control characters')
end
if reason == '' then reason = 'operator' end
if not actor_fields(by) then return fail('INVALID', 'malformed actor (by)') end
if by == '' then by = 'operator' end
local dk = k('device', did)
local d = redis.call('HMGET', dk, 'host_id', 'state', 'reserved_by', 'quarantined', 'driver_type', 'held',
  'booked_until', 'health')
if not d[1] then return fail('NOT_FOUND', 'no device ' .. did) end
local function count(by)
  if redis.call('HINCRBY', k('qdrivers'), d[5] or '', by) <= 0 then redis.call('HDEL', k('qdrivers'), d[5] or '') end
end
if flag == '1' then
  if d[4] ~= '1' then
    redis.call('HSET', dk, 'quarantined', '1', 'quarantined_at', now_str(), 'quarantine_reason', reason)
    idle_remove(did)
    redis.call('SADD', k('host', d[1], 'quarantined'), did)
    count(1)
    ctl(d[1], 'quarantine')
    emit('device_quarantined', 'device', did, 'host', d[1], 'by', by, 'reason', reason)
    device_log(did, {event = 'quarantined', reason = reason, by = by})
  end
  return 'quarantined'
end
if d[4] ~= '1' then return 'not_quarantined' end  -- (nothing changed)
redis.call('HSET', dk, 'quarantined', '0', 'consecutive_failures', '0', 'attention', '', 'quarantine_reason', '')
redis.call('HDEL', k('faults'), did)
redis.call('SREM', k('host', d[1], 'quarantined'), did)
count(-1)
ctl(d[1], 'quarantine')
emit('device_unquarantined', 'device', did, 'host', d[1], 'by', by)
device_log(did, {event = 'unquarantined', by = by})
local _, added = refresh_idle(did, gate(did))
if added then wake(k('sched', 'wake')) end
return 'released'
