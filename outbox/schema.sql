-- warren's outbox in schema {{schema}}: the messages that committed transactions published,
-- until a relay has them confirmed by the broker. Applied by outbox.Migrate (or `warren outbox
-- migrate`); every statement may run again.
CREATE SCHEMA IF NOT EXISTS {{schema}};

CREATE TABLE IF NOT EXISTS {{schema}}.outbox (
    -- The order of publishing: a transaction's rows are numbered as it wrote them.
    id          bigserial PRIMARY KEY,
    -- The Watermill topic, UUID, payload and metadata, as bytes: a Watermill message may hold
    -- any bytes, NUL and invalid UTF-8 included, which text and jsonb refuse.
    topic       bytea       NOT NULL,
    uuid        bytea       NOT NULL,
    payload     bytea       NOT NULL,
    metadata    bytea       NOT NULL,
    -- The message's warren publish id (warren-dlx-id), the same on every copy a relay sends.
    publish_id  text        NOT NULL,
    -- When the message is due, for a delayed one (its delay counts from the write).
    due         timestamptz,
    written     timestamptz NOT NULL DEFAULT now(),
    -- Set when the broker will never take the message: the row waits for a replay.
    set_aside   timestamptz,
    reason      text
);

-- The relay reads the rows that wait, in order.
CREATE INDEX IF NOT EXISTS outbox_waiting ON {{schema}}.outbox (id) WHERE set_aside IS NULL;

-- The inbox: the keys of the messages whose handlers committed (Inbox), so that a copy or a
-- redelivery is acked without running its handler again. Rows older than the retention go.
CREATE TABLE IF NOT EXISTS {{schema}}.inbox (
    key      bytea       PRIMARY KEY,
    handled  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS inbox_handled ON {{schema}}.inbox (handled);
