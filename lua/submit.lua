--- @include "lib/base"
--- @include "lib/config"
--- @include "lib/args"
--- @include "lib/text"
--- @include "lib/retry"
--- @include "lib/events"
--- @include "lib/notify"
--- @include "lib/constraints"
--- @include "lib/status"
--- @include "lib/queue"
--- @include "lib/roles"
-- submit.lua: enqueue one or more tasks as `queued` (all or nothing).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV[1]  n, the number of tasks (1..10000); then 14 (or, without the last three, 11) fields
--          per task: id kind(goal|workflow) goal workflow driver_type('' = any) tags(csv,
--          sorted, distinct, at most 32) priority(0..9) max_attempts('' = pool default, else
--          1..1000) idempotency_key('' = none) queue_timeout_s('' = pool default, else a
--          decimal 0 < s <= 1 year) reject_unmatched('' = pool setting reject_unmatchable, '1'
--          yes, '0' no) retry_on('' = pool setting; none or a csv of failure kinds)
--          retry_backoff('' = pool setting; none | fixed:S | exponential:BASE:MAX)
--          tenant('' = none; an id: the bucket is per tenant, see signature in lib/constraints.lua)
--          and, as a 15th field, roles ('' = none; NAME=DRIVER:TAGS;... see parse_roles in
--          lib/roles.lua: a multi-device task, which waits in `gangs` instead of a bucket and has
--          no driver_type, tags or tenant of its own) and, as a 16th, timeout ('' = none, else
--          a decimal 0.001 <= s <= 7 days: the longest a run may take, capped by the host's
--          --task-timeout; not with roles) and, as a 17th, not_before ('' = none, else ms since
--          the epoch, at most a year ahead: the task waits in `retries`, field eligible_at,
--          until then; expire.lua enqueues it; its queue timeout counts from then) and, as an
--          18th, retry_of ('' = none, else the id of an existing task this one runs again, see
--          Client.retry: the new task's field retry_of, the old task's rerun_by the new id) and,
--          as a 19th, by ('' = not recorded, else an id: who submitted it, e.g. the dashboard
--          user who retried a task; the task's submitted_by and the submitted event's `by`) and,
--          as a 20th, traceparent ('' = none, else a W3C trace context 00-TRACE(32 hex)-SPAN(16
--          hex)-FLAGS(2 hex): the trace of its submission, deviceq.core.tracing) and, as a
--          21st, class ('' = none, else an id: its priority class, deviceq.core.priority_classes;
--          the caller gives the class's priority as its priority). A
--          goal holds no NUL byte (no runner can pass one).
-- Keys     reads config, caps, idem:KEY, task:ID, workflow:NAME, status:queued;
--          writes seq, task:ID, task:ID:goal, idem:KEY, deadlines, sig:SIG, queue:SIG, queues, gangs,
--          retries, status:queued, events, sched:wake
-- Returns  a flat array: per task, its id and 1 (created) or 0 (an earlier task with the same
--          idempotency key, whose id is returned instead).
-- Errors   QUEUE_FULL (the pool holds max_queue_depth queued tasks), NOT_FOUND (unknown
--          workflow), INVALID (any malformed argument; nothing is written), EXISTS (task id
--          already used), UNMATCHABLE (rejecting unmatched tasks and no registered device could
--          run it; the check reads the `caps` hash of distinct device profiles, not the devices).
local n = int_in(ARGV[1], 1, 10000)
local F = n and (#ARGV == 1 + n * 21 and 21 or #ARGV == 1 + n * 20 and 20 or #ARGV == 1 + n * 19 and 19 or #ARGV == 1 + n * 18 and 18
  or #ARGV == 1 + n * 17 and 17 or #ARGV == 1 + n * 16 and 16
  or #ARGV == 1 + n * 15 and 15 or #ARGV == 1 + n * 14 and 14 or 11)
if not n or #ARGV ~= 1 + n * F then return fail('INVALID', 'bad argument count') end

-- can any registered device profile (driver_type|tags, counted in `caps`) satisfy it?
local profiles
local function matchable(driver, tags)
  if not profiles then profiles = redis.call('HKEYS', k('caps')) end
  if #profiles == 0 then return false, 'no devices are registered' end
  local best
  for _, p in ipairs(profiles) do
    local d, t = p:match('^([^|]*)|(.*)$')
    local ok, why = satisfies(driver, tags, d, t)
    if ok then return true end
    if not best or why ~= 'driver_type_mismatch' then best = why end
  end
  if best == 'driver_type_mismatch' then return false, 'no device has driver_type ' .. driver end
  return false, 'no matching device has tag ' .. best:sub(13)
end

-- check one task's fields; returns nil or an error reply
local function check(b)
  local id, kind, goal, wf, driver, tags = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4],
    ARGV[b + 5], ARGV[b + 6]
  if not valid_id(id) then return fail('INVALID', 'malformed task id') end
  if kind == 'goal' then
    if #goal < 1 or #goal > 16384 or not goal:match('%S') or not valid_utf8(goal) then
      return fail('INVALID', 'goal must be 1-16384 bytes of UTF-8 text and not blank')
    end
    if goal:find('\0', 1, true) then
      return fail('INVALID', 'goal must not contain a NUL byte (no runner could pass it)')
    end
    if wf ~= '' then return fail('INVALID', 'a goal task names no workflow') end
  elseif kind == 'workflow' then
    if not valid_id(wf) then return fail('INVALID', 'malformed workflow name') end
    if goal ~= '' then return fail('INVALID', 'a workflow task has no goal') end
  else
    return fail('INVALID', 'kind must be goal or workflow')
  end
  if driver ~= '' and not valid_id(driver) then return fail('INVALID', 'malformed driver_type') end
  if not valid_tags(tags) then
    return fail('INVALID', 'tags must be at most 32 valid tags, sorted and distinct, comma-separated')
  end
  if not int_in(ARGV[b + 7], 0, 9) then return fail('INVALID', 'priority must be 0-9') end
  if ARGV[b + 8] ~= '' and not int_in(ARGV[b + 8], 1, 1000) then
    return fail('INVALID', 'max_attempts must be 1-1000')
  end
  if ARGV[b + 9] ~= '' and not valid_id(ARGV[b + 9]) then
    return fail('INVALID', 'malformed idempotency key')
  end
  if ARGV[b + 10] ~= '' and not num_in(ARGV[b + 10], 0.001, 31536000) then
    return fail('INVALID', 'queue_timeout must be a number of seconds, 0 < s <= 1 year')
  end
  local rej = ARGV[b + 11]
  if rej ~= '' and rej ~= '0' and rej ~= '1' then return fail('INVALID', 'reject_unmatched must be 0 or 1') end
  if F >= 14 then
    if ARGV[b + 12] ~= '' and not retry_kinds(ARGV[b + 12]) then
      return fail('INVALID', 'retry_on must be none or a csv of infrastructure, runner_error, timeout, runner_failed, lease_expired')
    end
    if ARGV[b + 13] ~= '' and not parse_backoff(ARGV[b + 13]) then
      return fail('INVALID', 'retry_backoff must be none, fixed:SECONDS or exponential:BASE:MAX')
    end
    if ARGV[b + 14] ~= '' and not valid_id(ARGV[b + 14]) then return fail('INVALID', 'malformed tenant') end
  end
  if F >= 17 and ARGV[b + 17] ~= '' then
    local nb = int_in(ARGV[b + 17], 0, 9007199254740991)
    if not nb or nb > now_ms() + 31536000000 then
      return fail('INVALID', 'not_before must be a time (ms since the epoch) at most a year ahead')
    end
  end
  if F >= 19 and ARGV[b + 19] ~= '' and not valid_id(ARGV[b + 19]) then
    return fail('INVALID', 'malformed submitter (by)')
  end
  if F == 21 and ARGV[b + 21] ~= '' and not valid_id(ARGV[b + 21]) then
    return fail('INVALID', 'malformed priority class')
  end
  if F >= 20 and ARGV[b + 20] ~= '' and not ARGV[b + 20]:match('^00%-' .. ('[0-9a-f]'):rep(32) ..
      '%-' .. ('[0-9a-f]'):rep(16) .. '%-[0-9a-f][0-9a-f]$') then
    return fail('INVALID', 'malformed traceparent')
  end
  if F >= 18 and ARGV[b + 18] ~= '' and not valid_id(ARGV[b + 18]) then
    return fail('INVALID', 'malformed retry_of task id')
  end
  if F >= 16 and ARGV[b + 16] ~= '' then
    if not num_in(ARGV[b + 16], 0.001, 604800) then
      return fail('INVALID', 'timeout must be a number of seconds, 0.001 <= s <= 7 days')
    end
    if ARGV[b + 15] ~= '' then return fail('INVALID', 'a task with roles cannot have a timeout of its own') end
  end
  if F >= 15 and ARGV[b + 15] ~= '' then
    local roles, why = parse_roles(ARGV[b + 15])
    if not roles then return fail('INVALID', why) end
    if driver ~= '' or tags ~= '' then
      return fail('INVALID', 'a task with roles has no driver_type or tags of its own: give them per role')
    end
    if ARGV[b + 14] ~= '' then return fail('INVALID', 'a task with roles cannot have a tenant') end
    for _, r in ipairs(roles) do
      if #id + 1 + #r.name > 128 then return fail('INVALID', 'task id too long for its role names') end
    end
  end
end

-- validate everything before writing anything
for i = 0, n - 1 do
  local err = check(1 + i * F)
  if err then return err end
end
local fresh, out, seen, ids = 0, {}, {}, {}
for i = 0, n - 1 do
  local b = 1 + i * F
  local id, kind, wf, idem = ARGV[b + 1], ARGV[b + 2], ARGV[b + 4], ARGV[b + 9]
  if kind == 'workflow' and redis.call('EXISTS', k('workflow', wf)) == 0 then
    return fail('NOT_FOUND', 'unknown workflow ' .. wf)
  end
  if F >= 18 and ARGV[b + 18] ~= '' and redis.call('EXISTS', k('task', ARGV[b + 18])) == 0 then
    return fail('NOT_FOUND', 'no task ' .. ARGV[b + 18] .. ' to retry')
  end
  local rej = ARGV[b + 11]
  if rej == '' then rej = cfg('reject_unmatchable') == 1 and '1' or '0' end
  local roles = F >= 15 and ARGV[b + 15] ~= '' and parse_roles(ARGV[b + 15])
  if rej == '1' then
    local ok, why = true, nil
    for _, r in ipairs(roles or {{driver = ARGV[b + 5], tags = ARGV[b + 6]}}) do
      if ok then
        ok, why = matchable(r.driver, r.tags)
        if not ok and roles then why = why .. ' (role ' .. r.name .. ')' end
      end
    end
    if not ok then
      return fail('UNMATCHABLE', 'no registered device could run task ' .. id .. ': ' .. why)
    end
  end
  local existing = false
  if idem ~= '' then existing = redis.call('GET', k('idem', idem)) or seen[idem] end
  if existing then
    out[#out + 1] = existing; out[#out + 1] = 0
  else
    if ids[id] or redis.call('EXISTS', k('task', id)) == 1 then
      return fail('EXISTS', 'task id already used ' .. id)
    end
    ids[id] = true
    if idem ~= '' then seen[idem] = id end
    fresh = fresh + 1
    out[#out + 1] = id; out[#out + 1] = 1
  end
end

local depth = redis.call('ZCARD', k('status', 'queued'))
local limit = cfg('max_queue_depth')
if depth + fresh > limit then
  return fail('QUEUE_FULL', 'queue holds ' .. depth .. ' of max_queue_depth ' .. limit ..
    ' queued tasks; cannot accept ' .. fresh .. ' more')
end

local now = now_ms()
local now_s = now_str()
local seq = fresh > 0 and redis.call('INCRBY', k('seq'), fresh) - fresh or 0
for i = 0, n - 1 do
  if out[i * 2 + 2] == 1 then
    local b = 1 + i * F
    local id, kind, goal, wf, driver, tags, prio, maxa, idem, qto =
      ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5], ARGV[b + 6],
      ARGV[b + 7], ARGV[b + 8], ARGV[b + 9], ARGV[b + 10]
    prio = I(tonumber(prio))
    if maxa == '' then maxa = I(cfg('max_attempts')) end
    local tenant = F >= 14 and ARGV[b + 14] or ''
    local roles = F >= 15 and ARGV[b + 15] or ''
    local sig = roles == '' and signature(driver, tags, prio, tenant) or ''
    seq = seq + 1
    local seq_s = I(seq)
    local tk = k('task', id)
    if #goal > 64 then  -- keep the hash a listpack: long goals live in their own key
      redis.call('SET', k('task', id, 'goal'), goal)
      goal = ''
    end
    redis.call('HSET', tk, 'id', id, 'status', 'queued', 'kind', kind, 'goal', goal,
      'workflow', wf, 'driver_type', driver, 'tags', tags, 'priority', prio, 'attempt', '0',
      'max_attempts', maxa, 'seq', seq_s, 'sig', sig, 'submitted_at', now_s, 'updated_at', now_s)
    if F >= 14 and ARGV[b + 12] ~= '' then redis.call('HSET', tk, 'retry_on', ARGV[b + 12]) end
    if F >= 14 and ARGV[b + 13] ~= '' then redis.call('HSET', tk, 'retry_backoff', ARGV[b + 13]) end
    if roles ~= '' then redis.call('HSET', tk, 'roles', roles) end
    if F >= 16 and ARGV[b + 16] ~= '' then redis.call('HSET', tk, 'timeout', ARGV[b + 16]) end
    local later = F >= 17 and ARGV[b + 17] ~= '' and tonumber(ARGV[b + 17]) or 0
    if later <= now then later = nil end
    if tenant ~= '' then redis.call('HSET', tk, 'tenant', tenant) end
    if F >= 18 and ARGV[b + 18] ~= '' then
      redis.call('HSET', tk, 'retry_of', ARGV[b + 18])
      redis.call('HSET', k('task', ARGV[b + 18]), 'rerun_by', id)
    end
    if idem ~= '' then
      redis.call('HSET', tk, 'idempotency_key', idem)
      redis.call('SET', k('idem', idem), id, 'PX', cfg_ms('idempotency_ttl'))
    end
    local timeout = tonumber(qto ~= '' and qto or cfg('queue_timeout'))
    if timeout and timeout > 0 then
      local deadline = I((later or now) + math.floor(timeout * 1000))
      redis.call('HSET', tk, 'queue_deadline', deadline)
      redis.call('ZADD', k('deadlines'), deadline, id)
    end
    if later then  -- not before then: it waits as a retry does (expire.lua enqueues it)
      redis.call('HSET', tk, 'eligible_at', I(later))
      redis.call('ZADD', k('retries'), I(later), id)
    elseif roles ~= '' then  -- a gang task waits in `gangs` (the scheduler places all its roles at once)
      redis.call('ZADD', k('gangs'), seq_s, id)
    else
      enqueue(id, sig, seq_s, driver, tags, prio, tenant)
    end
    index_status(id, nil, 'queued', seq_s)
    if F >= 20 and ARGV[b + 20] ~= '' then redis.call('HSET', tk, 'traceparent', ARGV[b + 20]) end
    if F == 21 and ARGV[b + 21] ~= '' then redis.call('HSET', tk, 'class', ARGV[b + 21]) end
    local by = F >= 19 and ARGV[b + 19] or ''
    if by ~= '' then
      redis.call('HSET', tk, 'submitted_by', by)
      emit('submitted', 'task', id, 'sig', sig, 'by', by)
    else
      emit('submitted', 'task', id, 'sig', sig)
    end
  end
end
if fresh > 0 then wake(k('sched', 'wake')) end
return out
