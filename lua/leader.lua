--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/events"
-- leader.lua: acquire, renew or release the scheduler leader lease.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     owner ttl_ms op (acquire | release)
-- Returns  acquire: {epoch, 1} when `owner` leads (newly or still; epoch is the fencing token
--          the assign commit checks), {epoch_of_leader, 0, leader_owner} when another leads.
--          release: 1 if owner was the leader and stepped down, else 0.
-- Keys     reads/writes leader, leader:epoch, events; reads config
-- Errors   INVALID (malformed owner, ttl_ms not 1..3600000, unknown op)
local owner, op = ARGV[1], ARGV[3]
local ttl = int_in(ARGV[2], 1, 3600000)
if not valid_id(owner) or #ARGV ~= 3 then return fail('INVALID', 'malformed owner') end
if op ~= 'acquire' and op ~= 'release' then return fail('INVALID', 'op must be acquire or release') end
if not ttl then return fail('INVALID', 'ttl_ms must be an integer 1-3600000') end
local lk = k('leader')
local cur = redis.call('GET', lk)
if op == 'release' then
  if cur and cur:match('^(.*):%d+$') == owner then
    redis.call('DEL', lk)
    emit('leader_released', 'owner', owner)
    return 1
  end
  return 0
end
if cur then
  local who, epoch = cur:match('^(.*):(%d+)$')
  if who == owner then
    redis.call('PEXPIRE', lk, ttl)
    return {tonumber(epoch), 1}
  end
  return {tonumber(epoch), 0, who}
end
local epoch = redis.call('INCR', k('leader', 'epoch'))
redis.call('SET', lk, owner .. ':' .. epoch, 'PX', ttl)
emit('leader_elected', 'owner', owner, 'epoch', I(epoch))
return {epoch, 1}
