-- SPEC 7: a response id the proxy does not know is forwarded as `previous_response_id`; the
-- upstream then holds history the proxy never saw. The reply's response id records that id, and
-- a chain continued from it keeps sending it (with the stored items after it), so that history
-- is not silently dropped. NULL: the proxy holds the whole chain and sends it without one.
ALTER TABLE responses ADD COLUMN upstream_root TEXT;
