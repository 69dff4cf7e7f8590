--- @include "lib/base"
--- @include "lib/eligibility"
--- @include "lib/events"
--- @include "lib/notify"
-- lib/bookings.lua: the end of a person's reservation of a device.

-- end a person's reservation (booking) of device `did`: the device hash fields booked_by
-- (note), booked_until (ms) and booked_at (ms) go, so does its `bookings` entry (zset by end),
-- and the device is back among the idle candidates when the rule allows. `kind` is the event:
-- device_released | reservation_expired.
-- Returns the device's host id, or nil when the device is not booked (or gone).
local function end_booking(did, kind)
  local dk = k('device', did)
  redis.call('ZREM', k('bookings'), did)
  local d = redis.call('HMGET', dk, 'host_id', 'booked_until', 'booked_by')
  if not d[1] or not d[2] or d[2] == '' then return nil end
  redis.call('HDEL', dk, 'booked_by', 'booked_until', 'booked_at')
  local g = gate(did)
  local _, added = refresh_idle(did, g)
  if added then wake(k('sched', 'wake')) end
  emit(kind, 'device', did, 'host', d[1], 'by', d[3] or '', 'until', d[2])
  return d[1]
end
