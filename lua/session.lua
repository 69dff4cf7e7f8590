--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/auth"
--- @include "lib/liveness"
--- @include "lib/tasks"
--- @include "lib/handback"
-- session.lua: a host daemon starts (or ends) its session: one live daemon per host id.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token mode session owner expected
--          mode start    refused while another session is live (its host heartbeat is within
--                        host_timeout); a dead one is replaced and its attempts keep their
--                        leases until they expire (its runners may still be alive elsewhere)
--               dead     the caller checked that `expected`'s daemon process is gone (same
--                        machine, pid not running): replaced, and its dispatched attempts are
--                        handed back at once (their runners died with it)
--               takeover replaces even a live session: every later call of the old daemon is
--                        refused (SUPERSEDED) and it is told at once (host:ID:ctl) to stop its
--                        runners; its attempts keep their leases until they expire
--               end      the daemon exits cleanly: ends `session` if it is still current
--          session   the new session id; owner  who runs it (machine:boot:pid:start, shown in
--          `host list`, used by the next daemon to tell whether this one is alive);
--          expected  the session the caller saw ('' = none): start/dead are refused with
--          SESSION_ACTIVE if it changed meanwhile (two daemons starting at once).
-- Keys     reads/writes host:ID, host:ID:devices, host:ID:ctl, device:ID, task:ID,
--          task:ID:attempts, task:ID:goal, task:ID:tests, queue:SIG, sig:SIG, queues, status:*, deadlines, avoid, leases,
--          host:ID:inbox, idle, idle:c:*, cooling, LIMIT_COUNTERS, preemptible, gangs, retries, device:ID:history, events,
--          sched:wake; reads config, gates
-- Returns  start/dead/takeover: {epoch, replaced session ('' = none), attempts handed back};
--          end: 1 if the session ended, 0 if it was not current
-- Errors   AUTH, INVALID, SESSION_ACTIVE (a live daemon holds the host: use --takeover)
local host_id, token, mode, session, owner, expected = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local hk, err = auth_host(host_id, token, nil)
if not hk then return err end
local MODES = {start = true, dead = true, takeover = true, ['end'] = true}
if not MODES[mode] then return fail('INVALID', 'mode must be start, dead, takeover or end') end
if not valid_id(session) then return fail('INVALID', 'malformed session id') end
if type(owner) ~= 'string' or #owner > 200 or owner:find('%c') then return fail('INVALID', 'malformed owner') end
if type(expected) ~= 'string' or (expected ~= '' and not valid_id(expected)) then
  return fail('INVALID', 'malformed expected session')
end
local h = hfields(hk, {'session', 'session_owner', 'last_heartbeat', 'session_epoch'})
local cur = h.session or ''

if mode == 'end' then
  if cur ~= session then return 0 end
  redis.call('HSET', hk, 'session', '', 'session_owner', '', 'session_ended_at', now_str())
  emit('session_ended', 'host', host_id, 'session', session)
  return 1
end

if cur == session then return fail('INVALID', 'session ' .. session .. ' is already current') end
if (mode == 'start' or mode == 'dead') and cur ~= expected then
  return fail('SESSION_ACTIVE', 'another daemon of host ' .. host_id .. ' started meanwhile (session ' ..
    cur .. '); retry, or use --takeover')
end
if mode == 'start' and cur ~= '' and host_alive(hk) then
  local age = math.floor((now_ms() - (tonumber(h.last_heartbeat) or 0)) / 1000)
  return fail('SESSION_ACTIVE', 'host ' .. host_id .. ' already has a live daemon (session ' .. cur ..
    ', ' .. (h.session_owner or '?') .. ', last heartbeat ' .. age .. 's ago): stop it, or start this one with --takeover')
end

local epoch = redis.call('HINCRBY', hk, 'session_epoch', 1)
redis.call('HSET', hk, 'session', session, 'session_owner', owner, 'session_started_at', now_str(),
  'stopping', '0')
if cur ~= '' then ctl(host_id, 'session') end
emit('session_started', 'host', host_id, 'session', session, 'epoch', I(epoch), 'mode', mode,
  'replaced', cur)

local handed = 0
if mode == 'dead' then
  -- the previous daemon is gone with its runners: hand its running attempts back now
  for _, did in ipairs(redis.call('SMEMBERS', k('host', host_id, 'devices'))) do
    local tid = redis.call('HGET', k('device', did), 'reserved_by')
    if tid and tid ~= '' then
      local t = load_task(tid)
      if t.status == 'dispatched' and t.host_id == host_id and (t.session or '') ~= session then
        hand_back(tid, t, 'the previous daemon of host ' .. host_id .. ' died', true)
        handed = handed + 1
      end
    end
  end
  if handed > 0 then wake(k('sched', 'wake')) end
end
return {epoch, cur, handed}
