--- @include "lib/base"
--- @include "lib/config"
--- @include "lib/args"
--- @include "lib/retry"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/queue"
--- @include "lib/tasks"
--- @include "lib/bookings"
--- @include "lib/history"
--- @include "lib/attempts"
--- @include "lib/affinity"
--- @include "lib/leases"
--- @include "lib/outcomes"
--- @include "lib/budget"
--- @include "gen/statuses"
-- expire.lua: end leases past their expiry (assigned or dispatched), fail queued tasks past
-- their queue deadline, and trim the terminal status indexes to the `retention` window: each
-- at most `limit` entries per call and, given a time budget, only as many as fit in it
-- (bounded work; `more` says whether any is left). Events older than `retention` are
-- trimmed too (whole stream nodes: at most 10,000 entries per call without a budget, 1,000
-- with one, 100 by a call the budget cut). Each index is read 100 entries at a time (10 once
-- the budget cut a step), so a call reads little more than it does.
-- The budget splits the work between items, never inside one: each lease, retry, deadline,
-- reservation is ended whole (its entry leaves its index with it, so the next call starts at
-- the next one), the trim goes 100 index entries at a time. Every step (leases, retries,
-- deadlines, reservations, each terminal index) does at least one item per call even with
-- the budget spent, so a tiny budget still makes progress everywhere.
-- An expired lease is a fault: its device is held `suspect` and its host marked `suspect`, both
-- out of the candidates until the host's next heartbeat proves it alive; the task returns to
-- `queued` at its original place (attempts left and lease_expired in its retry_on; it then
-- prefers another device and host), after its retry_backoff, or becomes `failed` with
-- failure_kind=lease_expired (hand-backs do not count); a task whose cancel was requested
-- becomes `cancelled`. The expired attempt stays in task:ID:attempts.
-- Retries whose backoff has passed (`retries`, by eligible time) join their bucket (a gang
-- task: `gangs`).
-- A person's reservation of a device (device_reserve.lua) past its end is ended too (at most
-- `limit` per call, event reservation_expired): the device is back among the idle candidates.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     limit (1..10000) [budget_us ('' or absent = none, else 1..10000000: microseconds
--          of Redis time, from `TIME`, after which the call stops between items)]
-- Keys     reads config, gates; writes leases, task:ID, task:ID:attempts, task:ID:goal, task:ID:tests, device:ID,
--          host:ID, host:ID:inbox, host:ID:held_devices, idle, idle:c:*, queue:SIG, sig:SIG,
--          queues, status:*, deadlines,
--          avoid, bookings, retries, cooling, LIMIT_COUNTERS, preemptible, gangs, host:ID:ctl, events, sched:wake,
--          device:ID:history, device:ID:log
-- Returns  {requeued, failed, cancelled, unschedulable, more(0|1), trimmed, retried} (ended
--          reservations are not counted: each is a reservation_expired event); more is 1 when
--          a step met its limit or the budget stopped it with entries left
-- Errors   INVALID (bad limit or budget)
local limit = int_in(ARGV[1], 1, 10000)
if not limit or #ARGV < 1 or #ARGV > 2 then return fail('INVALID', 'limit must be an integer 1-10000') end
local budget = nil
if ARGV[2] and ARGV[2] ~= '' then
  budget = int_in(ARGV[2], 1, 10000000)
  if not budget then return fail('INVALID', 'budget_us must be an integer 1-10000000') end
end

-- end the lease of task `id` if it is past its expiry; returns what happened, or nil when the
-- task holds no expired lease
local function expire_lease(id)
  local t = load_task(id)
  if not LEASED[t.status] or (tonumber(t.lease_expires_at) or 0) > now_ms() then
    return nil
  end
  local old = t.status
  drop_lease(id, t)
  release_device(t.device_id, id, 'suspect')
  local hk = k('host', t.host_id)
  if redis.call('EXISTS', hk) == 1 then redis.call('HSET', hk, 'suspect', now_str()) end
  local rec = {failure_kind = 'lease_expired', expired_in = old,
    dispatched_at = old == 'dispatched' and tonumber(t.dispatched_at) or nil}
  emit('expired', 'task', id, 'lease', t.lease_id, 'host', t.host_id, 'device', t.device_id,
    'attempt', t.attempt, gang_field(t))
  if t.cancel_requested == '1' then
    close_attempt(id, t.attempt, 'expired', rec)
    finish(id, t, old, 'cancelled', 'cancelled', 'cancel requested; lease expired')
    return 'cancelled'
  end
  local delay, used = retry_delay(t, 'lease_expired')
  if delay then
    rec.retry = 'lease_expired is in retry_on; attempt ' .. used .. ' of ' .. (t.max_attempts or '?')
    rec.eligible_at = now_ms() + delay
  end
  close_attempt(id, t.attempt, 'expired', rec)
  if not delay then
    local max = tonumber(t.max_attempts) or 1
    finish(id, t, old, 'failed', 'lease_expired', 'lease expired on attempt ' .. used .. ' of ' ..
      max .. (used < max and ' (lease_expired is not in retry_on)' or ''))
    return 'failed'
  end
  avoid(id, t, t.device_id, t.host_id)
  requeue(id, t, old, delay)
  if delay > 0 then
    emit('requeued', 'task', id, 'attempt', t.attempt, 'eligible_at', I(now_ms() + delay), gang_field(t))
  else
    emit('requeued', 'task', id, 'attempt', t.attempt, gang_field(t))
  end
  return 'requeued'
end

local now = now_ms()
budget_start(budget)
local cut = false  -- the budget stopped a step with entries left
local PAGE = 100   -- entries read at a time: a call reads little more than it does
-- the due entries of zset `key` (score <= `max`), a page at a time, each passed to `each`
-- (which takes it out of that range: removes it or scores it later): at most `limit` in
-- all, and only while the budget lasts (the first always goes). Returns whether the limit
-- was reached (entries may be left).
local function drain(key, max, cost, each)
  local done = 0
  while done < limit do
    local want = math.min(PAGE, limit - done)
    local page = redis.call('ZRANGEBYSCORE', key, '-inf', max, 'LIMIT', 0, want)
    for _, id in ipairs(page) do
      if done > 0 and not budget_left() then
        cut = true
        return false
      end
      each(id)
      budget_spend(cost)
      done = done + 1
    end
    if #page < want then return false end
  end
  return true
end
local requeued, failed, cancelled, unsched = 0, 0, 0, 0
local more_due = drain(k('leases'), now, 150, function(id)
  redis.call('ZREM', k('leases'), id)
  local what = expire_lease(id)
  if what == 'requeued' then requeued = requeued + 1
  elseif what == 'failed' then failed = failed + 1
  elseif what == 'cancelled' then cancelled = cancelled + 1 end
end)
-- retries whose backoff has passed join their bucket (at their original place)
local retried = 0
local more_ripe = drain(k('retries'), now, 50, function(id)
  redis.call('ZREM', k('retries'), id)
  local t = load_task(id)
  if t.status == 'queued' and (t.eligible_at or '') ~= '' then
    redis.call('HDEL', k('task', id), 'eligible_at')
    to_queue(id, t)
    retried = retried + 1
  end
end)
local more_late = drain(k('deadlines'), now, 120, function(id)
  redis.call('ZREM', k('deadlines'), id)
  local t = load_task(id)
  if t.status == 'queued' then
    from_queue(id, t)
    finish(id, t, 'queued', 'failed', 'unschedulable', 'waited longer than its queue timeout')
    unsched = unsched + 1
  end
end)
-- reservations past their end (the score is the end: an extension re-scores the entry)
local more_ended = drain(k('bookings'), now, 80, function(did)
  local untl = tonumber(redis.call('HMGET', k('device', did), 'booked_until')[1] or '')
  if untl and untl > now then
    redis.call('ZADD', k('bookings'), I(untl), did)  -- a stale score: the end is later
  else
    local by = redis.call('HGET', k('device', did), 'booked_by')
    if end_booking(did, 'reservation_expired') then
      device_log(did, {event = 'reservation_expired', by = by or ''})
    end
  end
end)
-- terminal status indexes keep the retention window (their tasks' keys expire with it), a
-- page of entries at a time
local cutoff = I(now - cfg_ms('retention'))
local trimmed, more_trim = 0, false
for _, st in ipairs({'done', 'failed', 'cancelled'}) do
  local sk, done = k('status', st), 0
  while done < limit do
    if done > 0 and not budget_left() then
      cut = true
      break
    end
    -- (once a step was cut, its budget spent, the first page is 10 entries: it still goes)
    local want = math.min(cut and 10 or PAGE, limit - done)
    local old_ids = redis.call('ZRANGEBYSCORE', sk, '-inf', cutoff, 'LIMIT', 0, want)
    if #old_ids > 0 then redis.call('ZREM', sk, unpack(old_ids)) end
    budget_spend(300)
    done = done + #old_ids
    if #old_ids < want then break end
  end
  if done >= limit then more_trim = true end
  trimmed = trimmed + done
end
-- events older than the window go too (whole stream nodes only: '~', at most LIMIT entries:
-- 10,000 without a budget, 1,000 with one, 100 by a call the budget cut)
local xlimit = not budget and '10000' or cut and '100' or '1000'
redis.call('XTRIM', k('events'), 'MINID', '~', cutoff, 'LIMIT', xlimit)
if requeued > 0 or retried > 0 then wake(k('sched', 'wake')) end
local more = (cut or more_due or more_ripe or more_late or more_ended or more_trim) and 1 or 0
return {requeued, failed, cancelled, unsched, more, trimmed, retried}
