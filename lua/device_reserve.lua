--- @include "lib/base"
--- @include "lib/idle"
--- @include "lib/args"
--- @include "lib/events"
--- @include "lib/liveness"
--- @include "lib/eligibility"
--- @include "lib/bookings"
--- @include "lib/history"
--- @include "lib/where"
-- device_reserve.lua: a person's reservation ("booking") of a device, by an operator:
-- reserve (take an idle device for a duration), extend (push the end of a reservation out)
-- or release (end it early). A reserved device holds no lease and is out of the idle
-- candidates until the reservation ends; expire.lua ends it by itself at its end.
-- Reserve takes the device only when it is idle now: registered, reported idle, holding no
-- lease (reserved_by, the task of its lease, is empty), not quarantined, not held, its host
-- alive (heartbeat within host_timeout); else BUSY with the reason (nothing is pending).
-- Device hash fields: booked_by (the note: who, why), booked_until (ms), booked_at (ms);
-- `bookings` indexes booked devices by their end.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     action(reserve | extend | release) device_id duration_ms note.
--          reserve: duration_ms 1000..604800000 (7 days), note 1-200 bytes, no control
--          characters. extend: the end moves out by duration_ms (the end at most 7 days from
--          now); note '' keeps the current one. release: duration_ms and note ''.
--          reserve may add a fifth argument, compiled --where clauses (deviceq.core.where):
--          the device's attributes must satisfy them (else BUSY, naming the first that fails).
-- Keys     reads config, host:ID, device:ID:attrs; reads/writes device:ID, device:ID:log, idle, idle:c:*, bookings, events,
--          sched:wake
-- Returns  reserve/extend: {booked_until(ms), booked_by, host_id}; release: the host id
-- Errors   INVALID (bad arguments, or an extension past 7 days from now), NOT_FOUND (no
--          device; extend/release of a device that is not reserved), EXISTS (reserve of a
--          device already reserved: extend it instead), BUSY (the device is not idle: leased,
--          quarantined, held, running a health check, busy/offline, or its host is dead)
local MAX_MS = 604800000
local action, did, dur_s, note, where = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if #ARGV ~= 4 and not (#ARGV == 5 and action == 'reserve') then
  return fail('INVALID', 'bad argument count')
end
if where and where ~= '' and not valid_where(where) then return fail('INVALID', 'malformed where') end
if action ~= 'reserve' and action ~= 'extend' and action ~= 'release' then
  return fail('INVALID', 'action must be reserve, extend or release')
end
if not valid_id(did) then return fail('INVALID', 'malformed device id') end
local dur
if action == 'release' then
  if dur_s ~= '' or note ~= '' then return fail('INVALID', 'release takes no duration or note') end
else
  dur = int_in(dur_s, 1000, MAX_MS)
  if not dur then return fail('INVALID', 'duration must be 1s to 7 days (in ms: 1000-604800000)') end
  if type(note) ~= 'string' or #note > 200 or note:find('%c') or (action == 'reserve' and note == '') then
    return fail('INVALID', 'note must be 1-200 bytes without control characters')
  end
end

local dk = k('device', did)
local d = redis.call('HMGET', dk, 'host_id', 'state', 'reserved_by', 'quarantined', 'held',
  'booked_until', 'booked_by', 'health')
if not d[1] then return fail('NOT_FOUND', 'no device ' .. did) end
local booked = d[6] and d[6] ~= ''
local now = now_ms()

if action == 'release' then
  if not booked then return fail('NOT_FOUND', 'device ' .. did .. ' is not reserved') end
  end_booking(did, 'device_released')
  device_log(did, {event = 'released', by = d[7] or ''})
  return d[1]
end

if action == 'extend' then
  if not booked then return fail('NOT_FOUND', 'device ' .. did .. ' is not reserved') end
  local untl = math.max(tonumber(d[6]) or now, now) + dur
  if untl - now > MAX_MS then
    return fail('INVALID', 'a reservation ends at most 7 days from now (this one would end in ' ..
      math.floor((untl - now) / 3600000) .. 'h)')
  end
  local by = note ~= '' and note or (d[7] or '')
  redis.call('HSET', dk, 'booked_until', I(untl), 'booked_by', by)
  redis.call('ZADD', k('bookings'), I(untl), did)
  emit('device_reserved', 'device', did, 'host', d[1], 'by', by, 'until', I(untl), 'extended', '1')
  device_log(did, {event = 'booked', by = by, ['until'] = untl, extended = true})
  return {I(untl), by, d[1]}
end

-- reserve
if booked then
  return fail('EXISTS', 'device ' .. did .. ' is already reserved by "' .. (d[7] or '') .. '" until ' ..
    d[6] .. ' (ms); extend it instead')
end
-- idle now by the eligibility rule (device_blocker), except that a person may take an
-- unhealthy device (to look at it)
local why = device_blocker({state = d[2], reserved_by = d[3], quarantined = d[4], held = d[5],
  booked_until = '', health = d[8] ~= 'unhealthy' and d[8] or ''})
if why == 'reserved' then return fail('BUSY', 'device ' .. did .. ' is running task ' .. d[3]) end
if why == 'quarantined' then return fail('BUSY', 'device ' .. did .. ' is quarantined') end
if why == 'suspect' or why == 'held' then
  return fail('BUSY', 'device ' .. did .. ' is held (' .. d[5] .. ') until its host\'s next heartbeat')
end
if why == 'checking' then return fail('BUSY', 'device ' .. did .. ' is running a health check') end
if why then return fail('BUSY', 'device ' .. did .. ' is ' .. why .. ', not idle') end
if not host_alive(k('host', d[1])) then
  return fail('BUSY', 'host ' .. d[1] .. ' of device ' .. did .. ' stopped heartbeating')
end
local failed = where and where ~= '' and where_fails(did, where)
if failed then
  return fail('BUSY', 'device ' .. did .. ' does not satisfy --where (' .. failed[1] .. ' ' .. failed[2] .. ')')
end
local untl = I(now + dur)
redis.call('HSET', dk, 'booked_by', note, 'booked_until', untl, 'booked_at', now_str())
idle_remove(did)
redis.call('ZADD', k('bookings'), untl, did)
emit('device_reserved', 'device', did, 'host', d[1], 'by', note, 'until', untl)
device_log(did, {event = 'booked', by = note, ['until'] = now + dur})
return {untl, note, d[1]}
