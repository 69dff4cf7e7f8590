--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/fence"
--- @include "lib/events"
--- @include "lib/suites"
-- suite_join.lua: the joining window of a suite on every device (deviceq.suites,
-- `--include-joining`), for the leading scheduler (fenced by its epoch):
--   add:   record the shard of a device that registered within the window: its pinned task
--          was submitted already (its idempotency key is the suite's and the device's, so a
--          watcher killed before this call submits the same task again); once per device
--          (suite:ID:devices), at most MAX_DEVICES devices a suite; event suite_joined
--   close: the window has ended: the suite stops taking devices (`join_closed`), and ends
--          now (suite_done) when no shard is open (suite_shard.lua leaves it running until then)
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     fence('' = none, else the leader's epoch) id mode(add|close), then for add:
--          device(an id) shard(JSON object {task(an id), tests(array of 1..10000 ids), round 0,
--          pin(the device), est, joined})
-- Keys     reads leader, config, device:ID; reads/writes suite:ID, suite:ID:shards,
--          suite:ID:devices; writes suites:running, events
-- Returns  add: 'added', or 'known' (the device has its shard already: nothing written), or
--          'closed' (the window has closed, the device registered outside it, or the suite
--          has MAX_DEVICES devices: nothing written); close: the suite's status after the call
--          ('running', 'done', 'failed'); 'ended' when the suite was no longer running
-- Errors   INVALID (any malformed argument: nothing written), FENCED (not the leader's epoch),
--          NOT_FOUND (no such suite, or no such device for add)
local MAX_DEVICES = 200  -- mirrors deviceq.suites.model.MAX_SHARDS (tests/suites hold them equal)
local fence, id, mode = ARGV[1], ARGV[2], ARGV[3]
if not valid_id(id) then return fail('INVALID', 'malformed suite id') end
local device, shard
if mode == 'add' then
  if #ARGV ~= 5 then return fail('INVALID', 'add takes a device and a shard') end
  device = ARGV[4]
  if not valid_id(device) then return fail('INVALID', 'malformed device id') end
  local ok, s = pcall(cjson.decode, ARGV[5])
  if not ok or type(s) ~= 'table' or not valid_id(s.task) or type(s.tests) ~= 'table'
    or #s.tests < 1 or #s.tests > 10000 or s.pin ~= device then
    return fail('INVALID', 'the shard must be {task, tests, pin} pinned to the device')
  end
  shard = ARGV[5]
elseif mode == 'close' then
  if #ARGV ~= 3 then return fail('INVALID', 'close takes nothing more') end
else
  return fail('INVALID', 'mode must be add or close')
end
local fenced = check_fence(fence)
if fenced then return fenced end

local sk = k('suite', id)
local s = hfields(sk, {'status', 'each', 'open', 'submitted_at', 'join_until', 'join_closed'})
if not s.status then return fail('NOT_FOUND', 'no suite ' .. id) end
if s.status ~= 'running' then return 'ended' end
if mode == 'close' then
  if not s.join_until then return fail('INVALID', 'suite ' .. id .. ' has no joining window') end
  if s.join_closed ~= '1' then redis.call('HSET', sk, 'join_closed', '1') end
  if tonumber(s.open or '0') > 0 then return 'running' end
  return suite_end(id, sk)
end
if s.each ~= '1' or not s.join_until or s.join_closed == '1' then return 'closed' end
local registered = redis.call('HGET', k('device', device), 'registered_at')
if not registered then return fail('NOT_FOUND', 'no device ' .. device) end
local at = tonumber(registered) or 0
if at < tonumber(s.submitted_at) or at >= tonumber(s.join_until) then return 'closed' end
local dk = k('suite', id, 'devices')
if redis.call('SISMEMBER', dk, device) == 1 then return 'known' end
if redis.call('SCARD', dk) >= MAX_DEVICES then return 'closed' end
redis.call('SADD', dk, device)
redis.call('HSET', k('suite', id, 'shards'), I(redis.call('HLEN', k('suite', id, 'shards'))), shard)
redis.call('HINCRBY', sk, 'shards', 1)
redis.call('HSET', sk, 'open', I(tonumber(s.open or '0') + 1))
emit('suite_joined', 'suite', id, 'device', device)
return 'added'
