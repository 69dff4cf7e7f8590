--- @include "lib/base"
--- @include "lib/history"
-- lib/attempts.lua: closing a task's attempt record.

-- close the current attempt record (list index attempt-1) with an outcome; the attempt's device
-- remembers it (device_history) unless `whole_gang` (a multi-device task's own record: its
-- parts' records are the ones on their devices)
local function close_attempt(id, attempt, outcome, extra, whole_gang)
  local ak = k('task', id, 'attempts')
  local idx = (tonumber(attempt) or 0) - 1
  if idx < 0 then return end
  local raw = redis.call('LINDEX', ak, I(idx))
  if not raw then return end
  local rec = cjson.decode(raw)
  rec.outcome = outcome
  rec.ended_at = now_ms()
  if extra then for key, v in pairs(extra) do rec[key] = v end end
  redis.call('LSET', ak, I(idx), cjson.encode(rec))
  if not whole_gang then device_history(rec.device_id, id, rec) end
end
