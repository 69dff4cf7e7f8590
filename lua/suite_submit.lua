--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/events"
-- suite_submit.lua: record a suite whose shard tasks were just submitted (deviceq.suites):
-- the suite `running`, its shards open, the suite among the running ones the leading
-- scheduler watches; event suite_submitted. Past SUITES_KEPT suites, the oldest finished one
-- is dropped (its keys deleted: one suite a call, so the work stays O(shards)). A suite on
-- every device records its devices (suite:ID:devices, the shards' pins); with a joining
-- window (spec include_joining_s) also its end, `join_until` (ms): suite_join.lua adds a
-- shard for each matching device registering until then.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     id name(an id) each(0|1) spec(JSON object, at most 64 KiB; its include_joining_s,
--          when given: seconds, 0 < s <= 604800, with each 1 only) tests(1..10000)
--          eta_ms('' = none, else 0..1e11: ms from now at submit) n(1..200) then n shards,
--          each a JSON object {task(an id), tests(array of 1..10000 ids), round, pin, est}
-- Keys     reads config; reads/writes suites, suites:running; writes suite:ID, suite:ID:shards, events,
--          suite:ID:results, suite:ID:devices
-- Returns  1
-- Errors   INVALID (any malformed argument: nothing written), EXISTS (the suite id is used)
local SUITES_KEPT = 1000  -- mirrors deviceq.suites.model.SUITES_KEPT (tests/suites hold them equal)
local id, name, each, spec = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if not valid_id(id) then return fail('INVALID', 'malformed suite id') end
if not valid_id(name) then return fail('INVALID', 'malformed suite name') end
if each ~= '0' and each ~= '1' then return fail('INVALID', 'each must be 0 or 1') end
if type(spec) ~= 'string' or #spec > 65536 then return fail('INVALID', 'spec over 64 KiB') end
local okspec, sp = pcall(cjson.decode, spec)
if not okspec or type(sp) ~= 'table' then return fail('INVALID', 'spec must be a JSON object') end
local joining = sp.include_joining_s
if joining ~= nil and joining ~= cjson.null then
  if type(joining) ~= 'number' or joining <= 0 or joining > 604800 or each ~= '1' then
    return fail('INVALID', 'include_joining_s must be 0 < s <= 604800, with each 1')
  end
else
  joining = nil
end
local tests = int_in(ARGV[5], 1, 10000)
if not tests then return fail('INVALID', 'tests must be 1-10000') end
local eta = ARGV[6]
if eta ~= '' and not num_in(eta, 0, 1e11) then return fail('INVALID', 'eta_ms must be 0-1e11 or empty') end
local n = int_in(ARGV[7], 1, 200)
if not n or #ARGV ~= 7 + n then return fail('INVALID', 'bad shard count') end
local pins = {}
for i = 1, n do
  local ok, s = pcall(cjson.decode, ARGV[7 + i])
  if not ok or type(s) ~= 'table' or not valid_id(s.task) or type(s.tests) ~= 'table'
    or #s.tests < 1 or #s.tests > 10000 then
    return fail('INVALID', 'shard ' .. i .. ' must be {task, tests}')
  end
  if each == '1' then
    if not valid_id(s.pin) then return fail('INVALID', 'shard ' .. i .. ' of a suite on every device needs its pin') end
    pins[#pins + 1] = s.pin
  end
end
local sk = k('suite', id)
if redis.call('EXISTS', sk) == 1 then return fail('EXISTS', 'suite ' .. id .. ' exists') end

local now = now_ms()
local fields = {'id', id, 'name', name, 'status', 'running', 'each', each, 'spec', spec,
  'tests', ARGV[5], 'shards', I(n), 'open', I(n), 'submitted_at', I(now), 'n_pending', ARGV[5]}
if joining then
  fields[#fields + 1] = 'join_until'; fields[#fields + 1] = I(now + math.floor(joining * 1000))
end
if eta ~= '' then
  fields[#fields + 1] = 'eta_submit_ms'; fields[#fields + 1] = eta
  fields[#fields + 1] = 'eta_at'; fields[#fields + 1] = I(now + math.floor(tonumber(eta)))
end
redis.call('HSET', sk, unpack(fields))
local shards = {}
for i = 1, n do
  shards[#shards + 1] = I(i - 1); shards[#shards + 1] = ARGV[7 + i]
end
redis.call('HSET', k('suite', id, 'shards'), unpack(shards))
if #pins > 0 then redis.call('SADD', k('suite', id, 'devices'), unpack(pins)) end
redis.call('ZADD', k('suites'), now, id)
redis.call('SADD', k('suites', 'running'), id)
emit('suite_submitted', 'suite', id, 'name', name, 'shards', I(n), 'tests', ARGV[5])

-- keep at most SUITES_KEPT suites: drop the oldest finished one
if redis.call('ZCARD', k('suites')) > SUITES_KEPT then
  for _, old in ipairs(redis.call('ZRANGE', k('suites'), 0, 9)) do
    if redis.call('SISMEMBER', k('suites', 'running'), old) == 0 then
      redis.call('DEL', k('suite', old), k('suite', old, 'shards'), k('suite', old, 'results'),
        k('suite', old, 'devices'))
      redis.call('ZREM', k('suites'), old)
      break
    end
  end
end
return 1
