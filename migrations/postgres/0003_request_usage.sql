-- SPEC 4.2: a reply is rebuilt with its usage (for a stream, from the chunk that carries it), and
-- the request record is where the admin API shows it. JSON as the upstream sent it; NULL when
-- the reply had none (a chat stream without `stream_options.include_usage`, an error).
ALTER TABLE requests ADD COLUMN usage JSON;
