-- report.lua: the owning host ends attempts: done | failed | cancelled (terminal), or released
-- (handed back: the task returns to the queue at once, keeping its place; a hand-back does not
-- count against max_attempts). Only the current lease of the owning host may report; a lease past
-- its expiry that the expiry scan has not ended yet is still current (the scan decides).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token_digest n, then 5 fields per report:
--          task_id lease_id outcome failure_kind('' for done/released) payload(result or error)
-- Returns  per report a string: "ok:STATUS" (applied), "dup:STATUS" (the identical report was
--          already applied: same answer, nothing changed) or "rejected:REASON" with REASON one
--          of not_found superseded not_owner expired already_terminal cancel_not_requested.
-- Errors   AUTH (unknown host / wrong token), INVALID (bad outcome, failure_kind or arguments).
local host_id, digest, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local hk, err = auth_host(host_id, digest)
if not hk then return err end
if not n or n < 0 or #ARGV ~= 3 + n * 5 then return fail('INVALID', 'bad argument count') end
local OUTCOMES = {done = true, failed = true, cancelled = true, released = true}
local KINDS = {lease_expired = true, runner_failed = true, runner_error = true, cancelled = true,
  timeout = true, rejected = true, unschedulable = true}
for i = 0, n - 1 do
  local b = 4 + i * 5
  local outcome, kind = ARGV[b + 2], ARGV[b + 3]
  if not OUTCOMES[outcome] then return fail('INVALID', 'outcome must be done, failed, cancelled or released') end
  if outcome == 'failed' and not KINDS[kind] then return fail('INVALID', 'unknown failure_kind ' .. kind) end
  if not valid_id(ARGV[b]) or not valid_id(ARGV[b + 1]) then
    return fail('INVALID', 'malformed task or lease id')
  end
end
local now = now_ms()
local now_s = now_str()
local out, freed = {}, false
for i = 0, n - 1 do
  local b = 4 + i * 5
  local id, lease, outcome, kind, payload = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  if outcome == 'cancelled' then kind = 'cancelled' elseif outcome ~= 'failed' then kind = '' end
  local tk = k('task', id)
  local t = redis.call('HMGET', tk, 'status', 'lease_id', 'host_id', 'failure_kind', 'result',
    'error', 'device_id', 'attempt', 'seq', 'sig', 'cancel_requested', 'dispatched_at',
    'queue_deadline')
  local field = outcome == 'done' and 'result' or 'error'
  if not t[1] then out[#out + 1] = 'rejected:not_found'
  elseif TERMINAL[t[1]] then
    local same = t[2] == lease and t[3] == host_id and t[1] == outcome and (t[4] or '') == kind
      and ((outcome == 'done' and t[5] == payload) or (outcome ~= 'done' and t[6] == payload))
    if same then out[#out + 1] = 'dup:' .. t[1]
    elseif t[2] == lease then out[#out + 1] = 'rejected:already_terminal'
    else out[#out + 1] = 'rejected:superseded' end
  elseif t[1] == 'queued' then out[#out + 1] = 'rejected:expired'
  elseif t[2] ~= lease then out[#out + 1] = 'rejected:superseded'
  elseif t[3] ~= host_id then out[#out + 1] = 'rejected:not_owner'
  elseif outcome == 'cancelled' and t[11] ~= '1' then out[#out + 1] = 'rejected:cancel_not_requested'
  else
    local old = t[1]
    -- a hand-back of a task whose cancel was requested ends it as cancelled
    if outcome == 'released' and t[11] == '1' then outcome, kind = 'cancelled', 'cancelled' end
    if old == 'assigned' then redis.call('LREM', k('host', host_id, 'inbox'), 0, id) end
    redis.call('ZREM', k('leases'), id)
    local fails_before = release_device(t[7], id)
    freed = true
    local dk = k('device', t[7])
    local ran = {dispatched_at = old == 'dispatched' and tonumber(t[12]) or nil}
    if outcome == 'done' then
      if fails_before and fails_before > 0 then redis.call('HSET', dk, 'consecutive_failures', 0) end
    elseif outcome == 'failed' and kind ~= 'rejected' then
      local fails = redis.call('HINCRBY', dk, 'consecutive_failures', 1)
      local limit = cfg('quarantine_after')
      if limit > 0 and fails >= limit and redis.call('HGET', dk, 'quarantined') ~= '1' then
        redis.call('HSET', dk, 'quarantined', '1', 'quarantined_at', now)
        redis.call('ZREM', k('idle'), t[7])
        emit('device_quarantined', 'device', t[7], 'host', host_id, 'failures', fails)
      end
    end
    if outcome == 'released' then
      ran.error = payload
      close_attempt(id, t[8], 'released', ran)
      redis.call('HSET', tk, 'status', 'queued', 'host_id', '', 'device_id', '', 'lease_id', '',
        'lease_expires_at', '', 'updated_at', now_s)
      redis.call('HINCRBY', tk, 'handbacks', 1)  -- a hand-back does not use up an attempt
      if t[13] and t[13] ~= '' then redis.call('ZADD', k('deadlines'), t[13], id) end
      enqueue(id, t[10], t[9])
      index_status(id, old, 'queued', t[9])
      emit('released', 'task', id, 'lease', lease, 'host', host_id, 'device', t[7], 'attempt', t[8])
      out[#out + 1] = 'ok:queued'
    else
      ran.failure_kind = kind ~= '' and kind or nil
      close_attempt(id, t[8], outcome, ran)
      redis.call('HSET', tk, 'status', outcome, 'failure_kind', kind, field, payload,
        'finished_at', now_s, 'updated_at', now_s, 'lease_expires_at', '')
      index_status(id, old, outcome, t[9])
      emit(outcome, 'task', id, 'lease', lease, 'host', host_id, 'device', t[7], 'attempt', t[8],
        'failure_kind', kind)
      out[#out + 1] = 'ok:' .. outcome
    end
  end
end
if freed then wake(k('sched', 'wake')) end
return out
