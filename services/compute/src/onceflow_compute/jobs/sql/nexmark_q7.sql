-- job: nexmark_q7_sql
-- Nexmark q7, highest bid: the highest price and the number of bids in each 10 s tumbling window
-- of the bids' own time (the specification's 10 minutes, scaled to test-sized streams). A bid up
-- to 5 s late (the WATERMARK's delay) refines its window's row (the Python twin: nexmark_q7).
CREATE TABLE events (
  kind STRING NOT NULL,
  id BIGINT, name STRING, city STRING, state STRING,
  seller BIGINT, category BIGINT, expires BIGINT,
  auction BIGINT, bidder BIGINT, price BIGINT, channel STRING,
  date_time BIGINT NOT NULL,
  ts AS timestamp_millis(date_time),
  WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
);

SELECT 'all' AS scope, MAX(price) AS highest, COUNT(*) AS bids,
       window.start AS window_start, window.end AS window_end
FROM events
WHERE kind = 'bid'
GROUP BY 'all', window(ts, '10 seconds')
