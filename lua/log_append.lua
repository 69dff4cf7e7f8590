--- @include "lib/base"
--- @include "lib/config"
--- @include "lib/args"
--- @include "lib/auth"
--- @include "gen/statuses"
--- @include "gen/args/log_append"
--- @include "gen/bounds"
-- log_append.lua: the owning host appends chunks of its runs' output (stdout, stderr, what a
-- runner writes with task.log) to the attempt's capped log stream log:ID:ATTEMPT (the attempt
-- is the task's current one, never the caller's word). Only the
-- task's current lease, held by the caller's host and (dispatched) current session, may
-- append: a host writes only its own attempts' logs. Each append trims the stream to about
-- log_maxlen entries (XADD MAXLEN ~) and sets its expiry to the lease's remaining time plus
-- retention, so the log of a host that died mid-run still lives about `retention` past the
-- attempt's end (by lease expiry); a final chunk (the run ended, sent before its report) sets
-- it to retention exactly.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token session n(1..1000) chunks: packed (deviceq.core.script_args
--          LOG_APPEND, gen/args/log_append): one cmsgpack array of n * CHUNK_N values, chunk
--          after chunk:
--   task_id   the task
--   lease_id  its lease held by this host
--   stream    stdout | stderr | log
--   text      at most 65536 bytes; '' only with final
--   final     a number, 1: the run ended (the log's expiry is retention), else 0
-- Keys     reads host:ID, task:ID, config; writes log:ID:*
-- Returns  per chunk a string: "ok" (appended) or "rejected:REASON" with REASON one of
--          not_found superseded not_owner ended (the attempt is no longer running).
-- Errors   AUTH (unknown host / wrong token), SUPERSEDED (not the current session),
--          INVALID (bad arguments; nothing is written).
local host_id, token, session = ARGV[1], ARGV[2], ARGV[3]
local hk, err = auth_host(host_id, token, session or '')
if not hk then return err end
local n = int_in(ARGV[4], 1, 1000)
local A = #ARGV == 5 and packed_items(ARGV[5], n, CHUNK_N)
if not A then return fail('INVALID', 'bad argument count') end
local STREAMS = {stdout = true, stderr = true, log = true}
for i = 0, n - 1 do
  local b = i * CHUNK_N
  if not valid_id(A[b + CHUNK_TASK_ID]) or not valid_id(A[b + CHUNK_LEASE_ID]) then
    return fail('INVALID', 'malformed task or lease id')
  end
  if not STREAMS[A[b + CHUNK_STREAM]] then return fail('INVALID', 'stream must be stdout, stderr or log') end
  local text, final = A[b + CHUNK_TEXT], A[b + CHUNK_FINAL]
  if type(text) ~= 'string' or #text > MAX_PAYLOAD_BYTES then
    return fail('INVALID', 'chunk over ' .. MAX_PAYLOAD_BYTES .. ' bytes')
  end
  if final ~= 0 and final ~= 1 then return fail('INVALID', 'final must be 0 or 1') end
  if text == '' and final ~= 1 then return fail('INVALID', 'empty chunk') end
end
local now = now_ms()
local keep = I(cfg('log_maxlen'))
local retention = cfg_ms('retention')
local out = {}
for i = 0, n - 1 do
  local b = i * CHUNK_N
  local id, lease, stream, text, final = A[b + CHUNK_TASK_ID], A[b + CHUNK_LEASE_ID],
    A[b + CHUNK_STREAM], A[b + CHUNK_TEXT], A[b + CHUNK_FINAL]
  local t = redis.call('HMGET', k('task', id), 'status', 'lease_id', 'host_id', 'session',
    'attempt', 'lease_expires_at')
  if not t[1] then out[#out + 1] = 'rejected:not_found'
  elseif t[2] ~= lease then out[#out + 1] = 'rejected:superseded'
  elseif t[3] ~= host_id then out[#out + 1] = 'rejected:not_owner'
  elseif not LEASED[t[1]] then out[#out + 1] = 'rejected:ended'
  elseif t[1] == 'dispatched' and (t[4] or '') ~= (session or '') then
    out[#out + 1] = 'rejected:superseded'
  else
    local lk = k('log', id, t[5] or '0')
    if text ~= '' then
      redis.call('XADD', lk, 'MAXLEN', '~', keep, '*', 's', stream, 't', text)
    end
    local ttl = retention
    if final ~= 1 then ttl = math.max(0, (tonumber(t[6]) or now) - now) + retention end
    if redis.call('EXISTS', lk) == 1 then redis.call('PEXPIRE', lk, I(ttl)) end
    out[#out + 1] = 'ok'
  end
end
return out
