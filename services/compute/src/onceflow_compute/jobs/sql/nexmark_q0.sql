-- job: nexmark_q0_sql
-- Nexmark q0, pass-through: every event, as it came (the Python twin: nexmark_q0).
CREATE TABLE events (
  kind STRING NOT NULL,
  id BIGINT, name STRING, city STRING, state STRING,
  seller BIGINT, category BIGINT, expires BIGINT,
  auction BIGINT, bidder BIGINT, price BIGINT, channel STRING,
  date_time BIGINT NOT NULL,
  ts AS timestamp_millis(date_time),
  WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
);

SELECT kind, id, name, city, state, seller, category, expires, auction, bidder, price, channel, date_time
FROM events
