-- job: nexmark_q2_sql
-- Nexmark q2, selection: the bids on auctions whose id is a multiple of 123 (the Python twin: nexmark_q2).
CREATE TABLE events (
  kind STRING NOT NULL,
  id BIGINT, name STRING, city STRING, state STRING,
  seller BIGINT, category BIGINT, expires BIGINT,
  auction BIGINT, bidder BIGINT, price BIGINT, channel STRING,
  date_time BIGINT NOT NULL,
  ts AS timestamp_millis(date_time),
  WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
);

SELECT auction, price
FROM events
WHERE kind = 'bid' AND auction % 123 = 0
