-- expire.lua: end leases past their expiry (assigned or dispatched), at most `limit` per call,
-- and fail queued tasks past their queue deadline (same limit).
-- With attempts left the task returns to `queued` at its original place in submission order;
-- at the limit it becomes `failed` with failure_kind=lease_expired; a task whose cancel was
-- requested becomes `cancelled`. The device reservation is released either way and the expired
-- attempt stays in task:ID:attempts.
-- Also trims the terminal status indexes to the `retention` window.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     limit
-- Returns  {requeued, failed, cancelled, unschedulable, more(0|1)}

-- end the lease of task `id` if it is past its expiry: requeued (attempts left), failed
-- (lease_expired, at the limit; hand-backs do not count) or cancelled (a cancel was requested).
-- The reservation is released and the attempt closed as expired. Returns what happened, or nil
-- when the task holds no expired lease.
local function expire_lease(id)
  local now = now_ms()
  local tk = k('task', id)
  local t = redis.call('HMGET', tk, 'status', 'lease_id', 'lease_expires_at', 'attempt',
    'max_attempts', 'device_id', 'host_id', 'seq', 'sig', 'cancel_requested', 'dispatched_at',
    'handbacks', 'queue_deadline')
  if (t[1] ~= 'assigned' and t[1] ~= 'dispatched') or (tonumber(t[3]) or 0) > now then
    return nil
  end
  local old, lease, did, host = t[1], t[2], t[6], t[7]
  redis.call('ZREM', k('leases'), id)
  release_device(did, id)
  if old == 'assigned' then redis.call('LREM', k('host', host, 'inbox'), 0, id) end
  close_attempt(id, t[4], 'expired', {failure_kind = 'lease_expired', expired_in = old,
    dispatched_at = old == 'dispatched' and tonumber(t[11]) or nil})
  emit('expired', 'task', id, 'lease', lease, 'host', host, 'device', did, 'attempt', t[4])
  if t[10] == '1' then
    redis.call('HSET', tk, 'status', 'cancelled', 'failure_kind', 'cancelled',
      'error', 'cancel requested; lease expired', 'finished_at', now, 'updated_at', now)
    index_status(id, old, 'cancelled', t[8])
    emit('cancelled', 'task', id, 'lease', lease)
    return 'cancelled'
  end
  if tonumber(t[4]) - tonumber(t[12] or '0') >= tonumber(t[5]) then
    redis.call('HSET', tk, 'status', 'failed', 'failure_kind', 'lease_expired',
      'error', 'lease expired on attempt ' .. t[4] .. ' of ' .. t[5], 'finished_at', now,
      'updated_at', now)
    index_status(id, old, 'failed', t[8])
    emit('failed', 'task', id, 'lease', lease, 'failure_kind', 'lease_expired', 'attempt', t[4])
    return 'failed'
  end
  redis.call('HSET', tk, 'status', 'queued', 'host_id', '', 'device_id', '', 'lease_id', '',
    'lease_expires_at', '', 'updated_at', now)
  enqueue(id, t[9], t[8])
  index_status(id, old, 'queued', t[8])
  -- a queue timeout still applies (it fails at the next tick if it has passed meanwhile)
  if t[13] and t[13] ~= '' then redis.call('ZADD', k('deadlines'), t[13], id) end
  emit('requeued', 'task', id, 'attempt', t[4])
  return 'requeued'
end

local limit = tonumber(ARGV[1])
if not limit or limit < 1 then return fail('INVALID', 'limit must be a positive integer') end
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
local late = redis.call('ZRANGEBYSCORE', k('deadlines'), '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(late) do
  redis.call('ZREM', k('deadlines'), id)
  local tk = k('task', id)
  local t = redis.call('HMGET', tk, 'status', 'sig', 'seq')
  if t[1] == 'queued' then
    dequeue(id, t[2])
    redis.call('HSET', tk, 'status', 'failed', 'failure_kind', 'unschedulable',
      'error', 'waited longer than its queue timeout', 'finished_at', now, 'updated_at', now)
    index_status(id, 'queued', 'failed', t[3])
    emit('failed', 'task', id, 'failure_kind', 'unschedulable')
    unsched = unsched + 1
  end
end
-- terminal status indexes keep the retention window (their tasks' keys expire with it)
for st in pairs(TERMINAL) do
  redis.call('ZREMRANGEBYSCORE', k('status', st), '-inf', now - cfg_ms('retention'))
end
if requeued > 0 then wake(k('sched', 'wake')) end
local more = (#due == limit or #late == limit) and 1 or 0
return {requeued, failed, cancelled, unsched, more}
