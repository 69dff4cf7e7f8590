-- host_add.lua: register a host with the digest of its token, or rotate the token.
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token_digest mode (add | rotate)
-- Returns  "added" | "rotated"
-- Errors   INVALID (malformed id / mode), EXISTS (add: host exists), NOT_FOUND (rotate: no host)
local host_id, digest, mode = ARGV[1], ARGV[2], ARGV[3]
if not valid_id(host_id) then return fail('INVALID', 'malformed host id') end
if not digest or not digest:match('^sha256:[0-9a-f]+$') then return fail('INVALID', 'malformed token digest') end
local hk = k('host', host_id)
local exists = redis.call('EXISTS', hk) == 1
local now = now_ms()
if mode == 'add' then
  if exists then return fail('EXISTS', 'host ' .. host_id .. ' already exists') end
  redis.call('HSET', hk, 'id', host_id, 'token_digest', digest, 'draining', '0',
    'last_heartbeat', 0, 'created_at', now)
  redis.call('SADD', k('hosts'), host_id)
  emit('host_added', 'host', host_id)
  return 'added'
elseif mode == 'rotate' then
  if not exists then return fail('NOT_FOUND', 'no host ' .. host_id) end
  redis.call('HSET', hk, 'token_digest', digest, 'rotated_at', now)
  emit('host_token_rotated', 'host', host_id)
  return 'rotated'
end
return fail('INVALID', 'mode must be add or rotate')
