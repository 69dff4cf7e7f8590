--- @include "lib/base"
--- @include "lib/config"
--- @include "gen/statuses"
-- lib/status.lua: the status indexes and a finished task's expiry.

-- move a task between status indexes; terminal sets are scored by finish time (expire.lua
-- trims them to the retention window) and a finished task's keys expire after `retention`.
-- `t`: the task's fields as loaded this call (load_task), when the caller has them: a
-- finished task's attempt, goal, avoid_devices, queue_deadline and eligible_at are then not
-- read again (no transition changes them between its load and its end)
local _keep
local function index_status(id, old, new, seq, t)
  local part = seq == ''  -- a gang's part (gang_assign.lua): only its gang's task is indexed
  if old and not part then redis.call('ZREM', k('status', old), id) end
  if TERMINAL[new] then
    if not _keep then _keep = I(cfg_ms('retention')) end
    local keep = _keep
    if not part then redis.call('ZADD', k('status', new), now_str(), id) end
    redis.call('PEXPIRE', k('task', id), keep)
    -- the attempt history, a long goal and a list of tests (only these keys exist besides the
    -- hash)
    local h = t and {t.attempt, t.goal, t.avoid_devices, t.queue_deadline, t.eligible_at, t.tests}
      or redis.call('HMGET', k('task', id), 'attempt', 'goal', 'avoid_devices', 'queue_deadline',
        'eligible_at', 'tests')
    if h[1] and h[1] ~= '0' then redis.call('PEXPIRE', k('task', id, 'attempts'), keep) end
    if h[2] == '' and not part then redis.call('PEXPIRE', k('task', id, 'goal'), keep) end
    if h[6] and h[6] ~= '' then redis.call('PEXPIRE', k('task', id, 'tests'), keep) end
    if old == 'queued' and h[3] and h[3] ~= '' then redis.call('HDEL', k('avoid'), id) end
    if h[4] and h[4] ~= '' then redis.call('ZREM', k('deadlines'), id) end
    if old == 'queued' and h[5] and h[5] ~= '' then  -- ended while waiting for its retry
      redis.call('ZREM', k('retries'), id)
      redis.call('HDEL', k('task', id), 'eligible_at')
    end
  elseif not part then
    redis.call('ZADD', k('status', new), seq, id)
  end
end
