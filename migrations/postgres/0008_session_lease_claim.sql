-- SPEC 4.2: requests on one session are serialised across processes. A process wakes its own
-- waiters the moment it releases a session's lease, while another process's waiters poll: under
-- a steady stream of requests through one process, the other's never got in. A waiter that
-- finds the lease taken claims the next turn for its process (store/lease.rs), unless a waiter
-- that began waiting earlier holds the claim; while another process's claim stands (until
-- lock_claim_until), a free lease is not taken. Times are unix milliseconds.
ALTER TABLE sessions ADD COLUMN lock_claim TEXT;
ALTER TABLE sessions ADD COLUMN lock_claim_since BIGINT;
ALTER TABLE sessions ADD COLUMN lock_claim_until BIGINT;
