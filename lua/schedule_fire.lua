--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/fence"
--- @include "lib/events"
-- schedule_fire.lua: the leading scheduler takes one run of a periodic schedule (`deviceq
-- schedule`, deviceq.services.schedules). `claim` makes the caller the owner of the run at RUN_TIME:
-- only the current leader's epoch may, and only when the recorded last run is older, so two
-- schedulers never both own a run; the run is recorded pending ({"run": RUN_TIME}). The
-- caller then submits the task with the idempotency key schedule.NAME.RUN_TIME and `done`
-- records its id (or why it could not be submitted) on that pending run. A leader that finds
-- a run still pending (its owner died between the two) submits it again with the same key:
-- the submission itself is idempotent, so the run is submitted once.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     action(claim|done) fence(the caller's leader epoch, required) name(an id)
--          run_time(seconds since the epoch) task_id('' = none) error(at most 500 bytes;
--          '' = none; done only: why the run has no task)
-- Keys     reads leader, schedules, config; writes schedules:last, events
-- Returns  claim: 1 (the caller owns the run: it is recorded pending), 0 (a run at or after
--          RUN_TIME is recorded already, or there is no such schedule);
--          done: 1 (recorded, event schedule_fired), 0 (the recorded run is another one or
--          is no longer pending)
-- Errors   FENCED (the fence is not the current leader's epoch; nothing written), INVALID
local action, fence, name, run = ARGV[1], ARGV[2] or '', ARGV[3] or '', ARGV[4] or ''
local task_id, err = ARGV[5] or '', ARGV[6] or ''
if action ~= 'claim' and action ~= 'done' then return fail('INVALID', 'action must be claim or done') end
if fence == '' then return fail('INVALID', 'a schedule run is fired under a leader epoch') end
if not valid_id(name) then return fail('INVALID', 'malformed schedule name') end
if not run:match('^%d+$') or #run > 12 then return fail('INVALID', 'run_time must be whole seconds') end
if task_id ~= '' and not valid_id(task_id) then return fail('INVALID', 'malformed task id') end
if #err > 500 then return fail('INVALID', 'error over 500 bytes') end
local fenced = check_fence(fence)
if fenced then return fenced end

local lk = k('schedules', 'last')
local cur = redis.call('HGET', lk, name)
local last
if cur then
  local ok, v = pcall(cjson.decode, cur)
  if ok and type(v) == 'table' then last = v end
end
local run_n = tonumber(run)

if action == 'claim' then
  if redis.call('HEXISTS', k('schedules'), name) == 0 then return 0 end
  if last and tonumber(last.run) and tonumber(last.run) >= run_n then return 0 end
  redis.call('HSET', lk, name, cjson.encode({run = run_n}))
  return 1
end

if not last or tonumber(last.run) ~= run_n or last.task or last.error then return 0 end
local rec = {run = run_n}
if task_id ~= '' then rec.task = task_id else rec.error = (err ~= '' and err or 'not submitted') end
redis.call('HSET', lk, name, cjson.encode(rec))
if task_id ~= '' then
  emit('schedule_fired', 'schedule', name, 'run_time', run, 'task', task_id)
else
  emit('schedule_failed', 'schedule', name, 'run_time', run, 'error', rec.error)
end
return 1
