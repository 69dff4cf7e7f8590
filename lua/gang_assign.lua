--- @include "lib/base"
--- @include "lib/idle"
--- @include "lib/config"
--- @include "lib/args"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/constraints"
--- @include "lib/status"
--- @include "lib/roles"
--- @include "lib/fence"
--- @include "lib/tasks"
--- @include "lib/placement"
--- @include "lib/limits"
--- @include "lib/where"
--- @include "gen/args/gang_assign"
-- gang_assign.lua: commit one multi-device (gang) task: each of its roles gets its device, as
-- part task ID.ROLE (queued -> assigned, a lease of claim_ttl, the device reserved, the part in
-- its device's host's inbox), all in this one call or none (nothing is written when any
-- device cannot take its role). The gang task becomes `assigned` (attempt+1); the leader
-- part (first role) carries every role's placement in field `peers`.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     fence task_id n(1..8) devices: one per role, in the task's role order, packed
--          (deviceq.core.script_args GANG_ASSIGN, gen/args/gang_assign): one cmsgpack array of
--          n * ROLE_N values:
--   device_id  the device of the role
--          fence is the scheduler's leader epoch ('' for a manual dispatch).
-- Keys     reads leader, paused, config, host:ID, device:ID, device:ID:attrs; writes task:ID, task:ID.ROLE,
--          task:*:attempts, device:ID, idle, idle:c:*, gangs, deadlines, status:*, leases,
--          LIMIT_COUNTERS (lib/limits), host:ID:inbox, host:ID:wake, events
-- Returns  "ok:ATTEMPT" or "err:REASON" with REASON one of task_not_found not_multi_device
--          task_not_queued invalid_id duplicate_device pool_paused, or a device's reason as in assign.lua
--          followed by "@ROLE" (device_not_idle@phone, missing_tag:sim@phone, where_mismatch@phone: its
--          device's attributes fail the role's --where, ...), a declared
--          limit's NAME_cap@ROLE included (host_cap@ROLE: the role's device's host would hold
--          more than max_tasks_per_host leases; each of the task's devices on one host counts one)
-- Errors   FENCED (the fence is not the current leader epoch), INVALID (bad arguments).
local fence, id = ARGV[1], ARGV[2]
local n = int_in(ARGV[3], 1, 8)
local A = #ARGV == 4 and packed_items(ARGV[4], n, ROLE_N)
if not A then return fail('INVALID', 'bad argument count') end
if not valid_id(id) then return fail('INVALID', 'malformed task id') end
local fenced = check_fence(fence)
if fenced then return fenced end
if paused_for(fence) then return 'err:pool_paused' end

local t = load_task(id)
if not t.status then return 'err:task_not_found' end
if (t.roles or '') == '' then return 'err:not_multi_device' end
if t.status ~= 'queued' or not redis.call('ZSCORE', k('gangs'), id) then return 'err:task_not_queued' end
local roles = parse_roles(t.roles)
-- the roles' --where clauses (submit.lua checked them): role name -> compiled clauses
local rw = {}
if (t.role_where or '') ~= '' then
  local ok, m = pcall(cjson.decode, t.role_where)
  if ok and type(m) == 'table' then rw = m end
end
if not roles or #roles ~= n then return fail('INVALID', 'the task has ' .. #(roles or {}) .. ' roles') end
local hosts_ok, seen, rows, dids = {}, {}, {}, {}
for i, r in ipairs(roles) do
  local did = A[(i - 1) * ROLE_N + ROLE_DEVICE_ID]
  dids[i] = did
  if not valid_id(did) then return 'err:invalid_id' end
  if seen[did] then return 'err:duplicate_device' end
  seen[did] = true
  local d, why = device_assignable(did, hosts_ok)
  if d then
    local ok, miss = satisfies(r.driver, r.tags, d[5], d[6])
    if not ok then d, why = nil, miss
    elseif type(rw[r.name]) == 'string' and where_fails(did, rw[r.name]) then
      d, why = nil, 'where_mismatch'
    end
  end
  if not d then return 'err:' .. why .. '@' .. r.name end
  rows[i] = d
end
-- every declared limit (lib/limits): each role's lease counts as the task's parts do (by its
-- device's host; parts have no tenant of their own); written once per field, at the end
limits_defer()
for i, r in ipairs(roles) do
  local capped = limits_refusal(rows[i][1], nil, 1)
  if capped then return 'err:' .. capped .. '@' .. r.name end
  limits_count(rows[i][1], nil, 1)
end

local now = now_ms()
local now_s, expires_s = now_str(), I(now + cfg_ms('claim_ttl'))
local attempt = (tonumber(t.attempt) or 0) + 1
local attempt_s = I(attempt)
local what = hfields(k('task', id), {'kind', 'goal', 'workflow'})
local placed, parts = {}, {}
for i, r in ipairs(roles) do
  placed[i] = r.name .. '=' .. dids[i] .. '@' .. rows[i][1]
  parts[i] = id .. '.' .. r.name
end
local placement = table.concat(placed, ';')
for i, r in ipairs(roles) do
  local did, host_id, pid = dids[i], rows[i][1], parts[i]
  local pk = k('task', pid)
  local lease = pid .. '-a' .. attempt_s
  -- a part hash is kept across its gang's attempts (its fields are reset here); seq '' keeps it
  -- out of the status indexes: only its gang task is listed and counted
  redis.call('HDEL', pk, 'failure_kind', 'result', 'error', 'finished_at', 'dispatched_at',
    'cancel_requested', 'eligible_at')
  redis.call('HSET', pk, 'id', pid, 'gang', id, 'role', r.name, 'leader', i == 1 and '1' or '',
    'status', 'assigned', 'kind', what.kind or 'goal', 'goal', what.goal or '', 'workflow',
    what.workflow or '', 'driver_type', r.driver, 'tags', r.tags, 'priority', t.priority or '0',
    'seq', '', 'sig', '', 'attempt', attempt_s, 'max_attempts', t.max_attempts or '1',
    'retry_on', t.retry_on or '', 'retry_backoff', t.retry_backoff or '', 'host_id', host_id,
    'device_id', did, 'lease_id', lease, 'lease_expires_at', expires_s, 'assigned_at', now_s,
    'submitted_at', t.submitted_at or now_s, 'updated_at', now_s, 'session', '',
    'peers', i == 1 and placement or '')
  redis.call('ZADD', k('leases'), expires_s, pid)
  redis.call('HSET', k('device', did), 'reserved_by', pid, 'lease_id', lease, 'last_assigned_at', now_s)
  idle_remove(did)
  redis.call('RPUSH', k('task', pid, 'attempts'), cjson.encode({attempt = attempt, lease_id = lease,
    host_id = host_id, device_id = did, assigned_at = now, outcome = 'active'}))
  redis.call('RPUSH', k('host', host_id, 'inbox'), pid)
  wake(k('host', host_id, 'wake'))
  emit('assigned', 'task', pid, 'lease', lease, 'host', host_id, 'device', did, 'attempt',
    attempt_s, 'gang', id, 'role', r.name)
end
limits_flush()
redis.call('ZREM', k('gangs'), id)
if (t.queue_deadline or '') ~= '' then redis.call('ZREM', k('deadlines'), id) end
index_status(id, 'queued', 'assigned', t.seq)
redis.call('HSET', k('task', id), 'status', 'assigned', 'attempt', attempt_s, 'parts',
  table.concat(parts, ','), 'peers', placement, 'host_id', rows[1][1], 'device_id', dids[1],
  'lease_id', parts[1] .. '-a' .. attempt_s, 'assigned_at', now_s, 'updated_at', now_s)
redis.call('RPUSH', k('task', id, 'attempts'), cjson.encode({attempt = attempt,
  lease_id = parts[1] .. '-a' .. attempt_s, host_id = rows[1][1], device_id = dids[1],
  assigned_at = now, outcome = 'active'}))
emit('assigned', 'task', id, 'lease', parts[1] .. '-a' .. attempt_s, 'attempt', attempt_s,
  'roles', placement, 'queued_ms',
  I(now - (tonumber(t.submitted_at) or now)))
return 'ok:' .. attempt_s
