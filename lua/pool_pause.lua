--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/events"
--- @include "lib/notify"
-- pool_pause.lua: pause or resume the whole pool. While `paused` exists no scheduler commit
-- assigns anything (assign.lua and gang_assign.lua refuse a fenced batch with pool_paused);
-- running tasks go on, expiry and retries too, and a manual `deviceq dispatch` still works.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     action(pause|resume) reason (at most 200 bytes, checked by the caller; '' = none)
--          [by: who, an id ('' or absent = not recorded): the events' `by`, and paused's]
-- Keys     writes paused, events, sched:wake; reads config
-- Returns  "paused" or "resumed" (the change made), "unchanged" (already so)
-- Errors   INVALID (bad action, reason or by)
local action, reason, by = ARGV[1], ARGV[2] or '', ARGV[3] or ''
if action ~= 'pause' and action ~= 'resume' then return fail('INVALID', 'action must be pause or resume') end
if #reason > 200 then return fail('INVALID', 'reason over 200 bytes') end
local who = actor_fields(by)
if not who then return fail('INVALID', 'malformed actor (by)') end
local pk = k('paused')
local was = redis.call('EXISTS', pk) == 1
if action == 'pause' then
  if was then return 'unchanged' end
  redis.call('SET', pk, cjson.encode({at = now_ms(), reason = reason, by = by}))
  emit('pool_paused', 'reason', reason, unpack(who))
  return 'paused'
end
if not was then return 'unchanged' end
redis.call('DEL', pk)
emit('pool_resumed', unpack(who))
wake(k('sched', 'wake'))
return 'resumed'
