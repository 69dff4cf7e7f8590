--- @include "lib/base"
-- lib/queue.lua: where a queued task waits: its constraint bucket (queue:SIG, sig:SIG, the
-- queues index) or, a multi-device task, `gangs`.

-- buckets this call put tasks in: sig -> the lowest seq it gave the bucket index (the bucket
-- is non-empty and its constraints written; forgotten when tasks leave the bucket). A call
-- enqueuing many tasks of one bucket then checks its size and its head score once, not per
-- task.
local enqueued = {}

-- put a task into its constraint bucket (keeps its original submission order); the bucket's
-- constraints (sig:SIG, with the device its tasks are pinned to, if any) exist exactly while
-- the bucket is non-empty
local function enqueue(id, sig, seq, driver, tags, prio, tenant, pin, where)
  local low = enqueued[sig]
  if redis.call('ZADD', k('queue', sig), seq, id) == 1 and not low
      and redis.call('ZCARD', k('queue', sig)) == 1 then
    redis.call('HSET', k('sig', sig), 'driver_type', driver or '', 'tags', tags or '', 'priority', prio or '0',
      'tenant', tenant or '', 'where', where or '')
    if pin and pin ~= '' then redis.call('HSET', k('sig', sig), 'pin', pin) end
  end
  local n = tonumber(seq)
  if not low or n < low then
    redis.call('ZADD', k('queues'), 'LT', seq, sig)
    enqueued[sig] = n
  end
end

-- after tasks left bucket `sig`: drop it (and its constraints) or fix its head score
local function fix_head(sig)
  enqueued[sig] = nil
  local head = redis.call('ZRANGE', k('queue', sig), '0', '0', 'WITHSCORES')
  if #head == 0 then
    redis.call('ZREM', k('queues'), sig)
    redis.call('DEL', k('sig', sig))
  else
    redis.call('ZADD', k('queues'), head[2], sig)
  end
end

-- take a task out of its bucket, keeping the bucket index's head score right
local function dequeue(id, sig)
  redis.call('ZREM', k('queue', sig), id)
  fix_head(sig)
end

-- where a queued task waits: a gang task (roles) in `gangs` by seq, any other in its bucket
local function to_queue(id, t)
  if (t.roles or '') ~= '' then
    redis.call('ZADD', k('gangs'), t.seq, id)
  else
    enqueue(id, t.sig, t.seq, t.driver_type, t.tags, t.priority, t.tenant, t.pin, t.where)
  end
end
local function from_queue(id, t)
  if (t.roles or '') ~= '' then redis.call('ZREM', k('gangs'), id) else dequeue(id, t.sig) end
end
