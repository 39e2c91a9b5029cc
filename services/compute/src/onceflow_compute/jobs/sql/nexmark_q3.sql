-- job: nexmark_q3_sql
-- Nexmark q3, local item suggestion: the sellers in Oregon, Idaho or California of the auctions
-- in category 10, and those auctions. An incremental join (both sides kept): each auction joins
-- its seller whichever arrives first (the Python twin, nexmark_q3, gives the same pairs).
CREATE TABLE events (
  kind STRING NOT NULL,
  id BIGINT, name STRING, city STRING, state STRING,
  seller BIGINT, category BIGINT, expires BIGINT,
  auction BIGINT, bidder BIGINT, price BIGINT, channel STRING,
  date_time BIGINT NOT NULL,
  ts AS timestamp_millis(date_time),
  WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
);

SELECT p.name, p.city, p.state, a.id
FROM events a JOIN events p ON a.seller = p.id
WHERE a.kind = 'auction' AND a.category = 10 AND p.kind = 'person' AND p.state IN ('OR', 'ID', 'CA')
