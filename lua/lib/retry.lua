--- @include "lib/config"
--- @include "gen/retry_kinds"
-- lib/retry.lua: the retry policy: retry_on, retry_backoff and the delay before a retry.

-- retry policy (deviceq.core.config check_retry_on / check_retry_backoff are the same checks).
-- retry_on: 'none' or a csv of failure kinds -> a set, or nil when malformed
local function retry_kinds(csv)
  if csv == 'none' then return {} end
  if csv == '' or csv:find(',,', 1, true) or csv:sub(1, 1) == ',' or csv:sub(-1) == ',' then
    return nil
  end
  local set = {}
  for w in string.gmatch(csv, '[^,]+') do
    if not RETRY_KINDS[w] then return nil end
    set[w] = true
  end
  return set
end

-- retry_backoff: 'none' | 'fixed:S' | 'exponential:BASE:MAX' (seconds, at most 999999.999,
-- at most 3 decimals) -> base_ms, doubling(bool), max_ms; nil when malformed
local function secs_ms(s)
  if not s or not (s:match('^0$') or s:match('^[1-9]%d?%d?%d?%d?%d?$') or
    s:match('^0%.%d%d?%d?$') or s:match('^[1-9]%d?%d?%d?%d?%d?%.%d%d?%d?$')) then return nil end
  return math.floor(tonumber(s) * 1000 + 0.5)
end
local function parse_backoff(spec)
  if spec == 'none' then return 0, false, 0 end
  local f = spec:match('^fixed:([^:]+)$')
  if f then
    local v = secs_ms(f)
    if v then return v, false, v end
    return nil
  end
  local b, m = spec:match('^exponential:([^:]+):([^:]+)$')
  local bv, mv = secs_ms(b), secs_ms(m)
  if bv and mv then return bv, true, mv end
  return nil
end

-- the delay (ms) before retrying task t (fields of load_task) after it failed with `kind`, or
-- nil when it is not retried: no attempts left, or `kind` not in its retry_on (the task's own,
-- else the pool's). Returns also the number of attempts used (hand-backs and preempted
-- attempts use none).
local function retry_delay(t, kind)
  local used = (tonumber(t.attempt) or 0) - (tonumber(t.handbacks) or 0)
    - (tonumber(t.preempted) or 0)
  if used >= (tonumber(t.max_attempts) or 1) then return nil, used end
  local on = retry_kinds(t.retry_on or '') or retry_kinds(cfg_text('retry_on'))
    or retry_kinds(text_default('retry_on'))
  if not on[kind] then return nil, used end
  local base, doubling, max = parse_backoff(t.retry_backoff or '')
  if not base then base, doubling, max = parse_backoff(cfg_text('retry_backoff')) end
  if not base then base, doubling, max = parse_backoff(text_default('retry_backoff')) end
  local d = base
  if doubling then
    d = math.min(max, base * 2 ^ math.min(math.max(used - 1, 0), 40))
    -- jitter: between half and all of it (the clock's microseconds: scripts get no RNG seed)
    local us = tonumber(redis.call('TIME')[2]) or 0
    d = d / 2 + (d / 2) * ((us % 1000) / 1000)
  end
  return math.floor(d), used
end
