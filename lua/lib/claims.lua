--- @include "lib/base"
--- @include "lib/config"
--- @include "lib/events"
--- @include "lib/status"
--- @include "lib/tasks"
--- @include "lib/handback"
--- @include "lib/budget"
-- lib/claims.lua: a host takes assignments from its inbox (claim.lua, and report.lua after
-- its reports): `claim_inbox`.

local CLAIM_BUDGET_US, CLAIM_EVERY, CLAIM_ENTRY_US = 2500, 8, 60  -- (an entry's estimate)

-- a part of gang task `gid` was claimed: once every part is, the gang task is `dispatched`
local function gang_claimed(gid, now, now_s)
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

-- host `host_id` (session `session`) takes up to `max` unexpired assigned attempts of its
-- inbox to `dispatched`, each with a fresh lease (now + lease_ttl); an assignment whose device
-- was quarantined or held since it was committed is handed back instead. Stops between two
-- entries once `budget_us` (nil: 2,500) is spent, checked every CLAIM_EVERY entries.
-- Returns claim.lua's reply {lease_ms, task1, ...[, 'more']} and whether one was handed back
-- (the caller wakes the scheduler).
local function claim_inbox(host_id, session, max, budget_us)
  local now = now_ms()
  local ttl = cfg_ms('lease_ttl')
  local now_s, expires_s = now_str(), I(now + ttl)
  local inbox = k('host', host_id, 'inbox')
  local out, refused, taken, more = {ttl}, false, 0, false
  budget_start(budget_us or CLAIM_BUDGET_US)
  while #out <= max do
    if taken > 0 and taken % CLAIM_EVERY == 0 and not budget_left() then
      more = redis.call('LLEN', inbox) > 0
      break
    end
    local id = redis.call('LPOP', inbox)
    if not id then break end
    taken = taken + 1
    budget_spend(CLAIM_ENTRY_US)
    local t, flat = load_task_flat(id)
    if t.status == 'assigned' and t.host_id == host_id and (tonumber(t.lease_expires_at) or 0) > now then
      local d = redis.call('HMGET', k('device', t.device_id), 'quarantined', 'held', 'reserved_by')
      if d[1] == '1' or (d[2] and d[2] ~= '') or d[3] ~= id then
        local why = d[1] == '1' and 'device quarantined before the claim' or 'device held before the claim'
        hand_back(id, t, why, false)
        refused = true
      else
        redis.call('HSET', k('task', id), 'status', 'dispatched', 'lease_expires_at', expires_s,
          'dispatched_at', now_s, 'updated_at', now_s, 'session', session)
        index_status(id, 'assigned', 'dispatched', t.seq)
        redis.call('ZADD', k('leases'), expires_s, id)
        emit('dispatched', 'task', id, 'lease', t.lease_id, 'host', host_id, 'device', t.device_id,
          'attempt', t.attempt, 'claim_ms', I(now - tonumber(t.assigned_at)), 'since_submit_ms',
          I(now - tonumber(t.submitted_at)), gang_field(t))
        flat_update(flat, 'status', 'dispatched', 'lease_expires_at', expires_s, 'dispatched_at', now_s,
          'updated_at', now_s, 'session', session)
        local gang = t.gang or ''
        if t.goal == '' then  -- a long goal lives in its own key (a part's: its gang task's)
          flat_update(flat, 'goal', redis.call('GET', k('task', gang ~= '' and gang or id, 'goal')) or '')
        end
        if t.tests and t.tests ~= '' then
          flat_update(flat, 'tests_list', redis.call('GET', k('task', id, 'tests')) or '')
        end
        if gang ~= '' then gang_claimed(gang, now, now_s) end
        out[#out + 1] = flat
      end
    end
  end
  if more then out[#out + 1] = 'more' end
  return out, refused
end
