--- @include "lib/base"
-- lib/history.lua: a device's recent past: its attempt ends and its change log.

-- a device's recent attempts, newest first: device:ID:history holds the last DEVICE_RECENT
-- attempt ends on it as JSON {task, attempt, outcome, failure_kind, at (ms)} (LPUSH + LTRIM:
-- O(1) per call). `rec` is the closed attempt record of task `id`.
local DEVICE_RECENT = 20
local function device_history(did, id, rec)
  if not did or did == '' then return end
  local key = k('device', did, 'history')
  redis.call('LPUSH', key, cjson.encode({task = id, attempt = rec.attempt, outcome = rec.outcome,
    failure_kind = rec.failure_kind or cjson.null, at = rec.ended_at}))
  redis.call('LTRIM', key, '0', I(DEVICE_RECENT - 1))
end

-- a device's change log, newest first: device:ID:log holds its last DEVICE_RECENT quarantine,
-- health check and booking changes as JSON {event, at (ms), ...}: quarantined (reason, by),
-- unquarantined (by), health (result, reason), booked (by, until), booking_ended (event,
-- by). O(1) per call.
local function device_log(did, entry)
  if not did or did == '' then return end
  entry.at = now_ms()
  local key = k('device', did, 'log')
  redis.call('LPUSH', key, cjson.encode(entry))
  redis.call('LTRIM', key, '0', I(DEVICE_RECENT - 1))
end
