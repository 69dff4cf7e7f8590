--- @include "lib/base"
--- @include "lib/idle"
--- @include "lib/config"
--- @include "lib/args"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/constraints"
--- @include "lib/where"
--- @include "lib/status"
--- @include "lib/queue"
--- @include "lib/fence"
--- @include "lib/placement"
--- @include "lib/budget"
--- @include "lib/limits"
--- @include "gen/args/assign"
-- assign.lua: commit a batch of proposed (task, device) pairs. Each pair is re-validated and,
-- if valid, committed on its own: task queued -> assigned, attempt+1, a lease (claim_ttl),
-- the device reserved, the assignment filed in the owning host's inbox.
-- Given a time budget, the work is split by time: once `budget_us` is spent, checked every
-- BUDGET_EVERY pairs, the pairs not yet looked at answer `later` (the caller sends them again:
-- SchedulerClient.commit does); the first pair is always committed or refused. The inboxes
-- and bucket heads written after the pairs count against the budget as they accumulate
-- (FLUSH_US a host or bucket touched), so the whole call stays within it.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     fence n(0..10000) pairs [budget_us(1..10000000)].
--          fence is the scheduler's leader epoch ('' for a manual dispatch): when given it
--          must be the current leader's epoch. pairs: packed (deviceq.core.script_args ASSIGN,
--          gen/args/assign): one cmsgpack array of n * PAIR_N values, pair after pair:
--   task_id    a queued task
--   device_id  the device it goes to
-- A task of a priority class joins `preemptible` (by assignment time); a task that preempted
-- a run is given that device once it is free (or another: its hold is then dropped).
-- Keys     reads leader, paused, config, host:ID, device:ID, task:ID, tenants; writes task:ID,
--          preemptible, preempt:handover,
--          LIMIT_COUNTERS (lib/limits), task:ID:attempts, device:ID, idle, idle:c:*,
--          queue:SIG, sig:SIG, queues, status:*, leases, avoid, deadlines, host:ID:inbox,
--          host:ID:wake, events
-- Returns  per pair a string: "ok:LEASE_ID", "later" (not looked at: the budget was spent;
--          nothing of it changed) or "err:REASON" where REASON is one of
--          invalid_id task_not_found task_not_queued task_multi_device (a task with roles,
--          or one of its parts: gang_assign.lua places those) device_not_found device_reserved
--          device_not_idle device_quarantined device_held device_booked (reserved for a
--          person, device_reserve.lua) device_checking device_unhealthy (a health check
--          runs on it / failed: device_health.lua) host_dead host_draining
--          host_suspect driver_type_mismatch missing_tag:TAG where_mismatch device_preempted
--          (the device is held for the queued task that preempted its last run: preempt.lua)
--          pool_paused (every pair of a
--          fenced batch while the pool is paused: pool_pause.lua), or a declared limit's
--          NAME_cap (one more lease would break it, e.g. host_cap, tenant_cap: see
--          lib/limits.lua and deviceq.core.limits)
-- Errors   FENCED (the fence is not the current leader epoch; nothing is committed),
--          INVALID (bad arguments).
local BUDGET_EVERY, PAIR_US = 4, 40  -- (PAIR_US: a pair's estimate, lib/budget)
local FLUSH_US = 10  -- a host's inbox (RPUSH, wake) or a bucket's head written after the pairs
local fence = ARGV[1]
local n = int_in(ARGV[2], 0, 10000)
local A = (#ARGV == 3 or #ARGV == 4) and packed_items(ARGV[3], n, PAIR_N)
if not A then return fail('INVALID', 'bad argument count') end
local budget
if #ARGV == 4 then
  budget = int_in(ARGV[4], 1, 10000000)
  if not budget then return fail('INVALID', 'budget_us must be an integer 1-10000000') end
end
local fenced = check_fence(fence)
if fenced then return fenced end
if paused_for(fence) then
  local refused = {}
  for i = 1, n do refused[i] = 'err:pool_paused' end
  return refused
end

local now = now_ms()
local claim_ms = cfg_ms('claim_ttl')
local now_s, expires_s = now_str(), I(now + claim_ms)
local out, hosts_ok, inboxes, touched = {}, {}, {}, {}
-- the limits' counts of this call's leases are written once per field, at the end
limits_defer()
-- a device held for the task that preempted its run (preempt.lua): true when it is held for
-- another task, still queued and waiting for it; a hold whose task left the queue (or is not
-- `queued`, the task asking) is dropped
local function drop_hold(uid, did)
  redis.call('HDEL', k('device', did), 'preempt_for')
  redis.call('ZREM', k('preempt', 'handover'), uid)
end
local function held_for(did, id, queued, known)
  local pf = known or redis.call('HGET', k('device', did), 'preempt_for')
  if not pf or pf == '' then return false end
  if pf == id then
    if not queued then drop_hold(pf, did) end
    return false
  end
  local h = redis.call('HMGET', k('task', pf), 'status', 'preempting')
  if h[1] == 'queued' and h[2] == did then return true end
  drop_hold(pf, did)
  return false
end
local function check(id, did)
  if not valid_id(id) or not valid_id(did) then return nil, 'invalid_id' end
  local tk = k('task', id)
  local t = redis.call('HMGET', tk, 'status', 'driver_type', 'tags', 'sig', 'attempt', 'seq', 'submitted_at',
    'avoid_devices', 'avoid_hosts', 'queue_deadline', 'tenant', 'roles', 'gang', 'pin', 'class',
    'preempting', 'where')
  if not t[1] then return nil, 'task_not_found' end
  if (t[12] or '') ~= '' or (t[13] or '') ~= '' then return nil, 'task_multi_device' end
  if t[1] ~= 'queued' then
    held_for(did, id, false)
    return nil, 'task_not_queued'
  end
  if (t[14] or '') ~= '' and t[14] ~= did then return nil, 'task_pinned' end
  local d, bad = device_assignable(did, hosts_ok)
  if not d then return nil, bad end
  if d[11] and held_for(did, id, true, d[11]) then return nil, 'device_preempted' end
  local ok, why = satisfies(t[2], t[3], d[5], d[6])
  if not ok then return nil, why end
  if (t[17] or '') ~= '' and where_fails(did, t[17]) then return nil, 'where_mismatch' end
  local capped = limits_refusal(d[1], t[11], 1)
  if capped then return nil, capped end
  return {t = t, d = d}
end

budget_start(budget)
local flushes = 0  -- hosts and buckets the pairs so far touched (written after the loop)
for i = 0, n - 1 do
  if i > 0 and i % BUDGET_EVERY == 0 and not budget_left(flushes * FLUSH_US) then
    for _ = i, n - 1 do out[#out + 1] = 'later' end
    break
  end
  budget_spend(PAIR_US)
  local id, did = A[i * PAIR_N + PAIR_TASK_ID], A[i * PAIR_N + PAIR_DEVICE_ID]
  local v, why = check(id, did)
  if not v then
    out[#out + 1] = 'err:' .. why
  else
    local host_id = v.d[1]
    local attempt = tonumber(v.t[5]) + 1
    local attempt_s = I(attempt)
    local lease = id .. '-a' .. attempt_s
    redis.call('ZREM', k('queue', v.t[4]), id)
    if not touched[v.t[4]] then flushes = flushes + 1 end
    touched[v.t[4]] = true
    index_status(id, 'queued', 'assigned', v.t[6])
    redis.call('HSET', k('task', id), 'status', 'assigned', 'host_id', host_id, 'device_id', did,
      'attempt', attempt_s, 'lease_id', lease, 'lease_expires_at', expires_s, 'assigned_at',
      now_s, 'updated_at', now_s)
    if (v.t[8] or '') ~= '' or (v.t[9] or '') ~= '' then redis.call('HDEL', k('avoid'), id) end
    -- a queue deadline applies while queued only (requeue files it again)
    if v.t[10] and v.t[10] ~= '' then redis.call('ZREM', k('deadlines'), id) end
    redis.call('ZADD', k('leases'), expires_s, id)
    if (v.t[15] or '') ~= '' then redis.call('ZADD', k('preemptible'), now_s, id) end
    if (v.t[16] or '') ~= '' then  -- it preempted a run: its hold (on this device or another) ends
      if redis.call('HGET', k('device', v.t[16]), 'preempt_for') == id then
        redis.call('HDEL', k('device', v.t[16]), 'preempt_for')
      end
      redis.call('ZREM', k('preempt', 'handover'), id)
      redis.call('HSET', k('task', id), 'preempting', '')
    end
    limits_count(host_id, v.t[11], 1)
    redis.call('HSET', k('device', did), 'reserved_by', id, 'lease_id', lease, 'last_assigned_at',
      now_s)
    idle_remove(did, v.d[5], v.d[6])
    redis.call('RPUSH', k('task', id, 'attempts'), cjson.encode({attempt = attempt, lease_id = lease,
      host_id = host_id, device_id = did, assigned_at = now, outcome = 'active'}))
    if not inboxes[host_id] then flushes = flushes + 1 end
    inboxes[host_id] = inboxes[host_id] or {}
    table.insert(inboxes[host_id], id)
    emit('assigned', 'task', id, 'lease', lease, 'host', host_id, 'device', did, 'attempt',
      attempt_s, 'sig', v.t[4], 'queued_ms', I(now - tonumber(v.t[7])))
    out[#out + 1] = 'ok:' .. lease
  end
end
for sig in pairs(touched) do fix_head(sig) end
limits_flush()
for host_id, ids in pairs(inboxes) do
  for i = 1, #ids, 500 do
    redis.call('RPUSH', k('host', host_id, 'inbox'), unpack(ids, i, math.min(i + 499, #ids)))
  end
  wake(k('host', host_id, 'wake'))
end
return out
