--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/fence"
--- @include "lib/suites"
--- @include "gen/suite_tries"
-- suite_shard.lua: record the outcome of one shard of a running suite (deviceq.suites), once:
-- each test's try (status, the device, the shard) is added to its results and its final
-- status set (passed; flaky: failed, then passed; failed; skipped; pending while a retry shard
-- runs it again; a try `missing` (the run reported nothing on it) is no failure of a test
-- that passes later; a suite run on every device counts a test failed or missing on any
-- device as failed); each test's duration is kept per suite name
-- (weighted: half the last, half before) for the next split; a retry shard of failed tests,
-- already submitted, is added. When no shard is left open, the suite ends `done` (every test
-- passed, flaky or skipped) or `failed`; event suite_done; a suite on every device with a
-- joining window (`join_until`) not closed yet by suite_join.lua stays running until it is.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     fence('' = none, else the leader's epoch) id index(the shard) status(its task's
--          status) device('' = none) retry(JSON shard object or '' = none) m(0..10000), then m
--          tests, each: test(1..300 bytes) try(TRY_STATUSES) duration_ms('' = none) message(at
--          most 500 bytes)
-- Keys     reads leader, config; reads/writes suite:ID, suite:ID:shards, suite:ID:results,
--          suite_durations:NAME; writes suites:running, events
-- Returns  'running', 'done' or 'failed' (the suite's status after the call), or 'ended' (the
--          suite was no longer running or the shard was recorded already: nothing written)
-- Errors   INVALID (any malformed argument: nothing written), FENCED (not the leader's
--          epoch), NOT_FOUND (no such suite or shard)
local DURATIONS_KEPT = 20000  -- test durations kept per suite name (new tests past it are not)
local fence, id, index, tstatus, device, retry = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if not valid_id(id) then return fail('INVALID', 'malformed suite id') end
local idx = int_in(index, 0, 10000)
if not idx then return fail('INVALID', 'index must be 0-10000') end
if type(tstatus) ~= 'string' or not tstatus:match('^[a-z_]+$') or #tstatus > 20 then
  return fail('INVALID', 'malformed task status')
end
if device ~= '' and not valid_id(device) then return fail('INVALID', 'malformed device id') end
local rs
local retrying = {}  -- the tests the retry shard runs again: pending, not failed, meanwhile
if retry ~= '' then
  local ok, v = pcall(cjson.decode, retry or '')
  if not ok or type(v) ~= 'table' or not valid_id(v.task) or type(v.tests) ~= 'table' or #v.tests < 1 then
    return fail('INVALID', 'retry must be a shard {task, tests} or empty')
  end
  for _, t in ipairs(v.tests) do
    if type(t) ~= 'string' then return fail('INVALID', 'retry tests must be test ids') end
    retrying[t] = true
  end
  rs = retry
end
local m = int_in(ARGV[7], 0, 10000)
if not m or #ARGV ~= 7 + 4 * m then return fail('INVALID', 'bad test count') end
for i = 0, m - 1 do
  local b = 7 + 4 * i
  local test, try, dur, msg = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  if #test < 1 or #test > 300 or test:find('[%c]') then return fail('INVALID', 'malformed test id') end
  if not TRY_STATUSES[try] then return fail('INVALID', 'unknown try status ' .. try) end
  if dur ~= '' and not num_in(dur, 0, 1e10) then return fail('INVALID', 'duration_ms must be 0-1e10') end
  if #msg > 500 then return fail('INVALID', 'message over 500 bytes') end
end
local fenced = check_fence(fence)
if fenced then return fenced end

local sk, shk, rk = k('suite', id), k('suite', id, 'shards'), k('suite', id, 'results')
local s = hfields(sk, {'status', 'name', 'each', 'open'})
if not s.status then return fail('NOT_FOUND', 'no suite ' .. id) end
local raw = redis.call('HGET', shk, index)
if not raw then return fail('NOT_FOUND', 'suite ' .. id .. ' has no shard ' .. index) end
local shard = cjson.decode(raw)
if s.status ~= 'running' or shard.done then return 'ended' end

local each = s.each == '1'
-- a test's final status from its tries: a try `missing` (its run reported nothing on it) is
-- no failure of the test when a later try passes; one still to be retried is `pending`
local function final(test, tries)
  local passed, failed, missing, skipped = false, false, false, false
  for _, t in ipairs(tries) do
    if t[1] == 'passed' then passed = true
    elseif t[1] == 'skipped' then skipped = true
    elseif t[1] == 'missing' then missing = true
    else failed = true end
  end
  if passed and failed then return each and 'failed' or 'flaky' end
  if passed and not (each and missing) then return 'passed' end
  if failed or missing or passed then return retrying[test] and 'pending' or 'failed' end
  if skipped then return 'skipped' end
  return 'pending'
end

local dk = k('suite_durations', s.name)
local dlen = redis.call('HLEN', dk)
local delta, counts = {}, {}
for i = 0, m - 1 do
  local b = 7 + 4 * i
  local test, try, dur, msg = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  local cur = redis.call('HGET', rk, test)
  local r = cur and cjson.decode(cur) or {s = 'pending', tries = {}}
  local before = r.s
  r.tries[#r.tries + 1] = {try, device, idx}
  r.s = final(test, r.tries)
  r.dev = device
  if msg ~= '' then r.m = msg end
  if dur ~= '' then
    r.d = tonumber(dur) / 1000
    if try == 'passed' or try == 'failed' then
      local old = redis.call('HGET', dk, test)
      if old then
        redis.call('HSET', dk, test, I(math.floor((tonumber(old) + tonumber(dur)) / 2)))
      elseif dlen < DURATIONS_KEPT then
        redis.call('HSET', dk, test, I(math.floor(tonumber(dur))))
        dlen = dlen + 1
      end
    end
  end
  redis.call('HSET', rk, test, cjson.encode(r))
  counts[try] = (counts[try] or 0) + 1
  if before ~= r.s then
    delta[before] = (delta[before] or 0) - 1
    delta[r.s] = (delta[r.s] or 0) + 1
  end
end
for st, d in pairs(delta) do
  if d ~= 0 then redis.call('HINCRBY', sk, 'n_' .. st, d) end
end
shard.done = true
shard.device = device
shard.status = tstatus
shard.counts = counts
redis.call('HSET', shk, index, cjson.encode(shard))
local open = tonumber(s.open or '1') - 1
if rs then
  redis.call('HSET', shk, I(redis.call('HLEN', shk)), rs)
  redis.call('HINCRBY', sk, 'shards', 1)
  open = open + 1
end
redis.call('HSET', sk, 'open', I(open))
if open > 0 then return 'running' end
local j = hfields(sk, {'join_until', 'join_closed'})
if j.join_until and j.join_closed ~= '1' then return 'running' end  -- devices may still join
return suite_end(id, sk)
