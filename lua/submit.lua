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
--- @include "lib/where"
--- @include "gen/args/submit"
--- @include "gen/bounds"
--- @include "gen/retry_kinds"
-- submit.lua: enqueue one or more tasks as `queued` (all or nothing).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV[1]  n, the number of tasks (1..MAX_SUBMIT_TASKS; the bounds named here: gen/bounds)
-- ARGV[2]  the tasks, packed (deviceq.core.script_args SUBMIT, gen/args/submit): one cmsgpack
--          array of n * TASK_N values, task after task, each task's fields in this order (an
--          optional field not given is false):
--   id               the task id
--   kind             goal | workflow
--   goal             the goal ('' for a workflow task; no NUL byte: no runner can pass one)
--   workflow         the workflow's name ('' for a goal task)
--   driver_type      '' = any
--   tags             csv, sorted, distinct, at most 32
--   priority         a number 0..9
--   max_attempts     optional, a number 1..1000 (else the pool default)
--   idempotency_key  optional, an id
--   queue_timeout    optional, a decimal 0 < s <= 1 year (else the pool default)
--   reject_unmatched optional, 1 yes or 0 no (else the pool setting reject_unmatchable)
--   retry_on         optional, none or a csv of failure kinds (else the pool setting)
--   retry_backoff    optional, none | fixed:S | exponential:BASE:MAX (else the pool setting)
--   tenant           optional, an id: the bucket is per tenant (signature in lib/constraints.lua)
--   roles            optional, NAME=DRIVER:TAGS;... (parse_roles in lib/roles.lua): a
--                    multi-device task, which waits in `gangs` instead of a bucket and has no
--                    driver_type, tags or tenant of its own
--   timeout          optional, a decimal 0.001 <= s <= 7 days: the longest a run may take,
--                    capped by the host's --task-timeout; not with roles
--   not_before       optional, ms since the epoch, at most a year ahead: the task waits in
--                    `retries`, field eligible_at, until then (expire.lua enqueues it); its
--                    queue timeout counts from then
--   retry_of         optional, the id of an existing task this one runs again (Client.retry:
--                    the new task's field retry_of, the old task's rerun_by the new id)
--   by               optional, an id: who submitted it (e.g. the dashboard user who retried a
--                    task; the task's submitted_by and the submitted event's `by`)
--   traceparent      optional, a W3C trace context 00-TRACE(32 hex)-SPAN(16 hex)-FLAGS(2 hex):
--                    the trace of its submission (deviceq.core.tracing)
--   pin              optional, a device id: the task runs on that device only and waits for it
--                    (a bucket of its own: signature in lib/constraints.lua; assign.lua refuses
--                    any other device); not with roles
--   class            optional, an id: its priority class (deviceq.core.priority_classes; the
--                    caller gives the class's priority as its priority)
--   where            optional, compiled --where clauses (deviceq.core.where.compile_all;
--                    valid_where in lib/where.lua): the device's attributes must satisfy
--                    them (assign.lua re-checks); part of the bucket's signature; not with roles
--   tests            optional, its list of tests (a suite's shard): test ids, one a line
--                    (1..MAX_TEST_ID_BYTES bytes each, no control character, no blank around),
--                    at most MAX_TESTS_LIST_BYTES in all; kept in task:ID:tests (the hash's
--                    `tests`: how many) and returned with the claim; not with roles
--   role_where       optional, a JSON object role name -> compiled --where clauses (as where)
--                    of a task with roles: gang_assign.lua checks each role's device by them
-- Keys     reads config, caps, idem:KEY, task:ID, workflow:NAME, status:queued;
--          writes seq, task:ID, task:ID:goal, task:ID:tests, idem:KEY, deadlines, sig:SIG, queue:SIG, queues, gangs,
--          retries, status:queued, events, sched:wake
-- Returns  a flat array: per task, its id and 1 (created) or 0 (an earlier task with the same
--          idempotency key, whose id is returned instead).
-- Errors   QUEUE_FULL (the pool holds max_queue_depth queued tasks), NOT_FOUND (unknown
--          workflow), INVALID (any malformed argument; nothing is written), EXISTS (task id
--          already used), UNMATCHABLE (rejecting unmatched tasks and no registered device could
--          run it; the check reads the `caps` hash of distinct device profiles, not the devices).
local n = int_in(ARGV[1], 1, MAX_SUBMIT_TASKS)
local A = #ARGV == 2 and packed_items(ARGV[2], n, TASK_N)
if not A then return fail('INVALID', 'bad argument count') end

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

-- check one task's fields (from A[b + 1]); returns nil or an error reply
local function check(b)
  local id, kind, goal, wf, driver, tags = A[b + TASK_ID], A[b + TASK_KIND], A[b + TASK_GOAL],
    A[b + TASK_WORKFLOW], A[b + TASK_DRIVER_TYPE], A[b + TASK_TAGS]
  if not valid_id(id) then return fail('INVALID', 'malformed task id') end
  if kind == 'goal' then
    if type(goal) ~= 'string' or #goal < 1 or #goal > MAX_GOAL_BYTES or not goal:match('%S') or not valid_utf8(goal) then
      return fail('INVALID', 'goal must be 1-' .. MAX_GOAL_BYTES .. ' bytes of UTF-8 text and not blank')
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
  if not whole_in(A[b + TASK_PRIORITY], 0, MAX_PRIORITY) then
    return fail('INVALID', 'priority must be 0-' .. MAX_PRIORITY)
  end
  local maxa = A[b + TASK_MAX_ATTEMPTS]
  if maxa and not whole_in(maxa, 1, MAX_ATTEMPTS) then
    return fail('INVALID', 'max_attempts must be 1-' .. MAX_ATTEMPTS)
  end
  local idem = A[b + TASK_IDEMPOTENCY_KEY]
  if idem and not valid_id(idem) then
    return fail('INVALID', 'malformed idempotency key')
  end
  local qto = A[b + TASK_QUEUE_TIMEOUT]
  if qto and not num_in(qto, MIN_QUEUE_TIMEOUT, MAX_QUEUE_TIMEOUT) then
    return fail('INVALID', 'queue_timeout must be a number of seconds, 0 < s <= 1 year')
  end
  local rej = A[b + TASK_REJECT_UNMATCHED]
  if rej and rej ~= 0 and rej ~= 1 then return fail('INVALID', 'reject_unmatched must be 0 or 1') end
  local ro, rb, tenant = A[b + TASK_RETRY_ON], A[b + TASK_RETRY_BACKOFF], A[b + TASK_TENANT]
  if ro and (type(ro) ~= 'string' or not retry_kinds(ro)) then
    return fail('INVALID', 'retry_on must be none or a csv of ' .. RETRY_KINDS_TEXT)
  end
  if rb and (type(rb) ~= 'string' or not parse_backoff(rb)) then
    return fail('INVALID', 'retry_backoff must be none, fixed:SECONDS or exponential:BASE:MAX')
  end
  if tenant and not valid_id(tenant) then return fail('INVALID', 'malformed tenant') end
  local nb = A[b + TASK_NOT_BEFORE]
  if nb and (not whole_in(nb, 0, 9007199254740991) or nb > now_ms() + MAX_NOT_BEFORE_AHEAD_MS) then
    return fail('INVALID', 'not_before must be a time (ms since the epoch) at most a year ahead')
  end
  local by, tp = A[b + TASK_BY], A[b + TASK_TRACEPARENT]
  if by and not valid_id(by) then
    return fail('INVALID', 'malformed submitter (by)')
  end
  if A[b + TASK_CLASS] and not valid_id(A[b + TASK_CLASS]) then
    return fail('INVALID', 'malformed priority class')
  end
  if tp and (type(tp) ~= 'string' or not tp:match('^00%-' .. ('[0-9a-f]'):rep(32) ..
      '%-' .. ('[0-9a-f]'):rep(16) .. '%-[0-9a-f][0-9a-f]$')) then
    return fail('INVALID', 'malformed traceparent')
  end
  local pin = A[b + TASK_PIN]
  if pin and not valid_id(pin) then return fail('INVALID', 'malformed pin (a device id)') end
  if pin and A[b + TASK_ROLES] then return fail('INVALID', 'a task with roles cannot be pinned') end
  local tests = A[b + TASK_TESTS]
  if tests then
    if type(tests) ~= 'string' or #tests < 1 or #tests > MAX_TESTS_LIST_BYTES or not valid_utf8(tests)
        or tests:find('[%z\1-\9\11-\31\127]') or tests:find('\n\n', 1, true)
        or tests:sub(1, 1) == '\n' or tests:sub(-1) == '\n' then
      return fail('INVALID', 'tests must be test ids, one a line, at most ' .. MAX_TESTS_LIST_BYTES ..
        ' bytes, no control character')
    end
    for line in tests:gmatch('[^\n]+') do
      if #line > MAX_TEST_ID_BYTES or line:find('^%s') or line:find('%s$') then
        return fail('INVALID', 'a test id must be 1-' .. MAX_TEST_ID_BYTES .. ' bytes, no blank around')
      end
    end
    if A[b + TASK_ROLES] then return fail('INVALID', 'a task with roles cannot have a list of tests') end
  end
  local retry_of = A[b + TASK_RETRY_OF]
  if retry_of and not valid_id(retry_of) then
    return fail('INVALID', 'malformed retry_of task id')
  end
  local roles, timeout = A[b + TASK_ROLES], A[b + TASK_TIMEOUT]
  local where = A[b + TASK_WHERE]
  if where then
    if not valid_where(where) or not valid_utf8(where) then return fail('INVALID', 'malformed where') end
    if roles then return fail('INVALID', 'a task with roles cannot have where clauses of its own') end
  end
  if timeout then
    if not num_in(timeout, MIN_TASK_TIMEOUT, MAX_TASK_TIMEOUT) then
      return fail('INVALID', 'timeout must be a number of seconds, ' .. MIN_TASK_TIMEOUT .. ' <= s <= ' ..
        MAX_TASK_TIMEOUT .. ' (7 days)')
    end
    if roles then return fail('INVALID', 'a task with roles cannot have a timeout of its own') end
  end
  local rw = A[b + TASK_ROLE_WHERE]
  if rw then
    local ok, m = pcall(cjson.decode, rw)
    if not roles then return fail('INVALID', 'role_where is for a task with roles') end
    if not ok or type(m) ~= 'table' or #rw > 8192 or not valid_utf8(rw) then
      return fail('INVALID', 'malformed role_where')
    end
    local names = {}
    for _, r in ipairs(type(roles) == 'string' and parse_roles(roles) or {}) do names[r.name] = true end
    for name, w in pairs(m) do
      if type(name) ~= 'string' or not names[name] then return fail('INVALID', 'role_where names no role of the task') end
      if type(w) ~= 'string' or w == '' or not valid_where(w) then
        return fail('INVALID', 'malformed where of role ' .. name)
      end
    end
  end
  if roles then
    local parsed, why = type(roles) == 'string' and parse_roles(roles)
    if not parsed then return fail('INVALID', why or 'malformed roles') end
    if driver ~= '' or tags ~= '' then
      return fail('INVALID', 'a task with roles has no driver_type or tags of its own: give them per role')
    end
    if tenant then return fail('INVALID', 'a task with roles cannot have a tenant') end
    for _, r in ipairs(parsed) do
      if #id + 1 + #r.name > 128 then return fail('INVALID', 'task id too long for its role names') end
    end
  end
end

-- validate everything before writing anything
for i = 0, n - 1 do
  local err = check(i * TASK_N)
  if err then return err end
end
local fresh, out, seen, ids = 0, {}, {}, {}
for i = 0, n - 1 do
  local b = i * TASK_N
  local id, kind, wf, idem = A[b + TASK_ID], A[b + TASK_KIND], A[b + TASK_WORKFLOW], A[b + TASK_IDEMPOTENCY_KEY]
  if kind == 'workflow' and redis.call('EXISTS', k('workflow', wf)) == 0 then
    return fail('NOT_FOUND', 'unknown workflow ' .. wf)
  end
  local retry_of = A[b + TASK_RETRY_OF]
  if retry_of and redis.call('EXISTS', k('task', retry_of)) == 0 then
    return fail('NOT_FOUND', 'no task ' .. retry_of .. ' to retry')
  end
  local rej = A[b + TASK_REJECT_UNMATCHED]
  if not rej then rej = cfg('reject_unmatchable') == 1 and 1 or 0 end
  local roles = A[b + TASK_ROLES] and parse_roles(A[b + TASK_ROLES])
  if rej == 1 then
    local ok, why = true, nil
    for _, r in ipairs(roles or {{driver = A[b + TASK_DRIVER_TYPE], tags = A[b + TASK_TAGS]}}) do
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
  if idem then existing = redis.call('GET', k('idem', idem)) or seen[idem] end
  if existing then
    out[#out + 1] = existing; out[#out + 1] = 0
  else
    if ids[id] or redis.call('EXISTS', k('task', id)) == 1 then
      return fail('EXISTS', 'task id already used ' .. id)
    end
    ids[id] = true
    if idem then seen[idem] = id end
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
    local b = i * TASK_N
    local id, kind, goal, wf, driver, tags, maxa, idem, qto =
      A[b + TASK_ID], A[b + TASK_KIND], A[b + TASK_GOAL], A[b + TASK_WORKFLOW],
      A[b + TASK_DRIVER_TYPE], A[b + TASK_TAGS], A[b + TASK_MAX_ATTEMPTS],
      A[b + TASK_IDEMPOTENCY_KEY], A[b + TASK_QUEUE_TIMEOUT]
    local prio = I(A[b + TASK_PRIORITY])
    maxa = I(maxa or cfg('max_attempts'))
    local tenant = A[b + TASK_TENANT] or ''
    local roles = A[b + TASK_ROLES] or ''
    local pin = A[b + TASK_PIN] or ''
    local where = A[b + TASK_WHERE] or ''
    local sig = roles == '' and signature(driver, tags, prio, tenant, pin, where) or ''
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
    local ro, rb, timeout = A[b + TASK_RETRY_ON], A[b + TASK_RETRY_BACKOFF], A[b + TASK_TIMEOUT]
    if ro then redis.call('HSET', tk, 'retry_on', ro) end
    if rb then redis.call('HSET', tk, 'retry_backoff', rb) end
    if roles ~= '' then redis.call('HSET', tk, 'roles', roles) end
    if A[b + TASK_ROLE_WHERE] then redis.call('HSET', tk, 'role_where', A[b + TASK_ROLE_WHERE]) end
    if timeout then redis.call('HSET', tk, 'timeout', timeout) end
    if where ~= '' then redis.call('HSET', tk, 'where', where) end
    local later = A[b + TASK_NOT_BEFORE] or 0
    if later <= now then later = nil end
    if tenant ~= '' then redis.call('HSET', tk, 'tenant', tenant) end
    if pin ~= '' then redis.call('HSET', tk, 'pin', pin) end
    local tests = A[b + TASK_TESTS]
    if tests then  -- (its own key: the hash stays a listpack)
      local _, lines = tests:gsub('\n', '')
      redis.call('SET', k('task', id, 'tests'), tests)
      redis.call('HSET', tk, 'tests', I(lines + 1))
    end
    local retry_of = A[b + TASK_RETRY_OF]
    if retry_of then
      redis.call('HSET', tk, 'retry_of', retry_of)
      redis.call('HSET', k('task', retry_of), 'rerun_by', id)
    end
    if idem then
      redis.call('HSET', tk, 'idempotency_key', idem)
      redis.call('SET', k('idem', idem), id, 'PX', cfg_ms('idempotency_ttl'))
    end
    local timeout_s = tonumber(qto or cfg('queue_timeout'))
    if timeout_s and timeout_s > 0 then
      local deadline = I((later or now) + math.floor(timeout_s * 1000))
      redis.call('HSET', tk, 'queue_deadline', deadline)
      redis.call('ZADD', k('deadlines'), deadline, id)
    end
    if later then  -- not before then: it waits as a retry does (expire.lua enqueues it)
      redis.call('HSET', tk, 'eligible_at', I(later))
      redis.call('ZADD', k('retries'), I(later), id)
    elseif roles ~= '' then  -- a gang task waits in `gangs` (the scheduler places all its roles at once)
      redis.call('ZADD', k('gangs'), seq_s, id)
    else
      enqueue(id, sig, seq_s, driver, tags, prio, tenant, pin, where)
    end
    index_status(id, nil, 'queued', seq_s)
    local tp = A[b + TASK_TRACEPARENT]
    if tp then redis.call('HSET', tk, 'traceparent', tp) end
    if A[b + TASK_CLASS] then redis.call('HSET', tk, 'class', A[b + TASK_CLASS]) end
    local by = A[b + TASK_BY]
    if by then
      redis.call('HSET', tk, 'submitted_by', by)
      emit('submitted', 'task', id, 'sig', sig, 'by', by)
    else
      emit('submitted', 'task', id, 'sig', sig)
    end
  end
end
if fresh > 0 then wake(k('sched', 'wake')) end
return out
