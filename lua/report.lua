--- @include "lib/base"
--- @include "lib/idle"
--- @include "lib/config"
--- @include "lib/args"
--- @include "lib/text"
--- @include "lib/retry"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/auth"
--- @include "gen/statuses"
--- @include "gen/reports"
--- @include "lib/tasks"
--- @include "lib/history"
--- @include "lib/attempts"
--- @include "lib/limits"
--- @include "lib/affinity"
--- @include "lib/leases"
--- @include "lib/outcomes"
--- @include "lib/handback"
--- @include "lib/claims"
--- @include "lib/fence"
--- @include "lib/queue"
--- @include "lib/assignment"
--- @include "gen/args/report"
--- @include "gen/bounds"
-- report.lua: the owning host ends attempts: done | failed | cancelled (terminal), released
-- (handed back: see hand_back in lib/handback.lua), or preempted (its run stopped because
-- preempt.lua gave the device to an urgent task: the attempt ends `preempted`, the task is
-- queued again at its original place, and neither its attempts (field `preempted`, not counted
-- as used) nor the device's failure count move; the device is free, held for the urgent
-- task). Only the current lease, claimed by the caller's current session, may report; a lease
-- past its expiry that the expiry scan has not ended yet is still current (the scan decides).
-- A failure counts against the device (toward quarantine_after) only when it is the device's:
-- failure_kind infrastructure, runner_error (the runner crashed) or timeout; a task's own
-- failure (runner_failed, rejected) never does. Automatic quarantine takes at most
-- max_quarantine_fraction of one driver type's devices (but always one of two or more: a
-- small lab's only flaky phone is taken out while another stays); beyond it a
-- `quarantine_capped` event is emitted and the device is flagged `attention` instead. A device
-- with consecutive device faults is in `faults` (device -> count) until a task succeeds on
-- it: the scheduler offers it last.
-- A failure whose kind is in the task's retry_on (else the pool's), with attempts left, is
-- retried: the attempt is closed as failed (with why and when the retry becomes eligible), the
-- task is `queued` again after its retry_backoff (in `retries` until then) and prefers another
-- device and host; the reply is then "ok:queued".
-- A part of a multi-device task (task GANG.ROLE) that ends ends every other part and its task
-- GANG with it (gang_end in lib/outcomes.lua): the other parts' hosts are told on host:ID:ctl.
-- A device freed by a run that ended (done, failed, cancelled) takes its next-task hint (device
-- field `next_task`, plan_ahead.lua): while the hint's fence still leads and the pool is not
-- paused, the hinted task is assigned to it as assign.lua would (lib/assignment.lua: every
-- check, or the hint is dropped), filed in the host's inbox (so the claim below returns it)
-- and the device joins ahead:want (the scheduler chooses its next hint); its `assigned`
-- event says `via hint`.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token session n(1..10000) reports: packed (deviceq.core.script_args
--          REPORT, gen/args/report): one cmsgpack array of n * REPORT_N values, report after
--          report:
--   task_id       the task
--   lease_id      the lease it ends
--   outcome       done | failed | cancelled | released | preempted
--   failure_kind  failed: runner_failed | runner_error | timeout | rejected | infrastructure;
--                 '' otherwise
--   payload       result or error, at most 65536 bytes
--          claim_max (optional, 1..1000) [budget_us (1..10000000)]: after the reports, take up
--          to claim_max assignments from the host's inbox exactly as claim.lua does
--          (claim_inbox in lib/claims.lua: its time budget, 2,500 us unless budget_us is given,
--          bounds the claim; the reports are bounded by their count, sized by the caller)
-- Keys     reads host:ID, config, gates, drivers, qdrivers, leader, paused, tenants,
--          device:ID:attrs; writes faults, task:ID, task:ID:attempts, task:ID:goal, task:ID:tests,
--          device:ID, idle, idle:c:*, leases, host:ID:inbox, host:ID:quarantined, host:ID:held_devices,
--          status:*, qdrivers, LIMIT_COUNTERS, preemptible, cooling, events,
--          sched:wake, device:ID:history, device:ID:log; on a hand-back or a hint also
--          queue:SIG, sig:SIG, queues, deadlines, avoid, retries, gangs, host:ID:ctl,
--          preempt:handover, host:ID:wake, ahead:want
-- Returns  per report a string: "ok:STATUS" (applied), "dup:STATUS" (the identical report was
--          already applied: same answer, nothing changed) or "rejected:REASON" with REASON one
--          of not_found superseded not_owner expired already_terminal cancel_not_requested
--          preempt_not_requested. With claim_max given, one more element after the n
--          answers: claim.lua's reply {lease_ms, task1, ...[, 'more']} (an answer per report
--          first, so a reader of the n answers reads them as before).
-- Errors   AUTH (unknown host / wrong token), SUPERSEDED (not the current session),
--          INVALID (bad outcome, failure_kind or arguments; nothing is written).
local host_id, token, session = ARGV[1], ARGV[2], ARGV[3]
local hk, err = auth_host(host_id, token, session or '')
if not hk then return err end
local n = int_in(ARGV[4], 1, 10000)
local A = #ARGV >= 5 and #ARGV <= 7 and packed_items(ARGV[5], n, REPORT_N)
if not A then return fail('INVALID', 'bad argument count') end
local claim_max, budget = #ARGV >= 6 and int_in(ARGV[6], 1, 1000), nil
if #ARGV >= 6 and not claim_max then return fail('INVALID', 'claim_max must be an integer 1-1000') end
if #ARGV == 7 then
  budget = int_in(ARGV[7], 1, 10000000)
  if not budget then return fail('INVALID', 'budget_us must be an integer 1-10000000') end
end
for i = 0, n - 1 do
  local b = i * REPORT_N
  local outcome, kind = A[b + REPORT_OUTCOME], A[b + REPORT_FAILURE_KIND]
  if not OUTCOMES[outcome] then return fail('INVALID', 'outcome must be ' .. OUTCOMES_TEXT) end
  if outcome == 'failed' then
    if not HOST_KINDS[kind] then
      return fail('INVALID', 'failure_kind must be ' .. HOST_KINDS_TEXT)
    end
  elseif kind ~= '' and not (outcome == 'cancelled' and kind == 'cancelled') then
    return fail('INVALID', 'failure_kind is only given with outcome failed')
  end
  if not valid_id(A[b + REPORT_TASK_ID]) or not valid_id(A[b + REPORT_LEASE_ID]) then
    return fail('INVALID', 'malformed task or lease id')
  end
  local payload = A[b + REPORT_PAYLOAD]
  if type(payload) ~= 'string' then return fail('INVALID', 'payload must be text') end
  if #payload > MAX_PAYLOAD_BYTES then return fail('INVALID', 'payload over ' .. MAX_PAYLOAD_BYTES .. ' bytes') end
end

-- automatic quarantine of a device after its infrastructure failures (capped per driver type)
local function maybe_quarantine(did, fails)
  local limit = cfg('quarantine_after')
  local dk = k('device', did)
  if limit <= 0 or fails < limit then return end
  local d = redis.call('HMGET', dk, 'quarantined', 'driver_type', 'attention')
  if d[1] == '1' then return end
  local total = tonumber(redis.call('HGET', k('drivers'), d[2] or '') or '0') or 0
  local q = tonumber(redis.call('HGET', k('qdrivers'), d[2] or '') or '0') or 0
  local frac = cfg('max_quarantine_fraction')
  -- the cap never keeps a driver type's first device in service while another one stays
  local cap = math.max(math.floor(frac * total + 1e-9), total >= 2 and 1 or 0)
  if q + 1 > cap then
    if d[3] ~= '1' then
      redis.call('HSET', dk, 'attention', '1', 'attention_reason', fails ..
        ' consecutive infrastructure failures; not quarantined: quarantining it would take ' ..
        (q + 1) .. ' of ' .. total .. ' ' .. (d[2] or '?') .. ' devices (' ..
        math.floor((q + 1) * 100 / math.max(total, 1) + 0.5) .. '%) > ' ..
        math.floor(frac * 100 + 0.5) .. '% (max_quarantine_fraction)')
      emit('quarantine_capped', 'device', did, 'host', host_id, 'failures', I(fails), 'driver_type',
        d[2] or '', 'quarantined', I(q), 'devices', I(total))
    end
    return
  end
  local why = fails .. ' consecutive infrastructure failures'
  redis.call('HSET', dk, 'quarantined', '1', 'quarantined_at', now_str(), 'quarantine_reason', why,
    'attention', '')
  redis.call('SADD', k('host', host_id, 'quarantined'), did)
  redis.call('HINCRBY', k('qdrivers'), d[2] or '', 1)
  idle_remove(did)
  emit('device_quarantined', 'device', did, 'host', host_id, 'failures', I(fails), 'by', 'automatic',
    'reason', why)
  device_log(did, {event = 'quarantined', reason = why, by = 'automatic'})
end

-- the freed device's next-task hint, assigned if still valid (see the header)
local claim_ttl_ms, hosts_ok, hint_sigs, hint_ids, hint_devices = nil, {}, {}, {}, {}
local function take_hint(did)
  local dk = k('device', did)
  local hint = redis.call('HGET', dk, 'next_task')
  if not hint then return end
  redis.call('HDEL', dk, 'next_task')
  local fence, id = hint:match('^(%d*)|(.+)$')
  if not fence or check_fence(fence) or paused_for(fence) then return end
  local v = assignment_check(id, did, hosts_ok)
  if not v or v.d[1] ~= host_id then return end
  claim_ttl_ms = claim_ttl_ms or cfg_ms('claim_ttl')
  assignment_commit(id, did, v, now_ms(), claim_ttl_ms, 'hint')
  hint_sigs[v.t[4]] = true
  hint_ids[#hint_ids + 1] = id
  hint_devices[#hint_devices + 1] = did
end

local out, freed = {}, false
limits_defer()  -- (the limits' counts: written once per field, below)
for i = 0, n - 1 do
  local b = i * REPORT_N
  local id, lease, outcome, kind, payload = A[b + REPORT_TASK_ID], A[b + REPORT_LEASE_ID],
    A[b + REPORT_OUTCOME], A[b + REPORT_FAILURE_KIND], A[b + REPORT_PAYLOAD]
  if outcome == 'cancelled' then kind = 'cancelled' elseif outcome ~= 'failed' then kind = '' end
  local t = load_task(id)
  if not t.status then out[#out + 1] = 'rejected:not_found'
  elseif TERMINAL[t.status] then
    local same = t.lease_id == lease and t.host_id == host_id and t.status == outcome
      and (t.failure_kind or '') == kind
      and ((outcome == 'done' and t.result == payload) or (outcome ~= 'done' and t.error == payload))
    if same then out[#out + 1] = 'dup:' .. t.status
    elseif t.lease_id == lease then out[#out + 1] = 'rejected:already_terminal'
    else out[#out + 1] = 'rejected:superseded' end
  elseif t.status == 'queued' then out[#out + 1] = 'rejected:expired'
  elseif t.lease_id ~= lease then out[#out + 1] = 'rejected:superseded'
  elseif t.host_id ~= host_id then out[#out + 1] = 'rejected:not_owner'
  elseif t.status == 'dispatched' and (t.session or '') ~= (session or '') then
    out[#out + 1] = 'rejected:superseded'
  elseif outcome == 'cancelled' and t.cancel_requested ~= '1' then
    out[#out + 1] = 'rejected:cancel_not_requested'
  elseif outcome == 'preempted' and (t.preempt_by or '') == '' then
    out[#out + 1] = 'rejected:preempt_not_requested'
  else
    freed = true
    if outcome == 'preempted' then
      local old = t.status
      drop_lease(id, t)
      release_device(t.device_id, id, nil)
      close_attempt(id, t.attempt, 'preempted', {preempted_by = t.preempt_by,
        error = payload ~= '' and tail(payload, 2000) or nil,
        dispatched_at = old == 'dispatched' and tonumber(t.dispatched_at) or nil})
      redis.call('HINCRBY', k('task', id), 'preempted', 1)
      redis.call('HSET', k('task', id), 'preempted_by', t.preempt_by)
      requeue(id, t, old)
      emit('requeued', 'task', id, 'attempt', t.attempt or '0', 'reason', 'preempted by ' ..
        t.preempt_by, 'preempted_by', t.preempt_by, 'device', t.device_id or '')
      out[#out + 1] = 'ok:queued'
    elseif outcome == 'released' then
      out[#out + 1] = 'ok:' .. hand_back(id, t, payload ~= '' and payload or 'handed back', false)
    else
      local old = t.status
      drop_lease(id, t)
      local fails_before = release_device(t.device_id, id, nil)
      local dk = k('device', t.device_id)
      if outcome == 'done' then
        if fails_before and fails_before > 0 then
          redis.call('HSET', dk, 'consecutive_failures', '0', 'attention', '')
          redis.call('HDEL', k('faults'), t.device_id)
        end
      elseif outcome == 'failed' and DEVICE_KINDS[kind] and fails_before
        and not (kind == 'timeout' and redis.call('HGET', k('task', id), 'timeout')) then
        -- (a timeout at the task's own limit is not the device's fault)
        local fails = redis.call('HINCRBY', dk, 'consecutive_failures', '1')
        redis.call('HSET', k('faults'), t.device_id, I(fails))
        maybe_quarantine(t.device_id, fails)
      end
      local delay, used = nil, 0
      if outcome == 'failed' then delay, used = retry_delay(t, kind) end
      local dispatched = old == 'dispatched' and tonumber(t.dispatched_at) or nil
      if delay then  -- retried (retry_on, attempts left) once its backoff has passed
        local at = now_ms() + delay
        close_attempt(id, t.attempt, outcome, {failure_kind = kind, dispatched_at = dispatched,
          error = tail(payload, 2000), retry = kind .. ' is in retry_on; attempt ' .. used ..
          ' of ' .. (t.max_attempts or '?'), eligible_at = at})
        avoid(id, t, t.device_id, t.host_id)
        requeue(id, t, old, delay)
        emit('retrying', 'task', id, 'lease', t.lease_id or '', 'host', t.host_id or '', 'device',
          t.device_id or '', 'attempt', t.attempt or '0', 'failure_kind', kind, 'eligible_at', I(at),
          gang_field(t))
        out[#out + 1] = 'ok:queued'
      else
        close_attempt(id, t.attempt, outcome, {failure_kind = kind ~= '' and kind or nil,
          dispatched_at = dispatched})
        finish(id, t, old, outcome, kind, payload)
        out[#out + 1] = 'ok:' .. outcome
      end
      take_hint(t.device_id)
    end
  end
end
limits_flush()
if #hint_ids > 0 then
  for sig in pairs(hint_sigs) do fix_head(sig) end
  for i = 1, #hint_ids, 500 do
    local j = math.min(i + 499, #hint_ids)
    redis.call('RPUSH', k('host', host_id, 'inbox'), unpack(hint_ids, i, j))
    redis.call('SADD', k('ahead', 'want'), unpack(hint_devices, i, j))
  end
  if not claim_max then wake(k('host', host_id, 'wake')) end
end
if claim_max then
  local claimed, refused = claim_inbox(host_id, session or '', claim_max, budget)
  freed = freed or refused
  out[#out + 1] = claimed
end
if freed then wake(k('sched', 'wake')) end  -- (a device freed: the scheduler makes a pass)
return out
