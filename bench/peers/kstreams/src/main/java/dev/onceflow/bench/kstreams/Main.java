package dev.onceflow.bench.kstreams;

import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * Kafka Streams peer apps for {@code onceflow bench}: the same two single-hop jobs, arguments and
 * records as the Quix Streams peer (bench/peers/quix/apps.py).
 *
 * <pre>
 * java -jar target/onceflow-kstreams-peer.jar {keyed_count,dedup} --bootstrap HOST:PORT
 *     --input TOPIC --output TOPIC --group GROUP [--commit-interval 1.0] [--state-dir DIR]
 *     [--exactly-once | --at-least-once] [--quiet]
 * </pre>
 *
 * Input: key = user (keyed_count) or record_id (dedup), value = JSON
 * {@code {"record_id", "user", "amount", "ingest_time_ms"}}. The group is the application.id, so
 * it names the consumer group and the state store's changelog topic. Runs until SIGTERM or
 * SIGINT; the shutdown hook closes the KafkaStreams, which commits what it has processed (the JVM
 * then exits 143, as after any SIGTERM).
 */
public final class Main {
    static final String STORE = "state";
    // Jackson comes with kafka-streams; a Kafka Streams user would decode JSON with it.
    private static final ObjectMapper JSON = new ObjectMapper();

    private Main() {}

    /** Per user, count and sum in a changelogged store; one output per record. */
    static final class KeyedCount implements Processor<String, String, String, String> {
        private ProcessorContext<String, String> context;
        private KeyValueStore<String, byte[]> store;

        @Override
        public void init(ProcessorContext<String, String> context) {
            this.context = context;
            this.store = context.getStateStore(STORE);
        }

        @Override
        public void process(Record<String, String> record) {
            String user = record.key();
            byte[] old = store.get(user);
            ByteBuffer state = old == null ? ByteBuffer.allocate(16) : ByteBuffer.wrap(old);
            long count = state.getLong(0) + 1;
            JsonNode value = parse(record.value());
            long sum = state.getLong(8) + value.get("amount").asLong();
            store.put(user, ByteBuffer.allocate(16).putLong(count).putLong(sum).array());
            ObjectNode out = JSON.createObjectNode().put("user", value.get("user").asText()).put("count", count).put("sum", sum);
            context.forward(record.withValue(out.toString()));
        }
    }

    /** The first record with a key (its record_id) passes, later copies are dropped. */
    static final class Dedup implements Processor<String, byte[], String, byte[]> {
        private static final byte[] SEEN = {1};
        private ProcessorContext<String, byte[]> context;
        private KeyValueStore<String, byte[]> store;

        @Override
        public void init(ProcessorContext<String, byte[]> context) {
            this.context = context;
            this.store = context.getStateStore(STORE);
        }

        @Override
        public void process(Record<String, byte[]> record) {
            if (store.get(record.key()) != null) {
                return;
            }
            store.put(record.key(), SEEN);
            context.forward(record);
        }
    }

    static JsonNode parse(String json) {
        try {
            return JSON.readTree(json);
        } catch (java.io.IOException e) {
            throw new IllegalArgumentException("not JSON: " + json, e);
        }
    }

    static Topology topology(String job, String input, String output) {
        StreamsBuilder builder = new StreamsBuilder();
        // A persistent (RocksDB) store with a changelog topic, Kafka Streams' default.
        builder.addStateStore(Stores.keyValueStoreBuilder(
                Stores.persistentKeyValueStore(STORE), Serdes.String(), Serdes.ByteArray()));
        if (job.equals("keyed_count")) {
            builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                    .process(KeyedCount::new, STORE)
                    .to(output, Produced.with(Serdes.String(), Serdes.String()));
        } else {
            // The dedup gate never looks inside the value: its bytes pass through as they are.
            builder.stream(input, Consumed.with(Serdes.String(), Serdes.ByteArray()))
                    .process(Dedup::new, STORE)
                    .to(output, Produced.with(Serdes.String(), Serdes.ByteArray()));
        }
        return builder.build();
    }

    static Properties config(Map<String, String> args, boolean exactlyOnce) {
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args.get("--group"));
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args.get("--bootstrap"));
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG,
                exactlyOnce ? StreamsConfig.EXACTLY_ONCE_V2 : StreamsConfig.AT_LEAST_ONCE);
        long commitMs = Math.round(Double.parseDouble(args.getOrDefault("--commit-interval", "1.0")) * 1000);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Long.toString(commitMs));
        props.put(StreamsConfig.STATE_DIR_CONFIG, args.getOrDefault("--state-dir", "state"));
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        // One broker: the changelog cannot have three replicas.
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, "-1");
        return props;
    }

    static void usage(String why) {
        System.err.println(why);
        System.err.println("usage: {keyed_count,dedup} --bootstrap HOST:PORT --input TOPIC --output TOPIC"
                + " --group GROUP [--commit-interval SECONDS] [--state-dir DIR]"
                + " [--exactly-once | --at-least-once] [--quiet]");
        System.exit(2);
    }

    public static void main(String[] argv) throws InterruptedException {
        Map<String, String> args = new HashMap<>();
        List<String> positional = new ArrayList<>();
        boolean exactlyOnce = true;
        boolean quiet = false;
        for (int i = 0; i < argv.length; i++) {
            switch (argv[i]) {
                case "--exactly-once" -> exactlyOnce = true;
                case "--at-least-once" -> exactlyOnce = false;
                case "--quiet" -> quiet = true;
                case "--bootstrap", "--input", "--output", "--group", "--commit-interval", "--state-dir" -> {
                    if (i + 1 == argv.length) {
                        usage(argv[i] + " needs a value");
                    }
                    args.put(argv[i], argv[++i]);
                }
                default -> positional.add(argv[i]);
            }
        }
        if (positional.size() != 1 || !List.of("keyed_count", "dedup").contains(positional.get(0))) {
            usage("one job: keyed_count or dedup");
        }
        for (String required : List.of("--bootstrap", "--input", "--output", "--group")) {
            if (!args.containsKey(required)) {
                usage(required + " is required");
            }
        }
        // Before the first logger exists: slf4j-simple reads its level once.
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", quiet ? "warn" : "info");

        KafkaStreams streams = new KafkaStreams(
                topology(positional.get(0), args.get("--input"), args.get("--output")), config(args, exactlyOnce));
        CountDownLatch stopped = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.NOT_RUNNING || now == KafkaStreams.State.ERROR) {
                stopped.countDown();
            }
        });
        streams.setUncaughtExceptionHandler(exception -> {
            System.err.println("stream thread failed: " + exception);
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
                    .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(60));
            stopped.countDown();
        }, "shutdown"));
        streams.start();
        stopped.await();
        if (streams.state() == KafkaStreams.State.ERROR) {
            System.exit(1);
        }
    }
}
