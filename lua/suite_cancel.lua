--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/events"
-- suite_cancel.lua: end a running suite as `cancelled` (deviceq.suites): no shard's results
-- are recorded after this and no failed test is retried; event suite_done. The caller then
-- cancels each shard's task (cancel.lua), which it may do again safely.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     id [by(an id: who cancels it)]
-- Keys     reads config; reads/writes suite:ID; writes suites:running, events
-- Returns  1 (cancelled now), 0 (it had ended already)
-- Errors   INVALID (malformed id), NOT_FOUND (no such suite)
local id, by = ARGV[1], ARGV[2] or ''
if #ARGV < 1 or #ARGV > 2 or not valid_id(id) then return fail('INVALID', 'malformed suite id') end
if by ~= '' and not valid_id(by) then return fail('INVALID', 'malformed actor') end
local sk = k('suite', id)
local st = redis.call('HGET', sk, 'status')
if not st then return fail('NOT_FOUND', 'no suite ' .. id) end
if st ~= 'running' then return 0 end
redis.call('HSET', sk, 'status', 'cancelled', 'finished_at', I(now_ms()))
redis.call('SREM', k('suites', 'running'), id)
if by ~= '' then
  emit('suite_done', 'suite', id, 'status', 'cancelled', 'by', by)
else
  emit('suite_done', 'suite', id, 'status', 'cancelled')
end
return 1
