-- submit.lua: enqueue one or more tasks as `queued` (all or nothing).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV[1]  n, the number of tasks; then 12 fields per task:
--          id kind goal workflow driver_type tags(csv, sorted) priority max_attempts('' = pool
--          default) idempotency_key('' = none) sig queue_timeout_s('' = pool default)
--          reject_unmatched('' = pool setting reject_unmatchable, '1' yes, '0' no)
-- Returns  a flat array: per task, its id and 1 (created) or 0 (an earlier task with the same
--          idempotency key, whose id is returned instead).
-- Errors   QUEUE_FULL (the pool holds max_queue_depth queued tasks), NOT_FOUND (unknown
--          workflow), INVALID (malformed id or field), EXISTS (task id already used),
--          UNMATCHABLE (rejecting unmatched tasks and no registered device could run it; the
--          check reads the `caps` hash of distinct device profiles, not the devices).
local n = tonumber(ARGV[1])
local F = 12
if not n or n < 1 or #ARGV ~= 1 + n * F then return fail('INVALID', 'bad argument count') end

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

-- validate everything before writing anything
local fresh, out, seen = 0, {}, {}
for i = 0, n - 1 do
  local b = 1 + i * F
  local id, kind, wf, idem = ARGV[b + 1], ARGV[b + 2], ARGV[b + 4], ARGV[b + 9]
  if not valid_id(id) then return fail('INVALID', 'malformed task id') end
  if kind ~= 'goal' and kind ~= 'workflow' then return fail('INVALID', 'kind must be goal or workflow') end
  if kind == 'workflow' and redis.call('EXISTS', k('workflow', wf)) == 0 then
    return fail('NOT_FOUND', 'unknown workflow ' .. wf)
  end
  if not valid_id(ARGV[b + 10]) then return fail('INVALID', 'malformed signature') end
  local rej = ARGV[b + 12]
  if rej == '' then rej = cfg('reject_unmatchable') == 1 and '1' or '0' end
  if rej == '1' then
    local ok, why = matchable(ARGV[b + 5], ARGV[b + 6])
    if not ok then
      return fail('UNMATCHABLE', 'no registered device could run task ' .. id .. ': ' .. why)
    end
  end
  local existing = false
  if idem ~= '' then
    if not valid_id(idem) then return fail('INVALID', 'malformed idempotency key') end
    existing = redis.call('GET', k('idem', idem)) or seen[idem]
  end
  if existing then
    out[#out + 1] = existing; out[#out + 1] = 0
  else
    if redis.call('EXISTS', k('task', id)) == 1 then return fail('EXISTS', 'task id already used ' .. id) end
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
local sigs = {}
for i = 0, n - 1 do
  if out[i * 2 + 2] == 1 then
    local b = 1 + i * F
    local id, kind, goal, wf, driver, tags, prio, maxa, idem, sig, qto =
      ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5], ARGV[b + 6],
      ARGV[b + 7], ARGV[b + 8], ARGV[b + 9], ARGV[b + 10], ARGV[b + 11]
    if maxa == '' then maxa = I(cfg('max_attempts')) end
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
    if idem ~= '' then
      redis.call('HSET', tk, 'idempotency_key', idem)
      redis.call('SET', k('idem', idem), id, 'PX', cfg_ms('idempotency_ttl'))
    end
    local timeout = tonumber(qto ~= '' and qto or cfg('queue_timeout'))
    if timeout and timeout > 0 then
      local deadline = now + math.floor(timeout * 1000)
      redis.call('HSET', tk, 'queue_deadline', deadline)
      redis.call('ZADD', k('deadlines'), deadline, id)
    end
    if not sigs[sig] then  -- first (oldest) task of its bucket in this call
      sigs[sig] = true
      redis.call('HSET', k('sig', sig), 'driver_type', driver, 'tags', tags, 'priority', prio)
      redis.call('ZADD', k('queues'), 'LT', seq_s, sig)
    end
    redis.call('ZADD', k('queue', sig), seq_s, id)
    index_status(id, nil, 'queued', seq_s)
    emit('submitted', 'task', id, 'sig', sig)
  end
end
if fresh > 0 then wake(k('sched', 'wake')) end
return out
