--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/text"
--- @include "lib/auth"
--- @include "gen/statuses"
--- @include "gen/args/progress"
-- progress.lua: the owning host records how far its running attempts are (what a runner said
-- with task.progress or a `::deviceq progress` line): fields progress (a fraction 0..1),
-- progress_text, progress_at (Redis TIME, ms) and progress_lease (the lease it belongs to) of
-- task:ID. Only the task's current lease, held by the caller's host and (dispatched) current
-- session, may write: a host writes only its own attempts' progress. Readers show it only
-- while progress_lease is the task's lease_id, so a new attempt starts without progress and a
-- finished task keeps its last attempt's. The host sends at most one update a second per run
-- (the latest value), and the last one before its report.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token session n(1..1000) updates: packed (deviceq.core.script_args
--          PROGRESS, gen/args/progress): one cmsgpack array of n * UPDATE_N values, update
--          after update:
--   task_id   the task
--   lease_id  its lease held by this host
--   fraction  decimal text, 0..1
--   text      at most 800 bytes of UTF-8 without control characters (deviceq.host.progress
--             caps it at 200 characters)
-- Keys     reads host:ID, task:ID; writes task:ID
-- Returns  per update a string: "ok" (recorded) or "rejected:REASON" with REASON one of
--          not_found superseded not_owner ended (the attempt is no longer running).
-- Errors   AUTH (unknown host / wrong token), SUPERSEDED (not the current session),
--          INVALID (bad arguments; nothing is written).
local host_id, token, session = ARGV[1], ARGV[2], ARGV[3]
local hk, err = auth_host(host_id, token, session or '')
if not hk then return err end
local n = int_in(ARGV[4], 1, 1000)
local A = #ARGV == 5 and packed_items(ARGV[5], n, UPDATE_N)
if not A then return fail('INVALID', 'bad argument count') end
for i = 0, n - 1 do
  local b = i * UPDATE_N
  if not valid_id(A[b + UPDATE_TASK_ID]) or not valid_id(A[b + UPDATE_LEASE_ID]) then
    return fail('INVALID', 'malformed task or lease id')
  end
  if not num_in(A[b + UPDATE_FRACTION], 0, 1) then
    return fail('INVALID', 'progress must be a number from 0 to 1')
  end
  local text = A[b + UPDATE_TEXT]
  if type(text) ~= 'string' or #text > 800 or text:find('%c') or not valid_utf8(text) then
    return fail('INVALID', 'progress text must be at most 800 bytes of UTF-8 without control characters')
  end
end
local now = now_str()
local out = {}
for i = 0, n - 1 do
  local b = i * UPDATE_N
  local id, lease = A[b + UPDATE_TASK_ID], A[b + UPDATE_LEASE_ID]
  local tk = k('task', id)
  local t = redis.call('HMGET', tk, 'status', 'lease_id', 'host_id', 'session')
  if not t[1] then out[#out + 1] = 'rejected:not_found'
  elseif t[2] ~= lease then out[#out + 1] = 'rejected:superseded'
  elseif t[3] ~= host_id then out[#out + 1] = 'rejected:not_owner'
  elseif not LEASED[t[1]] then out[#out + 1] = 'rejected:ended'
  elseif t[1] == 'dispatched' and (t[4] or '') ~= (session or '') then
    out[#out + 1] = 'rejected:superseded'
  else
    redis.call('HSET', tk, 'progress', A[b + UPDATE_FRACTION], 'progress_text', A[b + UPDATE_TEXT],
      'progress_at', now, 'progress_lease', lease)
    out[#out + 1] = 'ok'
  end
end
return out
