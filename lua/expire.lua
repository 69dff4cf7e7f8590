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
local limit = tonumber(ARGV[1])
if not limit or limit < 1 then return fail('INVALID', 'limit must be a positive integer') end
local now = now_ms()
local requeued, failed, cancelled, unsched = 0, 0, 0, 0
local due = redis.call('ZRANGEBYSCORE', k('leases'), '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(due) do
  redis.call('ZREM', k('leases'), id)
  local tk = k('task', id)
  local t = redis.call('HMGET', tk, 'status', 'lease_id', 'lease_expires_at', 'attempt',
    'max_attempts', 'device_id', 'host_id', 'seq', 'sig', 'cancel_requested', 'dispatched_at')
  if (t[1] == 'assigned' or t[1] == 'dispatched') and tonumber(t[3]) <= now then
    local old, lease, did, host = t[1], t[2], t[6], t[7]
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
      cancelled = cancelled + 1
    elseif tonumber(t[4]) >= tonumber(t[5]) then
      redis.call('HSET', tk, 'status', 'failed', 'failure_kind', 'lease_expired',
        'error', 'lease expired on attempt ' .. t[4] .. ' of ' .. t[5], 'finished_at', now,
        'updated_at', now)
      index_status(id, old, 'failed', t[8])
      emit('failed', 'task', id, 'lease', lease, 'failure_kind', 'lease_expired', 'attempt', t[4])
      failed = failed + 1
    else
      redis.call('HSET', tk, 'status', 'queued', 'host_id', '', 'device_id', '', 'lease_id', '',
        'lease_expires_at', '', 'updated_at', now)
      enqueue(id, t[9], t[8])
      index_status(id, old, 'queued', t[8])
      emit('requeued', 'task', id, 'attempt', t[4])
      requeued = requeued + 1
    end
  end
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
local more = (#due == limit or #late == limit) and 1 or 0
if requeued > 0 then wake(k('sched', 'wake')) end
return {requeued, failed, cancelled, unsched, more}
