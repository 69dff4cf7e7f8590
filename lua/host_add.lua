--- @include "lib/base"
--- @include "lib/args"
--- @include "lib/events"
--- @include "lib/notify"
-- host_add.lua: register a host with the digest of its token, or rotate the token.
-- The digest is "sha1:" + hex SHA-1 of the token (computed by the operator's client; the host
-- later sends the token itself, which the scripts hash: reading Redis yields no credential).
-- Rotation ends the host's daemon session: the running daemon's next call is refused and it
-- is told at once (host:ID:ctl).
-- KEYS[1]  pool prefix "dq:{POOL}:"
-- ARGV     host_id token_digest mode (add | rotate)
-- Keys     writes host:ID, hosts, host:ID:ctl, events; reads config
-- Returns  "added" | "rotated"
-- Errors   INVALID (malformed id / digest / mode), EXISTS (add: host exists),
--          NOT_FOUND (rotate: no host)
local host_id, digest, mode = ARGV[1], ARGV[2], ARGV[3]
if not valid_id(host_id) then return fail('INVALID', 'malformed host id') end
if type(digest) ~= 'string' or not digest:match('^sha1:' .. string.rep('[0-9a-f]', 40) .. '$') then
  return fail('INVALID', 'malformed token digest')
end
if mode ~= 'add' and mode ~= 'rotate' then return fail('INVALID', 'mode must be add or rotate') end
local hk = k('host', host_id)
local exists = redis.call('EXISTS', hk) == 1
if mode == 'add' then
  if exists then return fail('EXISTS', 'host ' .. host_id .. ' already exists') end
  redis.call('HSET', hk, 'id', host_id, 'token_digest', digest, 'draining', '0', 'stopping', '0',
    'last_heartbeat', '0', 'session', '', 'created_at', now_str())
  redis.call('SADD', k('hosts'), host_id)
  emit('host_added', 'host', host_id)
  return 'added'
end
if not exists then return fail('NOT_FOUND', 'no host ' .. host_id) end
redis.call('HSET', hk, 'token_digest', digest, 'rotated_at', now_str(), 'session', '')
ctl(host_id, 'rotated')
emit('host_token_rotated', 'host', host_id)
return 'rotated'
