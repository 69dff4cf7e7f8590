-- cancel.lua: cancel a task. queued: cancelled at once. assigned (no runner started yet):
-- cancelled at once, reservation released, inbox entry dropped. dispatched: flagged
-- (cancel_requested=1); its host stops the runner and reports `cancelled`, or expiry ends it.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     task_id reason
-- Returns  "cancelled" | "requested" | "already:STATUS" (terminal already: nothing changed)
-- Errors   NOT_FOUND (no such task), INVALID (malformed id).
local id, reason = ARGV[1], ARGV[2]
if not valid_id(id) then return fail('INVALID', 'malformed task id') end
local tk = k('task', id)
local t = redis.call('HMGET', tk, 'status', 'sig', 'seq', 'device_id', 'host_id', 'attempt',
  'lease_id', 'cancel_requested')
if not t[1] then return fail('NOT_FOUND', 'no task ' .. id) end
if TERMINAL[t[1]] then return 'already:' .. t[1] end
local now = now_ms()
if t[1] == 'dispatched' then
  if t[8] ~= '1' then
    redis.call('HSET', tk, 'cancel_requested', '1', 'updated_at', now)
    emit('cancel_requested', 'task', id, 'lease', t[7], 'host', t[5], 'device', t[4])
  end
  return 'requested'
end
if t[1] == 'queued' then
  dequeue(id, t[2])
  redis.call('ZREM', k('deadlines'), id)
else -- assigned: nothing runs yet
  redis.call('ZREM', k('leases'), id)
  redis.call('LREM', k('host', t[5], 'inbox'), 0, id)
  release_device(t[4], id)
  close_attempt(id, t[6], 'cancelled', {failure_kind = 'cancelled'})
  wake(k('sched', 'wake'))
end
redis.call('HSET', tk, 'status', 'cancelled', 'failure_kind', 'cancelled', 'error', reason,
  'finished_at', now, 'updated_at', now)
index_status(id, t[1], 'cancelled', t[3])
emit('cancelled', 'task', id, 'lease', t[7] or '')
return 'cancelled'
