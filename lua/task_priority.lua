--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/constraints"
--- @include "lib/queue"
--- @include "lib/tasks"
--- @include "gen/args/task_priority"
-- task_priority.lua: change the priority of queued tasks. A task's priority is part of its
-- bucket's signature, so each one moves to the bucket of its new priority, keeping its place
-- in submission order (a retry waiting out its backoff, or a delayed task, moves when it is
-- enqueued). A multi-device task keeps its place in `gangs` with the new priority.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     priority(0..9) n(1..1000) tasks [by: who, an id ('' or absent = not recorded): the
--          priority_changed events' `by`]. tasks: packed (deviceq.core.script_args
--          TASK_PRIORITY, gen/args/task_priority): one cmsgpack array of n * PRIO_N values:
--   task_id  a queued task
-- Keys     reads/writes task:ID, queue:SIG, sig:SIG, queues, events, sched:wake; reads config
-- Returns  per task a string: "ok" (changed), "same" (it had that priority) or "err:REASON"
--          with REASON one of invalid_id task_not_found task_not_queued task_part (a part of
--          a multi-device task: change the task itself)
-- Errors   INVALID (bad arguments; nothing is written)
local prio = int_in(ARGV[1], 0, 9)
if not prio then return fail('INVALID', 'priority must be 0-9') end
local n = int_in(ARGV[2], 1, 1000)
local A = (#ARGV == 3 or #ARGV == 4) and packed_items(ARGV[3], n, PRIO_N)
if not A then return fail('INVALID', 'bad argument count') end
local by = ARGV[4] or ''
local who = actor_fields(by)
if not who then return fail('INVALID', 'malformed actor (by)') end
local p = I(prio)
local out, moved = {}, false
for i = 1, n do
  local id = A[(i - 1) * PRIO_N + PRIO_TASK_ID]
  if not valid_id(id) then
    out[i] = 'err:invalid_id'
  else
    local t = load_task(id)
    if not t.status then out[i] = 'err:task_not_found'
    elseif (t.gang or '') ~= '' then out[i] = 'err:task_part'
    elseif t.status ~= 'queued' then out[i] = 'err:task_not_queued'
    elseif (t.priority or '0') == p then out[i] = 'same'
    else
      local old = t.priority or '0'
      if (t.roles or '') ~= '' then
        redis.call('HSET', k('task', id), 'priority', p)
      else
        local sig = signature(t.driver_type or '', t.tags or '', p, t.tenant, t.pin, t.where)
        local waiting = (t.eligible_at or '') ~= ''  -- in `retries`: enqueued later, with t.sig
        if not waiting then dequeue(id, t.sig) end
        redis.call('HSET', k('task', id), 'priority', p, 'sig', sig)
        if not waiting then enqueue(id, sig, t.seq, t.driver_type, t.tags, p, t.tenant, t.pin, t.where) end
      end
      emit('priority_changed', 'task', id, 'from', old, 'to', p, unpack(who))
      out[i] = 'ok'
      moved = true
    end
  end
end
if moved then wake(k('sched', 'wake')) end
return out
