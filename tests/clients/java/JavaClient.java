import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Drives Kafka's own Java client (kafka-clients) against a gateway, one scenario per JVM:
 * {@code java JavaClient SCENARIO key=value...}. Keys that start with {@code client.} are
 * passed, without the prefix, to every client the scenario makes (security settings). Every
 * result is one JSON object per line on stdout; a failure is an {"event":"error"} line and
 * exit status 1, so the Python test sees the Java client's own exception class.
 */
public final class JavaClient {
    static Map<String, String> args = new HashMap<>();

    public static void main(String[] argv) {
        for (int i = 1; i < argv.length; i++) {
            int eq = argv[i].indexOf('=');
            args.put(argv[i].substring(0, eq), argv[i].substring(eq + 1));
        }
        try {
            switch (argv[0]) {
                case "produce" -> produce();
                case "consume" -> consume();
                case "group848" -> GroupScenarios.consumerProtocol();
                case "upgrade" -> GroupScenarios.upgrade();
                case "transactions" -> TxnScenarios.commitAndAbort();
                case "read-process-write" -> TxnScenarios.readProcessWrite();
                case "zombie" -> TxnScenarios.zombie();
                case "admin" -> AdminScenarios.run();
                case "more" -> MoreScenarios.run();
                default -> throw new IllegalArgumentException("unknown scenario " + argv[0]);
            }
        } catch (Throwable e) {
            Throwable cause = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
            emit("event", "error", "type", cause.getClass().getName(), "message", String.valueOf(cause.getMessage()));
            System.out.flush();
            System.exit(1);
        }
        System.out.flush();
        // Client threads (and the JVM's) must not keep a finished scenario alive.
        System.exit(0);
    }

    static String arg(String name, String fallback) {
        return args.getOrDefault(name, fallback);
    }

    static int intArg(String name, int fallback) {
        return Integer.parseInt(arg(name, Integer.toString(fallback)));
    }

    /** Settings every client shares: bootstrap plus the caller's client.* settings. */
    static Properties common() {
        Properties p = new Properties();
        p.put("bootstrap.servers", args.get("bootstrap"));
        for (Map.Entry<String, String> e : args.entrySet()) {
            if (e.getKey().startsWith("client.")) p.put(e.getKey().substring("client.".length()), e.getValue());
        }
        return p;
    }

    static KafkaProducer<String, String> producer(Map<String, Object> extra) {
        Properties p = common();
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        p.put("max.block.ms", arg("max.block.ms", "30000"));
        p.putAll(extra);
        return new KafkaProducer<>(p);
    }

    static KafkaConsumer<String, String> consumer(Map<String, Object> extra) {
        Properties p = common();
        p.put("key.deserializer", StringDeserializer.class.getName());
        p.put("value.deserializer", StringDeserializer.class.getName());
        p.put("enable.auto.commit", "false");
        p.put("auto.offset.reset", "earliest");
        p.putAll(extra);
        return new KafkaConsumer<>(p);
    }

    static synchronized void emit(Object... keyValues) {
        Map<String, Object> line = new LinkedHashMap<>();
        for (int i = 0; i < keyValues.length; i += 2) line.put((String) keyValues[i], keyValues[i + 1]);
        System.out.println(Json.of(line));
    }

    static Map<String, Object> record(ConsumerRecord<String, String> r) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("partition", r.partition());
        out.put("offset", r.offset());
        out.put("key", r.key());
        out.put("value", r.value());
        Map<String, String> headers = new LinkedHashMap<>();
        for (Header h : r.headers()) headers.put(h.key(), new String(h.value(), StandardCharsets.UTF_8));
        out.put("headers", headers);
        return out;
    }

    /**
     * The producer with the client's defaults (idempotent, acks=all): record i goes to
     * partition i % partitions with key k-i, value v-i and header seq=i.
     */
    static void produce() throws Exception {
        String topic = args.get("topic");
        int count = intArg("count", 10), partitions = intArg("partitions", 1);
        String prefix = arg("prefix", "");
        int interval = intArg("interval.ms", 0);
        List<Future<RecordMetadata>> acks = new ArrayList<>();
        try (KafkaProducer<String, String> producer = producer(Map.of())) {
            for (int i = 0; i < count; i++) {
                ProducerRecord<String, String> rec = new ProducerRecord<>(
                        topic, i % partitions, prefix + "k-" + i, prefix + "v-" + i);
                rec.headers().add("seq", Integer.toString(i).getBytes(StandardCharsets.UTF_8));
                acks.add(producer.send(rec));
                if (interval > 0) {
                    // Paced sends, with a mark a third of the way for the caller to disturb the gateway.
                    if (i == count / 3) emit("event", "progress", "sent", i);
                    Thread.sleep(interval);
                }
            }
            producer.flush();
            for (int i = 0; i < count; i++) {
                RecordMetadata md = acks.get(i).get();
                emit("event", "ack", "i", i, "partition", md.partition(), "offset", md.offset());
            }
        }
        if (Boolean.parseBoolean(arg("describe.producers", "false"))) {
            try (Admin admin = Admin.create(common())) {
                List<TopicPartition> tps = new ArrayList<>();
                for (int p = 0; p < partitions; p++) tps.add(new TopicPartition(topic, p));
                var described = admin.describeProducers(tps).all().get();
                for (var e : described.entrySet()) {
                    List<Map<String, Object>> states = new ArrayList<>();
                    for (ProducerState s : e.getValue().activeProducers()) {
                        states.add(Map.of("producerId", s.producerId(), "epoch", s.producerEpoch(),
                                "lastSequence", s.lastSequence()));
                    }
                    emit("event", "producers", "partition", e.getKey().partition(), "active", states);
                }
            }
        }
        emit("event", "produced", "count", count);
    }

    /**
     * One consumer in group `group` (protocol `group.protocol`, classic by default) reads
     * until it has `count` records or `timeout.ms` passes, committing after every poll.
     */
    static void consume() {
        Map<String, Object> extra = new HashMap<>();
        extra.put("group.id", args.get("group"));
        extra.put("group.protocol", arg("group.protocol", "classic"));
        extra.put("isolation.level", arg("isolation.level", "read_uncommitted"));
        int count = intArg("count", 1);
        long deadline = System.currentTimeMillis() + intArg("timeout.ms", 30000);
        int got = 0;
        try (KafkaConsumer<String, String> consumer = consumer(extra)) {
            consumer.subscribe(List.of(args.get("topic")));
            while (got < count && System.currentTimeMillis() < deadline) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                for (ConsumerRecord<String, String> r : records) {
                    emit("event", "record", "record", record(r));
                    got++;
                }
                if (!records.isEmpty()) consumer.commitSync();
            }
            emit("event", "consumed", "count", got, "assignment", partitionsOf(consumer.assignment()));
        }
    }

    static List<Integer> partitionsOf(Collection<TopicPartition> tps) {
        List<Integer> out = new ArrayList<>();
        for (TopicPartition tp : tps) out.add(tp.partition());
        out.sort(null);
        return out;
    }
}
