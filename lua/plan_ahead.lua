--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/fence"
--- @include "gen/args/plan_ahead"
-- plan_ahead.lua: the scheduler's next-task hints: for each busy device, the queued task its
-- strategy chose to run there next. A hint reserves nothing (the task stays queued, any pass
-- may place it elsewhere): the report that frees the device takes the hint and, if the pair
-- is still valid as assign.lua would judge it, assigns it in that call (report.lua).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     fence n(0..10000) hints: fence is the scheduler's leader epoch ('' unfenced):
--          when given it must be the current leader's epoch (report.lua uses a hint only
--          while its fence still leads). hints: packed (deviceq.core.script_args PLAN_AHEAD,
--          gen/args/plan_ahead): one cmsgpack array of n * HINT_N values, hint after hint:
--   task_id    the task to run next on the device
--   device_id  the device
-- Keys     reads leader; writes device:ID
-- Returns  the number of hints written: each is the device's field next_task = FENCE|TASK_ID
--          (replacing an older one); a device that does not exist gets none
-- Errors   FENCED (the fence is not the current leader epoch; nothing written), INVALID (bad
--          arguments or ids; nothing written).
local fence = ARGV[1]
local n = int_in(ARGV[2], 0, 10000)
local A = #ARGV == 3 and packed_items(ARGV[3], n, HINT_N)
if not A then return fail('INVALID', 'bad argument count') end
for i = 0, n - 1 do
  if not valid_id(A[i * HINT_N + HINT_TASK_ID]) or not valid_id(A[i * HINT_N + HINT_DEVICE_ID]) then
    return fail('INVALID', 'malformed task or device id')
  end
end
local fenced = check_fence(fence)
if fenced then return fenced end
local written = 0
for i = 0, n - 1 do
  local dk = k('device', A[i * HINT_N + HINT_DEVICE_ID])
  if redis.call('HEXISTS', dk, 'host_id') == 1 then
    redis.call('HSET', dk, 'next_task', fence .. '|' .. A[i * HINT_N + HINT_TASK_ID])
    written = written + 1
  end
end
return written
