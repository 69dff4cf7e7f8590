--- @include "lib/base"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/status"
--- @include "lib/queue"
--- @include "lib/tasks"
--- @include "lib/leases"
--- @include "lib/limits"
--- @include "lib/attempts"
--- @include "gen/statuses"
-- lib/outcomes.lua: a task leaves its attempt: back to the queue (requeue) or finished
-- (finish); a part of a multi-device task takes its whole gang with it (gang_end). The three
-- call each other (a part's requeue / finish ends its gang, whose own requeue / finish it
-- then does), so they live in one file, gang_end declared ahead.

-- the task (fields t, status `old`) returns to `queued` at its original place in submission
-- order, without a lease; its queue deadline still applies. With delay_ms > 0 (a retry's
-- backoff) it waits in `retries` (by the time it becomes eligible, field eligible_at) instead
-- of its bucket: expire.lua moves it there when due.
local gang_end  -- (below) a gang's attempt ends with one of its parts
local function requeue(id, t, old, delay_ms)
  redis.call('HSET', k('task', id), 'status', 'queued', 'host_id', '', 'device_id', '', 'lease_id', '',
    'lease_expires_at', '', 'session', '', 'updated_at', now_str())
  if (t.preempt_by or '') ~= '' then redis.call('HSET', k('task', id), 'preempt_by', '') end
  if (t.gang or '') ~= '' then  -- a part: its whole gang is retried
    gang_end(t.gang, id, 'retry', nil, nil, delay_ms)
    return
  end
  if delay_ms and delay_ms > 0 then
    local at = I(now_ms() + delay_ms)
    redis.call('HSET', k('task', id), 'eligible_at', at)
    redis.call('ZADD', k('retries'), at, id)
  else
    to_queue(id, t)
  end
  index_status(id, old, 'queued', t.seq)
  if t.queue_deadline and t.queue_deadline ~= '' then
    redis.call('ZADD', k('deadlines'), t.queue_deadline, id)
  end
  if (t.avoid_devices or '') ~= '' or (t.avoid_hosts or '') ~= '' then
    redis.call('HSET', k('avoid'), id, (t.avoid_devices or '') .. '|' .. (t.avoid_hosts or ''))
  end
end

-- end a task (fields t, status `old`) as done | failed | cancelled; `field` (result or error)
-- gets `payload`
local function finish(id, t, old, status, kind, payload, extra_event)
  local field = status == 'done' and 'result' or 'error'
  redis.call('HSET', k('task', id), 'status', status, 'failure_kind', kind or '', field, payload or '',
    'finished_at', now_str(), 'updated_at', now_str(), 'lease_expires_at', '')
  index_status(id, old, status, t.seq, t)
  local extra = extra_event or {}
  if (t.gang or '') ~= '' then extra = {'gang', t.gang, unpack(extra)} end
  emit(status, 'task', id, 'lease', t.lease_id or '', 'host', t.host_id or '', 'device',
    t.device_id or '', 'attempt', t.attempt or '0', 'failure_kind', kind or '', unpack(extra))
  if (t.gang or '') ~= '' then gang_end(t.gang, id, status, kind, payload) end
end

-- a gang's attempt ends (`outcome` done | failed | cancelled, or retry after delay_ms) because
-- its part `part_id` ended ('' = the gang task itself, e.g. cancelled): every other part still
-- holding a lease ends with it (lease dropped, device released, its host told at once), then
-- the gang task is finished or queued again in `gangs`. Nothing happens when the gang task
-- holds no attempt (already ended). `extra_event`: more fields for the gang task's own event
-- (cancel.lua: `by`).
gang_end = function(gid, part_id, outcome, kind, payload, delay_ms, extra_event)
  local g = load_task(gid)
  if not LEASED[g.status] then return end
  local why = part_id ~= '' and ('part ' .. part_id .. ' ended: ' .. outcome) or outcome
  local parts = redis.call('HGET', k('task', gid), 'parts') or ''
  for pid in string.gmatch(parts, '[^,]+') do
    local p = pid ~= part_id and load_task(pid) or {}
    if LEASED[p.status] then
      -- (not drop_lease: an unclaimed part stays in its host's inbox, where claim drops it as
      -- stale; so a host's call never writes another host's inbox, only its control list)
      redis.call('ZREM', k('leases'), pid)
      limits_count(p.host_id, p.tenant, -1)
      release_device(p.device_id, pid, nil)
      close_attempt(pid, p.attempt, 'ended', {error = 'gang attempt ended (' .. why .. ')',
        dispatched_at = p.status == 'dispatched' and tonumber(p.dispatched_at) or nil})
      if outcome == 'retry' then
        redis.call('HSET', k('task', pid), 'status', 'queued', 'host_id', '', 'device_id', '',
          'lease_id', '', 'lease_expires_at', '', 'session', '', 'updated_at', now_str())
        emit('requeued', 'task', pid, 'attempt', p.attempt or '0', 'reason', why, 'gang', gid)
      else
        redis.call('HSET', k('task', pid), 'status', outcome, 'failure_kind', kind or '',
          'finished_at', now_str(), 'updated_at', now_str(), 'lease_expires_at', '')
        index_status(pid, p.status, outcome, '')
        emit(outcome, 'task', pid, 'lease', p.lease_id or '', 'host', p.host_id or '', 'device',
          p.device_id or '', 'attempt', p.attempt or '0', 'failure_kind', kind or '', 'gang', gid)
      end
      ctl(p.host_id, 'gang')
    end
  end
  wake(k('sched', 'wake'))
  if outcome == 'retry' then
    close_attempt(gid, g.attempt, 'ended', {error = why}, true)
    requeue(gid, g, g.status, delay_ms)
    emit('requeued', 'task', gid, 'attempt', g.attempt or '0', 'reason', why)
  else
    close_attempt(gid, g.attempt, outcome, {failure_kind = kind ~= '' and kind or nil}, true)
    finish(gid, g, g.status, outcome, kind, payload, extra_event)
  end
end
