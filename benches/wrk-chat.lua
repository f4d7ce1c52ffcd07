-- wrk script for benches/overhead.sh: one small non-stream chat request, and one JSON line with
-- the exact numbers when the run ends (microseconds).
wrk.method = "POST"
wrk.body = '{"model":"s","messages":[{"role":"user","content":"hello there, how are you today?"}],"max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
-- WRK_API_KEY=KEY: sent as a bearer token (for gateways with api_keys).
local key = os.getenv("WRK_API_KEY")
if key then wrk.headers["Authorization"] = "Bearer " .. key end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"errors":%d,"non_2xx":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99)))
end
