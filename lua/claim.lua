--- @include "lib/base"
--- @include "lib/config"
--- @include "lib/args"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/auth"
--- @include "lib/status"
--- @include "lib/tasks"
--- @include "lib/handback"
--- @include "lib/budget"
-- claim.lua: the owning host takes up to `max` unexpired assigned attempts from its inbox to
-- `dispatched`, each with a fresh run lease (now + lease_ttl, read from the pool config now),
-- stamped with the claiming session. Exactly one caller gets each.
-- An assignment whose device was quarantined or held since it was committed is handed back
-- here (atomically, so the host never sees it; it counts against max_handbacks).
-- A multi-device task (GANG) becomes `dispatched` once each of its parts (GANG.ROLE) is claimed.
-- The work is split by time: once `budget_us` (default 2,500) is spent, checked every
-- BUDGET_EVERY entries, the claim stops between two entries and, when the inbox still holds
-- some, says `more` (the caller claims again: HostClient.claim does, up to its max).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token session max(1..1000) [budget_us(1..10000000)]
-- Keys     reads/writes host:ID, host:ID:inbox, task:ID, task:ID:attempts, task:ID:goal,
--          task:ID:tests,
--          device:ID, status:*, leases, events; on a hand-back also queue:SIG, sig:SIG, queues,
--          deadlines, avoid, idle, idle:c:*, cooling, LIMIT_COUNTERS, preemptible, host:ID:held_devices,
--          device:ID:history, sched:wake; reads config, gates
-- Returns  {lease_ms, task1, task2, ...[, 'more']}: the lease length granted and the claimed
--          tasks, each a flat field/value array of the task hash as read, then the fields the
--          claim set (a field may come twice: its last value is the current one), and for a
--          task with a list of tests (hash field `tests`) the field `tests_list` (task:ID:tests:
--          its test ids, one a line); last the
--          string 'more' when the budget stopped the claim with entries left in the inbox.
--          Stale inbox entries (expired, cancelled, reassigned) are dropped silently.
-- Errors   AUTH (unknown host / wrong token), SUPERSEDED (not the current session),
--          INVALID (bad max or budget).
local BUDGET_US, BUDGET_EVERY, ENTRY_US = 2500, 8, 60  -- (ENTRY_US: an entry's estimate, lib/budget)
local host_id, token, session = ARGV[1], ARGV[2], ARGV[3]
local hk, err = auth_host(host_id, token, session or '')
if not hk then return err end
local max = int_in(ARGV[4], 1, 1000)
if not max or (#ARGV ~= 4 and #ARGV ~= 5) then return fail('INVALID', 'max must be an integer 1-1000') end
local budget = BUDGET_US
if #ARGV == 5 then
  budget = int_in(ARGV[5], 1, 10000000)
  if not budget then return fail('INVALID', 'budget_us must be an integer 1-10000000') end
end
local now = now_ms()
local ttl = cfg_ms('lease_ttl')
local now_s, expires_s = now_str(), I(now + ttl)
local inbox = k('host', host_id, 'inbox')
-- a part of gang task `gid` was claimed: once every part is, the gang task is `dispatched`
local function gang_claimed(gid)
  local g = redis.call('HMGET', k('task', gid), 'status', 'parts', 'seq', 'attempt', 'assigned_at',
    'submitted_at')
  if g[1] ~= 'assigned' then return end
  for pid in string.gmatch(g[2] or '', '[^,]+') do
    if redis.call('HGET', k('task', pid), 'status') ~= 'dispatched' then return end
  end
  redis.call('HSET', k('task', gid), 'status', 'dispatched', 'dispatched_at', now_s, 'updated_at', now_s)
  index_status(gid, 'assigned', 'dispatched', g[3])
  emit('dispatched', 'task', gid, 'attempt', g[4] or '0', 'claim_ms',
    I(now - (tonumber(g[5]) or now)), 'since_submit_ms', I(now - (tonumber(g[6]) or now)))
end
local out = {ttl}
local refused = false
local taken, more = 0, false
budget_start(budget)
while #out <= max do
  if taken > 0 and taken % BUDGET_EVERY == 0 and not budget_left() then
    more = redis.call('LLEN', inbox) > 0
    break
  end
  local id = redis.call('LPOP', inbox)
  if not id then break end
  taken = taken + 1
  budget_spend(ENTRY_US)
  local tk = k('task', id)
  local t, flat = load_task_flat(id)
  if t.status == 'assigned' and t.host_id == host_id and (tonumber(t.lease_expires_at) or 0) > now then
    local d = redis.call('HMGET', k('device', t.device_id), 'quarantined', 'held', 'reserved_by')
    if d[1] == '1' or (d[2] and d[2] ~= '') or d[3] ~= id then
      local why = d[1] == '1' and 'device quarantined before the claim' or 'device held before the claim'
      hand_back(id, t, why, false)
      refused = true
    else
      redis.call('HSET', tk, 'status', 'dispatched', 'lease_expires_at', expires_s,
        'dispatched_at', now_s, 'updated_at', now_s, 'session', session or '')
      index_status(id, 'assigned', 'dispatched', t.seq)
      redis.call('ZADD', k('leases'), expires_s, id)
      emit('dispatched', 'task', id, 'lease', t.lease_id, 'host', host_id, 'device', t.device_id,
        'attempt', t.attempt, 'claim_ms', I(now - tonumber(t.assigned_at)), 'since_submit_ms',
        I(now - tonumber(t.submitted_at)), gang_field(t))
      flat_update(flat, 'status', 'dispatched', 'lease_expires_at', expires_s, 'dispatched_at', now_s,
        'updated_at', now_s, 'session', session or '')
      local gang = t.gang or ''
      if t.goal == '' then  -- a long goal lives in its own key (a part's: its gang task's)
        flat_update(flat, 'goal', redis.call('GET', k('task', gang ~= '' and gang or id, 'goal')) or '')
      end
      if t.tests and t.tests ~= '' then
        flat_update(flat, 'tests_list', redis.call('GET', k('task', id, 'tests')) or '')
      end
      if gang ~= '' then gang_claimed(gang) end
      out[#out + 1] = flat
    end
  end
end
if refused then wake(k('sched', 'wake')) end
if more then out[#out + 1] = 'more' end
return out
