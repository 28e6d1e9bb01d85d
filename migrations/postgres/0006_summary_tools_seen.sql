-- SPEC 6 with `scrub_history`: a summary holds what its summariser read, which includes the
-- results of the tool calls the triggering request's role could see. The tool names of every
-- call the summary (and the summaries it rolled forward) folded in, as a JSON array of strings,
-- so that a request whose role may not use one of them does not get it. NULL: made before this
-- column (what it read is judged from the history it covers instead).
ALTER TABLE summaries ADD COLUMN tools_seen TEXT;
