--- @include "lib/base"
--- @include "lib/args"
-- login_attempt.lua: no task state: the dashboard's limit on login attempts. `charge` counts
-- one attempt against its client address and (optionally) its user name, each a counter of
-- the current window (created with the window's expiry), or refuses it and counts nothing
-- when any of them is at its limit: concurrent attempts cannot all pass before one is
-- counted. `refund` takes one back from each counter still there (a successful login).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     charge window_ms(1..86400000) addr_digest addr_limit(1..1000000) [user_digest
--          user_limit] | refund addr_digest [user_digest]; a digest: 64 hex digits (sha256)
-- Keys     reads/writes dashboard:login:addr:DIGEST, dashboard:login:user:DIGEST
-- Returns  charge: 0 (counted: check the password) or the ms left of the window of a full
--          counter (refused); refund: the number of counters taken back
-- Errors   INVALID
local function digest(s)
  return type(s) == 'string' and #s == 64 and s:match('^%x+$') ~= nil
end
local op = ARGV[1]
if op == 'refund' then
  if (#ARGV ~= 2 and #ARGV ~= 3) or not digest(ARGV[2]) or (ARGV[3] and not digest(ARGV[3])) then
    return fail('INVALID', 'refund takes an address digest and an optional user digest')
  end
  local n = 0
  for i, scope in ipairs({'addr', 'user'}) do
    local key = ARGV[i + 1] and k('dashboard', 'login', scope .. ':' .. ARGV[i + 1])
    if key and tonumber(redis.call('GET', key) or '0') > 0 then
      redis.call('DECR', key)
      n = n + 1
    end
  end
  return n
end
if op ~= 'charge' or (#ARGV ~= 4 and #ARGV ~= 6) then
  return fail('INVALID', 'charge window_ms addr_digest addr_limit [user_digest user_limit]')
end
local window = int_in(ARGV[2], 1, 86400000)
local counters = {{ARGV[3], int_in(ARGV[4], 1, 1000000), 'addr'}}
if #ARGV == 6 then counters[2] = {ARGV[5], int_in(ARGV[6], 1, 1000000), 'user'} end
if not window then return fail('INVALID', 'window_ms must be 1..86400000') end
for _, c in ipairs(counters) do
  if not digest(c[1]) or not c[2] then return fail('INVALID', 'a digest is 64 hex digits, a limit 1..1000000') end
  c[1] = k('dashboard', 'login', c[3] .. ':' .. c[1])
end
local wait = 0
for _, c in ipairs(counters) do
  if tonumber(redis.call('GET', c[1]) or '0') >= c[2] then
    local ttl = redis.call('PTTL', c[1])
    if ttl < 0 then  -- a counter without expiry (none is made so): give it one
      redis.call('PEXPIRE', c[1], window)
      ttl = window
    end
    if ttl > wait then wait = ttl end
  end
end
if wait > 0 then return wait end
for _, c in ipairs(counters) do
  redis.call('INCR', c[1])
  if redis.call('PTTL', c[1]) < 0 then redis.call('PEXPIRE', c[1], window) end
end
return 0
