--- @include "lib/base"
--- @include "lib/args"
-- lib/auth.lua: host authentication (token digest and daemon session).

-- authenticate a host call: the host sends its token, Redis keeps only sha1(token), so reading
-- Redis never yields a usable credential. `session` must be the host's current session (''
-- only while no daemon session is active). Returns the host hash key, or nil and an error;
-- with `more` (field names of the host hash), also their values, read in the same HMGET.
local function auth_host(host_id, token, session, more)
  if not valid_id(host_id) then return nil, fail('AUTH', 'malformed host id') end
  local hk = k('host', host_id)
  local h = redis.call('HMGET', hk, 'token_digest', 'session', unpack(more or {}))
  if not h[1] then  -- (whatever the token: an unknown host is said to be one)
    return nil, fail('AUTH', 'unknown host ' .. host_id .. ': not registered in this pool (removed?)')
  end
  if type(token) ~= 'string' or #token < 16 or #token > 256 then
    return nil, fail('AUTH', 'wrong token for host ' .. host_id)
  end
  if h[1] ~= 'sha1:' .. redis.sha1hex(token) then
    return nil, fail('AUTH', 'wrong token for host ' .. host_id .. ' (rotated?)')
  end
  local vals = more and {unpack(h, 3, 2 + #more)} or nil
  if session == nil then return hk, nil, vals end
  if (h[2] or '') ~= session then
    if session == '' then
      return nil, fail('SUPERSEDED', 'host ' .. host_id .. ' has a daemon session; this call carries none')
    end
    return nil, fail('SUPERSEDED', 'session ' .. session .. ' of host ' .. host_id ..
      ' was superseded by a newer daemon (takeover, restart or token rotation)')
  end
  return hk, nil, vals
end
