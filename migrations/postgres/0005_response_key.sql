-- A response id belongs to the client key that made it, as it does at the provider (an id is
-- scoped to the account whose key made it): `previous_response_id` continues a stored chain only
-- for that key (hex sha256 of it, as sessions record it), so in a tenant whose clients bring
-- their own provider keys one client cannot read or extend another's conversation by its
-- response id. NULL: made without a key, or before this column (any key continues it).
ALTER TABLE responses ADD COLUMN key_hash TEXT;
