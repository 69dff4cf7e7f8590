--- @include "lib/base"
--- @include "lib/config"
--- @include "lib/args"
--- @include "lib/auth"
--- @include "gen/statuses"
--- @include "gen/args/renew"
-- renew.lua: the current lease holder extends one or more leases by lease_ttl from now (the
-- pool setting as it is now: a settings change applies at the next renewal of every lease).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token session n(0..10000) leases: packed (deviceq.core.script_args RENEW,
--          gen/args/renew): one cmsgpack array of n * LEASE_N values, lease after lease:
--   task_id   the task
--   lease_id  its lease held by this host
-- Keys     reads host:ID, task:ID, config; writes task:ID, leases
-- Returns  per lease a flat triple: {"ok", expires_at_ms, lease_ms} or {"cancel", expires_at_ms,
--          lease_ms} (renewed, and a cancel was requested: stop the runner and report
--          `cancelled`), or {"preempt:GRACE_MS", expires_at_ms, lease_ms} (renewed, and the task
--          was preempted (preempt.lua): stop the runner, giving it GRACE_MS after its stop signal,
--          and report `preempted`), or {"lost", REASON, 0} with REASON one of not_found superseded expired
--          gang_ended (another part of its multi-device task ended) finished not_owner: the
--          lease is gone and the worker must stop that runner and report nothing.
-- Errors   AUTH (unknown host / wrong token), SUPERSEDED (not the current session),
--          INVALID (bad arguments).
local host_id, token, session = ARGV[1], ARGV[2], ARGV[3]
local hk, err = auth_host(host_id, token, session or '')
if not hk then return err end
local n = int_in(ARGV[4], 0, 10000)
local A = #ARGV == 5 and packed_items(ARGV[5], n, LEASE_N)
if not A then return fail('INVALID', 'bad argument count') end
for i = 0, n - 1 do
  if not valid_id(A[i * LEASE_N + LEASE_TASK_ID]) or not valid_id(A[i * LEASE_N + LEASE_LEASE_ID]) then
    return fail('INVALID', 'malformed task or lease id')
  end
end
local now = now_ms()
local ttl = cfg_ms('lease_ttl')
local expires_s = I(now + ttl)
local out = {}
for i = 0, n - 1 do
  local id, lease = A[i * LEASE_N + LEASE_TASK_ID], A[i * LEASE_N + LEASE_LEASE_ID]
  local tk = k('task', id)
  local t = redis.call('HMGET', tk, 'status', 'lease_id', 'host_id', 'lease_expires_at',
    'cancel_requested', 'session', 'gang', 'preempt_by', 'preempt_grace_ms')
  local reason
  if not t[1] then reason = 'not_found'
  elseif TERMINAL[t[1]] then reason = t[2] == lease and 'finished' or 'superseded'
  elseif t[1] == 'queued' and (t[7] or '') ~= '' then reason = 'gang_ended'  -- another part ended
  elseif t[1] == 'queued' then reason = 'expired'  -- its lease expired (or was handed back)
  elseif t[2] ~= lease then reason = 'superseded'
  elseif t[3] ~= host_id then reason = 'not_owner'
  elseif t[1] == 'dispatched' and (t[6] or '') ~= (session or '') then reason = 'superseded'
  elseif (tonumber(t[4]) or 0) <= now then reason = 'expired'  -- not revived: the scan ends it
  end
  if reason then
    out[#out + 1] = 'lost'; out[#out + 1] = reason; out[#out + 1] = 0
  else
    redis.call('HSET', tk, 'lease_expires_at', expires_s, 'renewed_at', now_str())
    redis.call('ZADD', k('leases'), expires_s, id)
    if t[5] == '1' then out[#out + 1] = 'cancel'
    elseif (t[8] or '') ~= '' then out[#out + 1] = 'preempt:' .. (t[9] or '0')
    else out[#out + 1] = 'ok' end
    out[#out + 1] = expires_s
    out[#out + 1] = ttl
  end
end
return out
