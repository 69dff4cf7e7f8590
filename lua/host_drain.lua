--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/auth"
-- host_drain.lua: stop or resume new assignments to a host. Two separate flags: `draining`
-- (an operator's drain, kept across daemon restarts) and `stopping` (the host's own daemon is
-- shutting down; cleared when a daemon starts a new session). Work already assigned or
-- running is untouched.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id flag(1|0) who(operator|daemon) token session (daemon only; '' for operator)
--          [by: the operator who drains, an id ('' or absent = not recorded); the event's `by`]
-- Keys     reads/writes host:ID, events, sched:wake; reads config
-- Returns  "draining" | "active" (the operator flag) or "stopping" | "running" (the daemon's)
-- Errors   NOT_FOUND (no host), AUTH / SUPERSEDED (daemon: wrong token or session), INVALID
local host_id, flag, who, token, session = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local by = ARGV[6] or ''
local by_fields = actor_fields(by)
if not by_fields then return fail('INVALID', 'malformed actor (by)') end
if not valid_id(host_id) then return fail('INVALID', 'malformed host id') end
if flag ~= '1' and flag ~= '0' then return fail('INVALID', 'flag must be 1 or 0') end
if who ~= 'operator' and who ~= 'daemon' then return fail('INVALID', 'who must be operator or daemon') end
local hk = k('host', host_id)
if redis.call('EXISTS', hk) == 0 then return fail('NOT_FOUND', 'no host ' .. host_id) end
local field = 'draining'
if who == 'daemon' then
  local ok, err = auth_host(host_id, token, session or '')
  if not ok then return err end
  field = 'stopping'
end
if redis.call('HGET', hk, field) ~= flag then
  redis.call('HSET', hk, field, flag)
  local kind = who == 'operator' and (flag == '1' and 'host_draining' or 'host_undrained')
    or (flag == '1' and 'host_stopping' or 'host_running')
  emit(kind, 'host', host_id, unpack(by_fields))
  if flag == '0' then wake(k('sched', 'wake')) end
end
if who == 'operator' then return flag == '1' and 'draining' or 'active' end
return flag == '1' and 'stopping' or 'running'
