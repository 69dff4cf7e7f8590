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
--- @include "gen/statuses"
-- expire.lua: end leases past their expiry (assigned or dispatched), fail queued tasks past
-- their queue deadline, and trim the terminal status indexes to the `retention` window: each
-- at most `limit` entries per call (bounded work; `more` says whether any is left). Events
-- older than `retention` are trimmed too (at most 10,000 per call, whole stream nodes).
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
-- ARGV     limit (1..10000)
-- Keys     reads config; writes leases, task:ID, task:ID:attempts, task:ID:goal, device:ID,
--          host:ID, host:ID:inbox, idle, queue:SIG, sig:SIG, queues, status:*, deadlines,
--          avoid, bookings, retries, tenant_held, host_held, gangs, host:ID:ctl, events, sched:wake,
--          device:ID:history, device:ID:log
-- Returns  {requeued, failed, cancelled, unschedulable, more(0|1), trimmed, retried} (ended
--          reservations are not counted: each is a reservation_expired event)
-- Errors   INVALID (bad limit)
local limit = int_in(ARGV[1], 1, 10000)
if not limit or #ARGV ~= 1 then return fail('INVALID', 'limit must be an integer 1-10000') end

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
local requeued, failed, cancelled, unsched = 0, 0, 0, 0
local due = redis.call('ZRANGEBYSCORE', k('leases'), '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(due) do
  redis.call('ZREM', k('leases'), id)
  local what = expire_lease(id)
  if what == 'requeued' then requeued = requeued + 1
  elseif what == 'failed' then failed = failed + 1
  elseif what == 'cancelled' then cancelled = cancelled + 1 end
end
-- retries whose backoff has passed join their bucket (at their original place)
local ripe = redis.call('ZRANGEBYSCORE', k('retries'), '-inf', now, 'LIMIT', 0, limit)
local retried = 0
for _, id in ipairs(ripe) do
  redis.call('ZREM', k('retries'), id)
  local t = load_task(id)
  if t.status == 'queued' and (t.eligible_at or '') ~= '' then
    redis.call('HDEL', k('task', id), 'eligible_at')
    to_queue(id, t)
    retried = retried + 1
  end
end
local late = redis.call('ZRANGEBYSCORE', k('deadlines'), '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(late) do
  redis.call('ZREM', k('deadlines'), id)
  local t = load_task(id)
  if t.status == 'queued' then
    from_queue(id, t)
    finish(id, t, 'queued', 'failed', 'unschedulable', 'waited longer than its queue timeout')
    unsched = unsched + 1
  end
end
-- reservations past their end (the score is the end: an extension re-scores the entry)
local ended = redis.call('ZRANGEBYSCORE', k('bookings'), '-inf', now, 'LIMIT', 0, limit)
for _, did in ipairs(ended) do
  local untl = tonumber(redis.call('HMGET', k('device', did), 'booked_until')[1] or '')
  if untl and untl > now then
    redis.call('ZADD', k('bookings'), I(untl), did)  -- a stale score: the end is later
  else
    local by = redis.call('HGET', k('device', did), 'booked_by')
    if end_booking(did, 'reservation_expired') then
      device_log(did, {event = 'reservation_expired', by = by or ''})
    end
  end
end
-- terminal status indexes keep the retention window (their tasks' keys expire with it)
local cutoff = I(now - cfg_ms('retention'))
local trimmed, more_trim = 0, false
for _, st in ipairs({'done', 'failed', 'cancelled'}) do
  local old_ids = redis.call('ZRANGEBYSCORE', k('status', st), '-inf', cutoff, 'LIMIT', 0, limit)
  for i = 1, #old_ids, 500 do
    redis.call('ZREM', k('status', st), unpack(old_ids, i, math.min(i + 499, #old_ids)))
  end
  trimmed = trimmed + #old_ids
  if #old_ids == limit then more_trim = true end
end
-- events older than the window go too (whole stream nodes only: '~', at most LIMIT entries)
redis.call('XTRIM', k('events'), 'MINID', '~', cutoff, 'LIMIT', 10000)
if requeued > 0 or retried > 0 then wake(k('sched', 'wake')) end
local more = (#due == limit or #late == limit or #ended == limit or #ripe == limit or more_trim)
  and 1 or 0
return {requeued, failed, cancelled, unsched, more, trimmed, retried}
