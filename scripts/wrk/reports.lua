-- wrk script of scripts/bench_ingest.py: POST reports whose ids were never sent before.
--
--   wrk -s scripts/wrk/reports.lua URL -- NONCE LABELS BATCH
--
-- NONCE (integer < 2^32) differs between runs, so one run's ids are never another's;
-- each wrk thread has its own number and counter. Values cycle through the labels
-- c0 .. c(LABELS - 1). BATCH 1 sends one report per request, more sends {"reports": [...]}.

local next_thread = 0

function setup(thread)
  next_thread = next_thread + 1
  thread:set("thread_number", next_thread)
end

function init(args)
  nonce = tonumber(args[1]) or 0
  labels = tonumber(args[2]) or 100
  batch = tonumber(args[3]) or 1
  counter = 0
  headers = { ["Content-Type"] = "application/json" }
end

local function report()
  counter = counter + 1
  return string.format('{"report_id":"%08x-%04x-4000-8000-%012x","value":"c%d"}',
    nonce, thread_number, counter, counter % labels)
end

function request()
  local body
  if batch == 1 then
    body = report()
  else
    local parts = {}
    for i = 1, batch do
      parts[i] = report()
    end
    body = '{"reports":[' .. table.concat(parts, ",") .. ']}'
  end
  return wrk.format("POST", nil, headers, body)
end
