-- claim.lua: the owning host takes up to `max` unexpired assigned attempts from its inbox to
-- `dispatched`, each with a fresh run lease (now + lease_ttl). Exactly one caller gets each.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token_digest max
-- Returns  an array of claimed tasks, each a flat field/value array of the task hash.
--          Stale inbox entries (expired, cancelled, reassigned) are dropped silently.
-- Errors   AUTH (unknown host / wrong token), INVALID (bad max).
local host_id, digest, max = ARGV[1], ARGV[2], tonumber(ARGV[3])
local hk, err = auth_host(host_id, digest)
if not hk then return err end
if not max or max < 1 then return fail('INVALID', 'max must be a positive integer') end
local now = now_ms()
local ttl = cfg_ms('lease_ttl')
local now_s, expires_s = now_str(), I(now + ttl)
local inbox = k('host', host_id, 'inbox')
local out = {}
while #out < max do
  local id = redis.call('LPOP', inbox)
  if not id then break end
  local tk = k('task', id)
  local t = redis.call('HMGET', tk, 'status', 'host_id', 'lease_expires_at', 'attempt', 'seq',
    'assigned_at', 'submitted_at', 'lease_id', 'device_id')
  if t[1] == 'assigned' and t[2] == host_id and tonumber(t[3]) > now then
    redis.call('HSET', tk, 'status', 'dispatched', 'lease_expires_at', expires_s,
      'dispatched_at', now_s, 'updated_at', now_s)
    index_status(id, 'assigned', 'dispatched', t[5])
    redis.call('ZADD', k('leases'), expires_s, id)
    emit('dispatched', 'task', id, 'lease', t[8], 'host', host_id, 'device', t[9], 'attempt', t[4],
      'claim_ms', I(now - tonumber(t[6])), 'since_submit_ms', I(now - tonumber(t[7])))
    out[#out + 1] = task_flat(id)
  end
end
return out
