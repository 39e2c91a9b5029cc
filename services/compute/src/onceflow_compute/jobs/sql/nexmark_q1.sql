-- job: nexmark_q1_sql
-- Nexmark q1, currency conversion: every bid, its price in euros at the specification's rate of
-- 89 euro cents to the dollar, in integer arithmetic (the Python twin: nexmark_q1).
CREATE TABLE events (
  kind STRING NOT NULL,
  id BIGINT, name STRING, city STRING, state STRING,
  seller BIGINT, category BIGINT, expires BIGINT,
  auction BIGINT, bidder BIGINT, price BIGINT, channel STRING,
  date_time BIGINT NOT NULL,
  ts AS timestamp_millis(date_time),
  WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
);

SELECT auction, bidder, price * 89 DIV 100 AS price, date_time
FROM events
WHERE kind = 'bid'
