-- SPEC 4.1 and 4.2: a server-mode request's leading system (or developer) messages replace the
-- stored ones for that request only, so the branch keeps its own; the ones it sent instead, when
-- they differ, are kept with its record (a JSON array, as received), so that nothing received is
-- lost. NULL: the request replaced nothing.
ALTER TABLE requests ADD COLUMN system TEXT;
