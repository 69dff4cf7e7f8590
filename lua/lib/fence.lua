--- @include "lib/base"
-- lib/fence.lua: the scheduler leader's fencing epoch.

-- the scheduler's fence: nil when `fence` ('' = none, a manual dispatch) is the current
-- leader's epoch, else the error reply
local function check_fence(fence)
  if fence ~= '' and not fence:match('^%d+$') then return fail('INVALID', 'fence must be an epoch') end
  if fence ~= '' then
    local cur = redis.call('GET', k('leader'))
    if not cur or cur:match(':(%d+)$') ~= fence then
      return fail('FENCED', 'scheduler epoch ' .. fence .. ' is not the current leader')
    end
  end
end

-- a scheduler's commit (a fence given) while the pool is paused (`deviceq pause`,
-- pool_pause.lua): nothing new is assigned; a manual dispatch ('' fence) still is
local function paused_for(fence)
  return fence ~= '' and redis.call('EXISTS', k('paused')) == 1
end
