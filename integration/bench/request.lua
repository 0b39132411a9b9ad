-- The benchmark's request for wrk: a small JSON POST, like a payment API's.
-- Arguments (after --): mode, prefix, keys, recent.
--   plain   no Idempotency-Key
--   fresh   a new key on every request: <prefix>-<thread>-<n>
--   replay  one of <keys> keys (default 64), <prefix>-<i>, created before
--   random  a random one of <keys> keys (the soak)
--   stored  a random one of <keys> keys, <prefix>-1 to <prefix>-<keys>,
--           each a job stored beforehand (the sweep)
--   recent  a random one of the newest <recent> of those <keys> keys (the
--           sweep: retries of recent jobs, the usual ones)

wrk.method = "POST"
wrk.path = "/charges"
wrk.body = '{"amount":4200,"currency":"eur"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer bench"

local threads = 0

function setup(thread)
	threads = threads + 1
	thread:set("id", threads)
end

function init(args)
	mode = args[1] or "plain"
	prefix = args[2] or "bench"
	keys = tonumber(args[3] or "64")
	recent = math.min(tonumber(args[4] or "1"), keys)
	n = 0
	-- The upstream counts what reaches it by run (main.go, upstream).
	wrk.headers["X-Bench-Run"] = prefix
	math.randomseed(id * 7919 + os.time())
end

function request()
	n = n + 1
	if mode == "fresh" then
		wrk.headers["Idempotency-Key"] = prefix .. "-" .. id .. "-" .. n
	elseif mode == "replay" then
		wrk.headers["Idempotency-Key"] = prefix .. "-" .. (n % keys)
	elseif mode == "random" or mode == "stored" then
		wrk.headers["Idempotency-Key"] = prefix .. "-" .. math.random(keys)
	elseif mode == "recent" then
		wrk.headers["Idempotency-Key"] = prefix .. "-" .. (keys - recent + math.random(recent))
	end
	return wrk.format()
end
