-- wrk script of bench/rss.sh: POSTs to `idem serve`, each with an
-- Idempotency-Key (an RFC 8941 String). Most keys are fresh; a share of the
-- requests repeats a key sent a while before by the same thread (long
-- enough ago to have been answered), which the gateway replays.
--
--   wrk ... -s rss-serve.lua URL -- REPLAY_SHARE PAUSE_MS PREFIX
--
-- PAUSE_MS is the pause of each connection between two requests, which
-- paces the load (0: as fast as the gateway answers).

local threads = {}
local next_id = 0

function setup(thread)
   thread:set("id", next_id)
   next_id = next_id + 1
   table.insert(threads, thread)
end

local recent = {}        -- ring of the last RING fresh keys
local RING = 4096
local SETTLE = 256       -- the newest keys are left alone: they may be in flight

function init(args)
   share = tonumber(args[1]) or 0.2
   pause = tonumber(args[2]) or 0
   prefix = args[3] or "k"
   fresh, replays, ok, busy, other = 0, 0, 0, 0, 0
   math.randomseed(1000 + id)
   headers = { ["Content-Type"] = "application/json" }
   body = '{"amount":10}'
end

function delay()
   return pause
end

function request()
   local key
   if fresh > SETTLE and math.random() < share then
      local span = math.min(fresh - SETTLE, RING - SETTLE)
      local n = fresh - SETTLE - math.random(0, span - 1)
      key = recent[n % RING]
      replays = replays + 1
   else
      fresh = fresh + 1
      key = prefix .. "-" .. id .. "-" .. fresh
      recent[fresh % RING] = key
   end
   headers["Idempotency-Key"] = '"' .. key .. '"'
   return wrk.format("POST", nil, headers, body)
end

function response(status)
   if status >= 200 and status < 300 then
      ok = ok + 1
   elseif status == 409 then
      busy = busy + 1
   else
      other = other + 1
   end
end

function done(summary)
   local f, r, o, b, x = 0, 0, 0, 0, 0
   for _, thread in ipairs(threads) do
      f = f + thread:get("fresh")
      r = r + thread:get("replays")
      o = o + thread:get("ok")
      b = b + thread:get("busy")
      x = x + thread:get("other")
   end
   io.write(string.format("keys: %d fresh, %d repeats; answers: %d 2xx, %d 409, %d other\n", f, r, o, b, x))
end
