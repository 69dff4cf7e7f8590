--- @include "lib/base"
--- @include "lib/config"
--- @include "lib/args"
--- @include "lib/notify"
--- @include "lib/queue"
--- @include "lib/fence"
--- @include "lib/budget"
--- @include "lib/limits"
--- @include "lib/assignment"
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
-- a run is given that device once it is free (or another: its hold is then dropped). The
-- check and commit of a pair are lib/assignment.lua's (report.lua applies them to a next-task hint).
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
local out, hosts_ok, inboxes, touched = {}, {}, {}, {}
-- the limits' counts of this call's leases are written once per field, at the end
limits_defer()

budget_start(budget)
local flushes = 0  -- hosts and buckets the pairs so far touched (written after the loop)
for i = 0, n - 1 do
  if i > 0 and i % BUDGET_EVERY == 0 and not budget_left(flushes * FLUSH_US) then
    for _ = i, n - 1 do out[#out + 1] = 'later' end
    break
  end
  budget_spend(PAIR_US)
  local id, did = A[i * PAIR_N + PAIR_TASK_ID], A[i * PAIR_N + PAIR_DEVICE_ID]
  local v, why = assignment_check(id, did, hosts_ok)
  if not v then
    out[#out + 1] = 'err:' .. why
  else
    local lease = assignment_commit(id, did, v, now, claim_ms)
    if not touched[v.t[4]] then flushes = flushes + 1 end
    touched[v.t[4]] = true
    local host_id = v.d[1]
    if not inboxes[host_id] then flushes = flushes + 1 end
    inboxes[host_id] = inboxes[host_id] or {}
    table.insert(inboxes[host_id], id)
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
