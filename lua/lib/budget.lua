-- lib/budget.lua: a time budget for a script that splits its work by time, not count: the
-- script checks `budget_left()` between items (each item a whole transition) and stops once
-- its budget is spent, answering that more is left; its caller calls it again. `TIME` is read
-- afresh at each check (`now_ms` in lib/base.lua stays the one clock of the transitions).
-- Redis 7.2 and later freeze `TIME` while a script runs (it answers the script's start): where
-- the clock has not moved, the budget counts the estimates the script gives per item with
-- `budget_spend` instead (microseconds an item of that kind took on a development machine).

local _budget_t0, _budget_us, _budget_est

-- microseconds since the epoch, read now
local function clock_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- start the budget: `us` microseconds from now (nil: no budget, budget_left is always true)
local function budget_start(us)
  _budget_us, _budget_est = us, 0
  if us then _budget_t0 = clock_us() end
end

-- an item estimated at `us` microseconds is done (counts only where the clock stands still)
local function budget_spend(us)
  _budget_est = _budget_est + us
end

-- is some of the budget left? `reserve_us` (optional): the estimated work the script still
-- does after its items whatever happens (e.g. flushing what it batched), counted as spent
local function budget_left(reserve_us)
  if not _budget_us then return true end
  local spent = clock_us() - _budget_t0
  if spent <= 0 then spent = _budget_est end  -- a frozen clock (Redis 7.2+)
  return spent + (reserve_us or 0) < _budget_us
end
